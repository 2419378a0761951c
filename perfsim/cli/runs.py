"""``perfsim validate --runs FILE`` and ``perfsim calibrate --runs FILE``: measured
training runs against perfsim (design.runs), and a stack profile fitted to them
(design.runs_fit). Presentation only."""

import contextlib
import html
import statistics
import sys
from pathlib import Path

from perfsim.design import runs as runs_mod
from perfsim.design.runs_fit import default_reason, fit_stack, held_out_by_stack, held_out_summary, leave_one_out
from perfsim.errors import ConfigError
from perfsim.search.executors import make_executor
from perfsim.system.specio import check_finite_output, check_output, write_atomic
from perfsim.system.stacks import load_stack, write_stack


def table(result: runs_mod.RunsValidation) -> list[str]:
    lines = [f"# perfsim validate --runs{' (' + result.label + ')' if result.label else ''}; "
             "error = (predicted - measured) / measured",
             f"{'run':<22} {'stack':<16} {'metric':<22} {'measured':>10} {'predicted':>10} {'error_%':>8} {'fits':>5} "
             f"{'peak_GB (printed)':>22}"]
    for r in result.results:
        lines.append(f"{r.case.id[:22]:<22} {r.stack[:16]:<16} {r.case.metric[:22]:<22} {r.case.measured:>10.4g} "
                     f"{r.predicted:>10.4g} {r.error_pct:>+8.1f} {'yes' if r.fits else 'NO':>5} {peak(r):>22}")
    for key in runs_mod.GROUPS:
        for group, err in result.by(key).items():
            lines.append(f"MAPE {err:6.1f}%  {key} {group}")
    lines.append(f"MAPE {result.mape:6.1f}%  overall ({len(result.results)} runs), median |error| "
                 f"{result.median_abs_pct:.1f}%")
    memory = runs_mod.memory_note(result)
    lines += [memory] if memory else []
    note = runs_mod.routing_note([r.case for r in result.results])
    return lines + ([f"note: {note}"] if note else [])


def peak(r: runs_mod.RunResult) -> str:
    """The predicted per-GPU peak in GB, with the printed one and the signed error where the
    run's source prints it."""
    shown = f"{r.peak_memory_bytes / 1e9:.0f}"
    printed = r.case.measured_peak_bytes
    return shown if printed is None else f"{shown} ({printed / 1e9:.1f}, {r.memory_error_pct:+.0f}%)"


@contextlib.contextmanager
def _pricing(workers: int | None):
    """The executor the runs are priced on (search's ``make_executor``: a local pool of
    ``workers`` processes, this process for one), closed however the command ends."""
    executor = make_executor("local", workers or 1)
    try:
        yield executor
    finally:
        executor.close()


def cmd_validate(args, dumps) -> int:
    if args.html:
        check_output(args.html, args.force, "--html")
    cases = runs_mod.read_all(args.runs)
    with _pricing(args.workers) as executor:
        if args.loso:
            result = held_out_by_stack(cases, (tuple(args.fit) if args.fit else None), executor)
        else:
            stack = load_stack(args.stack) if args.stack else None
            result = runs_mod.validate_runs(cases, {c.id: stack for c in cases} if stack else None,
                                            label=f"all runs under {stack.name}" if stack else "each run's stack profile",
                                            executor=executor)
    check_finite_output(result.to_dict(), "validate")
    if args.html:
        write_html(result, args.html)
    print(dumps(result.to_dict()) if args.json else "\n".join(table(result)))
    if args.max_mape is not None and result.mape > args.max_mape:
        print(f"perfsim: accuracy gate failed: MAPE {result.mape:.2f}% > --max-mape {args.max_mape}%", file=sys.stderr)
        return 1
    return 0


def cmd_calibrate(args) -> int:
    check_output(args.out, args.force, "--out")
    cases = runs_mod.read_all(args.runs)
    names = sorted({c.stack for c in cases})
    if args.stack is None and len(names) > 1:
        raise ConfigError(f"--stack: the runs use several stacks ({', '.join(names)}); name the one to fit")
    base = load_stack(args.stack or names[0])
    mine = [c for c in cases if load_stack(c.stack).name == base.name]
    if not mine:
        raise ConfigError(f"--stack: no run in --runs uses stack {base.name!r}")
    params = (tuple(args.fit) if args.fit else None)
    with _pricing(args.workers) as executor:
        fit = fit_stack(mine, base, params, executor=executor)
        loo = leave_one_out(mine, base, params, executor)
    why = "--fit" if args.fit else default_reason(mine, base)
    write_stack(fit.stack, args.out, overwrite=args.force)
    print(f"# perfsim calibrate --runs: stack {base.name} fitted to {fit.num_runs} runs "
          f"({', '.join(fit.fitted_on)}) -> {args.out}")
    print(f"# free parameters: {', '.join(fit.values)} ({why})")
    for p, v in fit.values.items():
        print(f"{p:<28} {v:12.4g}{'  (at its bound)' if p in fit.at_bound else ''}")
    print(f"fit rms |log error| {100 * fit.rms_log_error:.1f}%")
    print(held_out_summary(loo))
    return 0


