"""Timestamps for the trace, in ns of the rank's clock (time.perf_counter_ns: CLOCK_MONOTONIC,
one clock for every process of a host), and each rank's offset to rank 0's clock, so that
ranks on several hosts land on one timeline.

On CUDA, kernels run asynchronously, so host timestamps would time the launch, not the
work: CudaClock records CUDA events and converts them to host ns after the step, through
an anchor event recorded right after a synchronize.

Clocks of several hosts: CLOCK_MONOTONIC counts from each host's boot, so two hosts' clocks
differ by anything up to their uptimes. At the start of a job (`estimate_offset`, from the rank
loop) every rank whose clock is not rank 0's (another host: another boot id or time namespace)
measures its offset to rank 0's by ping-pong over the process group, NTP's four timestamps per
round: each round bounds the offset to an interval (neither message can arrive before it was
sent), and the rounds' intersection is kept (no wider than the fastest round trip, which
Cristian's method would keep); its middle is the offset, half its width the uncertainty. 8
rounds where they are fast, more (up to 64, or 50 ms) on a busy host until one is. Ranks sharing
rank 0's clock measure nothing: their offset is 0 exactly (ranks forked here skip even the
all-gather that finds them, unless a skew is injected).
harness/measure/execution.py's `from_reports` puts every event on rank 0's timeline. Not corrected:
drift during the run (two hosts' CLOCK_MONOTONIC rates differ by what NTP leaves, typically a
few ppm: a few us for each second after the estimate).

`clock_skew_s` (TEST ONLY) adds seconds to a rank's clock, its marks and its CUDA anchor alike,
as another host's boot time would; the estimate must undo it (tests/test_clock.py).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from harness.measure.execution import ClockEstimate

# ping-pongs per rank off rank 0's clock (~0.1-0.3 ms each on gloo loopback): at least MIN_ROUNDS,
# then until the offset is known to GOOD_NS, or MAX_ROUNDS, or BUDGET_NS after the rank's first
# (rank 0 serves one rank at a time: a busy host's slow round trips get more tries, within a bound)
MIN_ROUNDS, MAX_ROUNDS, GOOD_NS, BUDGET_NS = 8, 64, 50_000, 50_000_000


class HostClock:
    def __init__(self, skew_ns: int = 0):
        self.skew_ns = skew_ns  # test-only: added to every reading (clock_skew_s)

    def now(self) -> int:
        """This rank's clock, in ns (host time, skew included)."""
        return time.perf_counter_ns() + self.skew_ns

    def local(self, host_ns: int) -> int:
        """A raw time.perf_counter_ns reading (the memory meter's) on this rank's clock."""
        return host_ns + self.skew_ns

    def start_step(self) -> None:
        pass

    def mark(self) -> int:
        return self.now()

    def resolve(self, token: int) -> int:
        return token

    def finish_step(self) -> None:
        pass


class CudaClock(HostClock):
    def __init__(self, device: torch.device, skew_ns: int = 0):
        super().__init__(skew_ns)
        self.device = device
        self.anchor_ns = 0
        self.anchor: torch.cuda.Event | None = None

    def start_step(self) -> None:
        torch.cuda.synchronize(self.device)
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        self.anchor_ns = self.now()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def finish_step(self) -> None:
        torch.cuda.synchronize(self.device)

    def resolve(self, token: torch.cuda.Event) -> int:
        assert self.anchor is not None
        return self.anchor_ns + int(self.anchor.elapsed_time(token) * 1e6)  # elapsed_time is ms


def skew_ns(skews: Sequence[float] | None, rank: int) -> int:
    """clock_skew_s's entry for global `rank` in ns (0 where the list is shorter or absent);
    ValueError for a value that is not a finite number."""
    if not skews or rank >= len(skews):
        return 0
    s = skews[rank]
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
        raise ValueError(f"run.clock_skew_s[{rank}]={s!r}: must be a finite number of seconds (test-only key)")
    return round(s * 1e9)


