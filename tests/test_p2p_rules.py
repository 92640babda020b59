"""Unit: lowering schedules to point-to-point programs and checking them under gloo's and
NCCL's matching rules (harness/schedules/p2p.py), and its CLI (pure, fast)."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.schedules import p2p
from harness.schedules.registry import built_in, build, chunks_per_rank, requirements
from harness.schedules.check import main as check_main
from harness.schedules.csv_io import write_csv
from harness.schedules.ir import Action
from harness.schedules.validate import ScheduleError, validate

# (name, v): every built-in, interleaved_1f1b with 2 and 3 chunks per rank
VARIANTS = [(name, 1) for name in built_in() if name != "interleaved_1f1b"] + [("interleaved_1f1b", 2),
                                                                             ("interleaved_1f1b", 3)]
# grid points (pp 2..8 x M 1..32) where eager on NCCL deadlocks, and how many points build.
# Only M=1 survives (one message each way per pair), and GPipe everywhere (every rank sends
# all its activations before it receives a gradient, and its peer receives them in that order).
EAGER_NCCL_DEADLOCKS = {
    ("gpipe", 1): (0, 224), ("1f1b", 1): (217, 224), ("zb_h1", 1): (217, 224), ("zb_h2", 1): (217, 224),
    ("zbv", 1): (217, 224),
    ("dualpipev", 1): (161, 161), ("interleaved_1f1b", 2): (124, 131), ("interleaved_1f1b", 3): (124, 131),
}


def acts(text: str) -> list[Action]:
    return [Action.parse(x) for x in text.split()]


@pytest.mark.grid
@pytest.mark.parametrize("name,v", VARIANTS)
def test_grid_safe_runs_everywhere_and_eager_deadlocks_on_nccl(name, v):
    """safe on NCCL (with one tag too) and eager on gloo run every point; eager on NCCL
    deadlocks where EAGER_NCCL_DEADLOCKS says (printed, so the counts are documented)."""
    dead = total = 0
    for n in range(2, 9):
        for m in range(1, 33):
            if requirements(name, n, m, v) is not None:
                continue
            total += 1
            schedule = build(name, n, m, v)
            validate(schedule, n * chunks_per_rank(name, v), m)  # once; each check below trusts it
            for dp in (1, 2):
                p2p.check(schedule, "safe", "nccl", n, dp, validated=True)
                p2p.check(schedule, "safe", "nccl", n, dp, single_tag=True, validated=True)
                p2p.check(schedule, "eager", "gloo", n, dp, validated=True)
            try:
                p2p.check(schedule, "eager", "nccl", n, validated=True)
            except p2p.P2PError as e:
                assert str(e).startswith("deadlock: "), (n, m, str(e).splitlines()[0])
                dead += 1
            else:
                assert m == 1 or name == "gpipe", (n, m)
    print(f"eager on nccl: {name} v={v}: {dead} of {total} points deadlock")
    assert (dead, total) == EAGER_NCCL_DEADLOCKS[(name, v)]


def test_eager_on_nccl_deadlocks_1f1b_with_grid():
    with pytest.raises(p2p.P2PError) as e:
        p2p.check(build("1f1b", 2, 2), "eager", "nccl", 2)
    first, *grid = str(e.value).splitlines()
    assert first.startswith("deadlock: rank 0 0B0 waits for 1B0's gradient from rank 1, behind its own send of "
                            "0F1's activation to rank 1, which rank 1 has not received (rank 1's stream there is at "
                            "its send of 1B0's gradient to rank 0); rank 1 1F1 waits for 0F1's activation")
    assert grid == ["rank 0:  0F0  0F1 [0B0] 0B1", "rank 1:  1F0  1B0 [1F1] 1B1"]


def test_dp_deadlock_marks_replica_zero_and_dp_runs_on_gloo():
    with pytest.raises(p2p.P2PError, match=r"^deadlock: rank 0 0B0 .*; rank 1 1F1 [^;]*\n") as e:
        p2p.check(build("1f1b", 2, 2), "eager", "nccl", 2, dp=2)
    assert "[0B0]" in str(e.value) and "rank 2" not in str(e.value)
    p2p.check(build("1f1b", 2, 2), "eager", "gloo", 2, dp=2)


def test_one_tag_on_a_v_schedule_mismatches_under_eager_not_safe():
    """zbv's rank 0 sends 0->1 activations and 3->2 gradients to rank 1: on one channel with
    one tag, rank 1's third receive (2I0's gradient) would take the third send, 0F2's."""
    zbv = build("zbv", 2, 4)
    with pytest.raises(p2p.P2PError) as e:
        p2p.check(zbv, "eager", "gloo", 2, single_tag=True)
    first, *grid = str(e.value).splitlines()
    assert first.startswith("mismatch: rank 1 2I0 would receive 0F2's activation (sent by rank 0 0F2) "
                            "instead of 3I0's gradient (gloo, transport=eager, one tag: ")
    assert "[0F2]" in grid[0] and "[2I0]" in grid[1]
    p2p.check(zbv, "safe", "gloo", 2, single_tag=True)
    p2p.check(zbv, "eager", "gloo", 2)  # unique tags: gloo sorts it out


