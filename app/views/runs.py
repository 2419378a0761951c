"""Measured runs: upload a runs CSV (validation/runs layout) or use the shipped published
set, see predicted vs measured per run, fit a stack profile to the runs
(perfsim calibrate --runs) and download it."""

import tempfile
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

import common
import fmt
from perfsim.design.runs import GROUPS, memory_note, read_all, routing_note, validate_runs
from perfsim.design.runs_fit import BOUNDS, default_params, fit_stack, held_out_summary, leave_one_out
from perfsim.system.stacks import dump_stack, list_stacks, load_stack

SHIPPED = common.ROOT / "validation" / "runs" / "published.csv"

st.title("Measured runs")
st.caption(fmt.md("One measured training run per row: plan, software stack, metric, measured value, source and what "
                  "the source did not state (`validation/runs/SOURCES.md` describes the layout). Error = (predicted "
                  "- measured) / measured, closed form."))
upload = st.file_uploader("Runs CSV", type=["csv"], key="w.r_upload")
use_shipped = st.toggle("Use the shipped published runs", value=upload is None, key="w.r_shipped",
                        help=str(SHIPPED))


def _cases():
    if upload is not None and not use_shipped:
        folder = Path(tempfile.mkdtemp(prefix="perfsim-runs-"))
        path = folder / "runs.csv"
        path.write_bytes(upload.getvalue())
        return read_all([str(path)])
    return read_all([str(SHIPPED)]) if SHIPPED.is_file() else ()


cases = ()
with common.shown_errors("Runs"):
    cases = _cases()
if not cases:
    st.info("Upload a runs CSV, or use the shipped published runs.")
    st.stop()

choice = st.selectbox("Price every run under", ["each run's own stack", *list_stacks()], key="w.r_stack")
override = None if choice.startswith("each") else load_stack(choice)
result = None
with common.shown_errors("Validate"):
    result = validate_runs(cases, {c.id: override for c in cases} if override else None)
if result is None:
    st.stop()

a, b, c = st.columns(3)
a.metric("Runs", len(result.results))
b.metric("MAPE", f"{result.mape:.1f}%")
c.metric("Median |error|", f"{result.median_abs_pct:.1f}%")
fig = go.Figure()
for stack in sorted({r.stack for r in result.results}):
    rows = [r for r in result.results if r.stack == stack]
    fig.add_scatter(x=[r.case.measured for r in rows], y=[r.predicted for r in rows], mode="markers", name=stack,
                    text=[r.case.id for r in rows], hovertemplate="%{text}: %{x:.4g} measured, %{y:.4g} predicted")
top = max(max(r.case.measured, r.predicted) for r in result.results)
fig.add_scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured", line=dict(dash="dot"))
fig.update_layout(title="Predicted vs measured", xaxis_title="measured", yaxis_title="predicted", height=460)
st.plotly_chart(fig, width="stretch", key="r.chart")
st.dataframe([{"run": r.case.id, "stack": r.stack, "metric": r.case.metric, "measured": r.case.measured,
               "predicted": round(r.predicted, 4), "error %": round(r.error_pct, 1), "fits": r.fits,
               "peak GB": round(r.peak_memory_bytes / 1e9, 1),
               "printed peak GB": None if r.case.measured_peak_bytes is None else round(r.case.measured_peak_bytes / 1e9, 1),
               "peak error %": None if r.memory_error_pct is None else round(r.memory_error_pct, 1),
               "source": r.case.source_id, "assumed": r.case.assumed} for r in result.results],
             hide_index=True, width="stretch", key="r.table")
st.dataframe([{"split": key, "group": g, "MAPE %": round(m, 1)} for key in GROUPS
              for g, m in result.by(key).items()], hide_index=True, key="r.groups")
memory = memory_note(result)
if memory:
    st.caption(fmt.md(memory + " (every uploaded run ran: one predicted not to fit is a miss)"))
note = routing_note(cases)
if note:
    st.caption(fmt.md(note))

st.subheader("Fit a stack profile to these runs")
stacks = sorted({load_stack(c.stack).name for c in cases})
f1, f2 = st.columns(2)
target = f1.selectbox("Stack to fit", stacks, key="w.r_fit_stack")
mine = [c for c in cases if load_stack(c.stack).name == target]
params = f2.multiselect("Free parameters", list(BOUNDS), default=list(default_params(mine, load_stack(target))),
                        key=f"w.r_params.{target}", help="default: the stack's calibration protocol ([calibration] fit) "
                        "among the parameters these runs identify")
if st.button("Fit", key="w.r_fit", disabled=not params):
    with common.shown_errors("Fit"):
        fit = fit_stack(mine, target, params)
        held = leave_one_out(mine, target, params)
        st.session_state["r.fit"] = (target, fit, held)
if "r.fit" in st.session_state:
    name, fit, held = st.session_state["r.fit"]
    st.dataframe([{"parameter": k, "value": round(v, 4), "at bound": k in fit.at_bound} for k, v in fit.values.items()],
                 hide_index=True, key="r.fit_values")
    st.write(fmt.md(f"{name}: fitted to {fit.num_runs} runs ({', '.join(fit.fitted_on)}); rms |log error| "
                    f"{100 * fit.rms_log_error:.1f}%; {held_out_summary(held)}."))
    st.download_button("Download the fitted stack profile", dump_stack(fit.stack), file_name=f"{name}-fitted.toml",
                       mime="application/toml", key="w.r_download")
