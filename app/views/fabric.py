"""Fabric: collective bus bandwidth vs message size for chosen ops and GPU counts, with
measured calibration points overlaid; link utilization of the simulated step."""

import os

import streamlit as st

import charts
import common
import derive
import fmt
from perfsim.units import parse_size

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
MEASURED_CSV = "calibration/allreduce_busbw_vs_size.csv"

st.title("Fabric")
inputs = common.get_inputs()
clusters = common.cluster_names()

# ---- collective sweep ---------------------------------------------------------------------
st.subheader("Collectives: bus bandwidth vs size")
a, b, c = st.columns([2, 2, 2])
cluster = a.selectbox("Cluster profile", clusters, key="w.fab_cluster",
                      index=clusters.index(inputs["cluster"]) if inputs["cluster"] in clusters else 0)
ops = b.multiselect("Collectives", OPS, default=["all_reduce", "all_to_all"], key="w.fab_ops")
gpus = c.multiselect("GPU counts", [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], default=[8, 64, 1024],
                     key="w.fab_gpus")
d, e, f = st.columns([1, 1, 4])
low = d.text_input("Min size (-b)", "8", key="w.fab_min")
high = e.text_input("Max size (-e)", "8G", key="w.fab_max")
csv_path = f.text_input("Measured points (CSV, rccl-tests columns)",
                        os.environ.get("PERFSIM_CALIBRATION_CSV", str(common.DATA_DIR / MEASURED_CSV)),
                        key="w.fab_csv", help="Default: validation/data/calibration/allreduce_busbw_vs_size.csv (shipped in the "
                                             "repository); set PERFSIM_DATA to move the data folder")

predicted = []
with common.shown_errors("Cannot sweep these collectives"):
    sizes = tuple(derive.size_sweep(parse_size(low, "min size"), parse_size(high, "max size")))
    with st.status(f"Timing {len(ops) * len(gpus) * len(sizes)} collectives...", expanded=False) as status:
        for op in ops:
            for n in gpus:
                predicted += common.collective_rows(op, int(n), cluster, sizes)
        status.update(label=f"Timed {len(predicted)} collectives on {cluster}", state="complete")
measured = derive.read_measured_busbw(csv_path)
if not measured:
    st.info(fmt.md(f"No measured points at {csv_path!r}; showing predictions only."), icon=":material/info:")
elif "all_reduce" not in ops:
    st.caption("Measured points are all_reduce runs; pick all_reduce to compare against them.")
series = sorted({r["series"] for r in measured})
chosen = st.multiselect("Measured series", series, default=[s for s in series if "mi300x" in s.lower()][:2],
                        key="w.fab_series")
st.plotly_chart(charts.busbw_chart(predicted, [r for r in measured if r["series"] in chosen]), width="stretch",
                key="chart.busbw")

# ---- link utilization of the simulated step ------------------------------------------------
st.subheader("Link utilization of the simulated step")
common.plan_caption(inputs)
report = None
with common.shown_errors("This plan cannot run"):
    report = common.simulate(inputs)
if report is not None:
    rows = derive.stream_utilization(report.spans, report.step_time_s)
    st.plotly_chart(charts.utilization_bar(rows), width="stretch", key="chart.util")
    for note in derive.idle_link_notes(rows):
        st.info(fmt.md(f"Idle link: {note}"), icon=":material/link_off:")
    st.caption("Busy fraction = time a stream has at least one op in flight / step time, per representative rank "
               "of each pipeline stage; GB/s is bytes moved / busy time (collective payload, rccl-tests 'size').")
