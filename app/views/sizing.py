"""Sizing: MI300X-aware model dimensions. Predicted TFLOPS of one layer's kernels, the
nearest better-quantized sizes with what they buy, and a heatmap over two dimensions."""

import json

import streamlit as st

import charts_design
import common
import perfsim

AXES = ("hidden", "ffn", "head_dim", "heads", "vocab", "experts")


@st.cache_data(max_entries=32, show_spinner=False)
def table(key: str) -> list[dict]:
    a = json.loads(key)
    work = perfsim.Workload(seq=a["seq"], mbs=a["mbs"], tp=a["tp"])
    return perfsim.sizing_table(perfsim.load_model(a["model"]), perfsim.load_cluster(a["cluster"], nodes=1), work)


@st.cache_data(max_entries=32, show_spinner=False)
def grid(key: str) -> dict:
    a = json.loads(key)
    work = perfsim.Workload(seq=a["seq"], mbs=a["mbs"], tp=a["tp"])
    gpu = perfsim.load_cluster(a["cluster"], nodes=1).gpu
    return perfsim.efficiency_grid(perfsim.load_model(a["model"]), gpu, a["x"], a["xs"], a["y"], a["ys"], work)


def around(value: int, step: int, count: int = 9) -> list[int]:
    """``count`` sizes spaced ``step`` apart, centred on ``value`` (all >= step)."""
    start = max(step, value - step * (count // 2))
    return [start + i * step for i in range(count)]


st.title("Sizing")
st.caption("Predicted by the calibrated cost model: GEMM size falloff x wave quantization over the GPU's "
           "compute units, per-expert tile padding, flash attention, memory-bound regimes.")
inputs = common.get_inputs()
models, clusters = common.model_names(), common.cluster_names()
a, b, c, d, e = st.columns(5)
model = a.selectbox("Model", models, key="w.sz_model",
                    index=models.index(inputs["model"]) if inputs["model"] in models else 0)
cluster = b.selectbox("Cluster", clusters, key="w.sz_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
seq = c.number_input("seq", min_value=1, value=4096, step=1024, key="w.sz_seq")
mbs = d.number_input("mbs", min_value=1, value=1, key="w.sz_mbs")
tp = e.number_input("tp", min_value=1, value=1, key="w.sz_tp")
base = {"model": model, "cluster": cluster, "seq": int(seq), "mbs": int(mbs), "tp": int(tp)}

rows = None
with common.shown_errors("Cannot size this model"):
    rows = table(json.dumps(base, sort_keys=True))
if rows is None:
    st.stop()
st.dataframe([{k: r[k] for k in ("name", "m", "n", "k", "groups", "tflops", "efficiency", "quantization", "bound",
                                 "suggestion", "gain_pct", "step_time_change_pct", "tflops_per_gpu_change_pct")}
              for r in rows], hide_index=True, width="stretch", key="sz.table",
             column_config={"tflops": st.column_config.NumberColumn("TFLOPS", format="%.1f"),
                            "efficiency": st.column_config.NumberColumn(format="percent"),
                            "gain_pct": st.column_config.NumberColumn("gain %", format="%+.1f"),
                            "step_time_change_pct": st.column_config.NumberColumn("step %", format="%+.2f"),
                            "tflops_per_gpu_change_pct": st.column_config.NumberColumn("TFLOPS/GPU %", format="%+.2f")})
if not any(r["suggestion"] for r in rows):
    st.caption("No nearby size quantizes better on this GPU; larger kernels still run faster per FLOP.")
st.plotly_chart(charts_design.kernel_bars(rows), width="stretch", key="chart.sz_kernels")

st.subheader("Heatmap")
spec = perfsim.load_model(model)
f, g, h, i = st.columns(4)
x = f.selectbox("x axis", AXES, index=0, key="w.sz_x")
y = g.selectbox("y axis", AXES, index=1, key="w.sz_y")
step = h.selectbox("step", (64, 128, 256, 512), index=2, key="w.sz_step")
metric = i.radio("colour", ("tflops", "efficiency"), horizontal=True, key="w.sz_metric")
heat = None
with common.shown_errors("Cannot draw this grid"):
    fields = {"hidden": "hidden_size", "head_dim": "head_dim", "heads": "num_heads", "vocab": "vocab_size",
              "experts": "num_experts",
              "ffn": "expert_ffn_hidden_size" if spec.is_moe and not spec.ffn_hidden_size else "ffn_hidden_size"}
    steps = {"heads": spec.num_kv_heads, "experts": 4, "head_dim": 16}
    xs = around(getattr(spec, fields[x]), steps.get(x, int(step)))
    ys = around(getattr(spec, fields[y]), steps.get(y, int(step)))
    heat = grid(json.dumps({**base, "x": x, "xs": xs, "y": y, "ys": ys}, sort_keys=True))
if heat is not None:
    st.plotly_chart(charts_design.sizing_heatmap(heat, metric), width="stretch", key="chart.sz_heatmap")
