"""A bash script: a comment header (the source, what maps to what, what the tool cannot
express) and one command, each flag with its values on its own line, every word shell-quoted
except the expansions the user must supply (written as `Raw`)."""

from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field

from harness.export.point import Launch

WIDTH = 100  # header comments are wrapped here
CANNOT = "CANNOT EXPRESS: "  # the prefix of a line saying what of the point the tool cannot run


@dataclass(frozen=True)
class Raw:
    """A shell word written as it is, never quoted: a parameter expansion the user supplies."""

    text: str


Word = str | Raw
ARGS = Raw('"$@"')  # the script's own arguments, passed on (anything more the user adds)


@dataclass
class Script:
    title: str  # first header line: the tool and its version
    source: str
    facts: list[str] = field(default_factory=list)  # how the point maps, one line each
    cannot: list[str] = field(default_factory=list)  # what the tool cannot express (said, never silent)
    notes: list[str] = field(default_factory=list)  # where the tool does the same thing differently
    command: list[list[Word]] = field(default_factory=list)  # one line of the command each
    needs: dict[str, str] = field(default_factory=dict)  # environment variable -> what the user sets it to
    environment: dict[str, str] = field(default_factory=dict)  # exported before the command: what the tool reads

    def need(self, var: str, what: str) -> Raw:
        """A value the source does not give and the tool needs to start: the environment variable
        the user sets, which bash refuses to run without (`${VAR:?...}`), so no default of the
        tool's or ours stands in for it unseen. Said in the header too."""
        self.needs[var] = what
        return Raw(f'"${{{var}:?see the header of this script}}"')

    def run_length(self, steps: int | None, steps_var: str, log_var: str) -> tuple[Word, Word]:
        """(steps, steps between logged lines): a run's own steps, each logged as the harness records
        them; for an advice point, which has none, both asked for (`need`)."""
        if steps is not None:
            return str(steps), "1"
        return self.need(steps_var, "the steps to train"), self.need(log_var, "steps between logged lines")

    def text(self) -> str:
        head = [self.title, f"source: {self.source}",
                *(f"set before running: {var}, {what}" for var, what in self.needs.items()),
                *self.facts, *(CANNOT + c for c in self.cannot), *(f"note: {n}" for n in self.notes)]
        out = ["#!/usr/bin/env bash"]
        for line in head:
            out += textwrap.wrap(line, WIDTH - 2, initial_indent="# ", subsequent_indent="#   ",
                                 break_on_hyphens=False, break_long_words=False)
        out.append("set -euo pipefail")
        out += [f"export {var}={shlex.quote(value)}" for var, value in self.environment.items()]
        out.append(" \\\n  ".join(" ".join(_word(w) for w in group) for group in self.command if group))
        return "\n".join(out) + "\n"


def _word(w: Word) -> str:
    return w.text if isinstance(w, Raw) else shlex.quote(w)


def torchrun(launch: Launch) -> list[Word]:
    """The launcher line: one machine standalone, or the same command on every node (c10d)."""
    if launch.nodes == 1:
        return ["torchrun", "--standalone", "--nproc-per-node", str(launch.per_node)]
    return ["torchrun", "--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", Raw('"${HEAD:?set HEAD to the address of the first node}:29500"')]


def launch_fact(launch: Launch, world: int) -> str:
    where = f"cluster {launch.cluster}: " if launch.cluster else ""
    if launch.nodes == 1:
        return f"launch: {where}{world} GPUs on one machine"
    return (f"launch: {where}{launch.nodes} nodes x {launch.per_node} GPUs = {world} ranks; run this on every "
            "node with HEAD set to the first node's address")
