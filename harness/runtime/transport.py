"""Point-to-point transports: how a message between two stages travels, in one place.

Every message a rank exchanges goes through `Transport.send` (never blocks), `recv` (blocks
until the tensor is here) and `drain` (waits for every send, at the end of the step), in
the order harness.schedules.p2p.lower writes; the validator checks that order under the
backend's rules, so "valid" means "runs". On gloo the runner also posts every receive of the
step at its start (`post`), in consumer order: gloo moves a message only once its receive is
posted, so each transfer starts as soon as its send does, and no receive is posted mid-step
(posting takes gloo's pair lock, which a transfer in flight holds); on NCCL it does not (a
receive queued on a pair's stream ahead of a send changes the order the validator checked).

- LocalHandoff: the neighbouring stage lives on this rank (V placement's turn, a rank's
  interleaved chunks): the tensor is handed over in memory.
- GroupTransport, `p2p=eager`: tagged isend/irecv on the world group. gloo matches by tag,
  so any valid order runs; NCCL ignores tags and runs a rank pair's sends and receives on
  one stream, where a large send holds the stream until the peer receives it: most
  schedules deadlock there (the validator shows where). On gloo, a message to a lower rank
  travels on a second world group (`DOWNWARD`), so each rank pair's connection carries data
  one way: two ranks of one pair sending to each other at once stalled one send or both for
  1-5 ms in 10-25% of cases (a two-process probe; none with the directions apart). The
  matching is unchanged: gloo matches per source and destination, which fix the direction.
- GroupTransport, `p2p=safe`: one process group per directed stage edge, so each edge has
  its own communicator, stream and FIFO; with every stage's microbatches in order, the k-th
  send of an edge is the k-th receive, and a send can only wait for its own receive.
  `p2p_single_tag=true` sends every message with tag 0, so gloo too matches in FIFO order
  (NCCL's rule), which the tests run to prove the FIFO matching without a GPU.
- Routes: picks local or group per message, so the runner never asks where a stage lives.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.distributed as dist

from harness.schedules import p2p
from harness.schedules.ir import Action, stage_to_rank
from harness.runtime.tracer import Tracer
from harness.measure.trace import COMM, WAIT

Message = p2p.Message


class Transport(Protocol):
    def send(self, msg: Message, tensor: torch.Tensor, producer: Action) -> None: ...

    def recv(self, msg: Message, consumer: Action) -> torch.Tensor: ...

    def drain(self) -> None: ...


class LocalHandoff:
    def __init__(self) -> None:
        self.held: dict[Message, torch.Tensor] = {}

    def send(self, msg: Message, tensor: torch.Tensor, producer: Action) -> None:
        self.held[msg] = tensor

    def recv(self, msg: Message, consumer: Action) -> torch.Tensor:
        return self.held.pop(msg)

    def drain(self) -> None:
        pass


class GroupTransport:
    """isend / irecv over process groups: `groups` maps a p2p.channel key to its group (a
    missing key: the world group). Receives land in a fresh buffer of the activation's
    shape and dtype. gloo cannot move CUDA tensors: with device cuda on gloo (ranks sharing
    a GPU), tensors travel through host memory."""

    def __init__(self, transport: str, replica: int, pp: int, owner: dict[int, int], groups: dict,
                 shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, tracer: Tracer,
                 single_tag: bool = False, backend: str = "gloo", tp: int = 1, tp_rank: int = 0):
        self.transport, self.replica, self.pp, self.owner = transport, replica, pp, owner
        self.tp, self.tp_rank = tp, tp_rank  # a message goes to the same tp rank of the peer stage
        self.groups, self.shape, self.dtype, self.device = groups, shape, dtype, device
        self.tracer, self.single_tag = tracer, single_tag
        self.stages = max(owner) + 1
        self.via_host = backend == "gloo" and device.type == "cuda"
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []  # each tensor must outlive its send
        self.routes: dict[Message, tuple[dist.ProcessGroup | None, int, int]] = {}  # the same every step
        # receives posted ahead of their consumer (`post`): gloo only. On NCCL a pair's receives and
        # sends share one stream, and a receive queued ahead of this rank's next send could wait
        # on a send that waits on it (the validator checks the order the runner posts without it)
        self.ahead = backend == "gloo"
        self.posted: dict[Message, tuple[dist.Work, torch.Tensor]] = {}
        # gloo between processes of one host: when the receive is posted, isend writes to the
        # loopback socket at once, and the kernel may leave delivering it to this core's
        # softirq thread, which then waits until this rank's next action stops computing (a
        # 1F1B hop measured 0.39 ms, 0.12 ms without the compute behind it). Yielding the core
        # after the send lets the delivery run first: the hop measured 0.19 ms (a yield with
        # nothing else to run returns at once, as across hosts)
        self.yield_after_send = backend == "gloo" and device.type == "cpu"

    def _route(self, msg: Message, peer_stage: int) -> tuple[dist.ProcessGroup | None, int, int]:
        route = self.routes.get(msg)
        if route is None:
            key = p2p.channel(self.transport, self.replica, msg.from_stage, msg.to_stage, self.owner, self.pp)
            if DOWNWARD in self.groups and downward(self.owner, msg):
                key = DOWNWARD
            route = self.routes[msg] = (
                self.groups.get(key), (self.replica * self.pp + self.owner[peer_stage]) * self.tp + self.tp_rank,
                p2p.tag(msg.from_stage, msg.to_stage, msg.microbatch, self.stages, self.single_tag))
        return route

    def send(self, msg: Message, tensor: torch.Tensor, producer: Action) -> None:
        t0 = self.tracer.mark()
        group, peer, tag = self._route(msg, msg.to_stage)
        tensor = (tensor.cpu() if self.via_host else tensor).contiguous()
        self.sends.append((dist.isend(tensor, dst=peer, group=group, tag=tag), tensor))
        if self.yield_after_send:
            os.sched_yield()
        self.tracer.record(f"send {producer}", COMM, "send", producer.stage, producer.microbatch, t0)

    def _irecv(self, msg: Message) -> tuple[dist.Work, torch.Tensor]:
        group, peer, tag = self._route(msg, msg.from_stage)
        buf = torch.empty(self.shape, dtype=self.dtype, device="cpu" if self.via_host else self.device)
        return dist.irecv(buf, src=peer, group=group, tag=tag), buf

    def post(self, msg: Message) -> None:
        """Posts `msg`'s receive now, so its transfer starts once its send does (gloo's
        transfer starts once both ends have posted); `recv` then only waits. Posting in the
        order the consumers run keeps each pair's (and each edge's) FIFO order."""
        if self.ahead and msg not in self.posted:
            self.posted[msg] = self._irecv(msg)

    def recv(self, msg: Message, consumer: Action) -> torch.Tensor:
        posted = self.posted.pop(msg, None)
        t0 = self.tracer.mark()  # the event: how long the consumer waited for its tensor
        work, buf = posted if posted is not None else self._irecv(msg)
        work.wait()
        self.tracer.record(f"recv {consumer}", WAIT, "recv", consumer.stage, consumer.microbatch, t0)
        return buf.to(self.device) if self.via_host else buf

    def drain(self) -> None:
        t0 = self.tracer.mark()
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()
        self.tracer.record("send wait", WAIT, "send", -1, -1, t0)


class Routes:
    """The rank's one Transport: a message to or from a stage on this rank is handed over
    locally, any other goes over the group transport."""

    def __init__(self, owner: dict[int, int], pipeline_rank: int, net: GroupTransport):
        self.owner, self.prank, self.local, self.net = owner, pipeline_rank, LocalHandoff(), net

    def _via(self, msg: Message) -> Transport:
        local = self.owner[msg.from_stage] == self.owner[msg.to_stage] == self.prank
        return self.local if local else self.net

    def send(self, msg: Message, tensor: torch.Tensor, producer: Action) -> None:
        self._via(msg).send(msg, tensor.detach(), producer)

    def recv(self, msg: Message, consumer: Action) -> torch.Tensor:
        return self._via(msg).recv(msg, consumer)

    def post(self, msg: Message | None) -> None:
        """A receive from another rank posted ahead (GroupTransport.post); else nothing."""
        if msg is not None and self._via(msg) is self.net:
            self.net.post(msg)

    def drain(self) -> None:
        self.net.drain()


DOWNWARD = "downward"  # eager on gloo: the group of every message to a lower rank


def downward(owner: dict[int, int], msg: Message) -> bool:
    """Whether `msg` goes to a lower rank: eager on gloo sends it on the DOWNWARD group."""
    return owner[msg.to_stage] < owner[msg.from_stage]


def message_groups(transport: str, backend: str, schedule: dict, pp: int, dp: int, rank: int,
                   device: torch.device, tp: int = 1) -> dict:
    """The groups messages travel on besides the world group, by channel key (GroupTransport's
    `groups`): safe's edge groups; eager on gloo, the downward world group (the module's
    docstring says why); none for eager on NCCL, whose channel is the rank pair, or at pp=1."""
    if transport == "safe":
        return edge_groups(schedule, pp, dp, rank, device, tp)
    if backend == "gloo" and pp > 1:
        return {DOWNWARD: dist.new_group(list(range(dist.get_world_size())))}
    return {}


def edge_groups(schedule: dict, pp: int, dp: int, rank: int, device: torch.device, tp: int = 1) -> dict:
    """p2p=safe: one process group per directed stage edge (and tp rank: each tp rank of a
    stage talks to the same tp rank of the next), in p2p.channels' order (new_group
    is collective: every rank creates every group), then one small exchange on each edge in
    that same order, so every communicator exists before the schedule's first message (NCCL
    creates a pair's communicator on first use, blocking both ends: a rendezvous the
    schedule's order does not have). Sequential in one global order, the exchanges cannot
    deadlock. Returns this rank's groups by channel key."""
    owner = stage_to_rank(schedule)
    edges = [(key, members) for key, members in p2p.channels(schedule, "safe", pp, dp) if key[0] == "edge"]
    mine = {}
    for key, members in edges:
        for t in range(tp):  # members are pipeline-level ranks (replica * pp + pipeline rank)
            group = dist.new_group([m * tp + t for m in members])
            if rank in (m * tp + t for m in members):
                mine[key] = group
    ping = torch.zeros(1, device=device)
    t = rank % tp
    for key, _ in edges:
        if key in mine:
            _, replica, frm, to = key
            src, dst = (replica * pp + owner[frm]) * tp + t, (replica * pp + owner[to]) * tp + t
            if rank == src:
                dist.send(ping, dst=dst, group=mine[key])
            else:
                dist.recv(ping, src=src, group=mine[key])
    return mine
