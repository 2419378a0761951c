"""MoE width: for a fixed active (or total) parameter budget, training throughput against
inference decode latency per token on the same hardware, and the Pareto front."""

import json

import streamlit as st

import charts_design
import common
import fmt
import perfsim


@st.cache_data(max_entries=16, show_spinner=False)
def sweep(key: str) -> list[dict]:
    a = json.loads(key)
    base = perfsim.load_model(a.pop("model"))
    cluster = perfsim.load_cluster(a.pop("cluster"), nodes=a.pop("nodes"))
    serving = perfsim.design.moe_width.Serving(batch=a.pop("batch"), context=a.pop("context"), ep=a.pop("serve_ep"))
    training = perfsim.design.moe_width.Training(seq=a.pop("seq"), gbs=a.pop("gbs"))
    return perfsim.moe_width_sweep(base, cluster, serving=serving, training=training,
                                   experts=tuple(a.pop("experts")), top_k=tuple(a.pop("top_k")), **a)


def ints(text: str) -> list[int]:
    values = [int(v) for v in text.replace(",", " ").split()]
    if not values or min(values) < 1:
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


st.title("MoE width")
st.caption("Training: api.estimate on dp x ep over the cluster. Decode: memory-bound reads of the experts a batch "
           "touches (E(1-(1-k/E)^B)), KV cache, attention, all-to-all at the serving EP degree.")
models, clusters = common.model_names(), common.cluster_names()
moe_models = [m for m in models if perfsim.load_model(m).is_moe]
a, b, c, d = st.columns(4)
model = a.selectbox("Base model", moe_models, key="w.mw_model",
                    index=moe_models.index("zaya1-base") if "zaya1-base" in moe_models else 0)
inputs = common.get_inputs()  # the planner's cluster (mi300x-pollara, as the CLI, until changed on the Plan page)
cluster = b.selectbox("Cluster", clusters, key="w.mw_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
budget_kind = c.radio("Fixed budget", ("active", "total"), horizontal=True, key="w.mw_kind")
budget = d.number_input("Parameters (billions)", min_value=0.01, value=0.8 if budget_kind == "active" else 8.3,
                        step=0.1, key=f"w.mw_budget_{budget_kind}")
e, f, g, h, i = st.columns(5)
serving = perfsim.design.moe_width.Serving()  # one source of defaults with `perfsim moe-width`
batch = e.number_input("Decode batch", min_value=1, value=serving.batch, key="w.mw_batch")
context = f.number_input("Context", min_value=1, value=serving.context, step=1024, key="w.mw_context")
serve_ep = g.number_input("Serving EP", min_value=1, value=serving.ep, key="w.mw_ep")
nodes = h.number_input("Training nodes", min_value=1, value=128, key="w.mw_nodes")
seq = i.number_input("Training seq", min_value=1, value=4096, step=1024, key="w.mw_seq")
j, k = st.columns(2)
experts_text = j.text_input("Experts", ", ".join(map(str, perfsim.design.moe_width.DEFAULT_EXPERTS)), key="w.mw_experts")
topk_text = k.text_input("Top-k", ", ".join(map(str, perfsim.design.moe_width.DEFAULT_TOP_K)), key="w.mw_topk")

rows = None
with common.shown_errors("Cannot sweep"):
    args = {"model": model, "cluster": cluster, "nodes": int(nodes), "batch": int(batch), "context": int(context),
            "serve_ep": int(serve_ep), "seq": int(seq), "gbs": 2 * int(nodes) * common.cluster_info(cluster)["gpus_per_node"],
            "experts": ints(experts_text), "top_k": ints(topk_text),
            f"{budget_kind}_params": float(budget) * 1e9}
    with st.spinner("Sweeping expert counts and widths..."):
        rows = sweep(json.dumps(args, sort_keys=True))
if rows is None:
    st.stop()
if not rows:
    st.warning("No (experts, top-k) fits this budget.")
    st.stop()
st.plotly_chart(charts_design.moe_pareto(rows), width="stretch", key="chart.mw_pareto")
st.dataframe(fmt.scaled_rows(rows), hide_index=True, width="stretch", key="mw.table",
             column_config=fmt.column_config(st.column_config.NumberColumn))
st.caption("Pareto rows: no other width both trains faster and decodes sooner (quality is not modelled).")
