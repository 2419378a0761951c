"""docs/accuracy.md section: the closed form against the engine (nothing is fitted here:
both price the same lowered blocks with the same cost model; the engine simulates the
overlap and link sharing the closed form summarises).

    .venv/bin/python -m validation.accuracy_estimators
"""

from validation import bench_estimators

PLANS, SEED = 300, 0
FOLD_PLANS, FOLD_SEED = 40, 7  # plans long enough to fold (agreement.long_sample)


def section() -> str:
    rows = bench_estimators.measure(PLANS, SEED)
    d = bench_estimators.distribution(rows)
    st = bench_estimators.distribution(bench_estimators.measure(PLANS, SEED, stacks=True))
    b = bench_estimators.BEFORE
    lines = [
        "## Closed form vs engine", "",
        f"`estimate()` (closed form) against `simulate()` (SimPy engine) on the seeded {PLANS}-plan sample of "
        "`validation/agreement.py` (ZeRO 0-3 with ZeRO-3 gathering per pass or once and ZeRO-2/3 reducing per microbatch without a pipeline, tp/pp/vpp/cp/ep/etp, every schedule, recompute, TP-comm overlap, the expert-parallel all-to-all overlap, the shared-expert overlap, "
        "MoE routing skew; MI300X and MI355X + Pollara, H100 + InfiniBand; 8-64 GPUs). No parameter is fitted: "
        "this is the closed form's summary error, which the search uses to decide which plans to confirm on the "
        "engine (`perfsim/estimators/agreement.toml`, written by `validation/bench_estimators.py --write`). "
        "The second row prices the same plans each under a framework stack drawn for it (nemo, maxtext, "
        "megatron-primus, torchtitan: their launch gaps, fused kernels, FP8 recipes, dispatch paths and plan "
        "defaults; `validation/bench_estimators.py --stacks`).", "",
        "| | median | p95 | max | within 5% |", "| --- | --- | --- | --- | --- |",
        f"| now | {d['median']:.2%} | {d['p95']:.2%} | {d['max']:.2%} | {d['within_5pct']}/{PLANS} |",
        f"| now, each plan under a framework stack | {st['median']:.2%} | {st['p95']:.2%} | {st['max']:.2%} | "
        f"{st['within_5pct']}/{PLANS} |",
        f"| before (1721bd4) | {b['median']:.2%} | {b['p95']:.2%} | {b['max']:.2%} | {b['within_5pct']}/{b['plans']} |",
        "", "Largest disagreements:", "",
        "| closed / engine - 1 | plan |", "| --- | --- |",
    ]
    for err, _, _, case in sorted(rows, key=lambda r: -abs(r[0]))[:5]:
        lines.append(f"| {err:+.1%} | {case.describe()} |")
    folds = bench_estimators.measure_fold(FOLD_PLANS, FOLD_SEED)
    f = bench_estimators.fold_distribution(folds)
    lines += [
        "", "Both compare against the engine as `simulate()` runs it, which folds a long step: it simulates "
        "short steps and extends the last two linearly once the step's growth per group of microbatches "
        "repeats (`pipeline.steady_window`, in both estimators). Against the engine's full simulation of "
        f"every microbatch, on {f['plans']} plans given enough microbatches to fold "
        f"(`validation/agreement.py` `long_sample({FOLD_PLANS}, {FOLD_SEED})`, at most eight layers; "
        "`validation/bench_estimators.py --fold`):", "",
        "| against the full simulation | median | max |", "| --- | --- | --- |",
        f"| folded engine | {f['fold_median']:.2%} | {f['fold_max']:.2%} |",
        f"| closed form | {f['closed_median']:.2%} | {f['closed_max']:.2%} |",
        "", "Largest folded-engine errors:", "",
        "| folded / full - 1 | closed / full - 1 | short steps extended | plan |", "| --- | --- | --- | --- |",
    ]
    for fold, closed, points, case in sorted(folds, key=lambda r: -abs(r[0]))[:3]:
        lines.append(f"| {fold:+.2%} | {closed:+.2%} | {points[0]}, {points[1]} | {case.describe()} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(section())
