"""Plan: pick a model, a cluster and the parallel plan; see step time, throughput, MFU,
where the time goes, memory per rank against capacity, and warnings."""

import streamlit as st

import charts
import common
import derive
import fmt
import baseline
import editing
import inputs as planner_inputs
import perfsim
from inputs import CHOICES, KNOBS, PLACEMENTS, default_inputs
from perfsim.system.stacks import list_stacks
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULE_LEVELS, RECOMPUTE_MODULES

DEFAULT_DISPATCH = default_inputs()["fidelity"]["dispatch"]
OVERLAP_CHOICES = {"stack's": None, "on": True, "off": False}  # the stack's overlap policy unless overridden


def _overlap(column, label: str, key: str, fidelity: dict, help: str, disabled: bool = False,
             stacks: str = "the software stack's overlap policy"):
    """A stack-defaulted switch (the overlaps, FP8 weights): the stack's policy (None) or an
    explicit on/off override; ``stacks`` says what "stack's" means for it."""
    value = fidelity.get(key)
    now = "stack's" if value is None else ("on" if value else "off")
    choice = column.selectbox(label, list(OVERLAP_CHOICES), key=common.seed(key, now), disabled=disabled,
                              help=f"{help}; stack's = {stacks}")
    return OVERLAP_CHOICES[choice]

def _has(model: str, model_config: str | None, fact: str) -> bool:
    """Whether the model has ``fact`` (``common.model_facts``: "experts", "shared_experts")."""
    try:
        return bool(common.model_facts({"model": model, "model_config": model_config})[fact])
    except Exception:  # the page shows the model error itself
        return False


def _dispatch(column, experts: bool, cluster: str, fidelity: dict) -> str:
    """The "MoE dispatch" selectbox (--dispatch): the chosen cluster's implementations,
    alltoall first; only for a model with experts (a dense model dispatches nothing: alltoall).
    A stored choice the cluster does not offer (a scenario from another cluster, the cluster
    changed) falls back to alltoall."""
    if not experts:
        return DEFAULT_DISPATCH
    try:
        options = list(planner_inputs.dispatch_options(cluster))
    except Exception:  # the page shows the cluster error itself
        return DEFAULT_DISPATCH
    stored = fidelity.get("dispatch") or DEFAULT_DISPATCH
    wkey = common.seed("dispatch", stored if stored in options else DEFAULT_DISPATCH)
    if st.session_state.get(wkey) not in options:
        st.session_state[wkey] = DEFAULT_DISPATCH
    return column.selectbox("MoE dispatch", options, key=wkey,
                            help="--dispatch: the dispatch/combine all-to-all where ep > 1: alltoall (the collective "
                                 "library's) or one of the cluster profile's [dispatch] implementations (mori, "
                                 "deepep, ...)")


def _dispatch_fp8(column, experts: bool, dtype: str, fidelity: dict) -> bool:
    """The "FP8 dispatch" toggle (--dispatch-fp8): MoE models only, enabled under dtype fp8."""
    if not experts:
        return False
    on = column.toggle("FP8 dispatch", key=common.seed("dispatch_fp8", bool(fidelity.get("dispatch_fp8"))),
                       disabled=dtype != "fp8",
                       help="--dispatch-fp8 (dtype fp8): tokens go to their experts as FP8 + one FP32 scale per 128 "
                            "values; the combine stays BF16")
    return bool(on) and dtype == "fp8"


def _shared_overlap(column, shared: bool, fidelity: dict) -> bool:
    """The "Shared-expert overlap" toggle (--shared-expert-overlap): models with shared experts only."""
    if not shared:
        return False
    return bool(column.toggle("Shared-expert overlap", key=common.seed("shared_expert_overlap",
                                                                        bool(fidelity.get("shared_expert_overlap"))),
                              help="--shared-expert-overlap (Megatron-Core --moe-shared-expert-overlap): the shared "
                                   "experts beside the dispatch and combine all-to-alls; not with the EP all-to-all "
                                   "overlap or the shared_experts recompute module"))


