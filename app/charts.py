"""Pure Plotly figures for the planner: plain rows in, ``go.Figure`` out; no Streamlit."""

import plotly.graph_objects as go
from plotly.colors import qualitative

GROUP_PALETTES = {
    "compute": qualitative.Set2 + qualitative.Pastel2,
    "comm": ["#d62728", "#ff7f0e", "#e377c2", "#bcbd22", "#8c564b", "#9467bd", "#f4a582", "#b2182b"],
    "bubble": ["#b0b0b0"],
}
MEMORY_PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes")


def memory_parts(memory: list[dict]) -> list[str]:
    """The ``*_bytes`` parts of a report's memory rows (known ones first), total excluded."""
    extra = sorted({k for m in memory for k in m if k.endswith("_bytes")} - set(MEMORY_PARTS) - {"total_bytes"})
    return [p for p in MEMORY_PARTS if any(p in m for m in memory)] + extra
GB = 1e9


def category_colors(groups: dict[str, str]) -> dict[str, str]:
    """A stable colour per category: compute greens/blues, comm reds/oranges, bubble grey."""
    used = {g: 0 for g in GROUP_PALETTES}
    out = {}
    for category in sorted(groups):
        group = groups[category]
        palette = GROUP_PALETTES[group]
        out[category] = palette[used[group] % len(palette)]
        used[group] += 1
    return out


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
        fig.add_bar(x=stages, y=[m.get(part, 0.0) / GB for m in memory], name=part.removesuffix("_bytes"))
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
    return _layout(fig, "Bus bandwidth vs message size", height=420, xaxis_type="log",
                   xaxis_title="message size (bytes)", yaxis_title="busbw (GB/s)")


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


def predicted_vs_measured(rows: list[dict], x: str = "size_bytes") -> go.Figure:
    """Measured and predicted values against ``x`` with the signed error (%) on a second axis;
    rows carry ``measured``, ``predicted`` and optionally ``series``."""
    fig = go.Figure()
    for series in sorted({r.get("series", "") for r in rows}):
        mine = sorted((r for r in rows if r.get("series", "") == series), key=lambda r: r[x])
        xs = [r[x] for r in mine]
        fig.add_scatter(x=xs, y=[r["measured"] for r in mine], mode="markers", name=f"{series} measured",
                        marker=dict(symbol="x", size=7))
        fig.add_scatter(x=xs, y=[r["predicted"] for r in mine], mode="lines", name=f"{series} predicted")
        fig.add_bar(x=xs, y=[100 * (r["predicted"] - r["measured"]) / r["measured"] if r["measured"] else None
                             for r in mine], name=f"{series} error %", yaxis="y2", opacity=0.35)
    return _layout(fig, "Predicted vs measured", height=420, xaxis_type="log" if x == "size_bytes" else "linear",
                   xaxis_title=x, yaxis_title="value", yaxis2=dict(title="error %", overlaying="y", side="right"))


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
