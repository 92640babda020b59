"""trace.json against the trace-event format (Chrome's "Trace Event Format", what Perfetto and
chrome://tracing load): `check_trace` is a schema check written from that format and from what
Perfetto's JSON importer does with it (it drops events before ts 0, rounds us to whole ns, sorts
events of one start with E first, then X longest first, then the rest in file order, and binds
a flow end to the slice open on its track). No trace processor here: Perfetto's Python package
downloads its binary at run time, which this machine cannot. Then what write_trace_json draws
beyond the actions: a slice per rank and step, a flow per message between ranks, the
wall-clock time of step 0, each step's peak activation bytes."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.measure.execution import RankReport
from harness.measure.trace_json import _flow_times, messages, peaks_per_step, read_trace, read_trace_meta, wall_clock_origin, write_trace_json
from harness.schedules.registry import build
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate
from harness.measure.trace import COMPUTE, Event

METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
PHASES = set("BEXiIC") | set("bne") | set("stf") | set("PONDM") | {"R"}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ns(us: float) -> int:
    """A timestamp in us as Perfetto's importer takes it: whole ns, rounded."""
    return int(us) * 1000 if us == int(us) else round(us * 1000)


def _whole_ns(us: float) -> bool:
    """Written as a whole number of ns (three decimals of us): no reader rounds it anywhere else."""
    return abs(us * 1000 - round(us * 1000)) <= 1e-3  # float's error at 1e12 ns: 1e-4 ns


