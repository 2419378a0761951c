"""``perfsim validate``: predicted vs measured for a dataset read by ``readers``.

Each measured point (an rccl-tests row, a kernel CSV row) is priced by the same code
the simulator uses (``collectives.collective_cost`` for the log's rank geometry,
``kernel_fit.predict_kernel`` for kernels). Errors are signed, ``100 * (predicted -
measured) / measured``; MAPE is the mean of their absolute values, overall and per
category (one per log file, one per kernel kind and dtype). ``write_html`` renders a
report with Plotly (predicted vs measured, error vs size) and the point table; the
Plotly library is embedded (works offline) or, with ``plotlyjs="directory"``, written
once next to the report as ``plotly.min.js``.
"""

import html
import math
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from perfsim.calibration import collective_fit, kernel_fit
from perfsim.calibration.calibrate import check_forced, check_priceable, collective_points, forced_label
from perfsim.errors import ConfigError
from perfsim.system.specio import check_type, write_atomic
from perfsim.system.hardware import ClusterSpec, load_cluster
from perfsim.calibration.readers import check_files, read_kernel_csv, read_rccl_log
from perfsim.calibration.calibrate_fabric import table_series


@dataclass(frozen=True, kw_only=True)
class Point:
    category: str
    x: float  # bytes for collectives and memory kernels, GFLOP for compute kernels
    x_unit: str
    label: str
    measured_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, kw_only=True)
class Validation:
    cluster: str
    points: tuple[Point, ...]
    notes: tuple[str, ...] = ()

    @property
    def mape(self) -> float:
        return _mape(self.points)

    def by_category(self) -> dict[str, float]:
        cats = dict.fromkeys(p.category for p in self.points)
        return {c: _mape([p for p in self.points if p.category == c]) for c in cats}

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "mape_pct": self.mape, "mape_by_category_pct": self.by_category(),
                "notes": list(self.notes),
                "points": [{"category": p.category, "x": p.x, "x_unit": p.x_unit, "label": p.label,
                            "measured_us": p.measured_s * 1e6, "predicted_us": p.predicted_s * 1e6,
                            "error_pct": p.error_pct} for p in self.points]}


def _mape(points) -> float:
    return sum(abs(p.error_pct) for p in points) / len(points) if points else math.nan


def _collective_rows(path: str, cluster: ClusterSpec, in_place: bool, algorithm: str | None = None,
                     protocol: str | None = None) -> tuple[list[Point], list[str]]:
    lg = read_rccl_log(path)
    check_priceable([lg], cluster, algorithm, protocol)
    points = collective_points([lg], in_place, algorithm, protocol)
    forced = forced_label(points[0].algorithm, points[0].protocol) if points else ""
    category = (f"{Path(path).stem} ({lg.op}, {lg.num_ranks} ranks{', graph' if lg.graph else ''}"
                f"{', ' + forced if forced else ''})")
    rows = [Point(category=category, x=p.size_bytes, x_unit="bytes", label=f"{int(p.size_bytes)} B",
                  measured_s=p.time_s, predicted_s=collective_fit.predict(p, cluster)) for p in points]
    notes = [f"{path}: skipped {lg.num_skipped} unparsable lines"] if lg.num_skipped else []
    notes += list(lg.env_notes)
    if (lg.algorithm or lg.protocol) and not (algorithm or protocol):
        notes.append(f"{path}: the log forced {forced_label(lg.algorithm, lg.protocol).removesuffix(' forced')} "
                     f"(NCCL_ALGO / NCCL_PROTO): priced on that path")
    return rows, notes


