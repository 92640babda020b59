"""One clock for every node: each rank's clock measured against rank 0's at the start of a job
(harness/runtime/clock.py) and every event put on rank 0's timeline (harness/measure/execution.py
from_reports). Unit tests on fake clocks; then runs with a test-only skew of +/- 1 hour injected
into half the ranks' clocks (clock_skew_s), as ranks on hosts booted an hour apart would read."""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import replace

import pytest

from harness.measure.execution import ClockEstimate, Execution, RankReport, clock_offsets, clock_record, from_reports
from harness.runtime.clock import HostClock, bounds, ping, skew_ns
from harness.measure.trace import COMPUTE, Event

HOUR = 3600.0
# pp=4 x dp=2: ranks 1 and 5 an hour ahead, 3 and 7 an hour behind (one replica's ranks 0..3)
SKEW = [0.0, HOUR, 0.0, -HOUR, 0.0, HOUR, 0.0, -HOUR]


# -- the estimator on fake clocks --------------------------------------------------------------

class FakeLink:
    """A client and rank 0 on one simulated timeline `now` (ns): each reads it plus its own
    offset; a ping and a pong take the delays `delays` gives (asymmetric, random), and rank 0
    takes `serve_ns` between stamping the ping's arrival and its reply."""

    def __init__(self, client_ns: int, server_ns: int, delays, serve_ns: int = 2_000):
        self.now, self.client_ns, self.server_ns, self.delays, self.serve_ns = 10**12, client_ns, server_ns, delays, serve_ns

    def client_clock(self) -> int:
        self.now += 100  # reading a clock takes time too
        return self.now + self.client_ns

    def exchange(self) -> tuple[int, int]:
        out, back = next(self.delays)
        self.now += out
        t2 = self.now + self.server_ns
        self.now += self.serve_ns
        t3 = self.now + self.server_ns
        self.now += back
        return t2, t3


def test_ping_bounds_the_offset_and_is_no_wider_than_the_fastest_round_trip():
    """Random asymmetric delays (a first ping that waits its turn for 5 ms): the interval holds
    the true offset, the estimate is within its uncertainty of it, and the uncertainty is at most
    half the fastest round trip (what Cristian's method, keeping that round, would give)."""
    rng = random.Random(0)
    for trial in range(200):
        client, server = rng.choice([-1, 1]) * round(HOUR * 1e9) + rng.randrange(-10**9, 10**9), rng.randrange(10**9)
        delays = iter([(5_000_000, 40_000)] + [(rng.randrange(20_000, 400_000), rng.randrange(20_000, 400_000))
                                              for _ in range(11)])
        link = FakeLink(client, server, delays)
        rounds = ping(link.client_clock, link.exchange, min_rounds=12, max_rounds=12)
        lo, hi = bounds(rounds)
        truth = server - client  # rank 0's clock minus this one's
        assert lo <= truth <= hi
        offset, uncertainty = (lo + hi) // 2, (hi - lo + 1) // 2
        assert abs(offset - truth) <= uncertainty
        fastest = min((t4 - t1) - (t3 - t2) for t1, t2, t3, t4 in rounds)
        assert 2 * uncertainty <= fastest + 1


def test_symmetric_delays_give_the_offset_exactly():
    link = FakeLink(-7 * 10**12, 3 * 10**9, iter([(50_000, 50_000)] * 4), serve_ns=0)
    lo, hi = bounds(ping(link.client_clock, link.exchange, min_rounds=4, max_rounds=4))
    assert lo <= 3 * 10**9 + 7 * 10**12 <= hi and hi - lo <= 100_100  # one round trip, the clock reads inside


def test_ping_stops_once_the_offset_is_known_and_tries_longer_on_a_busy_host():
    """8 rounds where each comes back in < 0.1 ms; more where they are slow, until a fast one
    narrows the interval to +/- 50 us; never past 64 rounds or 50 ms after the first."""
    def rounds(delays) -> int:
        link = FakeLink(0, 10**9, iter(delays))
        return len(ping(link.client_clock, link.exchange))

    assert rounds([(49_000, 49_000)] * 64) == 8
    assert rounds([(400_000, 300_000)] * 20 + [(30_000, 30_000)] * 44) == 21
    assert rounds([(1_500_000, 1_000_000)] * 64) == 21  # 50 ms / 2.5 ms a round, after the first
    assert rounds([(40_000, 80_000)] * 64) == 64  # 0.12 ms round trips: +/- 60 us at best


def test_rounds_that_disagree_fall_back_to_the_fastest():
    """A clock that stepped during the exchange (impossible for CLOCK_MONOTONIC, but a record
    must not be built on an empty interval): the fastest round alone."""
    rounds = [(0, 1_000, 1_100, 2_000), (10_000, 9_000, 9_050, 10_300)]  # [-900, 1000] and [-1250, -1000]
    assert bounds(rounds) == (-1_250, -1_000)  # the second is faster (250 ns against 1,900)