def _dispatch_units(column, experts: bool, fidelity: dict) -> int | None:
    """The "Dispatch SMs / CUs" box (--dispatch-compute-units): MoE models only; empty is the
    cluster profile's count."""
    if not experts:
        return None
    units = column.number_input("Dispatch SMs / CUs", min_value=0, max_value=1 << 20, step=1, value=None,
                                placeholder="the profile's",
                                key=common.seed("dispatch_compute_units", fidelity.get("dispatch_compute_units")),
                                help="--dispatch-compute-units: the SMs / CUs the dispatch and combine kernels hold "
                                     "while they run (DeepEP's num_sms); compute overlapped with them runs on the "
                                     "rest. Empty: the cluster profile's (deepep 20 on NVIDIA)")
    return None if units is None else int(units)


RECIPE_LABELS = {"": "the stack's", "delayed": "delayed", "current": "current"}


GATHER_LABELS = {"": "the stack's", "per-pass": "every pass", "once": "once a step", "pipeline": "once with pp > 1"}


def _zero3_gather(column, zero: int, fidelity: dict) -> str:
    """The "ZeRO-3 gathers" choice (--zero3-gather): enabled under zero 3; "" = the stack's."""
    stored = fidelity.get("zero3_gather") or ""
    chosen = column.selectbox("ZeRO-3 gathers", list(GATHER_LABELS), format_func=GATHER_LABELS.get,
                              key=common.seed("zero3_gather", stored if stored in GATHER_LABELS else ""),
                              disabled=zero != 3,
                              help="--zero3-gather (zero 3): per-pass gathers each layer's weights before every "
                                   "forward and backward pass (FSDP2's default); once gathers them once a step and "
                                   "keeps weights and gradients unsharded until the last backward (PyTorch "
                                   "pipelining's FSDP path, MaxText pipeline_fsdp_ag_once); pipeline: once with "
                                   "pp > 1 (torchtitan's default); default: the stack's")
    return chosen if zero == 3 else ""


def _fp8_recipe(column, dtype: str, fidelity: dict) -> str:
    """The "FP8 recipe" choice (--fp8-recipe): enabled under dtype fp8; "" = the stack's."""
    stored = fidelity.get("fp8_recipe") or ""
    chosen = column.selectbox("FP8 recipe", list(RECIPE_LABELS), format_func=RECIPE_LABELS.get,
                              key=common.seed("fp8_recipe", stored if stored in RECIPE_LABELS else ""),
                              disabled=dtype != "fp8",
                              help="--fp8-recipe (dtype fp8): delayed scaling (scales from earlier steps' amax "
                                   "history, Megatron-LM's default) or current scaling (an amax pass before each "
                                   "cast: Megatron --fp8-recipe tensorwise, NVIDIA's FP8-CS); default: the stack's")
    return chosen if dtype == "fp8" else ""


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
        model = st.selectbox("Preset", names, key=common.seed("model", model if model in names else names[0]),
                             on_change=common.refit_widgets)
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
                           key=common.seed("cluster", current["cluster"] if current["cluster"] in clusters else clusters[0]),
                           on_change=common.refit_widgets)
    nodes = st.number_input("Nodes", min_value=1, max_value=100_000, step=1, key=common.seed("nodes", current["nodes"]),
                            on_change=common.refit_widgets)
    model_edit, hardware_edit = {}, {}
    with common.shown_errors("Cannot edit this model"):
        model_edit = editing.model_editor(planner_inputs.model_spec({"model": model, "model_config": model_config}),
                                          model if not model_config else "uploaded", current.get("model_edit") or {}
                                          if model == current["model"] else {})
    with common.shown_errors("Cannot edit this cluster"):
        hardware_edit = editing.hardware_editor(perfsim.load_cluster(cluster), cluster, current["knobs"]["dtype"],
                                                current.get("hardware_edit") or {} if cluster == current["cluster"] else {})
    estimator = st.radio("Estimator", CHOICES["estimator"], horizontal=True, key=common.seed("estimator", current["estimator"]),
                         help="des: SimPy discrete-event engine (contention, overlap); analytic: closed form")
    stacks = list_stacks()
    stack = st.selectbox("Software stack", stacks, key=common.seed("stack", current.get("stack") or "ideal"),
                         help="what the training framework adds (launch gaps, syncs, fused kernels, MoE dispatch, "
                              "kernel speed; perfsim/hardware_profiles/stacks); its overlap policy sets the overlap "
                              "knobs below unless they are set to on or off")
    if st.button("Reset to ZAYA1 on 128 MI300X nodes", icon=":material/restart_alt:"):
        common.set_inputs(default_inputs())
        st.rerun()