def _table_rows(tables, series, cluster: ClusterSpec, in_place: bool) -> tuple[list[Point], list[str]]:
    """Every timed series of the multi-node collective tables (``series`` picks some), priced on
    the path and launch each ran (the forced algorithm / protocol its software or note column
    names, its launch mode), one category per series."""
    rows, notes = [], []
    for s in table_series(tables, series, in_place):
        forced = forced_label(s.algorithm, s.protocol)
        category = (f"{s.series} ({s.coll.value}, {s.num_ranks} ranks, {s.num_nodes} node{'s' if s.num_nodes > 1 else ''}"
                    f"{', ' + forced if forced else ''}{', ' + s.launch if s.launch != 'mpi' else ''})")
        rows += [Point(category=category, x=p.size_bytes, x_unit="bytes", label=f"{int(p.size_bytes)} B",
                       measured_s=p.time_s, predicted_s=collective_fit.predict(p, cluster))
                 for p in s.points(cluster.node.gpus_per_node)]
        if s.gpu and s.gpu.lower() != cluster.gpu.name.lower():
            notes.append(f"{s.series}: measured on {s.gpu}, priced on {cluster.name} ({cluster.gpu.name})")
    return rows, notes


def _kernel_rows(path: str, cluster: ClusterSpec) -> tuple[list[Point], list[str]]:
    points, dropped = kernel_fit.usable(read_kernel_csv(path), cluster.gpu)
    rows = []
    for p in points:
        memory = p.kind == "memory"
        rows.append(Point(category=f"{p.kind} {p.kernel if memory else p.dtype}", x=p.bytes if memory else p.flops / 1e9,
                          x_unit="bytes" if memory else "GFLOP", label=_kernel_label(p), measured_s=p.time_s,
                          predicted_s=kernel_fit.predict_kernel(p, cluster.gpu)))
    host = sum(p.timing == "host" for p in points)
    notes = [f"{path} {d} (not validated)" for d in dropped]
    if host:  # their harness's host time per call belongs to no GPU table (calibrate fits it per series)
        notes.append(f"{path}: {host} host-timed rows priced at their GPU time; a call shorter than its harness's "
                     f"host time per call reads slower than predicted")
    return rows, notes


def _kernel_label(p) -> str:
    if p.kind in ("gemm", "grouped_gemm"):
        return (f"{p.m}x{p.n}x{p.k}" + (f" x{p.batch}" if p.batch > 1 else "")
                + (f" {p.direction}" if True in p.gemm_passes else ""))
    if p.kind == "attention":
        return f"b{p.batch} s{p.seq} h{p.heads}/{p.kv_heads} d{p.head_dim} {p.direction}"
    return f"{p.kernel} {p.bytes:.3g} B"


def validate(cluster: str | ClusterSpec, *, rccl_logs=(), kernel_csvs=(), in_place: bool = False,
             algorithm: str | None = None, protocol: str | None = None, collective_tables=(),
             series=()) -> Validation:
    """Predicted vs measured for every point of the given files. ``algorithm`` / ``protocol``
    name the path the rccl-tests runs forced (NCCL_ALGO / NCCL_PROTO) where their logs do not
    print it (a log run with NCCL_DEBUG=INFO does, and is priced on it). ``collective_tables``
    are multi-node CSV tables (the ``perfsim calibrate --collective-csv`` layout; ``series``
    picks some of their series)."""
    rccl_logs, kernel_csvs = check_files("rccl_logs", rccl_logs), check_files("kernel_csvs", kernel_csvs)
    collective_tables = check_files("collective_tables", collective_tables)
    if isinstance(series, str) or not isinstance(series, list | tuple) or not all(isinstance(x, str) for x in series):
        raise ConfigError(f"series: expected a list of series names, got {series!r}")
    check_type("cluster", cluster, (str, PathLike, ClusterSpec), "a profile name, path or ClusterSpec")
    if not (rccl_logs or kernel_csvs or collective_tables):
        raise ConfigError("validate: give at least one measurement file (--rccl-log, --kernel-csv, --collective-csv)")
    if series and not collective_tables:
        raise ConfigError(f"series: {series[0]!r} picks series of --collective-csv tables; none given")
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    check_forced(spec, algorithm, protocol, rccl_logs)
    points, notes = [], []
    for path in rccl_logs:
        rows, more = _collective_rows(str(path), spec, in_place, algorithm, protocol)
        points, notes = points + rows, notes + more
    if collective_tables:
        rows, more = _table_rows(collective_tables, series, spec, in_place)
        points, notes = points + rows, notes + more
    for path in kernel_csvs:
        rows, more = _kernel_rows(str(path), spec)
        points, notes = points + rows, notes + more
    if not points:
        raise ConfigError(f"validate: no point in the inputs can be priced on {spec.name}")
    return Validation(cluster=spec.name, points=tuple(points), notes=tuple(notes))