def test_hand_made_order_gloo_runs_and_nccl_deadlocks_on():
    """Rank 1 returns 1B0 before taking 0F2: gloo buffers the send, NCCL's pair stream holds it
    behind rank 0's send of 0F2 facing it."""
    schedule = {0: acts("0F0 0F1 0F2 0B0 0B1 0B2"), 1: acts("1F0 1F1 1B0 1F2 1B1 1B2")}
    p2p.check(schedule, "eager", "gloo", 2)
    p2p.check(schedule, "safe", "nccl", 2)
    with pytest.raises(p2p.P2PError) as e:
        p2p.check(schedule, "eager", "nccl", 2)
    first, *grid = str(e.value).splitlines()
    assert first.startswith("deadlock: rank 0 0B0 waits for 1B0's gradient from rank 1, behind its own send of "
                            "0F2's activation to rank 1")
    assert grid == ["rank 0:  0F0  0F1  0F2 [0B0] 0B1  0B2", "rank 1:  1F0  1F1  1B0 [1F2] 1B1  1B2"]


def test_nccl_matches_by_order_so_an_edge_must_be_consumed_in_sending_order():
    """Tags cannot reorder NCCL: stage 1 taking microbatch 1 first gets 0F0's activation."""
    schedule = {0: acts("0F0 0F1 0B0 0B1"), 1: acts("1F1 1F0 1B0 1B1")}
    p2p.check(schedule, "eager", "gloo", 2)
    with pytest.raises(p2p.P2PError, match=r"^mismatch: rank 1 1F1 would receive 0F0's activation \(sent by rank "
                                           r"0 0F0\) instead of 0F1's activation \(nccl, transport=safe"):
        p2p.check(schedule, "safe", "nccl", 2)
    with pytest.raises(p2p.P2PError, match="^mismatch: "):
        p2p.check(schedule, "safe", "gloo", 2, single_tag=True)


def test_malformed_schedule_gets_the_validators_message():
    with pytest.raises(ScheduleError, match="^invalid schedule: 1B0 comes before its 1F0"):
        p2p.check({0: acts("0F0 0B0"), 1: acts("1B0 1F0")}, "safe", "nccl", 2)
    with pytest.raises(ValueError, match="transport='tcp'"):
        p2p.check(build("1f1b", 2, 2), "tcp", "nccl", 2)
    with pytest.raises(ValueError, match="backend='mpi'"):
        p2p.check(build("1f1b", 2, 2), "safe", "mpi", 2)


def test_lower_1f1b_program_order():
    prog = p2p.lower(build("1f1b", 2, 2), "eager", 2)
    assert [(op.kind, op.index) for op in prog[0]] == [
        ("compute", 0), ("send", 0), ("compute", 1), ("send", 1), ("recv", 2), ("wait", 2), ("compute", 2),
        ("recv", 3), ("wait", 3), ("compute", 3), ("drain", 4)]
    assert [(op.kind, op.index) for op in prog[1]] == [
        ("recv", 0), ("wait", 0), ("compute", 0), ("compute", 1), ("send", 1),  # 1F0: last stage; 1B0
        ("recv", 2), ("wait", 2), ("compute", 2), ("compute", 3), ("send", 3), ("drain", 4)]
    send = prog[0][1]
    assert send.msg == p2p.Message(0, 1, "act", 0) and send.peer == 1 and send.tag == 0
    assert send.channel == p2p.channel("eager", 0, 0, 1, {0: 0, 1: 1}, 2) == ("world", frozenset({0, 1}))


def test_lower_dp_all_reduces_after_each_stages_last_backward():
    prog = p2p.lower(build("interleaved_1f1b", 2, 2, 2), "safe", 2, dp=2)
    sched = build("interleaved_1f1b", 2, 2, 2)
    for g, ops in prog.items():
        acts_ = sched[g % 2]
        reduced = [(op.index, op.channel) for op in ops if op.kind == "allreduce"]
        last = {a.stage: i for i, a in enumerate(acts_) if a.kind.value == "B"}
        assert reduced == sorted((i, ("dp", g % 2)) for i in last.values())
        for op in ops:
            if op.kind == "allreduce":
                assert ops[ops.index(op) + 1] == p2p.Op("wait", op.index, channel=op.channel)


