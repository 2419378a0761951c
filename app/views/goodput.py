"""Goodput: optimal checkpoint interval (Young/Daly), expected lost work, goodput and
tokens per day once failures, checkpoints and restarts are counted; Monte-Carlo check."""

import json
import math

import streamlit as st

import charts_design
import common
import perfsim


@st.cache_data(max_entries=32, show_spinner=False)
def run(key: str) -> dict:
    a = json.loads(key)
    node_h, gpu_h = a.pop("mtbf_node_h"), a.pop("mtbf_gpu_h")
    failures = perfsim.FailureModel(mtbf_node_s=node_h * 3600, mtbf_gpu_s=gpu_h * 3600 if gpu_h else math.inf)
    return perfsim.plan_goodput(a.pop("model"), a.pop("cluster"), failures=failures, **a)


st.title("Goodput")
inputs = common.get_inputs()
models, clusters = common.model_names(), common.cluster_names()
a, b, c, d = st.columns(4)
model = a.selectbox("Model", models, key="w.gp_model",
                    index=models.index(inputs["model"]) if inputs["model"] in models else 0)
cluster = b.selectbox("Cluster", clusters, key="w.gp_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
nodes = c.number_input("Nodes", min_value=1, value=128, key="w.gp_nodes")
storage = d.selectbox("Storage", perfsim.list_storage(), key="w.gp_storage")
e, f, g, h, i = st.columns(5)
mtbf_node = e.number_input("Node MTBF (h)", min_value=0.1, value=2000.0, step=100.0, key="w.gp_mtbf_node")
mtbf_gpu = f.number_input("GPU MTBF (h, 0 = in node)", min_value=0.0, value=0.0, step=1000.0, key="w.gp_mtbf_gpu")
restart = g.number_input("Restart + re-init (s)", min_value=0.0, value=600.0, step=60.0, key="w.gp_restart",
                         help="assumed default; the checkpoint read is added")
asynchronous = h.toggle("Asynchronous checkpoint", key="w.gp_async")
runs = i.number_input("Monte-Carlo runs", min_value=0, value=100, step=50, key="w.gp_runs")

out = None
with common.shown_errors("Cannot compute goodput"):
    gpus = int(nodes) * common.cluster_info(cluster)["gpus_per_node"]
    args = {"model": model, "cluster": cluster, "nodes": int(nodes), "storage": storage,
            "mtbf_node_h": float(mtbf_node), "mtbf_gpu_h": float(mtbf_gpu), "restart_s": float(restart),
            "async_checkpoint": bool(asynchronous), "monte_carlo_runs": int(runs), "zero": 1, "gbs": 2 * gpus,
            "seq": 4096}
    with st.spinner("Estimating the step and simulating failures..."):
        out = run(json.dumps(args, sort_keys=True))
if out is None:
    st.stop()

m = st.columns(5)
m[0].metric("Checkpoint interval", f"{out['interval_s'] / 60:,.1f} min")
m[1].metric("Goodput", f"{100 * out['goodput']:.2f}%")
m[2].metric("Tokens/day", f"{out['tokens_per_day'] / 1e9:,.1f} B")
m[3].metric("Job MTBF", f"{out['system_mtbf_s'] / 3600:,.2f} h")
m[4].metric("Lost work/failure", f"{out['lost_work_per_failure_s']:,.0f} s")
st.latex(r"\tau_{opt} = \sqrt{2\,\delta\,M} - \delta \quad\text{(Daly 2006, first order)}")
st.caption(f"delta = {out['delta_s']:.2f} s blocking per checkpoint, M = {out['system_mtbf_s']:.0f} s; "
           f"checkpoint {out['checkpoint_bytes'] / 1e9:,.1f} GB, write {out['write_s']:.1f} s, read {out['read_s']:.1f} s; "
           f"exact-expectation optimum {out['optimal_interval_s']:.0f} s.")
st.plotly_chart(charts_design.goodput_curve(out), width="stretch", key="chart.gp_curve")
mc = out.get("monte_carlo")
if mc:
    lo, hi = mc["ci95_goodput"]
    verdict = "inside" if mc["agrees"] else "outside"
    st.info(f"Monte-Carlo: goodput {100 * mc['goodput']:.2f}% (95% CI {100 * lo:.2f}-{100 * hi:.2f}%, "
            f"{mc['runs']} runs); the closed form {100 * mc['closed_form_goodput']:.2f}% is {verdict} the CI.")