def clock_domain(clock: HostClock) -> int:
    """What identifies this rank's clock, as a signed 64-bit number: processes with the same boot
    id and time namespace read one CLOCK_MONOTONIC; an injected skew makes another clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:  # not Linux: the host's name stands for its clock
        boot = os.uname().nodename
    try:
        ns = str(os.stat("/proc/self/ns/time").st_ino)
    except OSError:
        ns = "-"
    digest = hashlib.blake2b(f"{boot}/{ns}/{clock.skew_ns}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


Round = tuple[int, int, int, int]  # (t1 sent here, t2 received at rank 0, t3 replied at rank 0, t4 received here)


def ping(now: Callable[[], int], exchange: Callable[[], tuple[int, int]], min_rounds: int = MIN_ROUNDS,
         max_rounds: int = MAX_ROUNDS, good_ns: int = GOOD_NS, budget_ns: int = BUDGET_NS) -> list[Round]:
    """Round trips to the reference clock: `now` reads this rank's clock, `exchange` sends a ping
    and returns the reference's (receive, reply) timestamps once its pong is here. At least
    `min_rounds`; then it stops once `bounds` knows the offset to +/- `good_ns`, or after
    `max_rounds`, or `budget_ns` after the first round came back."""
    out: list[Round] = []
    while len(out) < max_rounds:
        t1 = now()
        t2, t3 = exchange()
        out.append((t1, t2, t3, now()))
        if len(out) >= min_rounds:
            lo, hi = bounds(out)
            if hi - lo <= 2 * good_ns or out[-1][3] - out[0][3] > budget_ns:
                break
    return out


def bounds(rounds: Iterable[Round]) -> tuple[int, int]:
    """(lo, hi): rank 0's clock minus this rank's lies in [lo, hi]. A round bounds it to
    [t3 - t4, t2 - t1] (the ping cannot arrive before it was sent, nor the pong); the rounds'
    intersection holds it, and is no wider than the fastest round trip's (t4 - t1) - (t3 - t2).
    Where the intersection is empty (a clock stepped during the exchange) the fastest round's
    interval alone."""
    rounds = list(rounds)
    lo, hi = max(t3 - t4 for _, _, t3, t4 in rounds), min(t2 - t1 for t1, t2, _, _ in rounds)
    if lo <= hi:
        return lo, hi
    t1, t2, t3, t4 = min(rounds, key=lambda r: (r[3] - r[0]) - (r[2] - r[1]))
    return t3 - t4, t2 - t1


def same_clock(clock: HostClock) -> ClockEstimate:
    """The estimate of a rank known to read rank 0's clock (forked on its host): exact."""
    return ClockEstimate("this host", 0, 0, 0, 0.0, time.time_ns(), clock.now())


def estimate_offset(clock: HostClock, backend: str, device: torch.device) -> ClockEstimate:
    """Collective, on every rank of the job's process group, before the first step: this rank's
    clock against rank 0's. The ranks' clock domains are gathered (one all-gather of 8 bytes
    each: all a job whose ranks share one clock pays); rank 0 then serves, one rank at a time, the ping-pongs of
    every rank off its own clock (`ping`; a ping says whether it is the last), over the job's
    group (gloo) or, with NCCL, a gloo group made for it (host timestamps, no kernel in
    between). `seconds`: from the gather to the end (rank 0's is the whole exchange)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    domain = clock_domain(clock)
    wall_ns, clock_ns = time.time_ns(), clock.now()
    mine = torch.tensor([domain], dtype=torch.int64, device=device if backend == "nccl" else "cpu")
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    domains = [int(t.item()) for t in gathered]
    t0 = time.perf_counter()
    clients = [r for r in range(1, world) if domains[r] != domains[0]]
    group = dist.new_group(backend="gloo") if clients and backend != "gloo" else None  # collective: every rank
    if rank not in clients and (rank != 0 or not clients):  # reads rank 0's clock: exact
        return ClockEstimate(str(domain), 0, 0, 0, 0.0, wall_ns, clock_ns)
    buf = torch.zeros(2, dtype=torch.int64)  # a ping: [1 (0: no more), -]; a pong: [t2, t3]
    stamps = buf.numpy()  # writes through, without a tensor op between the timestamp and the send
    if rank == 0:
        for r in clients:
            while True:
                dist.recv(buf, r, group)
                if stamps[0] == 0:
                    break
                stamps[0] = clock.now()
                stamps[1] = clock.now()
                dist.send(buf, r, group)
        return ClockEstimate(str(domain), 0, 0, 0, time.perf_counter() - t0, wall_ns, clock_ns)

    def exchange() -> tuple[int, int]:
        stamps[0] = 1
        dist.send(buf, 0, group)
        dist.recv(buf, 0, group)
        return int(stamps[0]), int(stamps[1])

    rounds = ping(clock.now, exchange)
    stamps[0] = 0
    dist.send(buf, 0, group)
    lo, hi = bounds(rounds)
    return ClockEstimate(str(domain), lo, hi, len(rounds), time.perf_counter() - t0, wall_ns, clock_ns)
