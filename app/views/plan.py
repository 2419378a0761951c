"""Plan: pick a model, a cluster and the parallel plan; see step time, throughput, MFU,
where the time goes, memory per rank against capacity, and warnings."""

import streamlit as st

import charts
import common
import derive
import fmt
from inputs import CHOICES, KNOBS, default_inputs

st.title("Plan")
current = common.get_inputs()

# ---- model and cluster (sidebar) -------------------------------------------------------
with st.sidebar:
    st.subheader("Model and cluster")
    source = st.radio("Model", ("preset", "upload config.json"), horizontal=True,
                      key=common.seed("model_source", "upload config.json" if current.get("model_config") else "preset"))
    model, model_config = current["model"], None
    if source == "preset":
        names = common.model_names()
        model = st.selectbox("Preset", names, key=common.seed("model", model if model in names else names[0]))
    else:
        upload = st.file_uploader("Hugging Face config.json", type=["json"], key="w.model_upload")
        if upload is not None:
            model, model_config = upload.name.removesuffix(".json"), upload.getvalue().decode("utf-8", "replace")
        elif current.get("model_config"):
            model_config = current["model_config"]
            st.caption(fmt.md(f"Using the stored config of {model!r}."))
        else:
            st.info("Upload a config.json (Llama, Mixtral, Qwen-MoE, DeepSeek, OLMoE).")
    clusters = common.cluster_names()
    cluster = st.selectbox("Cluster profile", clusters,
                           key=common.seed("cluster", current["cluster"] if current["cluster"] in clusters else clusters[0]))
    nodes = st.number_input("Nodes", min_value=1, max_value=100_000, step=1, key=common.seed("nodes", current["nodes"]))
    estimator = st.radio("Estimator", CHOICES["estimator"], horizontal=True, key=common.seed("estimator", current["estimator"]),
                         help="des: SimPy discrete-event engine (contention, overlap); analytic: closed form")
    if st.button("Reset to ZAYA1 on 128 MI300X nodes", icon=":material/restart_alt:"):
        common.set_inputs(default_inputs())
        st.rerun()

# ---- plan knobs ---------------------------------------------------------------------------
knobs = {}
with st.expander("Parallel plan", expanded=True, icon=":material/grid_view:"):
    helps = {"dp": "0 = derive from the GPU count", "vpp": "virtual stages per pp stage (interleaved schedule)",
             "etp": "expert tensor parallel", "zero": "ZeRO stage 0-3", "gbs": "global batch (sequences)"}
    columns = st.columns(len(KNOBS))
    for column, key in zip(columns, KNOBS):
        low = 0 if key in ("dp", "zero") else 1
        knobs[key] = column.number_input(key, min_value=low, step=1, help=helps.get(key),
                                         key=common.seed(key, current["knobs"][key]))
    c = st.columns(7)
    for column, key in zip(c, ("dtype", "recompute", "schedule")):
        knobs[key] = column.selectbox(key, CHOICES[key], key=common.seed(key, current["knobs"][key]))
    routing = dict(current["routing"])
    routing["distribution"] = c[3].selectbox("MoE routing", CHOICES["distribution"],
                                             key=common.seed("distribution", routing["distribution"]))
    routing["skew"] = c[4].number_input("zipf skew", min_value=0.0, step=0.1, key=common.seed("skew", routing["skew"]))
    routing["concentration"] = c[5].number_input("dirichlet conc.", min_value=0.01, step=0.1,
                                                 key=common.seed("concentration", routing.get("concentration", 1.0)))
    routing["seed"] = c[6].number_input("routing seed", min_value=0, step=1, key=common.seed("seed", routing["seed"]))

inputs = {"model": model, "model_config": model_config, "cluster": cluster, "nodes": int(nodes),
          "knobs": knobs, "routing": routing, "estimator": estimator}
st.session_state["inputs"] = inputs
common.plan_caption(inputs)
if source != "preset" and not model_config:
    st.stop()

# ---- results ------------------------------------------------------------------------------
report = None
with common.shown_errors("This plan cannot run"):
    report = common.simulate(inputs)
if report is None:
    st.stop()

m = st.columns(6)
m[0].metric("Step time", fmt.duration(report.step_time_s))
m[1].metric("Tokens/s", fmt.tokens_per_s(report.tokens_per_s))
m[2].metric("Tokens/s/GPU", fmt.tokens_per_s(report.tokens_per_s_per_gpu))
m[3].metric("MFU", fmt.percent(report.mfu))
m[4].metric("TFLOPS/GPU", f"{report.tflops_per_gpu:,.0f}")
m[5].metric("Peak memory", fmt.num_bytes(report.peak_memory_bytes),
            delta=f"{fmt.num_bytes(abs(report.memory_capacity_bytes - report.peak_memory_bytes))} "
                  + (f"free of {fmt.num_bytes(report.memory_capacity_bytes)}" if report.fits
                     else f"over capacity ({fmt.num_bytes(report.memory_capacity_bytes)})"),
            delta_color="normal" if report.fits else "inverse", delta_arrow="off")

for warning in report.warnings:
    st.warning(fmt.md(warning), icon=":material/warning:")
for note in derive.idle_link_notes(derive.stream_utilization(report.spans, report.step_time_s)):
    st.info(fmt.md(f"Idle link: {note}"), icon=":material/link_off:")

left, right = st.columns([3, 2])
left.plotly_chart(charts.breakdown_bar(derive.breakdown_rows(report.breakdown, report.overlapped_comm_s),
                                       report.overlapped_comm_s), width="stretch", key="chart.breakdown")
right.plotly_chart(charts.memory_bar(report.memory, report.memory_capacity_bytes), width="stretch", key="chart.memory")
st.caption(fmt.md(f"{report.world_size:,} GPUs · estimator {report.estimator} · the bar is where critical pipeline "
                  f"stage {report.critical_stage}'s step goes (sums to the step; its idle time is pipeline_bubble)"))
with st.expander("Critical path: why it differs from the breakdown", icon=":material/route:"):
    st.markdown(fmt.md(derive.critical_path_note(report)))
    st.dataframe([{"category": k, "on the critical path": fmt.duration(v), "in the breakdown": fmt.duration(report.breakdown.get(k, 0.0))}
                  for k, v in derive.critical_path_rows(report)], hide_index=True, key="plan.critical")

st.download_button("Download HTML run report", common.html_report(inputs), file_name="perfsim_run.html",
                   mime="text/html", icon=":material/download:", key="plan.html",
                   help="plan, breakdown, memory, communication with message sizes per collective and per layer, "
                        "timeline; the same report as `perfsim simulate --html`")

# ---- save as a scenario -------------------------------------------------------------------
with st.container(border=True):
    st.markdown("**Save this scenario** (compare it on the Compare page)")
    a, b = st.columns([4, 1], vertical_alignment="bottom")
    name = a.text_input("Scenario name", key="w.scenario_name", placeholder="e.g. zaya1 dp1024 zero1")
    if b.button("Save scenario", icon=":material/save:", width="stretch"):
        with common.shown_errors("Could not save"):
            saved = common.store().save(name, inputs, report.to_dict())
            st.success(fmt.md(f"Saved scenario {saved!r}."), icon=":material/check_circle:")
