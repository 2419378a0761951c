"""Pure Plotly figures for the planner: plain rows in, ``go.Figure`` out; no Streamlit."""

import math
import zlib

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

GROUP_PALETTES = {
    "compute": qualitative.Set2 + qualitative.Pastel2,
    "comm": ["#d62728", "#ff7f0e", "#e377c2", "#bcbd22", "#8c564b", "#9467bd", "#f4a582", "#b2182b"],
    "bubble": ["#9e9e9e", "#d0d0d0", "#707070"],
}
MEMORY_PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "zero_buffers_bytes", "activations_bytes",
                "logits_bytes")
# not a part of the stacked bar: the total, and the gradients' reuse of freed activation memory
# (subtracted: the stage's peak is drawn as its own marker where the parts' sum overshoots it)
NOT_STACKED = {"total_bytes", "reused_bytes"}
MEMORY_COLORS = {"weights_bytes": "#1f77b4", "gradients_bytes": "#aec7e8", "optimizer_bytes": "#d62728",
                 "activations_bytes": "#ff9896", "logits_bytes": "#2ca02c", "fragmentation_bytes": "#c7c7c7",
                 "zero_buffers_bytes": "#9467bd"}


def memory_parts(memory: list[dict]) -> list[str]:
    """The stacked ``*_bytes`` parts of a report's memory rows (known ones first; not ``NOT_STACKED``)."""
    extra = sorted({k for m in memory for k in m if k.endswith("_bytes")} - set(MEMORY_PARTS) - NOT_STACKED)
    return [p for p in MEMORY_PARTS if any(p in m for m in memory)] + extra
GB = 1e9


# One fixed colour per category, the same in every plan and chart (issue 17.10): compute in
# greens/blues/purples, communication in reds/oranges/browns, waiting in greys. A category
# not listed takes a colour of its group picked by a hash of its name: still fixed per name.
CATEGORY_COLORS = {
    "attention_proj": "#1b9e77", "attention_core": "#66c2a5", "mlp": "#1f78b4", "experts": "#a6cee3",
    "shared_expert": "#6a3d9a", "router": "#cab2d6", "norm": "#b2df8a", "embedding": "#33a02c",
    "lm_head": "#0b6e4f", "head": "#0b6e4f", "loss": "#8dd3c7", "optimizer": "#4b0082", "recompute": "#80b1d3",
    "moe_permute": "#bebada", "moe_dispatch": "#9e9ac8", "fp8_cast": "#ccebc5", "elementwise": "#9ecae1", "activation": "#c7e9c0",
    "tp_comm": "#d62728", "cp_comm": "#ff7f0e", "ep_a2a": "#e6550d", "etp_ag": "#fd8d3c", "etp_rs": "#fdae6b",
    "dp_grad_reduce": "#8c564b", "grad_norm": "#a0522d", "embedding_grad_sync": "#c49c94", "dp_param_gather": "#e377c2", "pp_p2p": "#bcbd22",
    "pipeline_bubble": "#9e9e9e", "idle": "#d0d0d0", "wait": "#707070",
}


def category_color(category: str, group: str) -> str:
    """The fixed colour of ``category`` (its group's palette when the category is new)."""
    if category in CATEGORY_COLORS:
        return CATEGORY_COLORS[category]
    palette = GROUP_PALETTES.get(group, GROUP_PALETTES["compute"])
    return palette[zlib.crc32(category.encode()) % len(palette)]


def category_colors(groups: dict[str, str]) -> dict[str, str]:
    """Colour per category of ``groups`` ({category: group}); independent of the other categories."""
    return {category: category_color(category, group) for category, group in groups.items()}


def _layout(fig: go.Figure, title: str, **kwargs) -> go.Figure:
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=40, b=10), legend_title_text="", **kwargs)
    return fig


def breakdown_bar(rows: list[dict], overlapped: dict[str, float]) -> go.Figure:
    """Stacked horizontal bar: the step on the critical stage split by category, and the
    communication that was hidden under compute (rows from derive.breakdown_rows)."""
    colors = category_colors({r["category"]: r["group"] for r in rows})
    fig = go.Figure()
    for r in rows:
        fig.add_bar(y=["step"], x=[r["seconds"] * 1e3], name=r["category"], orientation="h",
                    marker_color=colors[r["category"]],
                    hovertemplate=f"{r['category']} ({r['group']}): %{{x:.2f}} ms<extra></extra>")
    for category, seconds in sorted(overlapped.items()):
        if seconds > 0:
            fig.add_bar(y=["overlapped comm"], x=[seconds * 1e3], name=f"{category} (hidden)", orientation="h",
                        marker_color=colors.get(category, "#999"), marker_pattern_shape="/", showlegend=False,
                        hovertemplate=f"{category} hidden under compute: %{{x:.2f}} ms<extra></extra>")
    return _layout(fig, "Where the step goes (critical stage, milliseconds)", barmode="stack", height=360,
                   yaxis=dict(autorange="reversed"), legend=dict(orientation="h", yanchor="top", y=-0.15, x=0))


