"""`python -m harness` (and the `harness` console script): Hydra, with every error it or the
schema raises said in one line, `harness: error: <key>=<value>: <what is allowed>`, exit 2.

Hydra composes and checks the config against the typed schema (harness/config.py, struct
mode: an unknown key or a value of the wrong type is refused); a sweep's points are each
planned before the first job runs (harness/frontend/sweeper.py). This module only turns what they
raise into one line: `run.debug=true` or HYDRA_FULL_ERROR=1 shows the full error instead.
Tab completion (`-sc install=bash`: completion_script), `--config-dir` presets, interpolations (`microbatches=${pp}`)
and quoted values are Hydra's own.
"""

from __future__ import annotations

import os
import re
import sys
from typing import NoReturn

from harness.frontend import signals
from harness.records.scratch import Scratch

# flags of Hydra's command line whose next argument is their value, not an override
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--shell-completion",
                     "-sc", "--experimental-rerun", "--info", "-i", "--package", "-p", "--cfg", "-c"}
_FAULT_PART = re.compile(r"[a-z]+@rank\d+")
_STEP_PART = re.compile(r"step\d+")
_TRUE = re.compile(r"^\+{0,2}run\.debug=(true|True|TRUE|yes|1)$")


def torchrun_overrides(argv: list[str], env: dict[str, str]) -> tuple[list[str], str | None, Scratch | None]:
    """Under torchrun every rank runs this app: rank 0 records the job in Hydra's output
    directory; the others get a scratch directory and no logs. Sweeps are refused there (each
    job would need a fresh world): a sweep across machines is `-m hydra/launcher=slurm`, which
    gives each point its own allocation and starts its ranks as SLURM tasks (their scratch
    directories are made by harness.runtime.cluster.SubmititJob, which never passes through here).
    Returns (argv, why it cannot run or None, the scratch directory made for this rank or None):
    the scratch directory is made here (mkdtemp) and is the only one removed at the end, by
    its identity, never a directory that merely has a scratch directory's name."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return argv, None, None
    if "-m" in argv or "--multirun" in argv:
        return argv, ("-m/--multirun under torchrun: run one job per torchrun (a sweep across machines: "
                      "-m hydra/launcher=slurm, an allocation per point sized to its pp x dp)"), None
    if env["RANK"] == "0":
        return argv, None, None
    scratch = Scratch(prefix=f"harness-torchrun-{env.get('TORCHELASTIC_RUN_ID', 'run')}-rank{env['RANK']}-")
    return argv + [f"hydra.run.dir={scratch.path}", "hydra.output_subdir=null", "hydra/job_logging=disabled",
                   "hydra/hydra_logging=disabled"], None, scratch


def quote_fault(arg: str) -> str:
    """`run.fault=raise@rank1,step2`, as the README writes it, is one value, not a sweep over
    `raise@rank1` and `step2` nor Hydra's "ambiguous value": its halves are quoted together
    (also within a sweep: `run.fault=raise@rank1,step0,kill@rank0,step0,null`; the old
    top-level `fault=` too, so that it is told where the key moved)."""
    key, eq, value = arg.partition("=")
    if not eq or key.lstrip("+") not in ("run.fault", "fault") or value[:1] in ("'", '"', "[", "{") or "(" in value:
        return arg
    parts, out, i = value.split(","), [], 0
    while i < len(parts):
        if _FAULT_PART.fullmatch(parts[i]) and i + 1 < len(parts) and _STEP_PART.fullmatch(parts[i + 1]):
            out.append(f"'{parts[i]},{parts[i + 1]}'")
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return f"{key}={','.join(out)}"


def overrides_of(argv: list[str]) -> list[str]:
    """The key=value overrides on a command line (flags and their values left out)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


class _QuietJobErrors:
    """sys.stderr without the line Hydra writes before re-raising a failed job's exception
    ("Error executing job with overrides: [...]"): the error is said once, in one line."""

    def __init__(self, stream: object) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if text.startswith("Error executing job with overrides:"):
            return len(text)
        return self.stream.write(text)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


_PYTHON_M = re.compile(r"^\s*\S*python[\d.]*\s+-m\s+harness(?=\s|$)")
# the commands the completion is bound to: bash looks a compspec up by the command's full path, then by
# its last part (.venv/bin/python is `python`); python3.X by name, each minor of its own
COMMANDS = ("python", "python3", *(f"python3.{minor}" for minor in range(30)), "harness")
# Hydra's bash completion function (hydra/_internal/core_plugins/bash_completion.py), but the
# interpreter may be any python (a path, python3.X) and `-m harness` is completed by
# `<python> -m harness -sc query=bash` (Hydra's completes `python app.py` and an app by its name)
_FUNCTION = """hydra_bash_completion()
{
    words=($COMP_LINE)
    if [[ "${words[0]##*/}" =~ ^python[0-9.]*$ ]]; then
        if (( ${#words[@]} < 2 )); then
            return
        fi
        if [ "${words[1]}" == "-m" ]; then
            if [ "${words[2]}" != "harness" ]; then
                return
            fi
            helper="${words[0]} -m harness"
        else
            file_path=$(pwd)/${words[1]}
            if [ ! -f "$file_path" ]; then
                return
            fi
            grep "@hydra.main" $file_path -q
            helper="${words[0]} ${words[1]}"
        fi
    else
        helper="${words[0]}"
        true
    fi

    EXECUTABLE=($(command -v $helper))
    if [ "$HYDRA_COMP_DEBUG" == "1" ]; then
        printf "EXECUTABLE_FIRST='${EXECUTABLE[0]}'\\n"
    fi
    if ! [ -x "${EXECUTABLE[0]}" ]; then
        false
    fi

    if [ $? == 0 ]; then
        choices=$( COMP_POINT=$COMP_POINT COMP_LINE=$COMP_LINE $helper -sc query=bash)
        word=${words[$COMP_CWORD]}

        if [ "$HYDRA_COMP_DEBUG" == "1" ]; then
            printf "\\n"
            printf "COMP_LINE='$COMP_LINE'\\n"
            printf "COMP_POINT='$COMP_POINT'\\n"
            printf "Word='$word'\\n"
            printf "Output suggestions:\\n"
            printf "\\t%s\\n" ${choices[@]}
        fi
        COMPREPLY=($( compgen -o nospace -o default -W "$choices" -- "$word" ));
    fi
}
"""