# ---- HTML report ---------------------------------------------------------------------


def _figures(result: Validation) -> list:
    import plotly.graph_objects as go  # only the report needs plotly
    from plotly.subplots import make_subplots

    figs = []
    for cat, err in result.by_category().items():
        pts = sorted((p for p in result.points if p.category == cat), key=lambda p: p.x)
        x = [p.x for p in pts]
        text = [p.label for p in pts]
        fig = make_subplots(rows=1, cols=2, subplot_titles=("time: measured vs predicted", "signed error"))
        fig.add_trace(go.Scatter(x=x, y=[p.measured_s * 1e6 for p in pts], name="measured", mode="lines+markers", text=text), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=[p.predicted_s * 1e6 for p in pts], name="predicted", mode="lines+markers", text=text), 1, 1)
        fig.add_trace(go.Bar(x=[str(t) for t in text], y=[p.error_pct for p in pts], name="error %"), 1, 2)
        fig.update_xaxes(type="log", title_text=pts[0].x_unit, row=1, col=1)
        fig.update_yaxes(type="log", title_text="time (us)", row=1, col=1)
        fig.update_yaxes(title_text="(predicted - measured) / measured, %", row=1, col=2)
        fig.update_layout(title_text=f"{cat}: MAPE {err:.2f}% over {len(pts)} points", height=420)
        figs.append(fig)
    return figs


def _table(result: Validation) -> str:
    head = "<tr><th>category</th><th>point</th><th>measured (us)</th><th>predicted (us)</th><th>error (%)</th></tr>"
    rows = "".join(f"<tr><td>{html.escape(p.category)}</td><td>{html.escape(p.label)}</td><td>{p.measured_s * 1e6:.3f}</td>"
                   f"<td>{p.predicted_s * 1e6:.3f}</td><td>{p.error_pct:+.2f}</td></tr>" for p in result.points)
    return f"<table border=1 cellpadding=3>{head}{rows}</table>"


def write_html(result: Validation, path: str | Path, plotlyjs: str = "embed") -> Path:
    """Self-contained report (``plotlyjs='embed'``) or one that loads ./plotly.min.js
    written beside it (``'directory'``); no network needed either way."""
    if plotlyjs not in ("embed", "directory"):
        raise ConfigError(f"plotlyjs: {plotlyjs!r} is not one of embed, directory")
    path = Path(path)
    include = True if plotlyjs == "embed" else "directory"
    parts = [fig.to_html(full_html=False, include_plotlyjs=include if i == 0 else False)
             for i, fig in enumerate(_figures(result))]
    cats = "".join(f"<li>{html.escape(c)}: {m:.2f}%</li>" for c, m in result.by_category().items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
    body = (f"<h1>perfsim validation: {html.escape(result.cluster)}</h1><p>MAPE {result.mape:.2f}% over "
            f"{len(result.points)} points</p><ul>{cats}</ul>{''.join(parts)}<h2>Points</h2>{_table(result)}"
            + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""))
    if plotlyjs == "directory":
        _write_plotlyjs(path.parent / "plotly.min.js")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>perfsim validation</title></head>"
            f"<body>{body}</body></html>")
    return write_atomic(path, page, "html")


def _write_plotlyjs(target: Path) -> None:
    from plotly.offline import get_plotlyjs

    if not target.exists():
        write_atomic(target, get_plotlyjs(), "html")