def test_the_skew_is_in_the_clock():
    """clock_skew_s reaches a rank's marks, its memory samples (local) and a CUDA anchor (now)."""
    clock = HostClock(skew_ns([0.0, -HOUR], 1))
    before = time.perf_counter_ns()
    assert abs(clock.mark() - round(-HOUR * 1e9) - before) < 10**9
    assert clock.local(123) == 123 - round(HOUR * 1e9)
    assert skew_ns(None, 3) == skew_ns([1.0], 3) == 0 and skew_ns([0.5], 0) == 500_000_000
    with pytest.raises(ValueError, match=r"clock_skew_s\[0\]=nan"):
        skew_ns([float("nan")], 0)


# -- one timeline from the reports ---------------------------------------------------------------

def _report(rank: int, skew: int, estimate: ClockEstimate | None, starts=(0,)) -> RankReport:
    """A rank that ran F of microbatch i at true time 1 s + starts[i] ms for 1 ms, on a clock
    `skew` ns off the host's, and sampled its memory at the first start."""
    events = [(0, f"{rank}F{i}", COMPUTE, "F", rank, i, 10**9 + s * 10**6 + skew, 10**9 + (s + 1) * 10**6 + skew)
              for i, s in enumerate(starts)]
    return RankReport(rank, events, None, memory=[(0, events[0][6], 64)], clock=estimate)


def test_from_reports_puts_every_rank_on_rank0s_clock():
    """Rank 0's host (domain a) is exact; the ranks of another clock (domain b) share one
    estimate, the intersection of their intervals; memory samples move with their events."""
    h = round(HOUR * 1e9)
    reports = [_report(0, 0, ClockEstimate("a", 0, 0, 0, 0.0), starts=(0, 5)),
               _report(1, h, ClockEstimate("b", -h - 300, -h + 100, 12, 0.01), starts=(2,)),
               _report(2, h, ClockEstimate("b", -h - 100, -h + 400, 12, 0.01), starts=(3,)),
               _report(3, 0, ClockEstimate("a", 0, 0, 0, 0.0), starts=(4,))]
    offsets, uncertainties = clock_offsets(reports)
    assert offsets == [0, -h, -h, 0] and uncertainties == [0, 100, 100, 0]  # [-h - 100, -h + 100]
    run = from_reports(reports)
    starts = {e.name: e.start for e in run.trace}
    assert starts == pytest.approx({"0F0": 0.0, "0F1": 0.005, "1F0": 0.002, "2F0": 0.003, "3F0": 0.004}, abs=1e-9)
    assert [m[2] for m in run.memory] == pytest.approx([0.0, 0.002, 0.003, 0.004], abs=1e-9)
    assert run.clock_offset_ns == offsets and run.clock_uncertainty_ns == uncertainties
    # intervals that do not meet (a clock moved in between): the narrower one
    reports[2] = replace(reports[2], clock=ClockEstimate("b", -h + 500, -h + 600, 12, 0.01))
    assert clock_offsets(reports) == ([0, -h + 550, -h + 550, 0], [0, 50, 50, 0])
    # reports without estimates (pickled by an older harness): one host, one clock, as before
    old = [replace(r, clock=None) for r in reports]
    assert clock_offsets(old) is None and from_reports(old).clock_offset_ns is None


def test_the_bubble_is_flagged_where_the_clocks_are_uncertain():
    """The note comes where the worst uncertainty is over 5% of the mean compute action."""
    trace = [Event(0, 1, "0F0", COMPUTE, "F", 0, 0, 0.0, 0.001), Event(1, 1, "1F0", COMPUTE, "F", 1, 0, 0.001, 0.004)]
    run = Execution(trace, 2, [], None, [], clock_offset_ns=[0, 5], clock_uncertainty_ns=[0, 99_000])
    fields = clock_record(run, trace)
    assert fields["clock_uncertainty_ns"] == 99_000 and fields["clock_note"] is None  # 99 us < 5% of 2 ms
    fields = clock_record(replace(run, clock_uncertainty_ns=[0, 101_000]), trace)
    assert fields["clock_note"].startswith("bubble uncertain: the ranks' clocks were put on rank 0's to within 101.0 us")
    assert clock_record(replace(run, clock_offset_ns=None, clock_uncertainty_ns=None), trace) == {}


# -- real runs --------------------------------------------------------------------------------

