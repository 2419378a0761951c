"""End-to-end accuracy on published training runs (docs/accuracy.md, issue 16).

``section() -> str`` is the markdown validation/accuracy_doc.py includes. Two figures per
run, both from ``perfsim validate --runs validation/runs/published.csv``:

- held out (``--loso``): each stack with runs from two or more sources is refitted
  (``perfsim calibrate --runs``'s parameters) leaving one source out, and that source's
  runs are priced by the fit to the others; a stack with one source keeps its shipped
  profile (its values are assumed, not fitted, so its runs are held out too);
- shipped: every run under the profile as committed (in-sample where that profile was
  fitted to the reference set).

``python validation/accuracy_runs.py --write`` also rewrites validation/runs/accuracy_runs.csv,
the committed per-run table tests/test_runs.py holds the held-out errors to (a run may not
get more than 5 points worse). Usage: python validation/accuracy_runs.py (prints the section).
"""

import csv
import dataclasses
import functools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfsim.design.runs import memory_stats, predict, read_all, validate_runs  # noqa: E402
from perfsim.plan.routing import RoutingSpec  # noqa: E402
from perfsim.design.runs_fit import fit_stack, held_out_by_stack, params_for, sources_by_stack, vendor_of  # noqa: E402
from perfsim.system.hardware import load_cluster  # noqa: E402
from perfsim.system.stacks import IDEAL, stack_base  # noqa: E402

RUNS = ROOT / "validation" / "runs" / "published.csv"
COMMITTED = ROOT / "validation" / "runs" / "accuracy_runs.csv"
TARGET_MEDIAN, TARGET_MAX = 10.0, 25.0  # issue 16: median |error| <= 10%, every run within +-25%


@functools.lru_cache(maxsize=None)
def evaluate():
    cases = read_all([str(RUNS)])
    return cases, held_out_by_stack(cases), validate_runs(cases)


def ideal_range(cases, family: str) -> tuple[float, float]:
    """Signed error range of a model family's runs with no stack (``ideal``)."""
    mine = [c for c in cases if c.family == family]
    errs = [r.error_pct for r in validate_runs(mine, {c.id: IDEAL for c in mine}).results]
    return min(errs), max(errs)


def _stats(results) -> tuple[float, float, float, int]:
    errs = [abs(r.error_pct) for r in results]
    return (sum(errs) / len(errs), statistics.median(errs), max(errs), sum(e <= TARGET_MAX for e in errs))


def _unfitted(stack: str) -> str:
    """What prices a single-source stack's runs: its profile, none of it fitted to them."""
    base = stack_base(stack)
    if base is None:
        return "nothing (profile values assumed)"
    return f"nothing of its own (its base `{base}`'s values, fitted to `{base}`'s runs, and assumed ones)"