def completion_commands(argv0: str) -> list[str]:
    """What the completion is bound to: every python, `harness`, and the script run if it is
    another (a console script under another name)."""
    name = os.path.basename(argv0)
    return [*COMMANDS, *([name] if name and not name.endswith(".py") and name not in COMMANDS else [])]


def completion_script(command: str, argv0: str) -> str:
    """`-sc install=bash` (zsh: the same, through bashcompinit) and `-sc uninstall=bash`: Hydra's,
    bound to every way the README runs the harness (`python -m harness`, `.venv/bin/python -m
    harness`, `python3.X -m harness`, `harness`) instead of the literal `python` or the app's name."""
    names = " ".join(completion_commands(argv0))
    if command == "uninstall":
        return (f"unset hydra_bash_completion\ncomplete -r {names} 2> /dev/null\n"
                f"{os.environ.get('_HYDRA_OLD_COMP', '')}\nunset _HYDRA_OLD_COMP\n")
    return (f"export _HYDRA_OLD_COMP=$(complete -p {names} 2> /dev/null)\n{_FUNCTION}\n"
            "COMP_WORDBREAKS=${COMP_WORDBREAKS//=}\n"
            f"COMP_WORDBREAKS=$COMP_WORDBREAKS complete -o nospace -o default -F hydra_bash_completion {names}\n")


def shell_completion(argv: list[str]) -> str | None:
    """`-sc ...`: "install" or "uninstall" for bash or zsh (the script is ours: completion_script),
    else None (Hydra answers: a query, fish). A query's line is made `harness ...`: Hydra
    strips `python file.py` or an app's name, not `<python> -m harness`."""
    flag = next((i for i, a in enumerate(argv) if a in ("-sc", "--shell-completion")), None)
    if flag is None:
        return None
    if "COMP_LINE" in os.environ:
        os.environ["COMP_LINE"] = _PYTHON_M.sub("harness", os.environ["COMP_LINE"])
    command, _, shell = (argv[flag + 1] if flag + 1 < len(argv) else "").partition("=")
    return command if command in ("install", "uninstall") and shell in ("bash", "zsh") else None


def fail(message: str) -> NoReturn:
    print(f"harness: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main() -> None:
    signals.install()  # Ctrl-C and SIGTERM honoured at every moment, a job's first milliseconds too
    # a torchrun rank other than 0 writes into a scratch directory made for it: removed when it is done
    argv, problem, scratch = torchrun_overrides(sys.argv[1:], dict(os.environ))
    if problem:
        fail(problem)
    argv = [quote_fault(a) for a in argv]
    full = os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0") or any(_TRUE.match(a) for a in argv)
    sys.argv[1:] = argv
    if (script := shell_completion(argv)) is not None:  # no config composed: the script alone
        print(completion_script(script, sys.argv[0]), end="")
        return
    from hydra.core.global_hydra import GlobalHydra

    from harness.frontend.app import main as hydra_main
    from harness.frontend.errors import check_deletions, hydra_problem
    from harness.frontend.sweeper import FULL_ERRORS_ENV

    GlobalHydra.instance().clear()  # a second main() in one process (tests) starts afresh, as Hydra expects
    saved = {k: os.environ.get(k) for k in ("HYDRA_FULL_ERROR", FULL_ERRORS_ENV)}
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing; we print one line, or all of it
    os.environ[FULL_ERRORS_ENV] = "1" if full else "0"  # the sweeper's points say theirs the same way
    stderr = sys.stderr
    if not full:
        sys.stderr = _QuietJobErrors(stderr)  # type: ignore[assignment]
    try:
        check_deletions(overrides_of(argv))  # `~pp` composes without error: it would run the default unasked
        hydra_main()
        signals.check()  # one that arrived where its raise was lost (a finalizer) still ends it
    except KeyboardInterrupt:  # between jobs: nothing was running, every record is complete
        print("harness: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - every error the user can cause is one line (run.debug=true: all of it)
        if full:
            raise
        fail(hydra_problem(e, overrides_of(argv), sweep="-m" in argv or "--multirun" in argv))
    finally:
        sys.stderr = stderr
        GlobalHydra.instance().clear()
        if scratch is not None:
            scratch.remove()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