def check_trace(data: dict) -> dict:
    """Assert `data` is a trace a viewer loads as written; returns what it found: `slices`
    {(pid, tid): [(begin ns, end ns, name, event)]} (X and B/E alike), `flows` {id: (s, f)},
    `bound` {id: (the slice s binds to, the slice f binds to)}, `steps` {(pid, tid, step):
    (begin, end) in us}."""
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list), "an object with traceEvents"
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    assert isinstance(data.get("otherData", {}), dict) and isinstance(data.get("metadata", {}), dict)
    slices: dict = {}
    open_: dict = {}  # (pid, tid) -> stack of B events
    be: list = []
    flows: dict = {}
    for i, e in enumerate(data["traceEvents"]):
        where = f"event {i} {e!r:.200}"
        assert isinstance(e, dict) and isinstance(e.get("ph"), str) and e["ph"] in PHASES, where
        ph = e["ph"]
        if ph == "M":  # metadata: names a process or a thread, no timestamp
            assert e.get("name") in METADATA and isinstance(e.get("pid"), int), where
            assert isinstance(e.get("args"), dict), where
            if e["name"].startswith("thread_"):
                assert isinstance(e.get("tid"), int), where
            if e["name"].endswith("_name"):
                assert isinstance(e["args"].get("name"), str), where
            continue
        for k in ("ts", "pid", "tid"):
            assert k in e, f"{where}: no {k}"
        assert _number(e["ts"]) and e["ts"] >= 0, f"{where}: ts a finite number >= 0 (Perfetto drops ts < 0)"
        assert _whole_ns(e["ts"]) and (ph != "X" or _whole_ns(e.get("dur", 0))), f"{where}: not whole ns"
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["pid"] >= 0 and e["tid"] >= 0, where
        track = (e["pid"], e["tid"])
        if ph in ("X", "B", "s", "f", "C", "i", "I"):
            assert isinstance(e.get("name"), str), f"{where}: no name"
        if "args" in e:
            assert isinstance(e["args"], dict), where
        if ph == "X":
            assert _number(e.get("dur")) and e["dur"] >= 0, f"{where}: X needs a finite dur >= 0"
            slices.setdefault(track, []).append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["name"], e))
        elif ph == "C":
            assert e["args"] and all(_number(v) for v in e["args"].values()), f"{where}: counters are numbers"
        elif ph in ("B", "E"):
            be.append((e["ts"], 0 if ph == "E" else 1, i, track, e))
        elif ph in ("s", "f"):
            assert isinstance(e.get("id"), (int, str)) and not isinstance(e.get("id"), bool), f"{where}: a flow id"
            assert isinstance(e.get("cat"), str), f"{where}: a flow's cat (its id is matched within cat and name)"
            if ph == "f":
                assert e.get("bp") == "e", f"{where}: binds to the enclosing slice"
            pair = flows.setdefault(e["id"], {})
            assert ph not in pair, f"{where}: id {e['id']} has two {ph!r} events (ids are unique per pair)"
            pair[ph] = e
    # B/E: in time order (E first at one ts, as a viewer sorts), matched per track by name
    for ts, _, i, track, e in sorted(be, key=lambda x: x[:3]):
        stack = open_.setdefault(track, [])
        if e["ph"] == "B":
            stack.append(e)
            continue
        assert stack, f"E {e!r:.200} closes nothing"
        b = stack.pop()
        assert b["name"] == e.get("name", b["name"]) and b.get("cat") == e.get("cat", b.get("cat")), (b, e)
        slices.setdefault(track, []).append((_ns(b["ts"]), _ns(e["ts"]), b["name"], b))
    assert not [s for s in open_.values() if s], f"B without E: {[s for s in open_.values() if s]}"

    # slices of a track nest (or follow each other), as Perfetto puts them on one track; a B
    # must begin strictly before an X of the same start (X sorts first at one start)
    for track, ss in slices.items():
        ss.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list = []
        for s in ss:
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert s[1] <= parent[1], f"{track}: {s[2]} [{s[0]}, {s[1]}] overlaps {parent[2]} [{parent[0]}, {parent[1]}]"
                if parent[3]["ph"] == "B":
                    assert parent[0] < s[0], f"{track}: B {parent[2]} at {parent[0]} ns, not before {s[2]}"
            stack.append(s)

    # flows: one s and one f per id, same cat and name, each inside a slice on its track
    bound = {}
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid}: {sorted(pair)} (an s and an f per id)"
        s, f = pair["s"], pair["f"]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]), f"flow {fid}: cat and name differ"
        assert _ns(f["ts"]) >= _ns(s["ts"]), f"flow {fid}: points backwards in time ({s['ts']} -> {f['ts']} us)"

        def enclosing(e: dict):
            t = _ns(e["ts"])
            inside = [x for x in slices.get((e["pid"], e["tid"]), []) if x[0] < t < x[1] and x[3].get("cat") != "step"]
            assert inside, f"flow {fid}: {e['ph']} at {e['ts']} us binds to no slice on its track"
            return min(inside, key=lambda x: x[1] - x[0])  # the innermost

        bound[fid] = (enclosing(s), enclosing(f))

    # a step slice per (track, step) with actions, enclosing exactly them (within the pad)
    steps = {}
    for track, ss in slices.items():
        for b, e, name, ev in ss:
            if ev.get("cat") == "step":
                assert re.fullmatch(r"step \d+", name) and ev["args"]["step"] == int(name[5:]), ev
                assert (*track, ev["args"]["step"]) not in steps, f"{track}: two slices of {name}"
                steps[(*track, ev["args"]["step"])] = (b, e)
    actions: dict = {}
    for track, ss in slices.items():
        for b, e, _, ev in ss:
            if ev["ph"] == "X" and ev.get("cat") != "step" and "step" in ev.get("args", {}):
                key = (*track, ev["args"]["step"])
                lo, hi = actions.get(key, (b, e))
                actions[key] = (min(lo, b), max(hi, e))
    if steps:
        assert steps.keys() == actions.keys(), "a step slice per rank and step with events"
        for key, (b, e) in steps.items():
            lo, hi = actions[key]
            assert b <= lo and e >= hi, f"step slice {key} [{b}, {e}] does not enclose [{lo}, {hi}]"
            assert lo - b <= 2 and e - hi <= 2, f"step slice {key} [{b}, {e}] wider than its events [{lo}, {hi}]"
    return {"slices": slices, "flows": {k: (v["s"], v["f"]) for k, v in flows.items()}, "bound": bound,
            "steps": steps}


def _with_comm(steps: int = 2, pp: int = 2, m: int = 4, dp: int = 1, send_grads: bool = False) -> list[Event]:
    """1F1B as the native executor traces it (the simulator with send and receive costs: one
    thing at a time on a rank): a recv wait before each action with an input from another rank,
    a send after each F (after each B too with send_grads; else the gradient's flow starts at the
    B itself), dp replicas of the same pipeline, steps apart."""
    one = [e for e in simulate(build("1f1b", pp, m), replace(CostModel.uniform(pp), send_s=0.05, recv_s=0.02))
           if send_grads or not (e.kind == "send" and "B" in e.name)]
    span = max(e.end for e in one) + 0.01
    out = []
    for s in range(steps):
        for d in range(dp):
            o = s * span + d * 1e-4
            out += [Event(d * pp + e.rank, s, e.name, e.cat, e.kind, e.stage, e.microbatch, e.start + o, e.end + o)
                    for e in one]
            end = max(e.end for e in one) + o
            for r in range(d * pp, (d + 1) * pp):
                out.append(Event(r, s, "optim", COMPUTE, "optim", -1, -1, end, end + 0.002))
    return out