def _summary(held, shipped) -> list[str]:
    lines = ["| stack | source (checked on) | runs | fitted on | held-out MAPE | median | max | within 25% | "
             "shipped-profile MAPE |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keys = sorted({(r.stack, r.case.source_id) for r in held.results})
    for stack, source in keys:
        mine = [r for r in held.results if (r.stack, r.case.source_id) == (stack, source)]
        ship = [r for r in shipped.results if (r.stack, r.case.source_id) == (stack, source)]
        others = sorted({r.case.source_id for r in held.results if r.stack == stack} - {source})
        fitted = ", ".join(others) if others else _unfitted(stack)
        mine_vendors = {vendor_of(r.case) for r in mine}
        same = [o for o in others if mine_vendors & {vendor_of(r.case) for r in held.results if r.case.source_id == o}]
        foreign = [o for o in others if o not in same]
        verb = "is" if len(foreign) == 1 else "are"
        if others and not same:  # a kernels' speed per vendor: the other vendor's fit does not apply
            fitted = (f"nothing for {'/'.join(sorted(mine_vendors))} GPUs (kernels' speed assumed; "
                      f"{', '.join(foreign)} {verb} another vendor's)")
        elif foreign:
            fitted = f"{', '.join(same)} ({', '.join(foreign)} {verb} another vendor's)"
        mape, med, worst, ok = _stats(mine)
        lines.append(f"| {stack} | {source} | {len(mine)} | {fitted} | {mape:.1f}% | {med:.1f}% | {worst:.1f}% | "
                     f"{ok}/{len(mine)} | {_stats(ship)[0]:.1f}% |")
    mape, med, worst, ok = _stats(held.results)
    lines.append(f"| all | | {len(held.results)} | | {mape:.1f}% | {med:.1f}% | {worst:.1f}% | {ok}/{len(held.results)} | "
                 f"{_stats(shipped.results)[0]:.1f}% |")
    return lines


def _targets(held) -> list[str]:
    """The issue's target per stack (median |error| and every run within the bound), held out."""
    lines = ["The target per stack (issue 16: held-out median |error| <= "
             f"{TARGET_MEDIAN:g}% and every run within +-{TARGET_MAX:g}%):", "",
             "| stack | sources | runs | held-out median | worst | within 25% | target |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for stack in sorted({r.stack for r in held.results}):
        mine = [r for r in held.results if r.stack == stack]
        _, med, worst, ok = _stats(mine)
        met = med <= TARGET_MEDIAN and ok == len(mine)
        why = [] if met else ([f"median {med:.1f}%"] if med > TARGET_MEDIAN else []) + (
            [", ".join(f"{r.case.id} {r.error_pct:+.1f}%" for r in mine if abs(r.error_pct) > TARGET_MAX)]
            if ok < len(mine) else [])
        sources = len({r.case.source_id for r in mine})
        verdict = ("met" + (" (one source, priced blind)" if sources == 1 else "")) if met else "not met: " + "; ".join(why)
        lines.append(f"| {stack} | {sources} | {len(mine)} | {med:.1f}% | {worst:.1f}% | {ok}/{len(mine)} | {verdict} |")
    return lines


def _cluster_label(cluster: str) -> str:
    """A shipped profile's name, or the file name of a profile beside the CSV (not its path)."""
    return Path(cluster).name if cluster.endswith(".toml") else cluster


def one_run_calibration(cases) -> list[tuple[str, str, str, int, list[float]]]:
    """(source, model, cluster, runs, signed errors %) per group of two or more runs of one model
    on one GPU in one source: each run in turn is the one measurement a stack is fitted to
    (``fit_stack`` on one run: the one parameter it identifies, as ``perfsim project`` fits), and
    the group's other runs (other batch, schedule, capacity factor or dispatch path) are priced."""
    groups: dict[tuple, list] = {}
    for c in cases:
        groups.setdefault((c.source_id, c.model, c.cluster), []).append(c)
    out = []
    for (source, model, cluster), mine in sorted(groups.items()):
        if len(mine) < 2:
            continue
        errs = []
        for anchor in mine:
            fitted = fit_stack([anchor], anchor.stack).stack
            others = [c for c in mine if c is not anchor]
            errs += [r.error_pct for r in validate_runs(others, {c.id: fitted for c in others}).results]
        out.append((source, model, _cluster_label(cluster), len(mine), errs))
    return out


def scale_projection(cases) -> list[tuple[str, str, str, str, int, str, int, float]]:
    """(source, model, cluster, from run, its GPUs, to run, its GPUs, signed error %) per pair of
    runs of one model, stack and cluster in one source that differ only in node count (and the
    global batch that follows it): the smaller run is the one measurement the stack is fitted to
    (as ``perfsim project`` fits it) and the larger is priced: the projection from a few nodes to
    many that cluster teams run."""
    def plan(c):
        return (c.source_id, c.model, c.cluster, c.stack, c.capacity_factor, c.data, c.routing,
                tuple((k, v) for k, v in c.knobs if k != "gbs"))

    series: dict[tuple, list] = {}
    for c in cases:
        series.setdefault(plan(c), []).append(c)
    out = []
    for runs in series.values():
        for small in runs:
            bigger = [big for big in runs if small.nodes < big.nodes]
            if not bigger:
                continue
            fitted = fit_stack([small], small.stack).stack  # once per calibrating run
            per_node = load_cluster(small.cluster).gpus_per_node
            for r in validate_runs(bigger, {big.id: fitted for big in bigger}).results:
                out.append((small.source_id, small.model, _cluster_label(small.cluster), small.id,
                            small.nodes * per_node, r.case.id, r.case.nodes * per_node, r.error_pct))
    return sorted(out)


@functools.lru_cache(maxsize=None)
def shipped_scale() -> tuple:
    """``scale_projection`` of the reference set, once per process."""
    return tuple(scale_projection(evaluate()[0]))


@functools.lru_cache(maxsize=None)
def shipped_one_run() -> tuple:
    """``one_run_calibration`` of the reference set (``evaluate``), once per process: the
    docs section and perfsim/calibration/accuracy.toml both read it."""
    return tuple(one_run_calibration(evaluate()[0]))


def _one_run() -> list[str]:
    lines = ["Calibrated on one run (`perfsim project --runs FILE --id RUN`, or `perfsim calibrate --runs` on a one-row CSV): "
             "each run of a model on one GPU in turn is the one measurement the stack is fitted to (the one parameter "
             "it identifies: the routed-expert speed of an MoE run's dispatch path with kernels of its own, else the "
             "kernels' speed), and that model's other runs on that GPU in the same source (other batch, schedule, "
             "capacity factor or dispatch path) are priced with the fit. A same-source check of how a calibration on "
             "one run carries across plans, not a held-out figure; projection across scale alone is the next table.", "",
             "| source | model | cluster | runs | fitted / priced pairs | MAPE | median | worst |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for source, model, cluster, n, errs in shipped_one_run():
        absolute = [abs(e) for e in errs]
        lines.append(f"| {source} | {model} | {cluster} | {n} | {len(errs)} | {sum(absolute) / len(absolute):.1f}% | "
                     f"{statistics.median(absolute):.1f}% | {max(errs, key=abs):+.1f}% |")
    return lines


def _scale() -> list[str]:
    pairs = shipped_scale()
    lines = ["Projected across scale (`perfsim project --runs FILE --id RUN --nodes N`): pairs of runs of one model "
             "and plan in one source that differ only in node count (and the global batch with it); the smaller "
             "run alone calibrates the stack (the one parameter it identifies) and the larger is priced. A "
             "same-source check, like the table above."]
    if not pairs:
        return lines + ["", "No such pair in the reference set: projection across scale is not checked."]
    lines += ["", "One row per series (runs of one plan at several node counts; every pair of them, the smaller "
              "calibrating, the larger priced): the smallest run projected to the largest, and over every pair "
              "the median |error| and the worst.", "",
              "| source | model | cluster | series (smallest run) | runs | GPUs | pairs | smallest -> largest | "
              "median | worst |", "| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for series in scale_series(pairs):
        first, last = series[0], max(series, key=lambda q: (-q[4], q[6]))  # the smallest run to the largest
        gpus = sorted({g for q in series for g in (q[4], q[6])})
        errs = [q[7] for q in series]
        lines.append(f"| {first[0]} | {first[1]} | {first[2]} | {first[3]} | {len(gpus)} | {gpus[0]}-{gpus[-1]} | "
                     f"{len(series)} | {last[7]:+.1f}% | {statistics.median(abs(e) for e in errs):.1f}% | "
                     f"{max(errs, key=abs):+.1f}% |")
    return lines


def scale_series(pairs) -> list[list[tuple]]:
    """``scale_projection``'s pairs grouped into series: the runs a chain of pairs links (one plan
    of one model in one source at several node counts), each series' pairs from its smallest run
    first."""
    parent: dict[str, str] = {}

    def root(run: str) -> str:
        while parent.setdefault(run, run) != run:
            run = parent[run]
        return run

    for pair in pairs:
        parent[root(pair[5])] = root(pair[3])
    groups: dict[str, list[tuple]] = {}
    for pair in pairs:
        groups.setdefault(root(pair[3]), []).append(pair)
    return [sorted(g, key=lambda q: (q[4], q[6])) for g in sorted(groups.values(), key=lambda g: min(g))]


def routing_pairs(cases) -> list[tuple]:
    """(forced-balance case, dropless case) pairs: one source's runs alike in everything but
    the routing, the one stating uniform (forced balance), the other on real data stating none."""
    def key(c):
        return (c.source_id, c.model, c.cluster, c.nodes, c.knobs)

    balanced = {key(c): c for c in cases if c.routing is not None and c.routing.distribution == "uniform"}
    return [(balanced[key(c)], c) for c in cases if c.routing is None and c.data == "real" and key(c) in balanced]


ROUTING_CONCENTRATIONS = (RoutingSpec(distribution="dirichlet").concentration, 3.0, 10.0)  # perfsim's default first


def _routing(cases) -> list[str]:
    """The routing model against measured imbalance: each pair's measured forced-balance /
    dropless throughput beside perfsim's, the dropless run priced under --routing dirichlet
    at its default concentration and two flatter ones. Nothing is fitted; the shipped stack."""
    pairs = routing_pairs(cases)
    lines = ["Routing imbalance (`--routing dirichlet[:A]`): runs measured twice, with forced-balance routing and "
             "dropless on real data, alike in everything else. Measured: forced-balance / dropless throughput; "
             "perfsim: the same ratio with the dropless run priced under a Dirichlet routing of concentration A "
             f"(the default {ROUTING_CONCENTRATIONS[0]:g} first, then flatter ones). A check of the routing model, "
             "not a fit: the reference set's dropless runs stay priced uniform (their routing is not stated)."]
    if not pairs:
        return lines + ["", "No such pair in the reference set."]
    lines += ["", "| source | model | seq | forced-balance run | measured | "
              + " | ".join(f"A = {a:g}" for a in ROUTING_CONCENTRATIONS) + " |",
              "| --- | --- | ---: | --- | ---: | " + " | ".join("---:" for _ in ROUTING_CONCENTRATIONS) + " |"]
    for fb, dl in pairs:
        flip = fb.metric == "step_time_s"  # a time: dropless / forced balance
        measured = dl.measured / fb.measured if flip else fb.measured / dl.measured
        base = predict(fb).predicted
        ratios = []
        for a in ROUTING_CONCENTRATIONS:
            skewed = predict(dataclasses.replace(dl, routing=RoutingSpec(distribution="dirichlet", concentration=a)))
            ratios.append(skewed.predicted / base if flip else base / skewed.predicted)
        lines.append(f"| {fb.source_id} | {fb.model} | {dict(fb.knobs)['seq']} | {fb.id} | {measured:.3f} | "
                     + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    return lines


def _memory(held) -> list[str]:
    """Per stack: the predicted per-GPU peak against the peaks the sources print, and the runs
    (all of which ran) predicted not to fit; memory is fitted to nothing."""
    lines = ["Memory per stack (issue 16: a run that ran must be predicted to fit; its peak compared where the "
             "source prints one; + = predicted above the printed peak):", "",
             "| stack | runs | printed peaks | median abs peak error | peak error range | predicted not to fit |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for stack in sorted({r.stack for r in held.results}):
        mine = [r for r in held.results if r.stack == stack]
        m = memory_stats(mine)
        spread = (f"{m['peak_median_abs_pct']:.1f}% | {m['peak_error_min_pct']:+.1f}% to {m['peak_error_max_pct']:+.1f}%"
                  if "peaks" in m else "- | -")
        lines.append(f"| {stack} | {len(mine)} | {m.get('peaks', 0)} | {spread} | {m['predicted_not_to_fit']} |")
    return lines


def _groups(held) -> list[str]:
    lines = ["| split | group | held-out MAPE |", "| --- | --- | --- |"]
    for key in ("stack", "family", "scale", "data"):
        lines += [f"| {key} | {g} | {m:.1f}% |" for g, m in held.by(key).items()]
    return lines


def _runs(held, shipped) -> list[str]:
    ship = {r.case.id: r for r in shipped.results}
    lines = ["| run | stack | measured | held-out error | shipped error | predicted to fit | peak GB predicted / printed "
             "| assumed |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in held.results:
        s = ship[r.case.id]
        lines.append(f"| {r.case.id} | {r.stack} | {r.case.measured:g} {r.case.metric} | {r.error_pct:+.1f}% | "
                     f"{s.error_pct:+.1f}% | {'yes' if s.fits else 'no'} | {_peak(s)} | {r.case.assumed} |")
    return lines


def _peak(result) -> str:
    printed = result.case.measured_peak_bytes
    shown = f"{result.peak_memory_bytes / 1e9:.0f}"
    return shown if printed is None else f"{shown} / {printed / 1e9:.1f} ({result.memory_error_pct:+.0f}%)"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _fitted_stacks(cases) -> str:
    """Which stacks the held-out protocol refits (two or more sources) and which keep assumed values."""
    sources = sources_by_stack(cases)
    fitted = [f"`{s}`" for s in sorted(sources) if len(sources[s]) > 1]
    single = [f"`{s}`" for s in sorted(sources) if len(sources[s]) == 1]
    text = f"{_listed(fitted) or 'No stack'}: two or more sources{' each' if len(fitted) > 1 else ''}, refitted leaving one out."
    if single:
        text += (f" {_listed(single)}: one source{' each' if len(single) > 1 else ''}, nothing to hold out, "
                 "so priced by the shipped profile, fitted to none of its runs.")
    return text


def section() -> str:
    cases, held, shipped = evaluate()
    lo, hi = ideal_range(cases, "moe")
    dlo, dhi = ideal_range(cases, "dense")
    med = held.median_abs_pct
    worst = max(abs(r.error_pct) for r in held.results)
    verdict = "met" if med <= TARGET_MEDIAN and worst <= TARGET_MAX else "not met"
    qwen = [100 * abs(r.peak_memory_bytes / r.case.measured_peak_bytes - 1) for r in shipped.results
            if r.case.measured_peak_bytes and "qwen3" in r.case.model]
    titan = [r.memory_error_pct for r in shipped.results if r.stack == "torchtitan" and r.case.measured_peak_bytes]
    dsv3 = [r for r in shipped.results if "deepseek-v3" in r.case.model]
    kimi = [r for r in shipped.results if "kimi" in r.case.model]
    unfit = sorted({dict(r.case.knobs)["mbs"] for r in kimi if not r.fits})
    dsv3_fit = (f"every DeepSeek-V3 run is predicted to fit" if all(r.fits for r in dsv3)
                else f"{sum(r.fits for r in dsv3)} of the {len(dsv3)} DeepSeek-V3 runs are predicted to fit")
    kimi_fit = (f"the Kimi-K2 runs at pdbs {', '.join(map(str, unfit))} are not ({len([r for r in kimi if not r.fits])} "
                f"of {len(kimi)}: 1.03 T x 16 B is 16.5 TB of the 64 GPUs' 18.4 TB before activations and the FSDP "
                "gathers' working buffers; that source must have used lower-precision states it does not state; "
                "validation/runs/SOURCES.md)" if unfit else "every Kimi-K2 run is predicted to fit")
    parts = [
        "## End-to-end: published training runs (issue 16)",
        "",
        "Generated by `validation/accuracy_runs.py`; reproduce with `perfsim validate --runs "
        "validation/runs/published.csv --loso` (held out) and without `--loso` (shipped profiles). Cases and "
        "sources: `validation/runs/SOURCES.md`. Error = (predicted - measured) / measured, closed form. "
        f"Fitted parameters (`maxtext`): {', '.join(params_for([c for c in cases if c.stack == 'maxtext']))}, "
        "the speed of the stack's kernels against the tuned tables and of the routed experts on each dispatch "
        "path with kernels of its own (bounded least squares on log error, "
        "`perfsim calibrate --runs`); every other speed, gap and overhead is the profile's.",
        "",
        f"Held-out median |error| {med:.1f}%, worst {worst:.1f}%: the issue's target (median <= {TARGET_MEDIAN:g}%, "
        f"every run within +-{TARGET_MAX:g}%) is {verdict}. {_fitted_stacks(cases)} Not fully blind: `maxtext`'s gradient reduction was set to not overlapped (a discrete choice, "
        "argued from the Kimi-K2 sweep's step growth with batch) after comparing both settings' held-out error "
        "on these two sources (about 29% overlapped vs 21% not), so that choice saw both sources. Unoverlapped "
        "FSDP parameter gathers as well (the same argument) were tried then and not kept (Kimi-K2 held out "
        "6.3% MAPE, DeepSeek-V3 14.4%, worst 46%); they were taken later with three other changes (last "
        "paragraph). Two structural additions (the library all-to-all's local "
        "regroup by expert, gradient clipping) were made while the Qwen3-235B runs' error was in view; they are "
        "physics the step contains in every stack, with no parameter fitted to a run. The capacity path's one-hot "
        "dispatch / combine einsums (MaxText dense_matmul: dense GEMMs of seq x top_k x capacity factor x hidden "
        "per token, `stack.moe.mask_einsum`) were added after these figures were seen; read from MaxText's code, "
        "they bring the DeepSeek-V3 sweep's measured cost per unit of capacity factor (0.35 ms per token) and "
        "its extrapolation to no capacity (0.34 ms) within 3% and 7% in-sample (0.32 and 0.45 ms without them), "
        "and move the fitted padded speed from 0.39 to 0.52, but the held-out median went from 8.9% to 13.1% "
        "(one Kimi-K2 speed now prices DeepSeek-V3's capacity factor 4 runs 13-16% slow; the GEMM tile choice "
        "makes Kimi-K2's dispatch einsum sensitive to its capacity slots' rounding, see validation/runs/SOURCES.md). Transformer Engine's "
        "FP8 weight caching (each weight cast once per step, `stack.fp8.weights_cast_once`, megatron-primus and "
        "nemo) was added from its documentation, and so was its norm-fused quantization (the norm in front of the "
        "QKV and MLP-up GEMMs writes their FP8 input, `stack.fp8.norm_fused_cast`); together they move the one FP8 "
        "run (MLPerf Llama-3.1-8B) from -11.0% to -7.4%. Memory-bound kernels at their measured bandwidth (the "
        "per-GPU `membound` tables of issue 14: norms, casts, activations and the other elementwise steps at the "
        "measured norm / rotary kernels' speed, 33% of the MI355X peak and 47% of MI300X's, never faster than a "
        "streaming copy) were added after these figures were seen, as the kernel measurements say, and `maxtext` "
        "refitted (padded 0.523 -> 0.553, dropless 0.238 -> 0.315): the held-out worst run went from 34.7% to "
        "30.6%, runs within 25% from 33 to 35 of 37, the median from 13.1% to 13.3%, and the MLPerf FP8 run from "
        "-7.4% to -23.6% (Transformer Engine's own elementwise kernels are not in the kernel data). Then, from "
        "Megatron-LM's arguments and Transformer Engine's documentation, delayed FP8 scaling (Megatron-LM's default "
        "--fp8-recipe: scales from earlier steps' amax history, so no amax pass before each cast, "
        "`stack.fp8.delayed_scaling`, megatron-primus and nemo): the MLPerf run -23.6% -> -20.0%.",
        "",
        "Last, four changes made together with these figures in view (the `maxtext` runs only move): (1) FSDP "
        "parameter gathers not overlapped (`maxtext` `[overlap] param_gather = false`: the Kimi-K2 step grows "
        "linearly from one sequence per device, 2.2 s per sequence on 15.2 s, where perfsim's unhidden gathers "
        "and gradient reduction come to 15.0 s); (2) the padded exchange carries every capacity slot, the static "
        "[experts, capacity, hidden] buffer (structure of every padded path, MaxText's EBCM einsum output and "
        "Megatron's drop-and-pad), so its bytes grow with the capacity factor; (3) the runs on Primus-Turbo's "
        "DeepEP priced by the profile's GPU-initiated dispatch kernel (`dispatch = mori`: a token once per "
        "rank, no local permute after it) instead of the library all-to-all, as the case records; (4) the "
        "fitted parameters are the kernels' speed and the dropless experts' speed "
        "(`perfsim.design.runs_fit.params_for`): MaxText's padded experts are batched dense GEMMs, so the "
        "padded-expert speed (which went to 1.7, faster than the dense GEMM table allows) is tied to the "
        "kernels' speed. Held out over the 31 MaxText runs: median 13.3% (then 7.5% with (1) alone, 6.5% with "
        "(3), 3.4% with (2)) and MAPE 12.3% -> 6.7%; the two sources alone now fit the same kernels' speed "
        "(1.193 each). The five real-data (C4) rows got worse (+5.8 / +1.3 / -6.7 / +25.8 / +15.8% -> "
        "+12.2 / +11.9 / +11.3 / +32.8 / +36.2%): the source attributes their slowdown to data loading and "
        "routing imbalance, neither of which perfsim models (uniform routing, no input pipeline); before, the "
        "fitted speeds absorbed part of it.",
        "",
        "In the same session the two NeMo 24.12 Llama-3 FP8 runs on H100 that `validation/reference_cases.csv` "
        "already held (priced there under `ideal`) joined the set as a second `nemo` source, so "
        "`nemo` is now refitted leaving one source out. The two sources disagree: under the shipped profile the "
        "H100 runs come out about 30% fast and the MI355X MLPerf run 20% slow, so a kernels' speed fitted on "
        "one (0.76 on H100, 1.25 on MI355X) prices the other 40-65% off. The profile's Transformer Engine "
        "savings (FP8 weight caching, norm-fused casts, delayed scaling, overlapped TP communication) are what "
        "separate `nemo` from `ideal` on H100 (+22% / +1% under `ideal`); which of them H100 does not get, or "
        "what the MLPerf submission's kernels do that the tables do not, perfsim cannot tell from three runs, "
        "and nothing was changed to close it. After these figures were seen, the FP8 backward casts were made "
        "what Transformer Engine runs (each GEMM's output gradient cast with its transpose, and the transpose of "
        "a norm-written FP8 input, instead of twice the forward cast; no weight recast): structure, no "
        "parameter; shipped MLPerf -20.0% -> -19.7%, NeMo H100 +31.7 / +30.0% -> +31.1 / +27.6%, `ideal` on "
        "them +9.7 / -10.4% -> +22.4 / +0.8% (the unfused down projection's backward cast had been counted "
        "on its 14k-wide input instead of its 4k-wide output gradient). Memory: NVIDIA's performance scripts "
        "reduce gradients in BF16 (grad_reduce_in_fp32 off; sourced in the `nemo` profile), so the 8B H100 run, "
        "predicted at 87 GB of 80 with perfsim's FP32-gradient default, is predicted to fit (71 GB), as it ran.",
        "",
        "Later, the same NeMo 24.12 page's three Llama-2 pretraining rows on H100 (7B on 8 GPUs, 13B on 16 with "
        "PP 4 VP 10, 70B on 64 with TP 4 PP 4 VP 20, all FP8, seq 4096) joined that source, so that it is "
        "the page's Llama pretraining table rather than the two rows the older reference file had picked; its "
        "GPT-3 and Nemotron rows are not cases (GPT-3's learned positions and GELU MLP, Nemotron's squared-ReLU "
        "MLP: perfsim has no preset for them). Under the shipped profile all five H100 rows come out 25-31% "
        "fast, across 7B-70B, CP 1-2, TP 1-4 and PP 1-4: one kernels' speed fitted to them alone (0.772) "
        "prices all five within 3%, so the gap is one H100-wide factor, not a plan-dependent one; the MLPerf "
        "MI355X run alone wants 1.251. Nothing was fitted to close it (the shipped `nemo` speed stays 1.0, "
        "assumed).",
        "",
        "Then, looking for what differs between the two GPUs with that gap in view: Transformer Engine runs "
        "each FP8 layer's dgrad and wgrad GEMMs with a split accumulator and only the forward with the fast "
        "one (its module/base.py: _2X_ACC_DGRAD = _2X_ACC_WGRAD = True, _2X_ACC_FPROP = False; torchao and "
        "XLA do the same), and Hopper's FP8 tensor cores lose speed for it (a torchao thread, pytorch/ao "
        "#2377, measures fast accumulation 1.1-1.2x faster: H100 / H200 `fp8_split_accumulator_speed` 0.87), "
        "while CDNA's FP8 instructions accumulate in FP32 (speed 1, assumed). A source-read mechanism and a "
        "measured speed, not a fit to these runs: shipped NeMo H100 +25..+31% -> +18..+25%, held out "
        "+55..+63% -> +46..+55%, the MLPerf run held out -37.8% -> -33.8% (shipped unchanged, -19.7%); a "
        "kernels' speed fitted to the H100 runs alone is now 0.822 (was 0.772). The rest of the H100 gap "
        "stays unexplained.",
        "",
        "Tenth session, a protocol change made with these figures in view: the kernels' speed is now a "
        "speed per GPU vendor where a stack's runs span vendors (`kernels.speed_amd`, `kernels.speed_nvidia`, "
        "`runs_fit.params_for`), because one stack runs different kernel libraries on each (cuBLAS / cuDNN / "
        "Transformer Engine CUDA on H100, hipBLASLt / CK / AITER / Transformer Engine ROCm on MI355X), and a "
        "speed measured on one vendor's runs is identified only for that vendor's GPUs "
        "(`runs_fit.identified`): a fold with no run on the held-out source's vendor prices it at the "
        "profile's assumed speed instead of carrying the other vendor's fit across. Only `nemo` spans two "
        "vendors; nothing is fitted to a held-out run and the shipped profiles are unchanged. Held out: NeMo "
        "H100 +45.8..+55.3% -> +17.6..+24.7%, the MLPerf MI355X run -33.8% -> -19.7% (their shipped figures: "
        "with one source per vendor there is nothing left to fit for either). The two ~20% gaps themselves "
        "(H100 fast, the MLPerf MI355X run slow) stay unexplained.",
        "",
        "Then the input pipeline, which the dropless source names (with routing imbalance) as the cause of "
        "its real-data slowdown, became a stack parameter (`[data] host_s_per_mtoken`: unhidden host seconds "
        "per million global-batch tokens per GPU, paid by runs with `data` = real, `--real-data`), fitted "
        "with the `maxtext` speeds where runs on real and on synthetic data are both present: 221 s per "
        "million tokens (about 6.3 s per step at 7 sequences of 4096 per device; the capacity rows alone "
        "show 4.7-5.1 s), kernels' speed 1.192 -> 1.26 and dropless speed 0.348 -> 0.364 (the real-data "
        "rows had pulled both down). Held out, the five real-data rows do not move: theirs is the only "
        "source with real data, so its fold prices them at the assumed 0 (`runs_fit.PRIORS`), and no "
        "held-out figure tests the fitted value; the Kimi-K2 source (fold fitted to the dropless source) "
        "3.1% -> 2.2% MAPE. Shipped, the dropless source 7.9% -> 4.4% MAPE (its real-data rows "
        "-8..+7%, the dropless ones still the slowest: routing imbalance is not modelled).",
        "",
        "Then the V-shape pipeline schedules (zbv, v-half, v-min: vpp 2, stage 0 holding the first layers "
        "and the LM head, backward split as in ZB-H1, 1F1B's activation memory, about half and about a third "
        "of it) let the Primus-pipeline source's six V-shape rows (Llama-2-7B zbv / v-half / v-min, "
        "Qwen3-235B v-half / v-min / zbv-formatted) become cases: 42 -> 48 runs. As Primus' zero-bubble "
        "scheduler builds them, zbv's order comes from a greedy list schedule over the priced passes' "
        "relative times and v-half's / v-min's from the paper's fixed blocks; four choices were made with "
        "these rows' figures in view (validation/runs/SOURCES.md), under the single-source `megatron-primus` "
        "stack whose values are assumed, nothing fitted. The new rows: -13.5 / -11.7 / -2.8% and +2.2 / "
        "-0.6 / +11.1%.",
        "",
        "Eleventh session, with `nemo`'s H100 gap in view: a second NVIDIA source for `nemo`, the NeMo 25.11 "
        "container's DGX-H100 pretraining rows (Megatron-Bridge's performance summary: Llama-3 8B and 70B, "
        "Llama-3.1-405B on 1,024 GPUs and Qwen3-30B-A3B, FP8-CS), so that each NVIDIA source is held out "
        "against a kernels' speed fitted on the other. Two changes were made with its first three rows' figures "
        "seen (validation/runs/SOURCES.md): the FP8 scaling recipe as a plan input (`fp8_recipe` current for "
        "FP8-CS, where the profile's recipe is delayed) and Transformer Engine's FP8 linear layers keeping their "
        "quantized inputs for the backward (`[fp8] saves_fp8_inputs`, read from TE's modules), after which the "
        "70B row fits in 80 GB without recompute as it ran (before: 89 GB, so `recompute auto` chose full "
        "recompute). The 405B row joined once perfsim could place uneven virtual stages under the interleaved "
        "schedule (its 126 layers over PP8 x VP8 as 1 + 62 x 2 + 1). Held out: NeMo 24.12 +17.6..+24.7% -> "
        "+3.0..+9.2%; the 25.11 dense rows -11.4 / -9.3 / +5.4% and its MoE row +52.8% (predicted too fast; "
        "unexplained). The MLPerf MI355X run stays the one AMD source of `nemo` (-19.7%; -19.4% with the FP8 primary "
        "weights its submission config sets, `fp8_params`, a plan input added then; -18.1% once `nemo` and "
        "`megatron-primus` price attention at AITER's asm v3 kernels' own table, which Transformer Engine ROCm's "
        "CK fused attention runs: `[kernels] attention_amd`, GPU `attention_libraries`, in-sample tables; "
        "`maxtext` too, TE JAX's CK attention per the Kimi-K2 source's own train_env.sh, its speeds refitted: "
        "held-out median 3.4 -> 3.6%).",
        "",
        "Twelfth session, with the MB2511-Q30B-H100 row's +52.8% in view (the search for H100 grouped-kernel "
        "measurements started from it): H100 had no grouped-GEMM table, so its experts were priced as dense GEMMs, "
        "unchecked. Two public H100 grouped-kernel measurements in the shared kernel data that an earlier rule had "
        "dropped became rows (tgale96/grouped_gemm PR #37 at Qwen3-30B-A3B's up_proj shape, VeOmni PR #460's MoE "
        "forward), and a grouped GEMM is now priced as one launch at the dense GEMM table with the grouped kernel's "
        "fitted speed against that price (the tokens-only efficiency table could not carry the experts' N and K: "
        "validation/data/kernels/SOURCES.md, round 10). Nothing was fitted to a run: the speeds come from kernel rows "
        "(H100 0.209 of the dense price, MI300X 0.910 forward / 0.721 backward; MI355X has no training grouped-kernel "
        "measurement, speed 1), and `maxtext` was refitted as before (kernels 1.254 -> 1.244, dropless 0.3636 -> "
        "0.3619). Held out: MB2511-Q30B-H100 +52.8 -> +9.2% (the two H100 sources disagree: a speed from VeOmni's rows "
        "alone gives +27.3%, from tgale96's alone -1.6%); `maxtext`'s dropless real-data rows +32.9 / +36.4 -> +29.4 / "
        "+33.1%. AITER's inference fused-MoE stage times were tried as MI355X's grouped speed and not kept (on MI300X "
        "they run at about half the training grouped GEMM's speed against the same dense price): with them the "
        "Qwen3-235B MI355X runs came to +2.7 / -5.4 / -6.7 / +1.1 / -2.4% and `megatron-primus`' median to 6.6%.",
        "",
        "Thirteenth session: an `mi350x` GPU profile (the MI355X die at a 2200 MHz peak clock and a 1000 W board "
        "limit; the MI355X kernel tables at its own peak, its clock under load assumed at the same ratio to peak) "
        "let the MLPerf source's second row, MLPERF51-L8B-MI350X, become a case (its config file not read: the "
        "MI355X submission's plan assumed). It was added as it came out (-5.0%), nothing fitted or changed for it. "
        "Measured, the MI350X run is 0.82 of the MI355X run's speed; perfsim, whose only difference between the two "
        "is the peak clock, predicts 0.95: if the 1000 W board holds its clock lower under load than the MI355X "
        "ratio assumes, that is where it shows, and the two rows' gap (-18.1% and -5.0%) says one kernels' speed "
        "cannot fit both.",
        "",
        "Fourteenth session: the Primus-pipeline source's last two rows, PIPE-Q235-06 / 07 (1F1B interleaved at "
        "VP3 / VP4, left out until then because 94 layers split evenly over neither), became cases with their "
        "layout assumed by the rule the V-shape rows use (the middle virtual stages equal, the first and last "
        "taking the rest: 7 + 10 x 8 + 7 and 5 + 14 x 6 + 5; Megatron-Core's --pipeline-model-parallel-layout can "
        "place either), decided before their figures were seen. They came out -17.3 / -17.1%: `recompute auto` "
        "chose full recompute of every layer, the plan without recompute needing 305 / 297 GB (the source prints "
        "287 / 279 GB) of the 288 GB. With those figures in view `recompute auto` became what a Megatron user "
        "sets at the memory edge: none, selective, then full recompute of the first N layers of each pipeline "
        "chunk for the smallest N that fits (--recompute-method block --recompute-num-layers N), then every "
        "layer. Held out: the two rows +6.3 / +5.0% (peaks 284 / 271 GB against 287 / 279 GB printed), "
        "`megatron-primus` 13 runs, median 9.1%; the Kimi-K2 rows MXS-KIMI-01 / 05 +0.9 -> +1.5% and +0.3 -> "
        "+1.0% (a block of layers recomputed where every layer was), every other run within 0.2 points. Then, read "
        "from the source (its list of settings Primus-pipeline requires: overlap_grad_reduce and "
        "overlap_param_gather false), the runs CSV gained `overlap_grad_reduce` / `overlap_param_gather` columns "
        "and the 13 Primus-pipeline rows set both false: the Qwen3-235B rows 0.1-0.2 points slower (their data-"
        "parallel gradient reduction exposed), the Llama-2-7B rows unchanged (no data parallelism); "
        "`megatron-primus` median 8.9%.",
        "",
        "Nineteenth session, two changes, both structure or source records, nothing fitted: (1) ZeRO gathers the "
        "embedding and LM head weights in the step's time as it does a layer's (ZeRO-1/2 with the updated weights, "
        "per-pass ZeRO-3 before the embedding's forward and the head's forward and backward): held-out median "
        "6.1 -> 6.0%, worst 33.0 -> 33.1%, every run within 0.3 points; (2) read from NeMo's and Megatron-Bridge's "
        "FP8 recipes (bf16_with_fp8_mixed, bf16_with_fp8_current_scaling_mixed: fp8_param_gather = True) with "
        "these figures in view, the nine NeMo / Megatron-Bridge H100 FP8 runs are recorded with FP8 primary "
        "weights and the `nemo` stack keeps them by default under FP8: within 0.3 points held out, their predicted "
        "peaks lower; memory then gained the FP8 weight copies a cast-once stack keeps through a step, and every "
        "FP8 run still fits (validation/runs/SOURCES.md). Then, structure: under per-pass ZeRO-3 the weights are "
        "gathered pass by pass, so their FP8 copies (casts, or FP8 primary weights' transposes) are made every "
        "microbatch, not once a step: MB2511-L8B-H100 (Megatron-FSDP) -12.3 -> -13.0% held out, the NEMO2412 rows, "
        "fitted on that source, +0.3 points; `nemo` median 8.7 -> 9.0%. The closed form's block templates had keyed "
        "the microbatch count only for cast-once stacks, so FP8 primary weights' transposes on other stacks were "
        "shared between batch sizes (an order-dependent answer, 1.8% on a Llama-3.1-8B plan); fixed.",
        "",
        "Twenty-first session, with the shipped figures in view: `nemo`'s NVIDIA kernels' speed is now fitted to the "
        "reference set (`kernels.speed_nvidia` 0.814, `perfsim calibrate --runs validation/runs/published.csv --stack "
        "nemo --fit kernels.speed_nvidia`, the nine H100 runs of its two NVIDIA sources), as `maxtext`'s speeds are: two "
        "sources inform it and the held-out check above tests that fit (a speed fitted on either source prices the other "
        "within 6-9% MAPE). Values one source informs stay as they were: assumed for `megatron-primus` and for `nemo`'s "
        "AMD speed and dropless experts, fitted in sample and flagged as untested for `maxtext`'s input pipeline. Held "
        "out nothing moves (each fold refits the speed; a fold without a run on a vendor now prices that vendor at the "
        "assumed speed, never the shipped fit: `runs_fit.PRIORS`); shipped, the NeMo H100 runs go from +7..+30% to "
        "-12..+10%.",
        "",
        "Twenty-second session: a first source for `torchtitan`, whose profile had no published run: torchtitan's "
        "performance page (December 2024; Llama 3.1 8B / 70B / 405B on 8-512 H100s, FSDP2, TP with and without "
        "AsyncTP, PP 1F1B and interleaved, CP 1-8 at 32k-256k tokens, Float8, torch.compile, full recompute), 12 "
        "cases, added before any of their figures was seen and fitted to nothing. Its H100s are 96 GB HBM2e parts "
        "at a 500 W power limit whose peak the page says it does not know (between the SXM's and NVL's): the cases "
        "run on a variant of `h100-ib` (`validation/runs/profiles/h100-grandteton.toml`, a profile naming a `base`), "
        "its clock assumed midway. Every run came out fast, most far outside 25% (rows below; context parallelism "
        "worst, growing with the CP degree); the page's two 8B tables at 8 and 128 GPUs, which would have checked "
        "projection across scale, use torchtitan's per-op selective recompute, which perfsim does not model, and are "
        "not cases. Likely causes, none fitted (validation/runs/SOURCES.md): torchtitan's attention was SDPA's "
        "FlashAttention-2 backend on H100 (pytorch/pytorch#142132), about half the speed of the FlashAttention-3 "
        "rows perfsim's H100 attention table is fitted to; the ring attention's per-chunk calls; the power-capped "
        "clock. With the figures in view the first of these was made the profile's: `torchtitan` names SDPA's flash "
        "backend as its NVIDIA attention library, priced at this project's own H200 FlashAttention-2 rows "
        "(`attention_libraries.sdpa_flash`; torchtitan PR #1196, pytorch/pytorch#142132), nothing fitted to a run: "
        "median |error| 79.6% -> 36.2%, the rows below; what is left grows with the CP degree and with AsyncTP (perfsim's "
        "TP overlap hides about four times the communication its measured 5.7% gain implies). Then a second "
        "torchtitan source on the same hosts, its Async TP benchmark (June 2025: Llama 3 70B on 256 H100s, vanilla "
        "and Async TP, BF16 and Float8; 4 cases, nothing changed for them), so `torchtitan` is refitted leaving one "
        "source out like `maxtext` and `nemo`, and ships the fit to both (`kernels.speed_nvidia` 0.7322, carrying "
        "the Grand Teton clock assumption; validation/runs/SOURCES.md): both sources ran one cluster, so the "
        "held-out figure checks a calibration across models, plans and builds there, not across clusters. Then "
        "torchtitan's per-op selective checkpointing became a recompute mode (`--recompute op`, read from its "
        "activation-checkpoint policy; dense layers), and four BF16 rows that use it became cases, among them the "
        "8B run on 8 and on 128 GPUs: the reference set's first model measured at two scales with one plan (the "
        "next-but-one table); the speed refitted on the 20 runs (0.7322).",
        "",
        "Twenty-third session, structure read from the implementation, nothing fitted but the speed: torchtitan's "
        "Async TP is PyTorch's micro-pipeline TP pass, which fuses a reduce-scatter only with the one matmul "
        "producing its input; torchtitan's Llama runs wq / wk / wv and w1 / w3 as separate matmuls, so the "
        "backward's reduce-scatters of the input gradients into them (sums of matmuls) stay blocking "
        "(`[overlap] tp_summed_dgrad = false`; validation/runs/SOURCES.md). The 8B Async TP row's held-out error "
        "+28.6 -> +21.9%; `kernels.speed_nvidia` refitted, 0.7322 -> 0.7444; `torchtitan` held-out median "
        "8.4 -> 9.8%, 20 of 20 within 25%. Then the H100 GEMM table gained a public sweep (OpenXLA's sm_90 matmul "
        "table, validation/data/kernels/SOURCES.md round 15) and the NVIDIA stacks' kernel speeds were refitted "
        "against it (`nemo` 0.8141 -> 0.8139, `torchtitan` 0.7444 -> 0.7413). Then, with these figures in view, "
        "`torchtitan`'s FP8 casts take torchao's own assumption for its compiled path: the abs-max of an activation "
        "or an output gradient is fused into the op that produced it, weights keeping their amax pass "
        "(`[fp8] amax_fused`; pytorch/ao benchmarks/float8/float8_roofline.py, whose authors note it does not always "
        "hold): its Float8 rows come out 2-4 points faster; `kernels.speed_nvidia` 0.7413 -> 0.7282; `torchtitan` "
        "held-out median 9.9 -> 8.4%, worst 22.9 -> 21.3%. Last, an FP8 abs-max with nothing to read runs no kernel "
        "(FP8 primary weights under current scaling, Megatron-Bridge's FP8-CS rows; the backward of a fused amax): "
        "both had been priced as empty launches; `nemo`'s speed refitted, 0.8139 -> 0.8111. Then `recompute auto` "
        "walks the settings the stack's framework offers (`[recompute] auto`): MaxText has one remat policy for every "
        "layer, so the Kimi-K2 rows at one sequence per device recompute every layer where a Megatron-style block of 57 "
        "was chosen before (MXS-KIMI-01 / 05 about 0.3 points slower); `maxtext`'s shipped speeds refitted (kernels "
        "1.244 -> 1.251, dropless 0.3619 -> 0.3701: mostly a drift earlier structure changes had left unrefitted).",
        "",
        "Twenty-fifth session, a kernel source re-read, nothing fitted to a run but `nemo`'s speed: the twelfth "
        "session's H100 grouped-GEMM table rested on tgale96/grouped_gemm PR #37 read as forward times, but its "
        "TFLOPS are forward FLOPs over the whole step its benchmark times (the forward, out.sum() and the dgrad and "
        "wgrad GEMMs; the author's run.log prints them beside \"Time per step\": validation/data/kernels/SOURCES.md, "
        "round 16), so its rows are now priced as forward plus backward plus the loss's two passes over the output; "
        "and VeOmni's MoE forwards timed whole (its routing-side work inside the timing) are checked, no longer "
        "fitted; and Transformer Engine's own H100 grouped GEMM (PR #2045: its multi-stream cuBLAS path, the one "
        "Megatron-Bridge runs by default, and the CUTLASS kernel the PR adds, at Qwen3-30B-A3B's expert shape, "
        "400-650 TFLOPS) joined as a kernel source. The H100 grouped speed went 0.206 -> 0.745 forward / 0.445 "
        "backward of the dense price. MB2511-Q30B-H100, whose +9.2% had come from that misread table, is +40.2% "
        "held out (+38.5% shipped): perfsim now prices Megatron-Bridge's Qwen3-30B-A3B step on H100 well faster "
        "than it ran, with its expert GEMMs at what Transformer Engine measures for that shape; what the step spends "
        "beyond perfsim's pricing is open. `nemo`'s NVIDIA speed refitted, 0.8111 -> 0.7905.",
        "",
        "Twenty-seventh session, new public data, added as found (validation/runs/SOURCES.md): the Megatron-Bridge "
        "performance-summary archive prints the DGX-H100 rows of the 25.09 and 26.02 containers beside 25.11's, so "
        "two `nemo` sources joined (25.09: Llama-3 8B / 70B, Llama-3.1-405B and Qwen3-30B-A3B / Qwen3-235B-A22B "
        "run with token drop; 26.02: Llama-3 70B, Llama-3.1-405B, Qwen3-30B-A3B, Qwen3-235B-A22B) and 25.11 gained "
        "its Qwen3-235B-A22B row, which the 25.11 page prints one column short: 75 -> 85 runs. Their DeepSeek-V3 row "
        "is not a case (a multi-token-prediction layer and a last pipeline stage without decoder layers). Read from "
        "the sources, before any figure: Megatron-Core picks the MoE path by the capacity factor, dropless without "
        "one and drop-and-pad with one (Megatron-Bridge's 25.09 token drop: factor 1.0, padded), and under "
        "drop-and-pad its dispatcher's split sizes are static, so it makes no device->host sync "
        "(`nemo` / `megatron-primus` `[moe] dispatch = capacity`; the host sync priced on the dropless path only). "
        "A protocol fix, also before: a dispatch path's routed-expert speed is identified only by runs on that "
        "path, so a fold whose other sources run no such path prices it at the prior 1.0 rather than at the "
        "profile's value (`runs_fit.identified`; no shipped profile had fitted a path only one source runs, so "
        "no figure moved). With `nemo`'s NVIDIA speed refitted (0.7905 -> 0.8106) the new rows came out: dense "
        "within -10..+9% held out; MB2511-Q30B-H100 +40.2% -> +12.8% (its fold now fits the dropless experts' "
        "speed on 26.02's MoE rows); MB2602-Q30B-H100 +66.7%, MB2509-Q30B-H100 -25.1%, and the 25.11 / 26.02 "
        "Qwen3-235B-A22B rows -37.2% / -32.2%, predicted too slow with about half of perfsim's step in the "
        "expert-parallel all-to-all (all runs: median 6.4% -> 6.5%, worst 40.2% -> 66.7%, within 25% 72/75 -> "
        "79/85). Then, with those figures in view, the recipes were read for what the step does: the 25.11 / "
        "26.02 Qwen3 H100 presets set moe_a2a_overlap (Megatron-Core's overlap_moe_expert_parallel_comm: its "
        "combined 1F1B runs one microbatch's forward of a layer beside another's backward, each pass's "
        "all-to-alls beside the other's compute; scripts/performance/configs/qwen3/workload_base_configs.py), "
        "which 25.09's token-drop runs did not. It became a plan input (`ep_comm_overlap`, `--ep-comm-overlap`, "
        "the runs CSV's `ep_comm_overlap` column, Megatron's switch in `--megatron-args`, a planner knob), priced "
        "in both estimators as each pass's all-to-alls off the chain from the layer's start (`stack.overlap."
        "ep_comm_share` of their bytes: 1, full concurrency as TP overlap is priced, nothing fitted), with "
        "Megatron-Core's own limits (vpp > 1 under a pipeline; no full recompute); the closed form plays those "
        "all-to-alls against the pass's own comm on shared links, max-min as the engine does (without it an FP8 plan "
        "of the estimators' sample came out 12% fast against the engine). The four rows that ran it "
        "record it. With it `nemo`'s speeds were refitted as the profile says (`kernels.speed_nvidia` 0.8396 and, "
        "two sources now running the dropless path, `moe.dropless_speed` 0.4559, which carries what NVIDIA names a "
        "regression of that path: its dropless Qwen3-30B-A3B runs of 25.11 about 2x slower than 25.09's token-drop "
        "ones, NVIDIA-NeMo/Megatron-Bridge issue #1998; 26.02 runs at 25.11's speed). Held out: the Qwen3-235B-A22B "
        "rows -37.2 / -32.2% -> -20.0 / -9.0%, MB2602-Q30B-H100 +66.7 -> +55.3%, MB2511-Q30B-H100 +12.8 -> -11.0%, "
        "`nemo` 17/21 -> 20/21 within 25%; all runs median 6.5 -> 6.4%, worst 66.7 -> 55.3%, 79 -> 82 of 85 "
        "within 25%. MB2509-Q30B-H100 (-24.6%) runs at 2 sequences per microbatch, where `recompute auto` "
        "recomputes every layer (without recompute perfsim needs 90 GB of 80; the 25.09 recipe found sets none at "
        "1 sequence); MB2511-Q30B-H100, at the same 2 sequences with moe_a2a_overlap, ran without full recompute "
        "(Megatron-Core refuses the two together), where perfsim's memory says it would not fit.",
        "",
        "Twenty-eighth session, memory in the units the hardware and the logs use, traced from that over-count "
        "before any throughput figure was looked at (validation/runs/SOURCES.md): GPU memory is binary (the spec "
        "sheet's 80 GB is 80 GiB, of which NVML reports 81,559 MiB = 85.52 GB on an H100; AMD's specification "
        "table lists MI300X / MI325X / MI355X VRAM as 192 / 256 / 288 GiB), so every GPU offered 7% more than "
        "perfsim had allowed; the Primus-pipeline rows' peaks are GiB (Primus logs rocm-smi's used VRAM / 1024^3), "
        "converted; and a layer no longer keeps a dropout mask's worth of residual (the presets train without "
        "dropout) or, under BF16, the attention output twice (flash attention's output is the output projection's "
        "input). Two limits of the expert-parallel overlap were built from Megatron-Core's code: the extra warmup "
        "forward it schedules (one more model chunk in flight) and its refusal of full recompute (`recompute auto` "
        "stops at selective beside it). MB2509-Q30B-H100 -24.6 -> -6.3% held out (it fits without recompute, as it "
        "ran); MB2511-Q30B-H100 keeps selective recompute and is predicted 86.05 GB of 85.52 (the one run of 85 "
        "predicted not to fit: the assumed 10% fragmentation budget is too large for it); the Qwen3-235B "
        "Primus-pipeline rows at VP3 / VP4 fit without recompute, as in the source (+3.8 / +2.6 -> +8.4 / +8.7%, "
        "peaks -5% against the printed device-level figures). Then, read from Megatron-Core's TEGroupedMLP: under "
        "FP8 each expert's token count is padded to a multiple of 16 (fp8_padding / fp8_unpadding, a copy of the "
        "routed tokens in and out, forward and backward: `[fp8] grouped_pad_align`), a cost twice as heavy against "
        "Qwen3-30B-A3B's narrow experts as against Qwen3-235B-A22B's. `nemo` refitted (0.8277, dropless 0.468). "
        "Held out: MB2511-Q30B-H100 +23.7%, MB2602-Q30B-H100 +27.0% (was +55.3%), the dropless Qwen3-235B rows "
        "-19.2 / -21.1%; all runs median 6.4 -> 6.5%, worst 55.3 -> 33.1%, 82 of 85 within 25%.",
        "",
        "Twenty-ninth session, a new source added as it came out, nothing fitted (validation/runs/SOURCES.md): "
        "the Megatron-MoE-ModelZoo's Qwen3-235B-A22B runs on 256 H100 (NVIDIA's Megatron-Core MoE team, named by "
        "the Megatron-Core MoE report, arXiv 2603.07685, for reproducing its runs), four plans that differ in "
        "where expert parallelism runs (EP32 across nodes with and without the all-to-all overlap, EP8 in a node "
        "under Megatron-FSDP or TP4 PP8), priced under `megatron-primus` (Megatron-LM's defaults; decided before "
        "the figures were seen: `nemo`'s values come from NVIDIA's NeMo performance scripts, and its fitted "
        "dropless speed, NVIDIA's named regression of two containers, would price them 12-110% slow). "
        "`megatron-primus` now spans both vendors, one source each: as a kernels' speed is one per vendor, a "
        "dispatch path's routed-expert speed in a held-out fold is now informed only by runs on the held-out "
        "runs' vendor (a change made with the first fold's figures in view: fitted on the H100 runs, it priced "
        "the Primus MI355X Qwen3 rows 30-47% fast), so both sources are priced at the assumed profile. "
        "Two of the runs recompute the MoE layer's norm and the experts' activation (Megatron's "
        "--recompute-modules layernorm moe_act), which perfsim's selective recompute (the attention core) could "
        "not express: Megatron-Core's recompute modules were built (`recompute_modules`: core_attn, layernorm, "
        "moe_act, mlp, moe), and those two runs fit as they ran (82 / 83 of 85.52 GB). MZ-Q235-H100-01 -1.1%, -02 "
        "(the overlap) +25.5% (the overlap saves 2.1 s where perfsim hides 5.8 s of all-to-all), -03 "
        "(Megatron-FSDP) -15.2%, -04 (TP4, EP8 in a node: the slowest run, ranked second fastest) +54.7%; the "
        "report's own H100 Qwen3-235B figure (Table 11, the zoo's later script for the -02 plan, with CUDA graphs) "
        "joined the source as -05, +9.6%.",
        "",
        "Thirtieth session, physics added with the ModelZoo runs' error in view, nothing fitted: the SMs DeepEP's "
        "dispatch and combine kernels hold while they run (20 of the H100's 132: DeepEP's Buffer.num_sms and "
        "Megatron-Core's moe_deepep_num_sms defaults; `compute_units` of a cluster's dispatch implementation), "
        "which the compute overlapped with them loses (the Megatron-Core MoE report names this contention as the "
        "cost of overlapping DeepEP); both estimators run that compute on the SMs left while an overlapped "
        "all-to-all is in flight, and the closed form reports it as `comm_interference`. It touches only runs "
        "with the all-to-all overlap on a dispatch that holds compute units (DeepEP on H100: MZ-Q235-H100-02 and "
        "-05): +25.5 -> +18.1% and +9.6 -> +3.2% held out. Then the ModelZoo page's long-context table joined its "
        "source as it came out (8 runs: Qwen3-235B-A22B at seq 16K-128K, TP4 with CP 1-8, forced-balance and "
        "dropless routing; model TFLOPS converted to tokens/s by Megatron-LM's own FLOP count, which reproduces the "
        "page's 4096-token rows): forced balance -11.1 to -0.7%, dropless +8.0 to +10.6%. Its pairs measure what "
        "dropless routing on real data costs, and `--routing dirichlet` at its default concentration (1, set in the "
        "first wave) reproduces each pair's ratio within 0.8% (the routing table below; concentrations 3 and 10, "
        "also tried, give too little); the dropless runs stay priced uniform, their routing not stated. Megatron's "
        "account-for-embedding/loss-in-pipeline-split became plan fields (a virtual stage may hold the embedding or "
        "the loss alone), so the page's A2A row (PP32 VPP3) joined as MZ-Q235-H100-06, as it came out: +32.8%, "
        "predicted not to fit (88.6 of 85.52 GB).",
        "",
        "Thirty-first session, memory structure with the Kimi-K2 runs in view (three of seven, which ran, were "
        "predicted not to fit: 324-354 GB of 309), nothing fitted: a stack's `[memory] gradient_buffer` says whether "
        "its gradients live in a buffer held through the step (Megatron-Core's DDP buffer, FSDP2's sharded grads: "
        "true, unchanged) or are temporaries of one compiled step (MaxText's jitted train step under XLA: false), "
        "where a step of one microbatch writes each layer's gradients as the backward frees that layer's "
        "activations, so its peak is the larger of the two rather than their sum (`lowering.memory.gradients_apart`; "
        "the report's `reused_bytes`). Every MaxText run here is one microbatch per step: all 31 now fit (peaks "
        "178-290 GB where they were 205-354), and no throughput moved (`--recompute auto` still picks full "
        "recompute for the Kimi-K2 runs). Then, with torchtitan's printed peaks in view (all 14 under-predicted, the "
        "8B long-context runs by 17-18%, whose head stage is the peak), its loss read from the code: eager "
        "F.cross_entropy on the FP32-cast logits, whose log_softmax backward holds its saved FP32 output, the "
        "incoming gradient and the input gradient at once, 12 B a logit where perfsim's default (Megatron-Core's "
        "fused in-place loss) counts 8 (`torchtitan` `[memory] logit_bytes`): those four runs come to +2 to +3%, the "
        "two torch.compile runs (-4 / -3%) to +8 / +11%, and the 70B TP runs -31 / -27% to -19 / -14%; the 405B "
        "runs peak on a stage without the head and do not move; no throughput moved. Then, found while tracing "
        "MZ-Q235-H100-06's not fitting, the interleaved schedule's activation memory walked as Megatron orders it: "
        "perfsim had scaled the first stage's in-flight microbatches (Narayanan'21) by pp - stage for the later "
        "stages, but Megatron's interleaved warm-up is (pp - rank - 1) x 2 + (vpp - 1) x pp chunk forwards, so a "
        "later stage holds nearly what the first does (pp 8, vpp 4: the last stage 25 layer-microbatches where "
        "perfsim counted 4.9); each chunk now weighs the layers it holds, so a virtual stage holding the embedding "
        "alone weighs nothing (`schedules.interleaved_peak`). MZ-Q235-H100-06 does not gain (89 -> 90 GB): the "
        "interleaved runs' peaks rise 2-9 GB, the Qwen3-30B rows at PP2 VP24 most (their last stage holds about two "
        "microbatches beside the logits): MB2511-Q30B-H100 86 -> 95 GB (still predicted not to fit) and "
        "MB2509-Q30B-H100 no longer fits without recompute (97 GB), so `--recompute auto` takes full recompute and "
        "it moves -6.3 -> -24.7% held out. Those runs ran, so perfsim over-counts their MoE layers' activations "
        "or its assumed 10% fragmentation, which the old formula's under-count of the last stage hid; not mended. "
        "`nemo` refitted in sample as its protocol says (kernels.speed_nvidia 0.8277 -> 0.8383, dropless 0.468 -> "
        "0.462: that run now priced with full recompute).",
        "",
        "Thirty-second session, that over-count traced in Megatron-Core's code, nothing fitted: perfsim kept each "
        "routed token twice (the up projection's input and a hidden-width copy that a combine weighing the experts' "
        "output by the router's probabilities keeps for their gradient, as MaxText's unpermute does), but "
        "Megatron-Core weighs them inside the experts' activation (TEGroupedMLP's weighted SwiGLU, which keeps only "
        "the up projection's output) and its alltoall dispatcher's permute, all-to-all and unpermute keep no tokens, "
        "so a Megatron-Core MoE layer keeps each routed token once (`[memory] routed_probs_copy` false: `nemo`, "
        "`megatron-primus`). Every run now fits as it ran (MB2511-Q30B-H100 95 -> 84 GB of 85.52, MZ-Q235-H100-06 "
        "90 -> 71 GB); MB2509-Q30B-H100 fits without recompute again (-24.7 -> -2.6% held out), MB2511-Q30B-H100, "
        "which kept selective recompute, now keeps none (+23.7 -> +26.8%); `nemo` refitted in sample as its protocol "
        "says (kernels.speed_nvidia 0.8383 -> 0.826, dropless 0.462 -> 0.4644). The Primus-pipeline Qwen3-235B "
        "peaks, device-level readings (rocm-smi's used VRAM: the caching allocator's reserve and RCCL / HIP buffers "
        "beside the tensors), move from -16..-6% to -22..-16% below the printed figures; perfsim counts neither those "
        "buffers nor a reserve beyond its assumed 10% fragmentation, and no measurement here separates them. Then, "
        "read from torchtitan's tensor-parallel plan with its 70B TP rows' peaks in view (-19 / -14%): DTensor's "
        "PrepareModuleInput gathers each block's attention and feed-forward input to the whole sequence before the "
        "column-parallel linears, whose matmuls keep it (in FP8 under torchao's float8 tensor parallelism), where "
        "Megatron / Transformer Engine keep the sequence shard (`torchtitan` `[memory] tp_gathered_inputs`): a "
        "recomputed layer's rerun holds it, so the TP rows' peaks rise 1-2 GB (70B -19 / -14% -> -17 / -12%, 405B "
        "about one point); no throughput moved.",
        "",
        "Thirty-third session, a kernel-table assumption replaced, with these figures in view: MI355X had no "
        "grouped-GEMM table (its public grouped-kernel tables are held back), so its grouped expert GEMMs ran at "
        "speed 1, as one dense launch of the same work, which every GPU with grouped measurements contradicts "
        "(MI300X 0.91 forward / 0.72 backward, H100 0.74 / 0.44, H200's torch._grouped_mm 0.87 / 0.80 against their "
        "own dense price). MI355X (and MI350X with it) now takes MI300X's grouped tables, the previous generation of "
        "the same vendor's grouped kernels, as speeds against its own dense price (validation/accuracy_kernels.py "
        "`GROUPED_FROM`; `derived` in `perfsim list --provenance`). Round 5 of the kernel work had tried the same "
        "and not kept it (validation/data/kernels/SOURCES.md): MaxText's capacity path, batched einsums, was then "
        "priced with the grouped table too; it is priced at the dense table now. The Primus-pipeline Qwen3-235B "
        "MI355X runs, priced at the stack's assumed speeds, move 2-8 points slower (+12.7 / +10.5% -> +6.9 / +2.2% "
        "the largest); `maxtext` refitted in sample as its protocol says (dropless 0.3701 -> 0.4188: its ragged "
        "experts' speed is now against the grouped table, kernels 1.251 unchanged, input pipeline 219.7 -> 219.3 s "
        "per million tokens), which moves its held-out median 3.3 -> 4.6% and DROPLESS-DSV3-23 / 24 +28.9 / +33.1% "
        "-> +28.0 / +30.9%. The AITER fused-MoE stages on MI355X, which inform no table, move 28.7 -> 26.8% (BF16). "
        "Then, read from Megatron-Core's code, nothing fitted: under the expert-parallel all-to-all overlap its "
        "combined schedule merges each steady step's forward and backward layer by layer (schedule_chunk_1f1b: "
        "the forward chunk's layer i beside the backward chunk's layer n - 1 - i), so the one more warm-up forward "
        "it runs leaves the peak one layer above the schedule's own, where perfsim had held one more chunk (a whole "
        "microbatch without a pipeline: a Qwen3-30B-A3B TP1 PP1 EP16 BF16 plan on 16 H100 under `megatron-primus` "
        "came out at 98 GB, not fitting, now 74 GB, where NVIDIA's Megatron-Bridge run of it with the overlap printed "
        "62.2 GiB, 66.8 GB, peak allocated: NVIDIA-NeMo/Megatron-Bridge PR #5123, a 26.08 container, not a case). The "
        "overlapped runs here lose under 1 GB (MZ-Q235-H100-02 / 05 68.5 -> 67.6 GB); no throughput moved. Then, from "
        "the same schedule, nothing fitted but `nemo`'s speeds by its protocol: the overlap's time. Its merged step "
        "runs the two passes' blocks in pairs on two streams (the forward's attention beside the backward's combine, "
        "the backward's experts beside the forward's dispatch, the forward's experts beside the backward's dispatch, "
        "the backward's attention beside the forward's combine), each all-to-all waiting for the compute that feeds "
        "it, so each pair lasts the longer of its two; perfsim had hidden a pass's all-to-alls behind the whole "
        "pass. Each all-to-all now runs beside its block: the overlapped runs move little (MZ-Q235-H100-02 +18.1 -> "
        "+17.9% shipped, the NeMo Qwen3-235B rows about 4 points slower before the refit); `nemo` refitted in sample "
        "(kernels.speed_nvidia 0.826 -> 0.8212, dropless 0.4644 -> 0.4874).",
        "",
        "Thirty-fourth session, two estimator changes, nothing fitted but `nemo`'s speeds by its protocol: (1) each "
        "MoE layer draws its own routing (a skewed routing's seeds `seed` to `seed + layers - 1`; a layer waits for "
        "its own busiest EP rank, a rank's memory holds its share over all layers), so a skewed prediction no longer "
        "rests on one draw (DeepSeek-V3 on EP 64 under `dirichlet`: max / mean tokens per rank 2.04-3.50 over 20 "
        "seeds with one draw for every layer, 2.49-2.54 now); no published run has a skewed routing, and the "
        "routing table above moves (the ModelZoo pairs within 1.9%, 0.8% from seed 0's single draw); (2) both "
        "estimators extend a long step from short ones only once its growth per group of microbatches repeats "
        "(`pipeline.steady_window`): extended from the warm-up's first two groups, some interleaved plans read a "
        "transient, up to 9.8% off the engine's full simulation (the closed form vs engine section). Among "
        "the runs the `nemo` rows with many microbatches move by hundredths of a point; `nemo` refitted "
        "(kernels.speed_nvidia 0.8212 -> 0.8218, dropless 0.4874 -> 0.4856): MB2511-Q30B-H100 +29.2 -> +29.4% held "
        "out, the `nemo` median 6.7 -> 6.6%.",
        "",
        "Thirty-fifth session, a capability, the case it let in (added as it came out) and a stack profile per "
        "container family: multi-token prediction (`--mtp-layers`, Megatron's --mtp-num-layers: each MTP layer a "
        "layer like the model's last plus its embedding, norms and 2h -> h projection, and one more LM head and loss) "
        "and Megatron's custom pipeline layout (`--pipeline-layout`, --pipeline-model-parallel-layout). The 25.09 "
        "Megatron-Bridge summary's DeepSeek-V3 H100 row (1,024 GPUs, TP2 PP8 VP4 EP64, one MTP layer, layout "
        "'Et|(tt|)*30mL', DeepEP, dropless and force-balanced), left out until perfsim could express both, joined its "
        "source as MB2509-DSV3-H100: -27.6% under the shipped `nemo`, whose dropless speed (0.4856) was fitted to "
        "the 25.11 / 26.02 containers' dropless runs, which carry the regression NVIDIA names (Megatron-Bridge #1998) "
        "and 25.09 predates (at dropless speed 1, the prior, +3.8%). One dropless speed for the three containers would "
        "fit none of them (refitted with the row in: the row -27.8%, the 25.11 / 26.02 Qwen3-30B-A3B rows +29 -> +43% "
        "held out). So the 25.11 / 26.02 rows now run under `nemo-25.11`, a profile based on `nemo` (a stack profile "
        "may name a `base` and hold only what differs) with its own dropless speed, `perfsim calibrate --runs "
        "validation/runs/published.csv --stack nemo-25.11 --fit moe.dropless_speed` (0.4883); `nemo` keeps the "
        "24.12 and 25.09 rows, its dropless and padded speeds at the prior (one source runs each) and its NVIDIA "
        "speed refitted by its protocol on its own rows (`--fit kernels.speed_nvidia`: 0.8218 -> 0.8157, which "
        "`nemo-25.11` inherits). MB2509-DSV3-H100 +1.6% held out; the `nemo-25.11` rows as before (Qwen3-30B-A3B "
        "+29%, Qwen3-235B-A22B -22 / -24%: one dropless speed still cannot price both models).",
        "",
        "Thirty-sixth session, structure read from Megatron-Core, nothing fitted but the stacks' speeds by their "
        "protocols: (1) the last two of its --recompute-modules, `mla_up_proj` (MLA's query / key / value up "
        "projections and their rope run under an output-discarding checkpoint: q, k and v are dropped once the "
        "attention has run and rebuilt from the kept latents in front of its backward) and `shared_experts`, are "
        "modelled, and a re-run FP8 GEMM casts its input again (the casts in front of it were left out of every "
        "module's rerun); MB2509-DSV3-H100's recipe recomputes mla_up_proj, until then recorded as not modelled: "
        "its peak 77 -> 59 GB of 85.5, its error +1.6 -> +0.7% held out; (2) the shared experts run as the tensor-"
        "parallel MLP Megatron-Core's SharedExpertMLP is (column-parallel up, row-parallel down: the sequence-"
        "parallel all-gather in front and the reduce-scatter after, each rank's share of the width over the whole "
        "sequence; before, each rank ran the whole width on its sequence shard with no TP collective, and no "
        "activation step), so a TP plan of a model with shared experts pays their gather and scatter: "
        "MB2509-DSV3-H100 (TP2) -> -1.3% held out, +0.3% shipped. Refitted: `nemo` kernels.speed_nvidia 0.8157 -> "
        "0.818, `nemo-25.11`'s dropless speed 0.4883 -> 0.4886 (MB2511-Q30B-H100 +29.2 -> +29.5% held out), "
        "`maxtext` kernels.speed 1.251 -> 1.253 (its DeepSeek-V3 and Kimi-K2 runs at TP 1 gain the shared experts' "
        "activation step only); the other runs within 0.2 points.",
        "",
        "Thirty-seventh session, new public data (validation/runs/SOURCES.md): the Megatron-Bridge performance "
        "archive of the 26.06 release prints the DGX-H100 rows of the 26.02.01, 26.04, 26.04.01 and 26.06 containers; "
        "the 12 rows perfsim has presets for (Llama-3 70B, Llama-3.1-405B, Qwen3-30B-A3B, Qwen3-235B-A22B) are one "
        "source, `megatron-bridge-perf-summary-26.02.01-26.06` (the same recipes re-run on the same systems: a "
        "container held out beside its near-identical twins would not be held out). 26.02.01 re-ran 26.02's "
        "Qwen3-30B-A3B layout at 9,058 tokens/s/GPU where 26.02 printed 5,113: the dropless regression NVIDIA named "
        "(Megatron-Bridge issue #1998) is gone, so the rows run under `nemo`, not `nemo-25.11`; from 26.04 that "
        "model runs EP16 on the HybridEP flex dispatcher, priced by the H100 profile's DeepEP table. Blind, under "
        "the shipped `nemo` profile (its dropless speed at the prior 1.0, nothing fitted to these rows): MAPE 6.2%, "
        "every row within -8.8..+15.9%. Then refitted by the profile's protocol, two `nemo` sources now running the "
        "dropless path: kernels.speed_nvidia 0.818 -> 0.8354, dropless speed 1.0 -> 0.8722; `nemo-25.11`'s dropless "
        "speed 0.4886 -> 0.4756 on top of it. The 24.12 and 25.09 rows move by up to +3.7 points held out "
        "(NEMO2412-L2-70B-H100 +8.0 -> +9.9%, MB2509-L405B-H100 +5.0 -> +8.7%). Then structure read from the "
        "frameworks, nothing fitted: the word-embedding copy an MTP stage holds has its gradients all-reduced with "
        "the first stage's over Megatron-Core's embedding group before the optimizer (MB2509-DSV3-H100 -3.96 -> "
        "-4.03% held out; `nemo`'s dropless speed 0.8721 -> 0.8722 refitted); a benchmark's balanced gate (NeMo "
        "AutoModel's FakeBalancedGate: each token's top-k one block of expert ids) is the routing `blocked`, and "
        "gradient accumulation run as separate pipeline schedules (torch.distributed.pipelining) is "
        "`pipeline_flushes`: no run here uses either (AutoModel's published rows, found this session, are not "
        "cases yet: validation/runs/SOURCES.md).",
        "",
        "Thirty-eighth session, new public data, a stack profile and sliding-window attention (validation/runs/"
        "SOURCES.md). (1) NeMo AutoModel's performance summary (DeepSeek-V3 on 1,024 and 256 H100, Kimi-K2 on 256, "
        "Qwen3-30B-A3B on 8; BF16, mock data, the fake balanced gate, no gradient clipping) joined as one source "
        "under a new stack, `automodel` (FSDP2, Transformer Engine layers, DeepEP, torch.distributed.pipelining; "
        "based on `nemo`, whose Transformer Engine kernels and fitted NVIDIA speed it shares): BF16 weights, "
        "gradients and Adam moments with no FP32 master, weights gathered once a step (reshard_after_forward false, "
        "the MoE models' MoEFSDPSyncMixin), the loss unfused, the experts at the prior speed 1, each read from "
        "AutoModel's code with session 37's blind figures under `nemo` known (DeepSeek-V3 +5.7 / -7.5%, Kimi-K2 "
        "-3.4%, Qwen3-30B-A3B -23.5%; the DeepSeek-V3 256-GPU plan then at 88 GB of 80); the runs CSV gained "
        "`clip_grad`. Priced by its shipped profile, fitted to none of its runs: +15.4 / -0.7 / +3.8 / -18.7%, "
        "every run predicted to fit. (2) Sliding-window attention (model fields `sliding_window`, "
        "`full_attention_every`; Hugging Face `layer_types`): a windowed layer's attention core does the band's "
        "work (W - W^2 / 2S keys per query, the kernel at its efficiency over W keys), a template of its own in both "
        "estimators; presets `gpt-oss-20b` / `gpt-oss-120b` (128-token windows on every other layer). The GPT-OSS "
        "rows of two sources joined as they came out: AutoModel's 20B on 8 GPUs +0.8%, 120B on 64 +8.5%; "
        "Megatron-Bridge's DGX-H100 GPT-OSS-120B rows of 26.02.01 / 26.04 / 26.04.01 +3.4 / +6.5 / +6.2% under "
        "`nemo`, and of 26.02 -29.4% under `nemo-25.11`. (3) With those figures in view, `nemo-25.11` narrowed to "
        "the regression NVIDIA names: Megatron-Bridge issue #1998 is titled for Qwen3 30B's dropless path, and "
        "across its fix (26.02 -> 26.02.01) Qwen3-30B-A3B went 5,113 -> 9,058 tokens/s/GPU while Qwen3-235B-A22B "
        "(1,633 -> 1,611) and GPT-OSS-120B (5,993 -> 5,984) did not move, so only the two Qwen3-30B-A3B rows of "
        "the 25.11 / 26.02 containers run under `nemo-25.11` and their other rows under `nemo`. Refitted by the "
        "profiles' protocols: `nemo` kernels.speed_nvidia 0.8354 -> 0.8369, dropless speed 0.8722 -> 0.825; "
        "`nemo-25.11`'s dropless speed 0.4756 -> 0.338. Held out: the 25.11 / 26.02 Qwen3-235B-A22B rows -21.5 / "
        "-24.3% -> +7.3 / +4.6%, the Qwen3-30B-A3B rows +29.7 / +28.6% -> -0.3 / +0.3% (one model's regression in "
        "two containers, each fitted on the other: it says the defect is the same in both, not that perfsim "
        "models it), the later containers' Qwen3-30B-A3B rows 2-7 points slower (MB260401-Q30B-H100 -3.4 -> "
        "-10.0%).",
        "",
        "Thirty-ninth session, new public data under a new stack, added as it came out (validation/runs/SOURCES.md): "
        "MosaicML llm-foundry's MPT training benchmarks on H100 (52 BF16 rows: MPT-760M to MPT-70B, 8-64 GPUs, seq "
        "512-65,536, FSDP FULL_SHARD, activation checkpointing on or off), with presets `mpt-350m` ... `mpt-70b` "
        "(GELU MLP, LayerNorm, tied embeddings; `ModelSpec.rotary` false for their learned positions, so no rope "
        "pass) and a `composer` profile read from Composer's and llm-foundry's 2023 code before any figure was "
        "seen (FSDP1 per-pass gathers, a gradient reduce-scatter every microbatch, the FP32 shard as master, "
        "flash-attn's fused loss, eager host costs as nemo's, attention at the FlashAttention-2 table and the "
        "kernels' speed at the prior 1, all assumed where not read). Priced blind: every row too fast, median "
        "+44.4% (+23 to +78%), 12 of 52 predicted not to fit; the memory miss traced with the figures in view to "
        "the loss's logits (flash-attn's CrossEntropyLoss keeps BF16 logits and writes a BF16 gradient: "
        "`logit_bytes` 4), after which all fit and no throughput moved. The level was left as it came out: a "
        "one-parameter in-sample diagnostic, not shipped, fits these rows' NVIDIA speed at 0.686 (rms log error "
        "9.1%), beside torchtitan's 0.728 and nemo's 0.837 fitted on their own sources. Then, in the same session, "
        "new public data for `nemo`, added as it came out: NVIDIA's DGX Cloud benchmark recipes "
        "(NVIDIA/dgxc-benchmarking; five releases, 24.11 to 25.05, each one source: NeMo step times on DGX H100 "
        "for GPT-3 175B, Nemotron-4 15B and 340B and Llama 3.1 8B / 70B / 405B, BF16 and FP8, each at every printed "
        "scale from 8 to 2,304 GPUs, 176 rows; throughput by the READMEs' own formula from the printed step time) and "
        "the NeMo 24.12 page's GPT3-175B and Nemotron-340B rows (presets `gpt3-175b`, `nemotron4-15b`, "
        "`nemotron4-340b`). Under the shipped profile, before any refit: the DGX Cloud rows' step times 0-23% "
        "shorter than measured on GPT-3 and Nemotron (MAPE 9.8%) and within 12% on Llama (MAPE 5.7%), the 24.12 "
        "page's three +10.3 / -0.5 / +8.4%. The recipes' MaxText Llama rows are not cases: at 64 nodes and up the "
        "recipe shards FSDP over 16 nodes and replicates beyond (HSDP), and its remat policies save named "
        "projections, neither of which perfsim models. Refitted by the profile's protocol (nemo over its 213 H100 "
        "runs): kernels.speed_nvidia 0.8369 -> 0.7858, moe.dropless_speed 0.825 -> 0.915 (the experts' price is the "
        "product of the two); `nemo-25.11`'s dropless speed 0.338 -> 0.3654.",
        "",
        "Fortieth session, a second source for `composer`, added as it came out (validation/runs/SOURCES.md): a "
        "later revision of llm-foundry's benchmark README (c90b9b3) prints an 'H100 80GB BF16 (Large Scale, >= 128 "
        "GPUs)' table, a separate campaign: 18 runs of MPT-1B to MPT-70B on 128, 256 and 512 H100s at seq 2048 "
        "(SHARD_GRAD_OP, as ZeRO-2, for 1B and 3B). Priced under the shipped profile before any fit: every row too "
        "fast, median +39.4% (+27.5 to +58.5%). With two sources the stack is fitted and held out by source like "
        "the others, by its default protocol (kernels.speed_nvidia, added to the profile at the prior 1): 0.6918 over "
        "its 70 runs, near the in-sample 0.686 of the 52-row table alone. Measured, throughput per GPU falls 4-10% "
        "from 128 to 512 GPUs; perfsim's stays flat. Then new public data for `torchtitan`, added as it came out: "
        "Trainy's H200 benchmark in torchtitan's benchmarks/ (Llama 3.1 8B on 32 and 64 H200, torch.compile, Float8 with "
        "FP8 all-gathers, per-op checkpointing: a third source, the stack's first on a standard Hopper part) and the "
        "Float8 rows of torchtitan-perf-2412's Tables 1 and 3, all with per-op checkpointing priced as in BF16 (what "
        "torch.compile keeps of the Float8 matmuls, which the policy's save list does not name, is not stated: "
        "assumed). Under the shipped profile: -8 to -14%, too slow as the stack's other Float8 rows. Refitted by "
        "protocol over the 24 runs: kernels.speed_nvidia 0.7282 -> 0.7452. And a twelfth source for `nemo`: the NeMo "
        "repository's performance summary for the 24.07 container (eight FP8 pretraining rows, each the model and plan of "
        "a 24.12 page row, an earlier container), priced under the shipped profile at -4.7 to +3.8% (MAPE 2.8%).",
        "",
        "Forty-first session, kernel data and a protocol made explicit, nothing fitted to a published run but by the "
        "stacks' protocols: cuDNN frontend's committed H200 prefill sweep (cuDNN 9.27.0 causal GQA forward attention, "
        "the 24 rows with equal query and key lengths) joined the kernel data as a second H200 attention family "
        "(validation/data/kernels/SOURCES.md), and, being cuDNN rows, the in-sample cuDNN attention table Transformer "
        "Engine stacks name; the published runs under `nemo` and `megatron-primus` moved by under 1 point (the "
        "ModelZoo's 32k-128k rows up to 2.7 points faster), and `nemo` was refitted by its protocol (kernels.speed_nvidia "
        "0.7858 -> 0.7844, dropless 0.915 -> 0.9168). A launch-fill term for every attention table (a launch of few "
        "tiles runs below the plateau), which the kernel rows support, was tried and not kept: it let the tables' "
        "plateaus rise, and the long-context runs, already priced fast, came out 10-17 points faster (`composer` 69 -> "
        "65 of 70 within 25% held out, `torchtitan` 24 -> 22 of 24). Each stack profile now states the parameters its "
        "shipped values were fitted on (`[calibration] fit`), which `calibrate --runs` and these folds free by default: "
        "`nemo`'s folds had freed five parameters (an AMD speed, the padded experts, the input pipeline besides the "
        "two it ships fitted); with its two, its held-out errors move under 0.05 points.",
        "",
        "Forty-second session, new public data priced blind first and fabric physics set with a new check series in "
        "view, nothing fitted to a published run but by the stacks' protocols. Two sources joined `nemo`: three MLPerf "
        "Training v5.1 llama31_8b runs of NVIDIA's NeMo code by other submitters (Cisco 64 and 128 H100, HPE 64 H200; "
        "plans from their config files), blind +9.6%, +52.3% and +6.1% (the 128-GPU TP2 run measured 1.38x the "
        "64-GPU run's samples/s where perfsim prices 1.92x: not explained), and NeMo's long-sequence page (Llama-2-7B "
        "FP8 with context parallelism on 8-1,024 H100, 8K-1M tokens, NeMo 24.03), its TFLOPS converted by the FLOP "
        "count that reproduces the NeMo 24.07 summary's own Llama-2-7B row, blind +2.1% at 8K rising to +46.7% at 1M: "
        "long-context training on H100 is priced fast, as the `composer` and `torchtitan` long rows had suggested (the "
        "cuDNN attention table is fitted to cuDNN 9.27's kernels, late 2025, and NeMo 24.03 ran early-2024 ones; no "
        "measurement here separates the kernels' age from the rest). Before them, a held-out NVIDIA multi-node "
        "all_reduce series with small and mid sizes (Voltage Park, 4 x 8 H100, InfiniBand) came out 33% / 43% fast at "
        ">= 1 MB / below on the IB profile, whose NIC ramp was flat below its one measured knot: the IB ramp now takes "
        "the Pollara fit's shape below 64 MB and a tree's network step NCCL's own tree hop latency (docs: the fabric "
        "section), which moved the published runs by under 1.1 points. `nemo` was refitted by its protocol twice "
        "(kernels.speed_nvidia 0.7844 -> 0.7856 after the fabric change, -> 0.7752 with the two sources; dropless "
        "0.9168 -> 0.9148 -> 0.9355), which moves its other NVIDIA runs about 1.3 points slower.",
        "",
        "Forty-third session, fabric physics from two new public MI355X + Pollara multi-node sources (docs: the fabric "
        "section), nothing fitted to a published run but by the stacks' protocols. Priced blind, perfsim's selector "
        "picked a hierarchical reduce-scatter / all-gather RCCL does not have (35-55% fast below 1 MB) and RCCL's "
        "all-to-all came out about 2x slow (its NIC efficiency had come from an acceptance threshold); the Pollara "
        "profiles now keep to RCCL's algorithms, pay RCCL's network post overhead per ring step, and take a fitted "
        "all-to-all efficiency. The newer RCCL (2.27+) also ran 20-60% faster at 2-32 MB than the ramp fitted to the "
        "older AAC14 sweep: refitting the Pollara profiles to it moved `maxtext`'s held-out median 4.6% -> 6.6% and "
        "priced the Kimi-K2 sweep less consistently (one run's fitted speed priced the others within 21%, against 8% "
        "on the older ramp), so the newer ramp is a profile of its own (`mi355x-pollara-rccl227`) and the runs stay on "
        "the older generation their 2025 containers ran (assumed; their sources print no RCCL version), a choice made "
        "with those figures in view. `maxtext` refitted by its protocol (kernels.speed 1.253 -> 1.254, dropless 0.4188 "
        "-> 0.4187, input pipeline unchanged).",
        "",
        "Forty-fourth session, one intra-node physics value: MI355X's usable xGMI bandwidth per link, assumed from "
        "MI300X's usable/raw ratio (56.2 GB/s), is fitted to a public single-node MI355X all_reduce sweep's "
        "bandwidth-bound rows (60.81 GB/s) and checked on another source (docs: the fabric section). Every MI355X "
        "run's intra-node collectives run about 8% faster at large sizes; `maxtext` refitted by its protocol "
        "(kernels.speed 1.254 -> 1.222, dropless 0.4187 -> 0.4266, input pipeline 219.3 -> 219.4), the only stack "
        "with a fitted parameter and MI355X runs.",
        "",
        "Fiftieth session, one identification rule and two kernel-table changes, nothing fitted to a published run "
        "but `maxtext`'s protocol. The input pipeline's cost is identified only by real-data beside synthetic-data "
        "runs on one vendor's GPUs (`runs_fit.identified`): in the `megatron-primus` fold holding out the MLPerf "
        "v6.0 MI325X run, the real-data runs were all H100 and the synthetic ones all AMD, a contrast the two "
        "vendors' own kernels' speeds absorb, and the fold had fitted 56 s a million tokens from the H100 runs' "
        "sequence-length spread; that run went from -32.1% to +35.0% held out, priced at the Primus-pipeline rows' "
        "AMD speed (shipped: +21.8%), a change made with that figure in view. A public MI350X hipBLASLt sweep joined "
        "the MI355X BF16 GEMM fit (plateau 0.861 -> 0.837), and the `aiter_v3` attention tables gained MLA's head "
        "dim 192 at the pooled tables' ratio to 128 (0.928) where it had taken 128's factor (docs: the kernels "
        "section); `maxtext` refitted by its protocol (kernels.speed 1.303 -> 1.339, dropless 0.4075 -> 0.4045, "
        "input pipeline 218.5 -> 218.3); the Primus-pipeline Qwen3-235B rows about one point slower; no run "
        "crossed the 25% line.",
        "",
        "Fifty-second session, one fabric value, fitted to a collective series, not to a run: NCCL's Simple "
        "protocol pays a cost per ring step across whole InfiniBand nodes (h100-ib / h200-ib "
        "`protocols.simple.ring_step_cost_us`, 12.4 us a step in each loop of 32 MiB a rank; docs: the fabric "
        "section), which prices a whole-node ring's large calls about 11% slower and an NVLSTree's about 7% "
        "slower. Calls above NCCL's LL128 window over every GPU of two or more nodes pay it (gradient buckets of a "
        "data-parallel group over whole nodes, an expert-data-parallel group's ZeRO-3 exchange); 68 runs moved, "
        "none by more than 0.9 points held out (MLPERF51-L8B-H200-64 +5.0 -> +4.1%); the stacks refitted by their "
        "protocols move by under 0.1%: `nemo` kernels.speed_nvidia 0.7774 -> 0.7775 (dropless 0.9367 as it was), "
        "`composer` 0.6919 -> 0.6925, `torchtitan` 0.7452 -> 0.7455. Closed form against engine: worst of the "
        "sample 2.57% -> 4.14% (a ZeRO-3 plan whose expert-data-parallel exchange over all 64 GPUs now shows more "
        "of itself, which the two overlap differently).",
        "",
        *_summary(held, shipped),
        "",
        *_targets(held),
        "",
        *_memory(held),
        "",
        *_one_run(),
        "",
        *_scale(),
        "",
        *_routing(cases),
        "",
        *_groups(held),
        "",
        f"What the figures say: with `ideal` (no stack) the MoE runs (all MaxText) are off by {lo:+.0f}% to "
        f"{hi:+.0f}% (positive: predicted too fast); the stack's capacity padding and (inferred) unoverlapped "
        "gradient reduction "
        "and parameter gathers explain most of it; the dense GEMMs run faster than the MI355X tables "
        "(whose clock under load is assumed) and the dropless experts (JAX ragged dot) at about a third of the "
        f"tuned grouped GEMM's speed, both fitted; the real-data rows carry costs perfsim does not model. The dense runs are off by {dlo:+.0f}% to {dhi:+.0f}% under `ideal`, "
        "with plans partly assumed (seq, batch not stated for Primus-pipeline). Memory: the `maxtext` profile keeps "
        f"MaxText's base.yml states (FP32 params, gradients and Adam moments, 16 B per parameter): {dsv3_fit}; "
        f"{kimi_fit}. "
        "Where the source prints a peak (Primus-pipeline's max_memory), perfsim's L7B peak is more than twice it "
        "under the assumed seq 4096 / gbs 64 plan (the source states neither; the states alone are about 17 GB); "
        f"the Qwen3-235B peaks agree within {max(qwen, default=0):.0f}%. torchtitan's pages print the caching "
        "allocator's peak reserved memory (its logger's max_reserved_gib: allocated blocks and the cached free ones), "
        "where perfsim's peak is the bytes allocated plus its fragmentation budget (10% of the transient bytes, "
        f"assumed), so perfsim's figure runs below the printed one ({min(titan, default=0):+.0f}% to "
        f"{max(titan, default=0):+.0f}% on those rows); nothing is fitted to close it. Twenty-sixth session, with "
        "these peaks in view, structure: what a recomputed layer reruns is held while that layer's backward runs "
        "(PyTorch's activation checkpointing reruns it with autograd on; `stack.memory.recompute_working_set`, "
        "off for `maxtext`, whose XLA step rematerializes to fit the device): the torchtitan rows' median |peak "
        "error| 20.8% -> 16%; then FSDP2's states (`stack.memory.sharded_master`: torchtitan's FP32 shards are the "
        "optimizer's master, no BF16 shard kept, 16 B per parameter where Megatron-style keeps 18) lower its "
        "per-pass rows' peaks by about 2 GB (the memory table above has the figures now); no run's throughput or "
        "predicted fit changed.",
        "",
        *_runs(held, shipped),
        "",
    ]
    return "\n".join(parts)


def write_committed(held) -> None:
    with open(COMMITTED, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "stack", "source_id", "held_out_error_pct"])
        for r in held.results:
            writer.writerow([r.case.id, r.stack, r.case.source_id, f"{r.error_pct:.2f}"])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_committed(evaluate()[1])
    print(section())
