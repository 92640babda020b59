"""Lower a schedule into per-rank point-to-point programs, and check them under a backend's
matching rules (gloo or NCCL). Pure: no torch; the runtime implements what `lower` writes.

Lowering. For each action of stage s, microbatch i, in the rank's list order: an F whose
stage s-1 lives on another rank posts the receive of (s-1 -> s, act, i) and waits for it,
computes, then posts (never waits for) the send of (s -> s+1, act, i) when s+1 lives on
another rank. A B or I does the same with the gradient, from s+1 and to s-1. A W only
computes. With dp > 1, the stage's last B, I or W in the rank's list then posts the stage's
gradient all-reduce on its pipeline rank's data-parallel channel and waits for it (DDP in a
last B; the explicit all-reduce after a last W). Neighbour
stages on one rank hand over locally (no message). After its last action a rank waits for
every send it posted (drain). Global rank = replica * pp + pipeline rank; every replica runs
the same lists and exchanges messages only inside itself.

Transports. "eager" sends everything over the world group (on gloo the runtime puts messages
to a lower rank on a second world-wide group, which changes no matching: gloo's FIFO is per
source and destination); NCCL, as PyTorch drives it, gives each pair of ranks one
communicator and one stream, so the channel is the rank pair, both directions together.
"safe" makes one process group per directed stage edge (replica, from_stage, to_stage).
All-reduces run on ("dp", pipeline rank) under both.

gloo: a send never blocks. A receive from rank A on channel C matches, in posting order, the
sends from A on C with the same tag (FIFO per channel, source, destination, tag; with one
tag, FIFO per channel, source, destination); a matched send carrying another message than
the one expected is a mismatch. A wait blocks until its receive is matched. An all-reduce
completes once every member has posted it; members must post their all-reduces in one order.

NCCL: tags are ignored. Each (rank, channel) is one FIFO stream of its posted sends,
receives and all-reduces, run strictly in posting order. The op at the head of rank A's
stream completes only together with its counterpart at the head of the peer's stream: a
send A -> B with B's receive from A (the k-th send meets the k-th receive; other messages:
a mismatch), an all-reduce with the all-reduce at every member's head. Every send is taken
as larger than NCCL's buffers, so it holds its stream until the receive reaches the peer's
head; two sends facing each other at the heads of one channel deadlock. A wait blocks the
rank until its op has completed; the drain until all its sends have.

A deadlock is a state where no rank can move and some program is unfinished; every stuck
rank is reported with the action it is at and what it waits for (for dp > 1, replica 0's:
the replicas run the same lists, so they stop at the same steps). The checker runs an event
loop: a rank runs until it blocks, and only a completion that it waits for wakes it; a
channel is matched only when an op reaches the head of one of its streams.

What follows from the rules. NCCL matches by order alone, so each stage edge must be received
in the order it is sent: a stage taking microbatches in another order than its neighbour
sends them is a mismatch (on a GPU, a silent one: same-shaped tensors trade places). Under
"safe" a stream carries one edge, one direction, so a send waits only for its own receive:
NCCL's verdict is gloo's with one tag, which a CPU run can exercise. Under "eager" one
stream carries both directions of a rank pair, and a send the peer has not asked for yet
holds every receive behind it: every built-in schedule but GPipe deadlocks once M > 1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import NamedTuple

from harness.schedules.ir import Action, Kind, Schedule, format_grid, stage_to_rank
from harness.schedules.validate import validate

TRANSPORTS = ("eager", "safe")
BACKENDS = ("gloo", "nccl")
OP_KINDS = ("recv", "wait", "compute", "send", "allreduce", "drain")
Channel = Hashable


class P2PError(ValueError):
    """First line: the rule broken and who waits for what; then the grid, offending steps marked."""


class Message(NamedTuple):
    """One tensor between two stages of one replica: kind "act" (F's output, to from_stage + 1)
    or "grad" (B/I's input gradient, to from_stage - 1)."""
    from_stage: int
    to_stage: int
    kind: str
    microbatch: int


def action_message(a: Action, into: bool, stages: int) -> Message | None:
    """The activation an F receives (into) or sends on, the gradient a B or I receives or
    sends; None for a W and at the pipeline's ends."""
    if a.kind is Kind.W:
        return None
    s, forward = a.stage, a.kind is Kind.F
    peer = s + (-1 if forward else 1) * (1 if into else -1)  # F: from s - 1, to s + 1; B, I: the reverse
    if not 0 <= peer < stages:
        return None
    kind = "act" if forward else "grad"
    return Message(peer, s, kind, a.microbatch) if into else Message(s, peer, kind, a.microbatch)


@dataclass(frozen=True)
class Op:
    """One step of a rank's program. `index` is the action (in the rank's list) it belongs
    to, len(list) for the drain. A wait repeats the fields of the op it waits for. An
    all-reduce has no message, tag or peer: its stage is its action's stage."""
    kind: str
    index: int
    msg: Message | None = None
    channel: Channel | None = None
    tag: int | None = None
    peer: int | None = None


def channel(transport: str, replica: int, from_stage: int, to_stage: int, owner: dict[int, int],
            pp: int) -> Channel:
    """The channel a message from_stage -> to_stage of `replica` travels on. `owner` maps stage
    to pipeline rank (stage_to_rank); `pp` turns pipeline ranks into global ranks (eager's key
    is the global rank pair, as PyTorch's NCCL keys its per-pair communicators)."""
    if transport == "eager":
        return ("world", frozenset((replica * pp + owner[from_stage], replica * pp + owner[to_stage])))
    if transport == "safe":
        return ("edge", replica, from_stage, to_stage)
    raise ValueError(f"transport={transport!r}: expected one of {', '.join(TRANSPORTS)}")


def dp_channel(pipeline_rank: int) -> Channel:
    """The data-parallel group of one pipeline rank: its dp replicas all-reduce there."""
    return ("dp", pipeline_rank)


def tag(from_stage: int, to_stage: int, mb: int, stages: int, single_tag: bool = False) -> int:
    """Unique per message of a replica, as the executor's today: (mb*2 + is_grad)*stages + from;
    0 for every message with single_tag (what a backend that ignores tags sees)."""
    if single_tag:
        return 0
    return (mb * 2 + int(to_stage < from_stage)) * stages + from_stage


# -- lowering ---------------------------------------------------------------------------
# Internally a program is shorter than lower()'s: a receive and its wait are one op, so is an
# all-reduce and its wait, and computes are left out. An op is the tuple (kind, index, msg,
# channel id, tag, peer, stream, peer's stream): msg is the message's unique key (tag without
# single_tag; for an all-reduce, its stage); a stream is one (global rank, channel id),
# numbered; peer's stream is None for an all-reduce.
_RECV, _WAIT, _COMPUTE, _SEND, _ALLREDUCE, _DRAIN = OP_KINDS


class _Lowered(NamedTuple):
    programs: list[list[tuple]]  # global rank -> ops
    keys: list[Channel]  # channel id -> key
    members: list[tuple[int, ...]]  # channel id -> member global ranks, sorted
    streams: list[list[int]]  # channel id -> its streams, in members' order
    stages: int


def _lower(schedule: Schedule, transport: str, pp: int, dp: int, single_tag: bool) -> _Lowered:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}: expected one of {', '.join(TRANSPORTS)}")
    if dp < 1 or pp < 1 or any(not 0 <= r < pp for r in schedule):
        raise ValueError(f"pp={pp}, dp={dp}: need pp, dp >= 1 and ranks 0..pp-1 (schedule has {sorted(schedule)})")
    owner = stage_to_rank(schedule)
    stages = max(owner, default=-1) + 1
    ids: dict[Channel, int] = {}
    keys: list[Channel] = []
    members: list[tuple[int, ...]] = []
    chan_streams: list[list[int]] = []
    sids: dict[tuple[int, int], int] = {}

    def chan_id(key: Channel, ranks: set[int]) -> int:
        if (c := ids.get(key)) is None:
            c = ids[key] = len(keys)
            keys.append(key)
            members.append(tuple(sorted(ranks)))
            chan_streams.append([sids.setdefault((g, c), len(sids)) for g in members[c]])
        return c

    programs: list[list[tuple]] = []
    for d in range(dp):
        base = d * pp

        def route(frm: int, to: int, me: int) -> tuple[int, int, int, int] | None:
            """(channel id, peer, my stream, peer's stream) of message frm -> to seen from stage
            `me` (one of the two); None when both stages live on one rank (local hand-off)."""
            if not (0 <= frm < stages and 0 <= to < stages) or owner[frm] == owner[to]:
                return None
            ends = (base + owner[frm], base + owner[to])
            c = chan_id(channel(transport, d, frm, to, owner, pp), set(ends))
            mine, peer = ends if me == frm else ends[::-1]
            return c, peer, sids[(mine, c)], sids[(peer, c)]

        # per stage, for F and for B/I: (receive route, send route, key offset of the received
        # message, of the sent one); a message's key is mb * 2 * stages + its offset
        fwd = [(route(s - 1, s, s), route(s, s + 1, s), s - 1, s) for s in range(stages)]
        bwd = [(route(s + 1, s, s), route(s, s - 1, s), stages + s + 1, stages + s) for s in range(stages)]
        F, W = Kind.F, Kind.W  # noqa: N806
        for p in range(pp):
            acts = schedule.get(p, [])
            # a stage's gradients are complete after its last B, I or W: its all-reduce goes there
            last_grad = {a.stage: i for i, a in enumerate(acts) if a.kind is not F} if dp > 1 else {}
            ar = chan_id(dp_channel(p), {r * pp + p for r in range(dp)}) if dp > 1 and last_grad else None
            out: list[tuple] = []
            for i, a in enumerate(acts):
                k, s = a.kind, a.stage
                if k is not W:
                    get, put, get_key, put_key = (fwd if k is F else bwd)[s]
                    if get is not None:
                        key = a.microbatch * 2 * stages + get_key
                        out.append((_RECV, i, key, get[0], 0 if single_tag else key, *get[1:]))
                    if put is not None:
                        key = a.microbatch * 2 * stages + put_key
                        out.append((_SEND, i, key, put[0], 0 if single_tag else key, *put[1:]))
                if ar is not None and k is not F and last_grad[s] == i:
                    out.append((_ALLREDUCE, i, s, ar, None, None, sids[(base + p, ar)], None))
            out.append((_DRAIN, len(acts), None, None, None, None, None, None))
            programs.append(out)
    return _Lowered(programs, keys, members, chan_streams, stages)


def _message(key: int, stages: int) -> Message:
    """The message whose unique key (tag without single_tag) is `key`."""
    rest, frm = divmod(key, stages)
    mb, grad = divmod(rest, 2)
    return Message(frm, frm - 1 if grad else frm + 1, "grad" if grad else "act", mb)


def lower(schedule: Schedule, transport: str, pp: int, dp: int = 1, single_tag: bool = False) -> dict[int, list[Op]]:
    """Global rank -> its program (the contract the runtime implements), in the module
    docstring's order. Assumes a valid schedule (check() validates first)."""
    low = _lower(schedule, transport, pp, dp, single_tag)
    out: dict[int, list[Op]] = {}
    for g, prog in enumerate(low.programs):
        comms: dict[int, list[tuple]] = {}
        for t in prog:
            comms.setdefault(t[1], []).append(t)
        ops: list[Op] = []
        for i in range(len(schedule.get(g % pp, []))):
            mine = comms.get(i, [])
            for kind, _, m, c, tg, peer, _, _ in mine:
                if kind is _RECV:
                    op = Op(_RECV, i, _message(m, low.stages), low.keys[c], tg, peer)
                    ops += (op, replace(op, kind=_WAIT))
            ops.append(Op(_COMPUTE, i))
            for kind, _, m, c, tg, peer, _, _ in mine:
                if kind is _SEND:
                    ops.append(Op(_SEND, i, _message(m, low.stages), low.keys[c], tg, peer))
                elif kind is _ALLREDUCE:
                    op = Op(_ALLREDUCE, i, channel=low.keys[c])
                    ops += (op, replace(op, kind=_WAIT))
        ops.append(Op(_DRAIN, prog[-1][1]))
        out[g] = ops
    return out


def _order(key: Channel, ranks: tuple[int, ...]) -> tuple:
    """Creation order: pipeline channels before data-parallel ones; edges by (replica, from,
    to); world pairs by their ranks; dp channels by pipeline rank."""
    kind = key[0]
    return (kind == "dp", ranks if kind == "world" else key[1:])


def channels(schedule: Schedule, transport: str, pp: int, dp: int = 1) -> list[tuple[Channel, tuple[int, ...]]]:
    """Every channel the programs use, with its member global ranks, in one deterministic
    order: new_group is collective over the world, so every rank creates every group, all
    in this order (eager's world pairs need no group; they are listed for completeness)."""
    low = _lower(schedule, transport, pp, dp, False)
    return sorted(zip(low.keys, low.members), key=lambda km: _order(*km))


def rank_channels(schedule: Schedule, transport: str, pp: int, dp: int = 1) -> dict[int, list[Channel]]:
    """Global rank -> the channels it is a member of, in channels()'s order."""
    every = channels(schedule, transport, pp, dp)
    return {g: [key for key, ranks in every if g in ranks] for g in range(pp * dp)}


# -- checking -----------------------------------------------------------------------------
def _rules(backend: str, transport: str, single_tag: bool) -> str:
    how = f"{backend}, transport={transport}" + (", one tag" if single_tag else "")
    if backend == "gloo":
        key = "channel, source and destination" if single_tag else "channel, source, destination and tag"
        return f"{how}: a receive takes the oldest unmatched send of the same {key}"
    return f"{how}: tags ignored, a rank's ops on a channel run in posting order, a send waits for the peer's receive"


class _Checker:
    """One run of the programs under a backend's rules. A rank runs until it blocks and is
    revisited (`todo`) only when what it waits for completes; NCCL streams are matched only
    when an op reaches the head of one, so each op is touched a bounded number of times."""

    def __init__(self, schedule: Schedule, low: _Lowered, nccl: bool, pp: int, rules: str):
        self.schedule, self.low, self.nccl, self.pp, self.rules = schedule, low, nccl, pp, rules
        self.progs = low.programs
        self.pc = [0] * len(self.progs)
        self.done = [bytearray(len(p)) for p in self.progs]
        self.blocked = [-2] * len(self.progs)  # rank -> position of the op it waits for (-1: drain, -2: none)
        self.unsent = [0] * len(self.progs)  # sends posted and not completed
        self.stream_rank = [0] * sum(map(len, low.streams))
        for ranks, sids in zip(low.members, low.streams):
            for g, sid in zip(ranks, sids):
                self.stream_rank[sid] = g
        self.queues: list[deque[int]] = [deque() for _ in self.stream_rank]  # stream -> posted op positions
        self.unmatched: dict[tuple, deque] = {}  # gloo: (channel, src, dst, tag) -> (send?, rank, position)
        self.gathered: dict[tuple[int, int], list[tuple[int, int]]] = {}  # gloo: (channel, k) -> all-reduces
        self.posted: list[int] = [0] * len(self.stream_rank)  # gloo: stream -> all-reduces posted
        self.todo: list[int] = []

    # -- completion ---------------------------------------------------------------------
    def _complete(self, g: int, i: int, send: bool) -> None:
        """Op i of rank g is done; wake g if it waits for it (or, for a send, at its drain)."""
        self.done[g][i] = 1
        if send:
            self.unsent[g] -= 1
            if self.unsent[g] or self.blocked[g] != -1:
                return
        elif self.blocked[g] != i:
            return
        self.blocked[g] = -2
        self.todo.append(g)

    def _mismatch(self, sg: int, si: int, rg: int, ri: int) -> P2PError:
        """Send (sg, si) meets receive (rg, ri), which expects another message."""
        (_, send_at, sent, *_), (_, recv_at, wanted, *_) = self.progs[sg][si], self.progs[rg][ri]
        return self._fail(f"mismatch: rank {rg} {self._act(rg, recv_at)} would receive {self._what(sent)} "
                          f"(sent by rank {sg} {self._act(sg, send_at)}) instead of {self._what(wanted)}",
                          {rg % self.pp: recv_at, sg % self.pp: send_at})

    def _reduce(self, c: int, ops: list[tuple[int, int]]) -> None:
        """The all-reduces `ops` (one per member) run together: they must be of one stage."""
        stages = {self.progs[g][i][2] for g, i in ops}
        if len(stages) > 1:
            raise self._fail(f"collective order differs on {self.low.keys[c]}: ranks reach the all-reduces of "
                             f"stages {sorted(stages)} together", {g % self.pp: self.progs[g][i][1] for g, i in ops})
        for g, i in ops:
            self._complete(g, i, False)

    # -- posting ------------------------------------------------------------------------
    def _match_nccl(self, g: int, op: tuple) -> None:
        """`op` of rank g is now the head of its stream: complete the channel's heads while
        they meet (a send with the peer's receive; all-reduces at every member's head)."""
        queues, progs, srank = self.queues, self.progs, self.stream_rank
        if op[7] is None:
            c = op[3]
            sids = self.low.streams[c]
            while all(queues[s] for s in sids):
                self._reduce(c, [(srank[s], queues[s][0]) for s in sids])
                for s in sids:
                    queues[s].popleft()
            return
        qa, qb = queues[op[6]], queues[op[7]]
        ga, gb = g, srank[op[7]]
        pa, pb = progs[ga], progs[gb]
        while qa and qb:
            ia, ib = qa[0], qb[0]
            a, b = pa[ia], pb[ib]
            if a[0] is b[0]:
                return  # two sends (or two receives) face each other
            if a[2] != b[2]:
                raise self._mismatch(ga, ia, gb, ib) if a[0] is _SEND else self._mismatch(gb, ib, ga, ia)
            qa.popleft()
            qb.popleft()
            self._complete(ga, ia, a[0] is _SEND)
            self._complete(gb, ib, b[0] is _SEND)

    def _post_gloo(self, g: int, op: tuple, pc: int) -> None:
        """A send or receive meets the oldest unmatched opposite of its (channel, src, dst,
        tag); a send never waits, so only receives complete. An all-reduce completes when
        every member has posted its k-th."""
        kind, _, msg, c, tg, peer, sid, _ = op
        if kind is _ALLREDUCE:
            k = self.posted[sid]
            self.posted[sid] = k + 1
            group = self.gathered.setdefault((c, k), [])
            group.append((g, pc))
            if len(group) == len(self.low.members[c]):
                self._reduce(c, group)
            return
        send = kind is _SEND
        key = (c, g, peer, tg) if send else (c, peer, g, tg)
        q = self.unmatched.get(key)
        if not q or q[0][0] is send:
            if q is None:
                q = self.unmatched[key] = deque()
            q.append((send, g, pc))
            return
        _, og, oi = q.popleft()
        sg, si, rg, ri = (g, pc, og, oi) if send else (og, oi, g, pc)
        if self.progs[og][oi][2] != msg:
            raise self._mismatch(sg, si, rg, ri)
        self._complete(rg, ri, False)

    # -- running ------------------------------------------------------------------------
    def run(self) -> None:
        progs, pcs, dones, unsent, blocked, nccl = self.progs, self.pc, self.done, self.unsent, self.blocked, self.nccl
        queues, match, post = self.queues, self._match_nccl, self._post_gloo
        todo = self.todo = list(range(len(progs) - 1, -1, -1))
        while todo:
            g = todo.pop()
            prog, pc, done = progs[g], pcs[g], dones[g]
            while True:  # every program ends with its drain
                op = prog[pc]
                kind = op[0]
                if kind is _DRAIN:
                    if unsent[g]:
                        blocked[g] = -1
                    else:
                        pc += 1
                    break
                if kind is _SEND or not done[pc]:  # a send, or a receive or all-reduce not posted yet
                    if not nccl:
                        post(g, op, pc)  # a gloo send is done when posted
                    else:
                        unsent[g] += kind is _SEND
                        q = queues[op[6]]
                        q.append(pc)
                        if len(q) == 1 and (op[7] is None or queues[op[7]]):  # heads to match
                            match(g, op)
                    if kind is not _SEND and not done[pc]:
                        blocked[g] = pc  # woken (put back in todo) once it is done
                        break
                pc += 1
            pcs[g] = pc
        stuck = [g for g, pc in enumerate(pcs) if pc < len(progs[g])]
        if stuck:
            shown = [g for g in stuck if g < self.pp] or stuck  # replicas run the same lists
            why = "; ".join(self._stuck_words(g) for g in shown)
            raise self._fail(f"deadlock: {why}", {g % self.pp: progs[g][pcs[g]][1] for g in shown})
        for q in self.unmatched.values():
            if q:
                _, g, i = q[0]
                raise self._fail(f"rank {g} {self._act(g, progs[g][i][1])}'s {self._op_words(g, i)} is never "
                                 "received", {g % self.pp: progs[g][i][1]})

    # -- words --------------------------------------------------------------------------
    def _what(self, key: int) -> str:
        msg = _message(key, self.low.stages)
        made = next((a for acts in self.schedule.values() for a in acts if a.stage == msg.from_stage
                     and a.microbatch == msg.microbatch and (a.kind is Kind.F) == (msg.kind == "act")
                     and a.kind is not Kind.W), "?")
        return f"{made}'s {'activation' if msg.kind == 'act' else 'gradient'}"

    def _act(self, g: int, index: int) -> str:
        acts = self.schedule.get(g % self.pp, [])
        return str(acts[index]) if index < len(acts) else "at its end"

    def _op_words(self, g: int, i: int) -> str:
        kind, _, msg, _, _, peer, _, _ = self.progs[g][i]
        if kind is _SEND:
            return f"send of {self._what(msg)} to rank {peer}"
        if kind is _RECV:
            return f"receive of {self._what(msg)} from rank {peer}"
        return f"all-reduce of stage {msg}"

    def _fail(self, why: str, mark: dict[int, int]) -> P2PError:
        return P2PError(f"{why} ({self.rules})\n{format_grid(self.schedule, mark)}")

    def _stuck_words(self, g: int) -> str:
        """What rank g waits for and, under NCCL, what holds that op up."""
        prog, i = self.progs[g], self.pc[g]
        kind, index, msg, c, _, peer, sid, _ = prog[i]
        if kind is _DRAIN:
            i = next(i for i, o in enumerate(prog) if o[0] is _SEND and not self.done[g][i])
            return f"rank {g} at its end waits for its {self._op_words(g, i)}{self._held(g, i)}"
        at = self._act(g, index)
        if kind is _ALLREDUCE:
            posted = {r for r, _ in self.gathered.get((c, self.posted[sid] - 1), [])} if not self.nccl else {
                self.stream_rank[s] for s in self.low.streams[c] if self.queues[s]}
            missing = [r for r in self.low.members[c] if r not in posted]
            return f"rank {g} {at} waits for the all-reduce of stage {msg}, which rank(s) {missing} have not posted"
        return f"rank {g} {at} waits for {self._what(msg)} from rank {peer}{self._held(g, i)}"

    def _held(self, g: int, i: int) -> str:
        """Why op i of rank g has not completed: under gloo its sender has not sent it; under
        NCCL the head of its stream (it, or an op of its own before it) has not met its match."""
        peer = self.progs[g][i][5]
        if not self.nccl:
            return f", which rank {peer} has not sent"
        head = self.queues[self.progs[g][i][6]][0]
        behind = f", behind its own {self._op_words(g, head)}" if head != i else ""
        kind, _, _, _, _, peer, _, psid = self.progs[g][head]
        q = self.queues[psid]
        there = f" (rank {peer}'s stream there is at its {self._op_words(peer, q[0])})" if q else ""
        return f"{behind}, which rank {peer} has not {'received' if kind is _SEND else 'sent'}{there}"


def check(schedule: Schedule, transport: str, backend: str, pp: int, dp: int = 1, single_tag: bool = False,
          validated: bool = False) -> None:
    """None if `schedule` runs to the end lowered for `transport` under `backend`'s rules,
    with dp replicas; else P2PError (see the module docstring). Unless the caller says it
    `validated` the schedule already, a malformed one gets validate()'s ScheduleError first."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    if not validated:
        stages = max((a.stage for acts in schedule.values() for a in acts), default=-1) + 1
        mbs = max((a.microbatch for acts in schedule.values() for a in acts), default=-1) + 1
        validate(schedule, stages, mbs)
    low = _lower(schedule, transport, pp, dp, single_tag)
    _Checker(schedule, low, backend == "nccl", pp, _rules(backend, transport, single_tag)).run()
