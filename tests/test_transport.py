"""The group a message travels on (GroupTransport's routing), without a process group: the
groups are stand-ins, only their choice is checked."""

from __future__ import annotations

import torch

from harness.runtime.clock import HostClock
from harness.runtime.tracer import Tracer
from harness.runtime.transport import DOWNWARD, GroupTransport, Message


def _transport(transport: str, owner: dict[int, int], groups: dict) -> GroupTransport:
    return GroupTransport(transport, 0, max(owner.values()) + 1, owner, groups, (2, 4), torch.float32,
                          torch.device("cpu"), Tracer(HostClock()))


def test_eager_on_gloo_carries_each_direction_of_a_rank_pair_on_its_own_group():
    # V placement: stages 0-3 down the ranks 0..3, stages 4-7 back up (stage 4 on rank 3)
    owner = {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2, 6: 1, 7: 0}
    down = object()
    net = _transport("eager", owner, {DOWNWARD: down})
    group = lambda frm, to, kind: net._route(Message(frm, to, kind, 0), to)[0]
    assert group(0, 1, "act") is None  # rank 0 -> 1: the world group
    assert group(1, 0, "grad") is down  # rank 1 -> 0
    assert group(4, 5, "act") is down  # rank 3 -> 2: an activation going down the ranks
    assert group(5, 4, "grad") is None  # rank 2 -> 3
    # the receiver routes the same message the same way (a send and its receive meet)
    assert net._route(Message(4, 5, "act", 3), 4)[0] is down


def test_without_the_downward_group_every_eager_message_is_on_the_world_group():
    net = _transport("eager", {0: 0, 1: 1}, {})  # NCCL: the channel is the rank pair
    assert net._route(Message(1, 0, "grad", 0), 0)[0] is None