def memory_bar(memory: list[dict], capacity_bytes: float) -> go.Figure:
    """Stacked memory per pipeline stage (GB) against the GPU's HBM capacity."""
    stages = [f"stage {m['stage']}" for m in memory]
    fig = go.Figure()
    for part in memory_parts(memory):
        fig.add_bar(x=stages, y=[m.get(part, 0.0) / GB for m in memory], name=part.removesuffix("_bytes"),
                    marker_color=MEMORY_COLORS.get(part) or category_color(part, "compute"))
    if any(m.get("reused_bytes") for m in memory):  # gradients written where activations were freed
        fig.add_scatter(x=stages, y=[m.get("total_bytes", 0.0) / GB for m in memory], mode="markers",
                        name="peak (gradients reuse freed activations)",
                        marker=dict(symbol="line-ew-open", size=36, color="black", line_width=3))
    fig.add_hline(y=capacity_bytes / GB, line_dash="dash", line_color="red",
                  annotation_text=f"HBM {capacity_bytes / GB:.0f} GB", annotation_position="top left")
    top = max([capacity_bytes] + [m.get("total_bytes", 0.0) for m in memory]) / GB
    return _layout(fig, "Memory per rank", barmode="stack", height=320, yaxis_title="GB",
                   yaxis_range=[0, top * 1.12])


def gantt(bars: list[dict], groups: dict[str, str]) -> go.Figure:
    """Zoomable Gantt: one row per (pipeline stage, stream), one trace per category, times in ms."""
    colors = category_colors(groups)
    labels = sorted({(b["rank"], b["stream"]) for b in bars})
    order = [f"stage {r} · {s}" for r, s in labels]
    fig = go.Figure()
    for category in sorted({b["category"] for b in bars}):
        mine = [b for b in bars if b["category"] == category]
        fig.add_bar(
            y=[f"stage {b['rank']} · {b['stream']}" for b in mine], x=[(b["end_s"] - b["start_s"]) * 1e3 for b in mine],
            base=[b["start_s"] * 1e3 for b in mine], orientation="h", name=category,
            marker_color=colors.get(category, "#999"), marker_line_width=0,
            customdata=[[b["op"], b["count"], b["bytes"]] for b in mine],
            hovertemplate=(f"{category}<br>%{{customdata[0]}} (+%{{customdata[1]}} merged)"
                           "<br>%{base:.3f} ms + %{x:.3f} ms<br>%{customdata[2]:.3s}B<extra></extra>"),
        )
    return _layout(fig, "Step timeline (drag to zoom, double-click to reset)", barmode="overlay",
                   height=max(260, 60 + 38 * len(order)), xaxis_title="milliseconds",
                   yaxis=dict(categoryorder="array", categoryarray=order[::-1]), bargap=0.25)


def busbw_chart(predicted: list[dict], measured: list[dict]) -> go.Figure:
    """Bus bandwidth vs message size: predicted lines per (op, ranks), measured points per series."""
    fig = go.Figure()
    for key in sorted({(r["op"], r["ranks"]) for r in predicted}):
        rows = sorted((r for r in predicted if (r["op"], r["ranks"]) == key), key=lambda r: r["size_bytes"])
        fig.add_scatter(x=[r["size_bytes"] for r in rows], y=[r["busbw_GBps"] for r in rows], mode="lines+markers",
                        name=f"{key[0]} · {key[1]} GPUs (perfsim)", marker_size=4)
    for series in sorted({r["series"] for r in measured}):
        rows = sorted((r for r in measured if r["series"] == series), key=lambda r: r["size_bytes"])
        fig.add_scatter(x=[r["size_bytes"] for r in rows], y=[r["busbw_GBps"] for r in rows], mode="markers",
                        name=f"{series} ({rows[0]['ranks']} GPUs, measured)", marker=dict(symbol="x", size=7))
    fig.update_xaxes(**size_axis([r["size_bytes"] for r in predicted + measured]), title_text="message size")
    return _layout(fig, "Bus bandwidth vs message size", height=420, yaxis_title="busbw (GB/s)")


def utilization_bar(rows: list[dict]) -> go.Figure:
    """Busy fraction of the step per (stage, stream) (rows from derive.stream_utilization)."""
    labels = [f"stage {r['rank']} · {r['stream']}" for r in rows]
    fig = go.Figure(go.Bar(
        x=[100 * r["busy_fraction"] for r in rows], y=labels, orientation="h",
        marker_color=["#4c78a8" if r["stream"] == "compute" else "#f58518" for r in rows],
        customdata=[[r["busy_s"] * 1e3, r["bytes"], r["busy_GBps"]] for r in rows],
        hovertemplate="%{y}: busy %{x:.1f}% (%{customdata[0]:.2f} ms)<br>"
                      "moved %{customdata[1]:.3s}B at %{customdata[2]:.1f} GB/s while busy<extra></extra>",
    ))
    return _layout(fig, "Stream utilization in the simulated step", height=max(220, 60 + 30 * len(rows)),
                   xaxis_title="% of step busy", xaxis_range=[0, 100], yaxis=dict(autorange="reversed"))


