"""`python -m harness.schedules.generate`: a zero-bubble order (harness/schedules/auto.py)
generated for equal stages of given costs, compared and written as torch's CSV."""

from __future__ import annotations

import argparse
import sys

from harness.schedules.auto import MAX_COST_S, generate, size_problem
from harness.schedules.csv_io import write_csv
from harness.simulate import engine
from harness.simulate.cost import CostModel


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.schedules.generate --pp 4 --microbatches 16 --memory-limit 2 -o auto.csv`:
    generate on equal stages of the given costs, print how it compares, write torch's CSV (run it
    with `python -m harness schedule=csv schedule.csv_path=auto.csv pp=4 microbatches=16`)."""
    ap = argparse.ArgumentParser(prog="python -m harness.schedules.generate", description=main.__doc__)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    ap.add_argument("--memory-limit", type=float, default=1.0, help="in units of 1F1B's peak (N microbatches)")
    ap.add_argument("--fwd", type=float, default=1.0, help="F seconds per stage")
    ap.add_argument("--igrad", type=float, default=1.0, help="I seconds per stage")
    ap.add_argument("--wgrad", type=float, default=0.5, help="W seconds per stage")
    ap.add_argument("--hop", type=float, default=0.03, help="seconds a message takes between ranks")
    ap.add_argument("--w-memory", type=float, default=1.0,
                    help="share of a microbatch's activations its deferred W keeps (M_W / M_B; default 1.0, the "
                         "most; GPT layers without flash attention about 0.4; a run measures its own)")
    ap.add_argument("-o", "--out", default=None, help="torch's compute_only CSV")
    args = ap.parse_args(argv)
    n, m = args.pp, args.microbatches
    try:
        if n < 1 or m < 1:
            raise ValueError(f"--pp {n}, --microbatches {m} (allowed: >= 1)")
        if (too_big := size_problem(n, m, "--pp", "--microbatches")) is not None:  # before a tuple of pp costs
            raise ValueError(too_big)
        for flag in ("fwd", "igrad", "wgrad", "hop"):
            x = getattr(args, flag)
            if not 0.0 <= x <= MAX_COST_S:  # NaN, inf, 1e308 (sums to inf), negative: no order can be timed
                raise ValueError(f"--{flag} {x:g}: not a possible cost (allowed: a finite number of seconds in "
                                 f"0..{MAX_COST_S:,.0f})")
        if not 0.0 <= args.w_memory <= 1.0:
            raise ValueError(f"--w-memory {args.w_memory:g} (allowed: a share in [0, 1])")
        cost = CostModel((args.fwd,) * n, (args.igrad + args.wgrad,) * n, (args.igrad,) * n, (args.wgrad,) * n,
                         fwd_hop_s=(args.hop,) * n, bwd_hop_s=(args.hop,) * n)
        g = generate(n, m, cost, args.memory_limit, args.w_memory)
        if args.out:
            write_csv(args.out, g.schedule)
    except (ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    c = engine.compile_schedule(g.schedule)
    print(f"zb_auto pp={n} M={m} memory_limit={args.memory_limit:g} ({g.limit:g} microbatches per rank, a deferred W "
          f"keeping {args.w_memory:g}): bubble {engine.steady_bubble(c, cost):.2%} with steps overlapped (period "
          f"{g.period_s:.4g} s), {engine.bubble(c, cost):.2%} in a step that starts at a barrier (step "
          f"{g.step_s:.4g} s); best of {g.candidates} candidates ({g.knobs}) in {g.seconds:.2f} s"
          + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
