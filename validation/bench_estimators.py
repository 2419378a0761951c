"""How far the closed form (``estimate``) is from the engine (``simulate``): the
distribution of |closed / engine - 1| over the seeded plan sample of
``validation/agreement.py`` (ZeRO 0-3, tp/pp/vpp/cp/ep/etp, every schedule, recompute,
TP-comm overlap, routing skew, three clusters), and the cases at the top.

    .venv/bin/python validation/bench_estimators.py [--plans 300] [--seed 0] [--top 10]
    .venv/bin/python validation/bench_estimators.py --fold [--plans 40] [--seed 7]

``--fold``: the engine's folded step (extended from short steps once their growth repeats,
``pipeline.steady_window``) and the closed form against the engine's full simulation, on
plans given enough microbatches to fold (``agreement.long_sample``).

``BEFORE`` is the same sample measured on commit 1721bd4 (the graph-lowering closed form
and the engine's single data-parallel queue), for the before/after.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from validation import agreement  # noqa: E402

BEFORE = {"plans": 300, "seed": 0, "median": 0.0242, "p95": 0.2124, "max": 0.4926, "within_5pct": 197}


def measure(plans: int, seed: int, stacks: bool = False) -> list[tuple[float, float, float, agreement.Case]]:
    """(signed error, closed-form s, engine s, case) per plan; ``stacks``: each plan under a
    framework stack (``agreement.under_stacks``)."""
    out = []
    cases = agreement.sample(plans, seed)
    for case in agreement.under_stacks(cases, seed) if stacks else cases:
        closed, engine = agreement.compare(case)
        out.append((closed / engine - 1, closed, engine, case))
    return out


def measure_fold(plans: int, seed: int) -> list[tuple[float, float, tuple, agreement.Case]]:
    """(folded / full - 1, closed / full - 1, the short steps extended, case) per plan long
    enough to fold."""
    return [(*agreement.fold_check(case), case) for case in agreement.long_sample(plans, seed)]


def fold_distribution(rows) -> dict:
    """Median and max |error| of the folded engine and of the closed form against the full simulation."""
    fold, closed = sorted(abs(r[0]) for r in rows), sorted(abs(r[1]) for r in rows)
    return {"plans": len(rows), "fold_median": statistics.median(fold), "fold_max": fold[-1],
            "closed_median": statistics.median(closed), "closed_max": closed[-1]}


def distribution(rows) -> dict:
    errs = sorted(abs(r[0]) for r in rows)
    return {"median": statistics.median(errs), "p95": errs[max(0, int(0.95 * len(errs)) - 1)], "max": errs[-1],
            "within_5pct": sum(e <= 0.05 for e in errs)}


TOML = Path(__file__).resolve().parent.parent / "perfsim" / "estimators" / "agreement.toml"


def write_toml(d: dict, plans: int, seed: int) -> None:
    head = [line for line in TOML.read_text().splitlines() if line.startswith("#")]
    body = [f'source = "measured: validation/bench_estimators.py --plans {plans} --seed {seed}"', f"plans = {plans}",
            f"median_rel = {d['median']:.4f}", f"p95_rel = {d['p95']:.4f}", f"max_rel = {d['max']:.4f}"]
    TOML.write_text("\n".join(head + body) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--stacks", action="store_true",
                        help="each plan under a framework stack (nemo, maxtext, megatron-primus, torchtitan)")
    parser.add_argument("--write", action="store_true",
                        help="record the distribution in perfsim/estimators/agreement.toml (what the search uses)")
    parser.add_argument("--fold", action="store_true",
                        help="the folded engine and the closed form against the full simulation, on long plans")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.fold:
        rows = measure_fold(args.plans, args.seed)
        d = fold_distribution(rows)
        print(f"folded engine and closed form vs the full simulation, {d['plans']} long plans (seed {args.seed}), "
              f"{time.perf_counter() - t0:.1f} s")
        print(f"  |folded/full - 1|: median {d['fold_median']:.2%}  max {d['fold_max']:.2%}")
        print(f"  |closed/full - 1|: median {d['closed_median']:.2%}  max {d['closed_max']:.2%}")
        for fold, closed, points, case in sorted(rows, key=lambda r: -abs(r[0]))[:args.top]:
            print(f"    folded {fold:+7.2%}  closed {closed:+7.2%}  short steps {points}  {case.describe()}")
        return
    if args.stacks and args.write:
        parser.error("--write records the plain sample's distribution: run it without --stacks")
    rows = measure(args.plans, args.seed, args.stacks)
    d = distribution(rows)
    under = ", each under a framework stack" if args.stacks else ""
    print(f"closed form vs engine, {args.plans} plans (seed {args.seed}){under}, {time.perf_counter() - t0:.1f} s")
    print(f"  |closed/engine - 1|: median {d['median']:.2%}  p95 {d['p95']:.2%}  max {d['max']:.2%}  "
          f"within 5%: {d['within_5pct']}/{args.plans}")
    print(f"  before (1721bd4):    median {BEFORE['median']:.2%}  p95 {BEFORE['p95']:.2%}  max {BEFORE['max']:.2%}  "
          f"within 5%: {BEFORE['within_5pct']}/{BEFORE['plans']}")
    if args.write:
        write_toml(d, args.plans, args.seed)
    print(f"  largest {args.top}:")
    for err, closed, engine, case in sorted(rows, key=lambda r: -abs(r[0]))[:args.top]:
        print(f"    {err:+7.1%}  closed {closed * 1e3:9.2f} ms  engine {engine * 1e3:9.2f} ms  {case.describe()}")


if __name__ == "__main__":
    main()