def cmd_project(args, dumps) -> int:
    from perfsim.calibration.accuracy import plan_to_plan_pct, scale_pairs
    from perfsim.design.projection import project

    cases = {c.id: c for c in runs_mod.read_all(args.runs)}
    if args.id not in cases:
        raise ConfigError(f"--id: no run {args.id!r} in --runs (runs: {', '.join(sorted(cases))})")
    p = project(cases[args.id], args.nodes, args.keep, (tuple(args.fit) if args.fit else None))
    src, dst = p.source, p.target
    if args.json:
        print(dumps({"run": p.case.id, "fitted": p.fitted, "source": src.to_dict(), "target": dst.to_dict()}))
        return 0
    fitted = ", ".join(f"{k} = {v:.4g}" for k, v in p.fitted.items())
    print(f"# perfsim project: {p.case.id} ({p.case.stack}, {src.world_size} GPUs, measured {p.case.measured:g} "
          f"{p.case.metric}) -> {dst.world_size} GPUs; fitted to the run: {fitted}")
    print(f"{'':<22} {src.world_size:>10} GPUs {dst.world_size:>10} GPUs")
    for label, a, b in (("step time (s)", src.step_time_s, dst.step_time_s),
                        ("tokens/s per GPU", src.tokens_per_s_per_gpu, dst.tokens_per_s_per_gpu),
                        ("exposed comm (s)", src.exposed_comm_s, dst.exposed_comm_s),
                        ("pipeline bubble (s)", src.bubble_s, dst.bubble_s)):
        print(f"{label:<22} {a:>15.4g} {b:>15.4g}")
    print("what changed (seconds per step, largest first):")
    for name, a, b in p.changes()[:8]:
        print(f"  {name:<20} {a:>12.4g} -> {b:<12.4g} ({b - a:+.4g})")
    margin = plan_to_plan_pct()
    if margin is not None:
        pairs = scale_pairs()
        if len(pairs) == 1:
            (q,) = pairs
            scale = (f"; across scale it has {q['from_gpus']} -> {q['to_gpus']} GPUs ({q['model']}, {q['source']}) "
                     f"{q['error_pct']:+.1f}% (one pair on one cluster: an example, not a bound)")
        elif pairs:
            errs = [q["error_pct"] for q in pairs]
            scale = (f"; across scale it has {len(pairs)} pairs of runs ({len({q['source'] for q in pairs})} sources, "
                     f"{min(q['from_gpus'] for q in pairs)} -> {max(q['to_gpus'] for q in pairs)} GPUs): median "
                     f"|error| {statistics.median(map(abs, errs)):.1f}%, worst {max(errs, key=abs):+.1f}%")
        else:
            scale = ("; no model in perfsim's reference set was measured at two node counts, so the change of scale "
                     "itself is unchecked")
        print(f"accuracy: after a calibration on one run, the same model's other plans on its GPU come out a median "
              f"{margin:.1f}% off (same-source check, docs/accuracy.md){scale}")
    return 0


def write_html(result: runs_mod.RunsValidation, path: str) -> Path:
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ConfigError("--html: the HTML report needs plotly, which is not installed") from None
    fig = go.Figure()
    for stack in sorted({r.stack for r in result.results}):
        rows = [r for r in result.results if r.stack == stack]
        fig.add_trace(go.Scatter(x=[r.case.measured for r in rows], y=[r.predicted for r in rows], mode="markers",
                                 name=stack, text=[r.case.id for r in rows]))
    top = max([max(r.case.measured, r.predicted) for r in result.results], default=1.0)
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured"))
    fig.update_layout(title="predicted vs measured", xaxis_title="measured", yaxis_title="predicted")
    rows = "".join(f"<tr><td>{html.escape(r.case.id)}</td><td>{html.escape(r.stack)}</td><td>{r.case.measured:.4g}</td>"
                   f"<td>{r.predicted:.4g}</td><td>{r.error_pct:+.1f}</td><td>{'yes' if r.fits else 'NO'}</td>"
                   f"<td>{html.escape(peak(r))}</td><td>{html.escape(r.case.assumed)}</td></tr>"
                   for r in result.results)
    groups = "".join(f"<li>{key} {html.escape(g)}: {m:.1f}%</li>" for key in runs_mod.GROUPS for g, m in result.by(key).items())
    note = runs_mod.routing_note([r.case for r in result.results])
    memory = runs_mod.memory_note(result)
    body = (f"<h1>perfsim validate --runs</h1><p>{html.escape(result.label)}: MAPE {result.mape:.1f}% over "
            f"{len(result.results)} runs</p><ul>{groups}</ul>{f'<p>{html.escape(note)}</p>' if note else ''}"
            f"{fig.to_html(full_html=False, include_plotlyjs=True)}"
            f"{f'<p>{html.escape(memory)}</p>' if memory else ''}"
            "<table><tr><th>run</th><th>stack</th><th>measured</th><th>predicted</th><th>error %</th>"
            f"<th>fits</th><th>peak GB (printed, error)</th><th>assumed</th></tr>{rows}</table>")
    page = f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>perfsim runs</title></head><body>{body}</body></html>"
    return write_atomic(path, page, "--html")