def test_channels_counts_order_and_tags():
    zbv = build("zbv", 2, 4)
    edges = [key for key, _ in p2p.channels(zbv, "safe", 2)]
    assert edges == [("edge", 0, 0, 1), ("edge", 0, 1, 0), ("edge", 0, 2, 3), ("edge", 0, 3, 2)]
    assert [key for key, _ in p2p.channels(zbv, "eager", 2)] == [("world", frozenset({0, 1}))]
    every = p2p.channels(build("interleaved_1f1b", 4, 8, 3), "safe", 4, dp=2)
    assert every == p2p.channels(build("interleaved_1f1b", 4, 8, 3), "safe", 4, dp=2)
    kinds = Counter(key[0] for key, _ in every)
    assert kinds == {"edge": 2 * 2 * (12 - 1), "dp": 4}
    assert [key for key, _ in every] == sorted((key for key, _ in every), key=lambda k: (k[0] == "dp", k[1:]))
    mine = p2p.rank_channels(build("interleaved_1f1b", 4, 8, 3), "safe", 4, dp=2)
    order = [key for key, _ in every]
    for g, keys in mine.items():
        assert keys == [key for key, ranks in every if g in ranks]
        assert keys == sorted(keys, key=order.index)
    for single in (False, True):
        sends, recvs = Counter(), Counter()
        for g, ops in p2p.lower(build("interleaved_1f1b", 4, 8, 3), "safe", 4, dp=2, single_tag=single).items():
            for op in ops:
                if op.kind in ("send", "recv"):
                    replica = g // 4
                    src, dst = (g, op.peer) if op.kind == "send" else (op.peer, g)
                    (sends if op.kind == "send" else recvs)[(replica, op.msg, op.channel, op.tag, src, dst)] += 1
        assert sends == recvs and set(sends.values()) == {1}  # every send meets exactly one receive
        tags = Counter((r, t) for r, _, _, t, _, _ in sends)
        if single:
            assert {t for _, t in tags} == {0}
        else:
            assert set(tags.values()) == {1}
            for r, msg, _, t, _, _ in sends:
                assert t == p2p.tag(msg.from_stage, msg.to_stage, msg.microbatch, 12)


def test_cli(tmp_path, capsys):
    assert check_main(["--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--p2p", "safe",
                       "--backend", "nccl"]) == 0
    assert capsys.readouterr().out.startswith("ok: 1f1b pp=2 M=2 dp=1 runs under nccl with p2p=safe")
    assert check_main(["--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--p2p", "eager",
                       "--backend", "nccl"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("deadlock: rank 0 0B0") and out[1:] == ["rank 0:  0F0  0F1 [0B0] 0B1",
                                                                     "rank 1:  1F0  1B0 [1F1] 1B1"]
    path = tmp_path / "zbv.csv"
    write_csv(path, build("zbv", 2, 4))
    assert check_main(["--csv", str(path), "--p2p", "eager", "--backend", "gloo", "--single-tag"]) == 1
    assert capsys.readouterr().out.startswith("mismatch: rank 1 2I0")
    assert check_main(["--csv", str(path), "--p2p", "safe", "--backend", "gloo", "--single-tag"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {path} pp=2 dp=1")
    for bad in (["--schedule", "1f1b", "--pp", "2"], ["--schedule", "zb_h9", "--pp", "2", "--microbatches", "2"],
                ["--csv", str(tmp_path / "missing.csv")], ["--csv", str(path), "--pp", "1"],
                ["--schedule", "dualpipev", "--pp", "4", "--microbatches", "7"], [],
                ["--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--backend", "mpi"]):
        assert check_main(bad) == 2, bad
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1, bad


def test_plan_refuses_a_transport_that_would_deadlock_or_mismatch(config):
    """Validation models the transport a run uses, before any worker: eager on NCCL (a GPU per
    rank) deadlocks 1F1B; eager with one tag mixes up zbv's messages on gloo; safe is chosen
    by default on NCCL and runs."""
    from harness.config import ConfigError
    from harness.planning.plan import make_plan

    with pytest.raises(ConfigError) as err:
        make_plan(config(pp=2, microbatches=2, device="cuda", p2p="eager"), cuda_devices=2)
    assert str(err.value).startswith("p2p=eager on nccl: deadlock: ") and "\n" not in str(err.value)
    assert "[" in err.value.detail  # the grid, the stuck steps marked
    with pytest.raises(ConfigError, match="^p2p=eager on gloo: mismatch: "):
        make_plan(config(pp=2, microbatches=4, p2p="eager", p2p_single_tag=True, **{"schedule.name": "zbv"}))
    plan = make_plan(config(pp=2, microbatches=4, device="cuda"), cuda_devices=2)
    assert (plan.backend, plan.p2p) == ("nccl", "safe")
    shared = make_plan(config(pp=2, microbatches=4, device="cuda"), cuda_devices=1)
    assert (shared.backend, shared.p2p) == ("gloo", "eager")  # two ranks on one GPU: through host memory
