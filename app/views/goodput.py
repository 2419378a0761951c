"""Goodput: optimal checkpoint interval (Young/Daly), expected lost work, goodput and
tokens per day once failures, checkpoints and restarts are counted; Monte-Carlo check."""

import json
import math

import streamlit as st

import charts_design
import common
import fmt
import perfsim
from perfsim.design import goodput


@st.cache_data(max_entries=32, show_spinner=False)
def run(key: str) -> dict:
    a = json.loads(key)
    node_h, gpu_h = a.pop("mtbf_node_h"), a.pop("mtbf_gpu_h")
    failures = perfsim.FailureModel(mtbf_node_s=node_h * 3600, mtbf_gpu_s=gpu_h * 3600 if gpu_h else math.inf)
    model, cluster, runs = a.pop("model"), a.pop("cluster"), a.pop("monte_carlo_runs")
    out = perfsim.plan_goodput(model, cluster, failures=failures, monte_carlo_runs=0, **a)
    intervals = math.ceil(RUN_DAYS * 86400 / out["interval_s"])
    allowed = min(runs, goodput.MAX_MC_SAMPLES // intervals)  # a short interval means many intervals per run
    if allowed:
        out = perfsim.plan_goodput(model, cluster, failures=failures, monte_carlo_runs=allowed, run_days=RUN_DAYS, **a)
    out["monte_carlo_capped"] = (runs, allowed) if allowed < runs else None
    return out


RUN_DAYS = 30.0  # useful training days per Monte-Carlo run (the CLI's --run-days default)


st.title("Goodput")
inputs = common.get_inputs()
models, clusters = common.model_names(), common.cluster_names()
a, b, c, d = st.columns(4)
model = a.selectbox("Model", models, key="w.gp_model",
                    index=models.index(inputs["model"]) if inputs["model"] in models else 0)
cluster = b.selectbox("Cluster", clusters, key="w.gp_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
nodes = c.number_input("Nodes", min_value=1, value=int(inputs["nodes"]), key="w.gp_nodes")
stores = perfsim.list_storage()
storage = d.selectbox("Storage", stores, key="w.gp_storage",  # the CLI's default (perfsim.design.goodput)
                      index=stores.index(goodput.DEFAULT_STORAGE) if goodput.DEFAULT_STORAGE in stores else 0)
e, f, g, h, i = st.columns(5)
mtbf_node = e.number_input("Node MTBF (h)", min_value=0.1, value=2000.0, step=100.0, key="w.gp_mtbf_node")
mtbf_gpu = f.number_input("GPU MTBF (h, 0 = in node)", min_value=0.0, value=0.0, step=1000.0, key="w.gp_mtbf_gpu")
restart = g.number_input("Restart + re-init (s)", min_value=0.0, value=600.0, step=60.0, key="w.gp_restart",
                         help="assumed default; the checkpoint read is added")
asynchronous = h.toggle("Asynchronous checkpoint", key="w.gp_async")
runs = i.number_input("Monte-Carlo runs", min_value=0, value=100, step=50, key="w.gp_runs")
estimators = ("des", "analytic")
estimator = st.radio("Step time from", estimators, horizontal=True, key="w.gp_estimator",
                     index=estimators.index(goodput.DEFAULT_ESTIMATOR),
                     help="des: the engine, the step time the Plan page and `perfsim simulate` report; "
                          "analytic: the closed form")

out = None
with common.shown_errors("Cannot compute goodput"):
    gpus = int(nodes) * common.cluster_info(cluster)["gpus_per_node"]
    args = {"model": model, "cluster": cluster, "nodes": int(nodes), "storage": storage,
            "mtbf_node_h": float(mtbf_node), "mtbf_gpu_h": float(mtbf_gpu), "restart_s": float(restart),
            "async_checkpoint": bool(asynchronous), "monte_carlo_runs": int(runs), "estimator": estimator,
            "zero": 1, "gbs": 2 * gpus,
            "seq": 4096}
    with st.spinner("Estimating the step and simulating failures..."):
        out = run(json.dumps(args, sort_keys=True))
if out is None:
    st.stop()

m = st.columns(6)
m[0].metric("Step time", fmt.duration(out["step_time_s"]), help=f"estimator {out['estimator']}; plan {out['plan']}")
m[1].metric("Checkpoint interval", fmt.duration(out["interval_s"]))
m[2].metric("Goodput", fmt.percent(out["goodput"], 2))
m[3].metric("Tokens/day", fmt.si(out["tokens_per_day"]))
m[4].metric("Job MTBF", fmt.duration(out["system_mtbf_s"]))
m[5].metric("Lost work/failure", fmt.duration(out["lost_work_per_failure_s"]))
st.latex(r"\tau_{opt} = \sqrt{2\,\delta\,M} - \delta \quad\text{(Daly 2006, first order)}")
st.caption(fmt.md(f"Step time from the {out['estimator']} estimator (as `perfsim goodput --engine "
                  f"{out['estimator']}` and the Plan page); delta = {fmt.duration(out['delta_s'])} blocking per "
                  f"checkpoint, M = {fmt.duration(out['system_mtbf_s'])}; checkpoint {fmt.num_bytes(out['checkpoint_bytes'])}, "
                  f"write {fmt.duration(out['write_s'])}, read {fmt.duration(out['read_s'])}; exact-expectation "
                  f"optimum {fmt.duration(out['optimal_interval_s'])}."))
st.plotly_chart(charts_design.goodput_curve(out), width="stretch", key="chart.gp_curve")
if out.get("monte_carlo_capped"):
    asked, allowed = out["monte_carlo_capped"]
    st.caption(fmt.md(f"Monte-Carlo: {allowed} of {asked} runs: a {fmt.duration(out['interval_s'])} interval gives "
                      f"{math.ceil(RUN_DAYS * 86400 / out['interval_s']):,} intervals per {RUN_DAYS:g}-day run "
                      f"(limit {goodput.MAX_MC_SAMPLES:,} simulated intervals)."))
mc = out.get("monte_carlo")
if mc:
    lo, hi = mc["ci95_goodput"]
    verdict = "inside" if mc["agrees"] else "outside"
    st.info(f"Monte-Carlo: goodput {100 * mc['goodput']:.2f}% (95% CI {100 * lo:.2f}-{100 * hi:.2f}%, "
            f"{mc['runs']} runs); the closed form {100 * mc['closed_form_goodput']:.2f}% is {verdict} the CI.")
