"""Timeline: the simulated step as a Gantt chart per pipeline stage and stream
(compute, communication, idle), zoomable; download the Perfetto trace."""

import streamlit as st

import charts
import common
import derive
import fmt

st.title("Timeline")
inputs = common.get_inputs()
common.plan_caption(inputs)

report = None
with common.shown_errors("This plan cannot run"):
    report = common.simulate(inputs)
if report is None:
    st.stop()

stages = sorted({s.rank for s in report.spans})
streams = sorted({s.stream for s in report.spans})
a, b, c = st.columns([2, 2, 1])
shown_stages = a.multiselect("Pipeline stages", stages, default=stages[:8], key="w.tl_stages")
shown_streams = b.multiselect("Streams", streams, default=streams, key="w.tl_streams")
max_bars = c.number_input("Max bars", min_value=200, max_value=50_000, value=4000, step=500, key="w.tl_bars",
                          help="Adjacent ops of one category are merged until at most this many bars remain")

spans = [s for s in report.spans if s.rank in shown_stages and s.stream in shown_streams]
bars = derive.gantt_bars(spans, report.step_time_s, int(max_bars))
bars += derive.idle_bars(spans, report.step_time_s)
groups = derive.span_groups(bars)
if bars:
    st.plotly_chart(charts.gantt(bars, groups), width="stretch", key="chart.gantt")
else:
    st.info("Pick at least one stage and one stream.")
st.caption(f"{len(report.spans):,} ops simulated, {len(bars):,} bars drawn · step {fmt.duration(report.step_time_s)} · "
           f"critical stage {report.critical_stage}; one representative rank per pipeline stage")

a, b = st.columns(2)
a.download_button(
    "Download Perfetto trace (JSON)", common.trace_json(inputs), file_name="perfsim_step.json",
    mime="application/json", icon=":material/download:",
    help="Open in https://ui.perfetto.dev or chrome://tracing",
)
b.download_button(
    "Download compressed trace (.json.gz)", common.trace_gz(inputs), file_name="perfsim_step.json.gz",
    mime="application/gzip", icon=":material/folder_zip:", key="tl.trace_gz",
    help="the same trace gzip-compressed (often 10x smaller); ui.perfetto.dev opens it directly",
)

st.subheader("Links of the critical stage")
if report.links:
    st.caption("How busy each link of the representative rank was over the step (its comm moving data; the xGMI "
               "row is the busiest peer link) and how much of the comm that uses it stuck out past compute. A "
               "link near 100% with exposed comm is why overlap failed; exposed comm on an idle link is latency.")
    st.table([{"link": name, "busy": fmt.duration(v["busy_s"]), "of the step": fmt.percent(v["utilization"]),
               "exposed comm on it": fmt.duration(v["exposed_s"])} for name, v in report.links.items()])
else:
    st.caption("No communication crosses a link in this plan.")
