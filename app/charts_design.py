"""Pure Plotly figures for the design pages (sizing, MoE width, goodput): plain rows or
dicts from the perfsim API in, ``go.Figure`` out; no Streamlit."""

import plotly.graph_objects as go

LABELS = {
    "hidden_size": "hidden size", "ffn_hidden_size": "FFN width", "expert_ffn_hidden_size": "expert width",
    "head_dim": "head dim", "num_heads": "heads", "vocab_size": "vocab", "num_experts": "experts",
}


def _layout(fig: go.Figure, title: str, **kwargs) -> go.Figure:
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=40, b=10), legend_title_text="", **kwargs)
    return fig


def sizing_heatmap(grid: dict, metric: str = "tflops") -> go.Figure:
    """Heatmap of a layer's achieved TFLOPS (or efficiency) over two dimensions
    (``perfsim.efficiency_grid`` output); a marker at the model's current size."""
    z = grid[metric]
    scale = 100.0 if metric == "efficiency" else 1.0
    z = [[None if v is None else v * scale for v in row] for row in z]
    unit = "% of peak" if metric == "efficiency" else "TFLOPS"
    xl, yl = LABELS.get(grid["x_knob"], grid["x_knob"]), LABELS.get(grid["y_knob"], grid["y_knob"])
    fig = go.Figure(go.Heatmap(
        x=[str(x) for x in grid["x"]], y=[str(y) for y in grid["y"]], z=z, colorscale="Viridis",
        colorbar=dict(title=unit),
        hovertemplate=f"{xl} %{{x}}<br>{yl} %{{y}}<br>%{{z:.1f}} {unit}<extra></extra>"))
    cx, cy = grid["current"]
    if cx in grid["x"] and cy in grid["y"]:
        fig.add_scatter(x=[str(cx)], y=[str(cy)], mode="markers", name="current",
                        marker=dict(symbol="x", size=14, color="white", line=dict(width=2, color="black")))
    fig.update_xaxes(title=xl, type="category")
    fig.update_yaxes(title=yl, type="category")
    return _layout(fig, f"Layer {unit} vs {xl} and {yl}")


def kernel_bars(rows: list[dict]) -> go.Figure:
    """Achieved TFLOPS per kernel of a layer (``perfsim.sizing_table`` rows), memory-bound
    kernels in a second colour."""
    fig = go.Figure()
    for bound, color in (("compute", "#1f77b4"), ("memory", "#ff7f0e")):
        sel = [r for r in rows if r["bound"] == bound]
        if sel:
            fig.add_bar(x=[r["name"] for r in sel], y=[r["tflops"] for r in sel], name=f"{bound}-bound",
                        marker_color=color, customdata=[[100 * r["efficiency"], r["m"], r["n"], r["k"]] for r in sel],
                        hovertemplate="%{x}: %{y:.0f} TFLOPS (%{customdata[0]:.1f}% of peak)<br>"
                                      "m=%{customdata[1]} n=%{customdata[2]} k=%{customdata[3]}<extra></extra>")
    fig.update_yaxes(title="TFLOPS")
    return _layout(fig, "Predicted kernel throughput")


def moe_pareto(rows: list[dict]) -> go.Figure:
    """Training tokens/s per GPU vs decode latency per token, one marker per (experts,
    top-k) (``perfsim.moe_width_sweep`` rows); the Pareto front joined by a line."""
    fig = go.Figure()
    for k in sorted({r["top_k"] for r in rows}):
        sel = [r for r in rows if r["top_k"] == k and r["train_fits"]]
        if not sel:
            continue
        fig.add_scatter(
            x=[r["decode_latency_ms"] for r in sel], y=[r["train_tokens_per_s_per_gpu"] for r in sel],
            mode="markers+text", name=f"top-{k}", text=[f"E{r['experts']}" for r in sel], textposition="top center",
            marker=dict(size=[8 + 2 * r["experts"] ** 0.5 for r in sel]),
            customdata=[[r["experts"], r["expert_ffn_hidden_size"], r["total_params"] / 1e9, r["active_params"] / 1e9]
                        for r in sel],
            hovertemplate="E=%{customdata[0]} width %{customdata[1]}<br>total %{customdata[2]:.2f}B, "
                          "active %{customdata[3]:.3f}B<br>decode %{x:.2f} ms/token, train %{y:,.0f} tok/s/GPU"
                          "<extra></extra>")
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["decode_latency_ms"])
    if front:
        fig.add_scatter(x=[r["decode_latency_ms"] for r in front], y=[r["train_tokens_per_s_per_gpu"] for r in front],
                        mode="lines", name="Pareto front", line=dict(color="black", dash="dash"), hoverinfo="skip")
    fig.update_xaxes(title="decode latency per token (ms, lower is better)")
    fig.update_yaxes(title="training tokens/s per GPU (higher is better)")
    return _layout(fig, "MoE width: training throughput vs decode latency")


def goodput_curve(result: dict) -> go.Figure:
    """Goodput vs checkpoint interval (``perfsim.plan_goodput`` output's ``curve``), with
    the chosen (Daly) and the exact-optimum intervals marked."""
    curve = result["curve"]
    fig = go.Figure()
    fig.add_scatter(x=[p["interval_s"] / 60 for p in curve], y=[100 * p["goodput"] for p in curve], mode="lines",
                    name="goodput", hovertemplate="%{x:.1f} min: %{y:.2f}%<extra></extra>")
    fig.add_vline(x=result["interval_s"] / 60, line_dash="dash", line_color="green",
                  annotation_text="Daly" if "daly_interval_s" in result else "chosen")
    fig.add_vline(x=result["optimal_interval_s"] / 60, line_dash="dot", line_color="gray", annotation_text="optimum",
                  annotation_position="bottom right")
    fig.update_xaxes(title="checkpoint interval (min)", type="log")
    fig.update_yaxes(title="goodput (%)")
    return _layout(fig, "Goodput vs checkpoint interval")