def _action_spans(found: dict) -> dict:
    """(pid, tid, step) -> (first start, last end) in ns of its actions (step slices left out)."""
    out: dict = {}
    for track, ss in found["slices"].items():
        for b, e, _, ev in ss:
            if ev.get("cat") != "step":
                key = (*track, ev["args"]["step"])
                lo, hi = out.get(key, (b, e))
                out[key] = (min(lo, b), max(hi, e))
    return out


def _write(tmp_path: Path, trace, memory=(), **kw) -> tuple[dict, dict]:
    path = tmp_path / "trace.json"
    cap = write_trace_json(path, trace, memory, **kw)
    data = json.loads(path.read_text())
    return cap, data


def test_flows_link_each_send_to_its_consumer_and_step_slices_enclose_each_rank_step(tmp_path):
    pp, m, dp, steps = 2, 4, 2, 2
    trace = _with_comm(steps, pp, m, dp)
    _, data = _write(tmp_path, trace, pp=pp)
    found = check_trace(data)
    # per step and replica: M activations 0 -> 1 and M gradients 1 -> 0
    assert len(found["flows"]) == steps * dp * 2 * m == data["otherData"]["flows"]
    for fid, (src, dst) in found["bound"].items():
        s_ev, f_ev = src[3], dst[3]
        assert s_ev["args"]["step"] == f_ev["args"]["step"] and s_ev["pid"] == f_ev["pid"]  # one replica, one step
        assert f_ev["cat"] == "compute" and s_ev["tid"] != f_ev["tid"]
        mb = f_ev["args"]["microbatch"]
        if f_ev["args"]["kind"] == "F":  # an activation: from the send after the F of the stage before
            assert s_ev["name"] == f"send {f_ev['args']['stage'] - 1}F{mb}" and s_ev["cat"] == "comm"
            assert found["flows"][fid][0]["name"] == f"activation {f_ev['args']['stage'] - 1}F{mb}"
        else:  # a gradient: no send traced, so from the B of the stage after
            assert f_ev["args"]["kind"] == "B" and s_ev["name"] == f"{f_ev['args']['stage'] + 1}B{mb}"
            assert found["flows"][fid][0]["name"] == f"gradient {f_ev['args']['stage'] + 1}B{mb}"
    assert sorted(found["steps"]) == sorted({(r // pp, r, s) for r in range(pp * dp) for s in range(steps)})
    # step slices span their events exactly, in whole ns
    assert all(e["ph"] == "X" for e in data["traceEvents"] if e.get("cat") == "step")
    assert all(found["steps"][k] == (lo, hi) for k, (lo, hi) in _action_spans(found).items())
    # the actions read back as before: step slices and flows are not events of the run
    back = read_trace(tmp_path / "trace.json")
    assert [(e.rank, e.step, e.name) for e in back] == [(e.rank, e.step, e.name) for e in trace]


def test_sends_of_both_directions_and_v_shape_local_hand_offs(tmp_path):
    # gradients sent too: every flow starts at a send
    trace = _with_comm(1, 3, 4, send_grads=True)
    found = check_trace(_write(tmp_path, trace, pp=3)[1])
    assert len(found["flows"]) == 2 * 4 * 2  # 2 boundaries x 4 microbatches x both directions
    assert all(src[3]["name"].startswith("send ") for src, _ in found["bound"].values())

    # executor=sim with send and receive costs: sends traced by the simulator; the V's turn
    # (stage 1 -> 2 on rank 1) is a hand-off on one rank, no message
    cost = replace(CostModel.uniform(4), send_s=0.05, recv_s=0.02)
    trace = simulate(build("zbv", 2, 4, 2), cost, step=3)
    data = _write(tmp_path, trace, pp=2)[1]
    found = check_trace(data)
    rank = {e.stage: e.rank for e in trace if e.stage >= 0}
    expected = sum(1 for e in trace if e.cat == COMPUTE and (
        (e.kind == "F" and e.stage > 0 and rank[e.stage - 1] != e.rank)
        or (e.kind in "BI" and e.stage < 3 and rank[e.stage + 1] != e.rank)))
    assert expected == 4 * 4 and len(found["flows"]) == expected
    assert not any(dst[3]["name"].startswith("2F") for _, dst in found["bound"].values())  # 1F -> 2F is local

    # executor=sim without communication costs: no send events, the flows join the actions
    plain = simulate(build("interleaved_1f1b", 2, 4, 2), CostModel.uniform(4))
    found = check_trace(_write(tmp_path, plain, pp=2)[1])
    assert len(found["flows"]) == len(messages(plain, 2)) == 3 * 4 * 2  # every boundary crosses ranks
    assert all(src[3]["cat"] == "compute" for src, _ in found["bound"].values())


def test_a_capped_trace_keeps_only_whole_flows(tmp_path):
    trace = _with_comm(3, 2, 4)
    _, data = _write(tmp_path, trace, pp=2, max_events=15)  # the last step alone, cut short
    found = check_trace(data)
    assert data["otherData"]["trace_cap"]["truncated_step"] == 2
    kept = {(e["tid"], e["name"]) for e in data["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"}
    for src, dst in found["bound"].values():
        assert (src[3]["tid"], src[3]["name"]) in kept and (dst[3]["tid"], dst[3]["name"]) in kept


def test_wall_clock_of_step_0_from_an_anchor_or_estimated_at_write(tmp_path):
    trace = [replace(e, start=e.start + 0.25, end=e.end + 0.25) for e in _with_comm(2, 2, 2)]
    step0 = min(e.start for e in trace if e.step == 0)
    _, data = _write(tmp_path, trace, pp=2, origin_wall_s=1_700_000_000.5)
    other, meta = data["otherData"], data["metadata"]
    assert meta == {k: other[k] for k in ("ts_origin_wall_clock", "step0_wall_clock", "wall_clock_source")}
    assert datetime.fromisoformat(other["ts_origin_wall_clock"]).timestamp() == pytest.approx(1_700_000_000.5, abs=1e-6)
    assert datetime.fromisoformat(other["step0_wall_clock"]).timestamp() == pytest.approx(
        1_700_000_000.5 + step0, abs=1e-6)
    assert other["wall_clock_source"].startswith("anchor")

    before = time.time()
    _, data = _write(tmp_path, trace, pp=2)  # no anchor: the write time less the trace's span
    got = datetime.fromisoformat(data["otherData"]["step0_wall_clock"]).timestamp()
    span = max(e.end for e in trace) - step0
    assert before - span - 0.01 <= got <= time.time() - span + 0.01
    assert data["otherData"]["wall_clock_source"].startswith("estimated")

    # the anchor from the ranks' raw monotonic ns (what from_reports puts at 0), read here
    wall, now = time.time(), time.perf_counter_ns()  # read together: a busy machine's pause after them moves neither
    reports = [RankReport(0, [(0, "0F0", COMPUTE, "F", 0, 0, now - 2_000_000_000, now - 1_000_000_000)], None),
               RankReport(1, [(0, "1F0", COMPUTE, "F", 1, 0, now - 1_500_000_000, now)], None)]
    origin = wall_clock_origin(SimpleNamespace(reports=reports))
    assert origin == pytest.approx(wall - 2.0, abs=0.05)
    assert wall_clock_origin(SimpleNamespace(reports=[], clock_offset_ns=None)) is None  # executor=sim
    shifted = wall_clock_origin(SimpleNamespace(reports=reports, clock_offset_ns=[0, -1_000_000_000]))
    assert shifted == pytest.approx(origin - 0.5, abs=0.05)  # rank 1's clock a second ahead of rank 0's


def test_peak_activation_bytes_per_step_from_every_sample_before_the_cap(tmp_path):
    trace = _with_comm(3, 2, 2)
    memory = [(r, s, min(e.start for e in trace if e.step == s and e.rank == r) + k * 1e-4, (k + 1) * (r + 1) * 100 + s)
              for r in range(2) for s in range(3) for k in range(3)]
    assert peaks_per_step(memory) == {s: {r: 300 * (r + 1) + s for r in range(2)} for s in range(3)}
    cap, data = _write(tmp_path, trace, memory, pp=2, max_events=60)
    assert cap["steps_dropped"] > 0
    assert data["otherData"]["peak_activation_bytes_per_step"] == {
        str(s): [300 + s, 600 + s] for s in range(3)}  # dropped steps' too
    assert read_trace_meta(tmp_path / "trace.json") == data["otherData"]  # from the first line
    check_trace(data)
    # a file whose first line is not the head (another writer's, pretty-printed) is read whole
    (tmp_path / "other.json").write_text(json.dumps(data, indent=1))
    assert read_trace_meta(tmp_path / "other.json") == data["otherData"]


def test_the_schema_check_catches_what_a_viewer_would_refuse():
    ok = {"traceEvents": [
        {"ph": "X", "name": "a", "cat": "compute", "pid": 0, "tid": 0, "ts": 1.0, "dur": 5.0, "args": {"step": 0}},
        {"ph": "X", "name": "b", "cat": "compute", "pid": 0, "tid": 1, "ts": 7.0, "dur": 5.0, "args": {"step": 0}},
        {"ph": "s", "name": "m", "cat": "message", "id": 1, "pid": 0, "tid": 0, "ts": 3.0},
        {"ph": "f", "bp": "e", "name": "m", "cat": "message", "id": 1, "pid": 0, "tid": 1, "ts": 9.0}]}
    check_trace(ok)

    def broken(i: int | None = None, **change) -> dict:
        events = [dict(e) for e in ok["traceEvents"]]
        if i is not None:
            events[i].update(change)
            events[i] = {k: v for k, v in events[i].items() if v is not None}
        return {"traceEvents": events}

    for bad, why in [(broken(0, dur=None), "dur"), (broken(1, ts=-1.0), "ts"), (broken(0, tid=None), "tid"),
                     (broken(3, id=2), "an s and an f"), (broken(3, bp=None), "enclosing"),
                     (broken(3, ts=20.0), "binds to no slice"), (broken(3, name="n"), "cat and name"),
                     (broken(1, ts=3.0, tid=0), "overlaps")]:
        with pytest.raises(AssertionError, match=why):
            check_trace(bad)
    dup = broken()
    dup["traceEvents"].append(dict(ok["traceEvents"][3]))
    with pytest.raises(AssertionError, match="unique per pair"):
        check_trace(dup)


def test_whole_ns_so_touching_slices_never_overlap_and_flows_never_point_back(tmp_path):
    # a start and a length each rounded up to whole ns end past the next start, rounded down
    # (ts + dur written apart did that: 0.6 + 0.6 ns read as 1 + 1); rounded once, they touch
    tiny = Event(0, 0, "0W0", COMPUTE, "W", 0, 0, 1e-3 + 0.6e-9, 1e-3 + 1.2e-9)
    after = Event(0, 0, "0W1", COMPUTE, "W", 0, 1, tiny.end, 0.05)
    check_trace(_write(tmp_path, [tiny, after], pp=1)[1])
    a = Event(0, 0, "0F0", COMPUTE, "F", 0, 0, 0.1, 0.1 + 0.2)
    b = Event(0, 0, "0F1", COMPUTE, "F", 0, 1, 0.3, 0.4)
    send = Event(0, 0, "send 0F0", "comm", "send", 0, 0, 0.1 + 0.2, 0.3 + 1e-7)
    # the consumer began before the send ended (its receive was posted first): the arrow lands in
    # it at the send's end, not before
    early = Event(1, 0, "1F0", COMPUTE, "F", 1, 0, 0.3, 0.5)
    found = check_trace(_write(tmp_path, [a, send, b, early], pp=2)[1])
    (s, f), = found["flows"].values()
    assert s["ts"] == f["ts"] == 300000.099  # 1 ns before the send's end, inside both
    assert found["bound"][1][0][2] == "send 0F0" and found["bound"][1][1][2] == "1F0"
    # a consumer that ended while the send was on: from the send at that moment; one that
    # ended before it began (clocks further apart than their estimate): no arrow
    assert _flow_times(send, replace(early, start=0.2, end=0.3 + 5e-8)) == (300000049, 300000049)
    assert _flow_times(send, replace(early, start=0.1, end=0.2)) is None
    assert _flow_times(a, replace(early, start=0.35)) == (299999999, 350000001)