def pareto_chart(points: list[dict], front: list[dict], x: str, y: str, labels: dict | None = None) -> go.Figure:
    """All candidate plans and the Pareto front (x minimized, y maximized)."""
    labels = labels or {}
    fig = go.Figure()
    fig.add_scatter(x=[p[x] for p in points], y=[p[y] for p in points], mode="markers", name="plans",
                    text=[p.get("label", "") for p in points], marker=dict(color="#9ecae1", size=8),
                    hovertemplate="%{text}<br>%{x:.4g}, %{y:.4g}<extra></extra>")
    fig.add_scatter(x=[p[x] for p in front], y=[p[y] for p in front], mode="lines+markers", name="Pareto front",
                    text=[p.get("label", "") for p in front], marker=dict(color="#d62728", size=10),
                    hovertemplate="%{text}<br>%{x:.4g}, %{y:.4g}<extra></extra>")
    return _layout(fig, "Candidate plans", height=380, xaxis_title=labels.get(x, x), yaxis_title=labels.get(y, y))


def size_axis(sizes: list[float]) -> dict:
    """A log message-size axis with one readable tick per factor of 16 ('16 B', '4 KiB', '1 GiB')."""
    sizes = [x for x in sizes if x and x > 0]
    if not sizes:
        return dict(type="log")
    lo, hi = int(math.floor(math.log2(min(sizes)))), int(math.ceil(math.log2(max(sizes))))
    ticks = [2 ** k for k in range(lo - lo % 4, hi + 1, 4)]
    return dict(type="log", tickvals=ticks, ticktext=[binary_size(t) for t in ticks], tickangle=0)


def binary_size(n: float) -> str:
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n:g} B"


def predicted_vs_measured(rows: list[dict], x: str = "size_bytes", y_title: str = "bus bandwidth (GB/s)") -> go.Figure:
    """Top: measured points and the predicted curve per series (``measured``/``predicted``,
    e.g. busbw). Bottom, on its own axis so it never covers the curves: the signed error of
    the time per call (``error``, a fraction; (predicted - measured) / measured, as
    ``perfsim validate`` and ``calibrate`` report it), or of ``predicted`` when rows carry no ``error``."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.06)
    for i, series in enumerate(sorted({r.get("series", "") for r in rows})):
        mine = sorted((r for r in rows if r.get("series", "") == series), key=lambda r: r[x])
        xs, color = [r[x] for r in mine], qualitative.D3[i % len(qualitative.D3)]
        fig.add_scatter(x=xs, y=[r["measured"] for r in mine], mode="markers", name=f"{series} measured",
                        marker=dict(symbol="x", size=7, color=color), row=1, col=1)
        fig.add_scatter(x=xs, y=[r["predicted"] for r in mine], mode="lines", name=f"{series} predicted",
                        line=dict(color=color), row=1, col=1)
        errors = [r["error"] if "error" in r else ((r["predicted"] - r["measured"]) / r["measured"]
                                                   if r["measured"] else None) for r in mine]
        fig.add_bar(x=xs, y=[None if e is None else 100 * e for e in errors], name=f"{series} error",
                    marker_color=color, showlegend=False, row=2, col=1,
                    hovertemplate="%{y:+.1f}%<extra>" + series + "</extra>")
    axis = size_axis([r[x] for r in rows]) if x == "size_bytes" else dict(type="linear")
    fig.update_xaxes(**axis, row=1, col=1)
    fig.update_xaxes(**axis, title_text="message size" if x == "size_bytes" else x, row=2, col=1)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    fig.update_yaxes(title_text="time error %", zeroline=True, row=2, col=1)
    return _layout(fig, "Predicted vs measured", height=520, legend=dict(orientation="h", y=-0.18, x=0))


def compare_bars(results: dict[str, dict], metrics: tuple[tuple[str, str], ...]) -> go.Figure:
    """Grouped bars of each metric relative to the first scenario (first = 100%)."""
    names = list(results)
    fig = go.Figure()
    for name in names:
        values = []
        for key, _ in metrics:
            base = results[names[0]].get(key)
            value = results[name].get(key)
            values.append(100 * value / base if base and value is not None else None)
        fig.add_bar(x=[label for _, label in metrics], y=values, name=name)
    fig.add_hline(y=100, line_dash="dot", line_color="#666")
    return _layout(fig, f"Relative to {names[0]} (= 100%)", barmode="group", height=360, yaxis_title="%")