# ---- plan knobs ---------------------------------------------------------------------------
knobs = {}
with st.expander("Parallel plan", expanded=True, icon=":material/grid_view:"):
    helps = {"dp": "0 = derive from the GPU count", "vpp": "virtual stages per pp stage (interleaved schedule; 2 for the V-shaped zbv / v-half / v-min)",
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
with st.expander("Overlap, MoE and variability knobs", icon=":material/tune:"):
    fidelity = dict(current.get("fidelity") or default_inputs()["fidelity"])
    f = st.columns(5)
    fidelity["tp_comm_overlap"] = _overlap(f[0], "TP comm overlap", "tp_comm_overlap", fidelity,
                                           "--tp-comm-overlap: TP all-gather/reduce-scatter beside the GEMM")
    fidelity["ep_comm_overlap"] = _overlap(f[0], "EP all-to-all overlap", "ep_comm_overlap", fidelity,
                                           "--ep-comm-overlap: an MoE layer's all-to-alls beside another "
                                           "microbatch's compute (Megatron-Core's combined 1F1B; pp 1 or vpp > 1, "
                                           "no TP-comm overlap or cp > 1)")
    fidelity["overlap_grad_reduce"] = _overlap(f[0], "Overlap grad reduce", "overlap_grad_reduce", fidelity,
                                               "off = --no-overlap")
    fidelity["overlap_param_gather"] = _overlap(f[0], "Prefetch param gathers", "overlap_param_gather", fidelity,
                                                "ZeRO all-gathers prefetched a layer ahead; off = --no-param-prefetch")
    fidelity["dma_offload"] = f[1].toggle("DMA offload", key=common.seed("dma_offload", fidelity["dma_offload"]),
                                          help="--dma-offload: comm on DMA engines, no compute interference")
    fidelity["clip_grad"] = f[1].toggle("Clip gradients", key=common.seed("clip_grad", fidelity.get("clip_grad", True)),
                                        help="gradient clipping by global norm before the optimizer step "
                                             "(off = --no-clip-grad)")
    fidelity["real_data"] = f[1].toggle("Real data", key=common.seed("real_data", fidelity.get("real_data", False)),
                                        help="--real-data: the stack's input pipeline adds its unhidden host time "
                                             "per step ([data] host_s_per_mtoken; 0 in every shipped stack but maxtext)")
    fidelity["overlap_cu_share"] = f[1].number_input("Overlap CU share", min_value=0.0, max_value=0.95, step=0.05,
                                                     key=common.seed("overlap_cu_share", fidelity["overlap_cu_share"]),
                                                     help="--overlap-cu-share: compute lost while comm overlaps it")
    fidelity["grad_bucket_mb"] = f[2].number_input("Grad bucket (MB)", min_value=1.0, step=10.0,
                                                   key=common.seed("grad_bucket_mb", fidelity["grad_bucket_mb"]),
                                                   help="--grad-bucket-size")
    capped = f[2].toggle("Cap expert capacity", key=common.seed("capped", fidelity["capacity_factor"] is not None))
    fidelity["capacity_factor"] = f[3].number_input(
        "Capacity factor", min_value=0.0, step=0.25, disabled=not capped,
        key=common.seed("capacity_factor", fidelity["capacity_factor"] or 1.25),
        help="--capacity-factor: tokens per expert capped at factor x mean (off: the model's own)") if capped else None
    routing["placement"] = f[3].selectbox("Expert placement", PLACEMENTS, key=common.seed(
        "placement", routing.get("placement", "contiguous")), help="--expert-placement contiguous | speed")
    experts = _has(model, model_config, "experts")
    fidelity["dispatch"] = _dispatch(f[3], experts, cluster, fidelity)
    fidelity["dispatch_fp8"] = _dispatch_fp8(f[3], experts, knobs["dtype"], fidelity)
    fidelity["shared_expert_overlap"] = _shared_overlap(f[3], _has(model, model_config, "shared_experts"), fidelity)
    fidelity["dispatch_compute_units"] = _dispatch_units(f[3], experts, fidelity)
    fidelity["fp8_recipe"] = _fp8_recipe(f[2], knobs["dtype"], fidelity)
    fidelity["zero3_gather"] = _zero3_gather(f[1], int(knobs.get("zero", 1)), fidelity)
    fidelity["fp8_params"] = _overlap(
        f[2], "FP8 weights", "fp8_params", fidelity,
        help="--fp8-params / --no-fp8-params (dtype fp8): FP8 primary weights (Transformer Engine fp8_model_init, "
             "Megatron --fp8-param-gather): 1 B a weight, no weight cast, ZeRO gathers in FP8",
        disabled=knobs["dtype"] != "fp8", stacks="its [fp8] primary_weights (on under nemo)")
    fidelity["gpu_variability"] = f[4].number_input("GPU variability (cv)", min_value=0.0, max_value=0.5, step=0.01,
                                                    key=common.seed("gpu_variability", fidelity["gpu_variability"]),
                                                    help="--gpu-variability: std-dev of per-GPU speed")
    fidelity["variability_seed"] = f[4].number_input("variability seed", min_value=0, step=1,
                                                     key=common.seed("variability_seed", fidelity["variability_seed"]))
    u = st.columns(4)
    fidelity["first_stage_layers"] = u[0].number_input(
        "First-stage layers", min_value=0, step=1, key=common.seed("first_stage_layers", fidelity.get("first_stage_layers", 0)),
        help="--first-stage-layers (Megatron --decoder-first-pipeline-num-layers); 0 = an even split")
    fidelity["last_stage_layers"] = u[1].number_input(
        "Last-stage layers", min_value=0, step=1, key=common.seed("last_stage_layers", fidelity.get("last_stage_layers", 0)),
        help="--last-stage-layers (Megatron --decoder-last-pipeline-num-layers); 0 = an even split")
    fidelity["account_for_embedding"] = u[0].toggle(
        "Embedding takes a layer slot", key=common.seed("account_for_embedding", bool(fidelity.get("account_for_embedding"))),
        help="--account-for-embedding (Megatron --account-for-embedding-in-pipeline-split): layers + slots split "
             "evenly, the first virtual stage a layer short")
    fidelity["account_for_loss"] = u[1].toggle(
        "Loss takes a layer slot", key=common.seed("account_for_loss", bool(fidelity.get("account_for_loss"))),
        help="--account-for-loss (Megatron --account-for-loss-in-pipeline-split): the last virtual stage a layer short")
    fidelity["mtp_layers"] = u[2].number_input(
        "MTP layers", min_value=0, max_value=64, step=1, key=common.seed("mtp_layers", int(fidelity.get("mtp_layers") or 0)),
        help="--mtp-layers (Megatron --mtp-num-layers, DeepSeek-V3's multi-token prediction): one more transformer "
             "layer, embedding, projection, LM head and loss each, on the last virtual stage or where the layout puts it")
    fidelity["pipeline_flushes"] = u[3].number_input(
        "Pipeline flushes", min_value=1, step=1,
        key=common.seed("pipeline_flushes", int(fidelity.get("pipeline_flushes") or 1)),
        help="--pipeline-flushes: gradient accumulation as that many pipeline schedules one after another, each "
             "filling and draining the pipeline (torchtitan, NeMo AutoModel); must divide the microbatches; pp > 1")
    fidelity["pipeline_layout"] = st.text_input(
        "Pipeline layout", key=common.seed("pipeline_layout", str(fidelity.get("pipeline_layout") or "")),
        placeholder="e.g. Et|(tt|)*30mL",
        help="--pipeline-layout (Megatron --pipeline-model-parallel-layout): virtual stages in forward order split by "
             "'|'; E embedding, t decoder layer, m MTP layer, L loss; x*N and (...)*N repeat; pp x vpp stages; "
             "empty = the even split (or the options above)")
    fidelity["recompute_layers"] = u[2].number_input(
        "Recompute layers per stage", min_value=0, step=1, key=common.seed("recompute_layers", fidelity.get("recompute_layers", 0)),
        help="--recompute-layers: only the first N layers of each stage chunk recompute (Megatron block method); 0 = all")
    fidelity["recompute_modules"] = st.multiselect(
        "Selective recompute modules", list(RECOMPUTE_MODULES),
        key=common.seed("recompute_modules", list(fidelity.get("recompute_modules") or DEFAULT_RECOMPUTE_MODULES)),
        disabled=knobs["recompute"] not in RECOMPUTE_MODULE_LEVELS,
        help="--recompute-modules (Megatron's, with recompute selective or auto): core_attn the attention core; "
             "mla_up_proj MLA's query / key / value up projections and their rope; layernorm an MoE layer's pre-MLP "
             "norm (the other norms are fused into the next linear under Transformer Engine); moe_act the routed "
             "experts' activation; shared_experts the shared experts; mlp a dense layer's MLP; moe an MoE layer's "
             "router, dispatch, experts and combine") or list(DEFAULT_RECOMPUTE_MODULES)
for note in st.session_state.pop("plan.refit_notes", []):
    st.info(fmt.md(f"Reset a knob that no longer fits: {note}"), icon=":material/restart_alt:")

inputs = {"model": model, "model_config": model_config, "cluster": cluster, "nodes": int(nodes),
          "knobs": knobs, "routing": routing, "fidelity": fidelity, "model_edit": model_edit,
          "hardware_edit": hardware_edit, "estimator": estimator, "stack": stack}
st.session_state["inputs"] = inputs
common.plan_caption(inputs)
with common.shown_errors("Model"):
    facts = common.model_facts(inputs)
    shape = f"{facts['layers']} layers, hidden {facts['hidden']:,}" + (
        f", {facts['experts']} experts top-{facts['top_k']}" if facts["experts"] else "")
    st.sidebar.caption(fmt.md(f"{fmt.params(facts['total'])} parameters, {fmt.params(facts['active'])} active per "
                              f"token without embeddings ({fmt.params(facts['total_emb'])} / "
                              f"{fmt.params(facts['active_emb'])} with); {shape}"))
if source != "preset" and not model_config:
    st.stop()

# ---- results ------------------------------------------------------------------------------
report = None
with common.shown_errors("This plan cannot run"):
    report = common.simulate(inputs)
if report is None:
    st.stop()

base = baseline.pinned() or {}
m = st.columns(6)
m[0].metric("Step time", fmt.duration(report.step_time_s), delta=baseline.relative(report.step_time_s, base.get("step_time_s")),
            delta_color="inverse")
m[1].metric("Tokens/s", fmt.si(report.tokens_per_s),
            delta=baseline.relative(report.tokens_per_s, base.get("tokens_per_s")))
m[2].metric("Tokens/s/GPU", fmt.si(report.tokens_per_s_per_gpu),
            delta=baseline.relative(report.tokens_per_s_per_gpu, base.get("tokens_per_s_per_gpu")))
m[3].metric("MFU", fmt.percent(report.mfu), delta=baseline.relative(report.mfu, base.get("mfu")))
m[4].metric("TFLOPS/GPU", f"{report.tflops_per_gpu:,.0f}",
            delta=baseline.relative(report.tflops_per_gpu, base.get("tflops_per_gpu")))
m[5].metric("Peak memory", fmt.num_bytes(report.peak_memory_bytes),
            delta=f"{fmt.num_bytes(abs(report.memory_capacity_bytes - report.peak_memory_bytes))} "
                  + (f"free of {fmt.num_bytes(report.memory_capacity_bytes)}" if report.fits
                     else f"over capacity ({fmt.num_bytes(report.memory_capacity_bytes)})"),
            delta_color="normal" if report.fits else "inverse", delta_arrow="off")

for warning in report.warnings:
    st.warning(fmt.md(warning), icon=":material/warning:")
for note in derive.idle_link_notes(derive.stream_utilization(report.spans, report.step_time_s)):
    st.info(fmt.md(f"Idle link: {note}"), icon=":material/link_off:")

baseline.controls(inputs, report)
baseline.show(report)
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

if report.accuracy.get("lines"):
    with st.expander("How far to trust this: perfsim's own held-out checks", icon=":material/fact_check:"):
        st.markdown("\n".join(f"- {fmt.md(line)}" for line in report.accuracy["lines"]))
        st.caption(fmt.md("Held out = priced by tables or stack values fitted without that source; the figures "
                          "and what each was fitted and checked on are in docs/accuracy.md."))

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
