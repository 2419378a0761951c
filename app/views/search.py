"""Search: find the best parallel plans for a model, cluster and batch under constraints
(perfsim.search); ranked table, Pareto chart, and "open this plan" on the Plan page."""

import json

import streamlit as st

import charts
import common
import derive
import fmt
from inputs import model_spec, nodes_for, search_switches, with_plan
from perfsim.search import DEFAULT_MAX_MEMORY_FRACTION

FIXABLE = ("tp", "pp", "ep", "cp", "zero", "mbs", "recompute", "dispatch")  # dispatch: a comma list, tried where ep > 1
EXECUTORS = ("local-spawn", "serial", "dask-local")  # never a forked pool inside Streamlit (issue 17.2)

st.title("Search")
search = common.optional_api("search", "search")
if search is None:
    common.unavailable("Parallelism search", "search")
    st.stop()

inputs = common.get_inputs()
models, clusters = common.model_names(), common.cluster_names()
a, b, c, d = st.columns(4)
model = a.selectbox("Model", models, key="w.s_model",
                    index=models.index(inputs["model"]) if inputs["model"] in models else 0)
cluster = b.selectbox("Cluster", clusters, key="w.s_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
gpus = c.text_input("GPUs", "1024", key="w.s_gpus",
                    help="a count (1024), a list (256,512) or a range of doublings (256-2048): several counts "
                         "give a Pareto front of GPU count vs throughput")
top = d.number_input("Top N", min_value=1, max_value=100, value=10, key="w.s_top")
e, f, g, h = st.columns(4)
gbs = e.number_input("gbs", min_value=1, value=inputs["knobs"]["gbs"], key="w.s_gbs")
seq = f.number_input("seq", min_value=1, value=inputs["knobs"]["seq"], key="w.s_seq")
mem = g.slider("Max memory fraction", 0.5, 1.0, DEFAULT_MAX_MEMORY_FRACTION, 0.05, key="w.s_mem",
               help="share of HBM a plan may use (the CLI's --max-memory default)")
objective = h.selectbox("Objective", ("time", "cost"), key="w.s_objective",
                        help="time: minimize step time; cost: minimize $ per token at a $/GPU-hour price")
with st.expander("Constraints and execution"):
    cols = st.columns(len(FIXABLE))
    fixed = {axis: col.text_input(f"fix {axis}", "", key=f"w.s_fix_{axis}", placeholder="any")
             for col, axis in zip(cols, FIXABLE)}
    i, j, k = st.columns(3)
    price = i.number_input("$ per GPU-hour (cost objective)", min_value=0.0, value=2.0, step=0.25, key="w.s_price")
    confirm = j.number_input("Confirm the best N with the engine", min_value=0, max_value=20, value=3, key="w.s_confirm")
    executor = k.selectbox("Executor", EXECUTORS, key="w.s_executor",
                           help="local-spawn: a pool of fresh worker processes, closed when the search ends "
                                "(a forked pool would inherit the planner's threads and signal handlers); "
                                "serial: in this process; dask-local: a Dask LocalCluster")
    ep_overlap = st.checkbox("Also try the expert-parallel all-to-all overlap", key="w.s_ep_overlap",
                             help="--ep-comm-overlap: each plan with and without Megatron-Core's combined 1F1B "
                                  "(an MoE layer's all-to-alls beside another microbatch's compute), where it can "
                                  "run: ep > 1, cp 1, pp 1 or vpp > 1, without TP-comm overlap")

dtype, stack = inputs["knobs"].get("dtype", "bf16"), inputs.get("stack") or "ideal"
switches = search_switches(inputs, model_spec({**inputs, "model": model, "model_config": None}))
SWITCH_WORDS = {"clip_grad": "gradient clip", "overlap_grad_reduce": "gradient-reduction overlap",
                "overlap_param_gather": "parameter prefetch", "dispatch_fp8": "FP8 dispatch", "real_data": "real data",
                "fp8_params": "FP8 weights", "shared_expert_overlap": "shared-expert overlap"}
# the knobs that take a name or a count (every key search_switches may return is in one of the two)
NAMED = {"fp8_recipe": "FP8 recipe", "zero3_gather": "ZeRO-3 gathers", "dispatch_compute_units": "dispatch compute units",
         "pipeline_flushes": "pipeline schedules per step"}
said = ", ".join(f"{NAMED[k]} {v}" if k in NAMED else f"{SWITCH_WORDS[k]} {'on' if v else 'off'}"
                 for k, v in sorted(switches.items()))
st.caption(fmt.md(f"Every plan runs in {dtype} under the {stack} stack, {said} (set on the Plan page)."))

args = None
with common.shown_errors("Invalid search"):
    pinned = {axis: (v.strip() if axis == "recompute" else
                     tuple(n.strip() for n in v.split(",") if n.strip()) if axis == "dispatch" else int(v))
              for axis, v in fixed.items() if v.strip()}
    if ep_overlap:
        pinned["ep_comm_overlap"] = (False, True)
    args = {"model": model, "cluster": cluster, "gpus": gpus.strip(), "gbs": int(gbs), "seq": int(seq),
            "top": int(top), "max_memory_fraction": float(mem), "objective": objective, "fixed": pinned or None,
            "usd_per_gpu_hour": float(price) if objective == "cost" else None, "confirm": int(confirm),
            "executor": executor, "dtype": dtype, "stack": stack, "plan_knobs": switches}
if args and st.button("Run search", type="primary", icon=":material/play_arrow:", key="s.run"):
    st.session_state["search.args"] = args

results = st.session_state.setdefault("search.results", {})  # cached per input for this session
key = json.dumps(st.session_state.get("search.args"), sort_keys=True)
if st.session_state.get("search.args") and key not in results:
    with common.shown_errors("Search failed"), st.status("Searching plans...", expanded=True) as status:
        bar = st.progress(0.0, text="enumerating")

        def progress(phase: str, done: int, total: int) -> None:
            bar.progress(done / max(total, 1), text=f"{phase}: {done}/{total}")

        call = dict(st.session_state["search.args"])
        result = search(call.pop("model"), call.pop("cluster"), progress=progress, **call)
        results[key] = {"rows": derive.search_rows(result), "summary": derive.search_summary(result),
                        "accuracy": (getattr(result, "accuracy", None) or {}).get("lines", [])}
        status.update(label=f"{len(results[key]['rows'])} ranked plans", state="complete", expanded=False)
found = results.get(key)
if not found:
    st.stop()

rows = found["rows"]
if found["summary"]:
    st.caption(fmt.md(found["summary"]))
if found.get("accuracy"):
    with st.expander("How far to trust these: perfsim's own held-out checks (the same for every plan here)",
                     icon=":material/fact_check:"):
        st.markdown("\n".join(f"- {fmt.md(line)}" for line in found["accuracy"]))
st.dataframe(fmt.scaled_rows([{k: v for k, v in r.items() if k != "plan"} for r in rows]), hide_index=True,
             width="stretch", key="s.table",
             column_config=fmt.column_config(st.column_config.NumberColumn))
multi = len({r.get("world_size") for r in rows}) > 1
x = "world_size" if multi else "peak_memory_bytes"
y = "tokens_per_s" if multi else "tokens_per_s_per_gpu"
if all(x in r and y in r for r in rows):
    st.plotly_chart(charts.pareto_chart(rows, derive.pareto_front(rows, x, y), x, y,
                                        {"world_size": "GPUs", "peak_memory_bytes": "peak memory per GPU (bytes)",
                                         "tokens_per_s": "tokens/s", "tokens_per_s_per_gpu": "tokens/s/GPU"}),
                    width="stretch", key="chart.pareto")

a, b = st.columns([3, 1], vertical_alignment="bottom")
pick = a.selectbox("Plan", range(len(rows)), format_func=lambda i: f"#{rows[i]['rank']}: {rows[i]['label']}",
                   key="w.s_pick")
if b.button("Open this plan", icon=":material/open_in_new:", key="s.open", width="stretch"):
    row = rows[pick]
    per_node = common.cluster_info(cluster)["gpus_per_node"]
    new = with_plan({**inputs, "model": model, "model_config": None, "cluster": cluster, "model_edit": {},
                     "hardware_edit": {}}, row["plan"])
    new["nodes"] = nodes_for(row.get("world_size", per_node), per_node)
    common.set_inputs(new)
    st.switch_page("views/plan.py")