def _truth(run: Execution, skews: list[float]) -> Execution:
    """The same run put on one timeline with the injected skews undone exactly (what the
    estimate is held to): every rank's interval is its true offset alone."""
    reports = [replace(r, clock=r.clock if not skews[r.rank] else
                       replace(r.clock, lo_ns=-skew_ns(skews, r.rank), hi_ns=-skew_ns(skews, r.rank)))
               for r in run.reports]
    return from_reports(reports)


def _messages(trace: list[Event], pp: int):
    """(producer, consumer) of each activation and gradient between ranks."""
    compute = {(e.rank // pp, e.step, e.name): e for e in trace if e.in_window}
    for (replica, step, _), e in compute.items():
        s, mb = e.stage, e.microbatch
        source = compute.get((replica, step, f"{s - 1}F{mb}" if e.kind == "F" else f"{s + 1}B{mb}"))
        if source is not None and source.rank != e.rank:
            yield source, e


@pytest.mark.dist
def test_an_hour_of_skew_on_half_the_ranks_is_undone(config):
    """pp=4 x dp=2, emulated: ranks 1, 5 an hour ahead and 3, 7 an hour behind. Each offset is
    the injected skew undone to within its recorded uncertainty; within the run, every event is
    where the exactly undone skew puts it to within its rank's uncertainty, and so each step's
    bubble to within 2u / (window - 2u) (the window's two edges; compute durations are one
    rank's clock, untouched); the schedule and imbalance parts of the attribution are the same;
    no message arrives before it was sent by more than the two ranks' uncertainties."""
    from harness.job import execute
    from harness.measure.metrics import compute_metrics, window
    from harness.planning.plan import make_plan

    c = config(pp=4, dp=2, microbatches=4, steps=2, compute="emulated", **{"run.clock_skew_s": SKEW},
               **{"cost.fwd_ms_per_layer": 2.0})
    plan = make_plan(c)
    run = execute(plan, [])
    offsets, uncertainty = run.clock_offset_ns, run.clock_uncertainty_ns
    for r, skew in enumerate(SKEW):
        assert abs(offsets[r] + skew_ns(SKEW, r)) <= uncertainty[r], (r, offsets, uncertainty)
        assert (uncertainty[r] > 0) == (skew != 0)  # rank 0's clock: exact, never estimated
    u = max(uncertainty)
    assert u < 20_000_000  # a loopback round trip: ~0.1-0.3 ms; on a loaded 2-core machine a scheduler slice (4-8 ms)
    assert offsets[1] == offsets[5] and offsets[3] == offsets[7]  # one clock, one estimate

    truth = _truth(run, SKEW)
    anchor = next(e for e in truth.trace if e.rank == 0).start - next(e for e in run.trace if e.rank == 0).start
    for got, want in zip(run.trace, truth.trace):  # the same events, in one order
        assert got.name == want.name and got.rank == want.rank
        assert abs(got.start + anchor - want.start) <= uncertainty[got.rank] / 1e9 + 1e-9
        assert got.dur == pytest.approx(want.dur, abs=1e-12)

    got, want = compute_metrics(plan, run), compute_metrics(plan, truth)
    narrowest = min(t1 - t0 for t0, t1 in (window([e for e in run.trace if e.step == s and e.rank // c.pp == d])
                                           for s in range(c.warmup_steps, c.warmup_steps + c.steps) for d in range(c.dp)))
    bound = 2 * u / 1e9 / (narrowest - 2 * u / 1e9)
    assert got.bubble.measured_per_step == pytest.approx(want.bubble.measured_per_step, abs=bound + 1e-12)
    assert got.bubble.measured == pytest.approx(want.bubble.measured, abs=bound + 1e-12)
    a, b = got.bubble.attribution, want.bubble.attribution
    assert (a.schedule, a.imbalance) == pytest.approx((b.schedule, b.imbalance), abs=1e-12)
    assert a.communication + a.overhead == pytest.approx(b.communication + b.overhead, abs=bound + 1e-12)
    assert got.clock_uncertainty_ns == u and got.clock_offset_ns_per_global_rank == offsets
    for producer, consumer in _messages(run.trace, c.pp):
        slack = (uncertainty[producer.rank] + uncertainty[consumer.rank]) / 1e9
        assert consumer.start >= producer.end - slack - 1e-9, (producer, consumer)


def _trace_events(path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("compute", "comm", "wait")]


def _lags(events: list[dict], pp: int, ranks: int) -> dict[int, list[float]]:
    """Per global rank, per step: its first compute start after its pipeline's window start (us),
    the cross-rank timing a wrong clock moves (by the clock's error)."""
    out: dict[int, list[float]] = {r: [] for r in range(ranks)}
    for step in sorted({e["args"]["step"] for e in events}):
        compute = [e for e in events if e["args"]["step"] == step and e["cat"] == "compute" and e["args"]["kind"] in "FBIW"]
        for r in range(ranks):
            t0 = min(e["ts"] for e in compute if e["tid"] // pp == r // pp)
            out[r].append(min(e["ts"] for e in compute if e["tid"] == r) - t0)
    return out


@pytest.mark.dist
@pytest.mark.slow
def test_a_skewed_run_measures_what_an_unskewed_run_measures(tmp_path, config):
    """pp=4 x dp=2, emulated (20 ms F, 40 ms B a stage), once with one clock and once with an
    hour of skew on half the ranks. The records' bubble and each part of its attribution agree
    within the clocks' 2u / window plus the runs' noise: 4 standard errors of the difference of
    their per-step means, plus 0.03 (what test_pipeline allows a run of this machine against the
    closed form; seen: up to 0.015). trace.json's per-rank event order is the same, and each
    rank's lag behind its pipeline's first compute (cross-rank timing: an hour off with the
    clocks as read) agrees within 2u plus the lags' noise: 4 standard errors, plus 4 ms for each
    forward and receive before the rank's first action (each wakes from a sleep, which on a
    loaded 2-core machine can wait a scheduler slice, 4 ms at HZ=250, in one run and not the
    other; seen: up to 8.5 ms at pipeline rank 3). A wrong clock shows as an hour; the
    microsecond check is test_an_hour_of_skew_on_half_the_ranks_is_undone's, within one run."""
    from harness.job import run_job

    results, traces = {}, {}
    for name, skew in (("one_clock", None), ("skewed", SKEW)):
        c = config(pp=4, dp=2, microbatches=8, steps=3, compute="emulated", **{"run.clock_skew_s": skew},
                   **{"cost.fwd_ms_per_layer": 10.0})
        out = tmp_path / name
        out.mkdir()
        result = run_job(c, out, "test", name)
        assert result.status == "ok", result.error
        results[name], traces[name] = result, _trace_events(out / "trace.json")
    ref, skewed = results["one_clock"].metrics, results["skewed"].metrics
    assert ref.clock_offset_ns_per_global_rank == [0] * 8 and ref.clock_uncertainty_ns == 0
    for r, skew in enumerate(SKEW):
        assert abs(skewed.clock_offset_ns_per_global_rank[r] + skew_ns(SKEW, r)) <= \
            skewed.clock_uncertainty_ns_per_global_rank[r]
    u = skewed.clock_uncertainty_ns / 1e9
    on_disk = json.loads((tmp_path / "skewed" / "result.json").read_text())["metrics"]
    assert on_disk["clock_uncertainty_ns"] == skewed.clock_uncertainty_ns
    assert on_disk["clock_note"] is None or on_disk["clock_note"].startswith("bubble uncertain")  # > 5% of an action

    def noise(a: list[float], b: list[float], floor: float) -> float:
        return floor + 4 * (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5

    window = min(ref.step_time_s, skewed.step_time_s)
    tol = noise(ref.bubble.measured_per_step, skewed.bubble.measured_per_step, 0.03) + 2 * u / (window - 2 * u)
    assert abs(skewed.bubble.measured - ref.bubble.measured) <= tol, (skewed.bubble, ref.bubble, tol)
    for part in ("schedule", "imbalance", "communication", "overhead"):
        assert abs(getattr(skewed.bubble.attribution, part) - getattr(ref.bubble.attribution, part)) <= tol, part

    for r in range(8):
        order = [[e["name"] for e in sorted((e for e in traces[n] if e["tid"] == r), key=lambda e: (e["args"]["step"], e["ts"]))]
                 for n in ("one_clock", "skewed")]
        assert order[0] == order[1], r
    lags = {n: _lags(traces[n], 4, 8) for n in traces}
    for r in range(8):
        a, b = lags["one_clock"][r], lags["skewed"][r]
        tol_us = noise(a, b, 4000.0 * (r % 4)) + 2 * u * 1e6
        assert abs(statistics.fmean(a) - statistics.fmean(b)) <= tol_us, (r, a, b, tol_us)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_skewed_cuda_clock_is_undone(tmp_path, config):
    """Two ranks sharing one GPU (CUDA-event timing through the anchor), rank 1 an hour behind."""
    from harness.job import run_job

    c = config(pp=2, microbatches=4, device="cuda", **{"run.clock_skew_s": [0.0, -HOUR]})
    result = run_job(c, tmp_path, "gpu", "skew", cuda_devices=1)
    assert result.status == "ok", result.error
    m = result.metrics
    assert abs(m.clock_offset_ns_per_global_rank[1] - round(HOUR * 1e9)) <= m.clock_uncertainty_ns
    assert m.step_time_s < 60 and 0 <= m.bubble.measured < 1
