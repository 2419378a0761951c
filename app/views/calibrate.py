"""Calibrate: upload rccl-tests logs and kernel CSVs, see predicted vs measured and the
error, fit the profile (perfsim.calibrate), and save the calibrated profile."""

import tempfile
from pathlib import Path

import streamlit as st

import charts
import common
import derive
import fmt
import perfsim
from perfsim.system import hardware

st.title("Calibrate")
from perfsim.calibration.readers import read_kernel_csv, read_rccl_log  # noqa: E402
from perfsim.calibration.readers_multinode import read_collective_table  # noqa: E402
from perfsim.cost.collectives import bus_bandwidth  # noqa: E402
from perfsim.lowering.ops import Coll  # noqa: E402

EXAMPLES = sorted((common.DATA_DIR / "calibration" / "rccl-tests").glob("*.log"))
KERNEL_EXAMPLES = sorted(common.DATA_DIR.glob("gemm_*.csv"))  # the README's calibrate example (perfsim kernel schema)
P2P_EXAMPLES = sorted((common.DATA_DIR / "calibration").glob("*p2p*.csv"))
TABLE_EXAMPLES = sorted((common.DATA_DIR / "multinode").glob("collectives_*.csv"))  # multi-node series, SOURCES.md
clusters = common.cluster_names()
current = common.get_inputs()["cluster"]
cluster = st.selectbox("Profile to calibrate", clusters, key="w.c_cluster",
                       index=clusters.index(current) if current in clusters else 0)
a, b, c = st.columns(3)
logs = a.file_uploader("rccl-tests / nccl-tests logs", type=["log", "txt", "out"], accept_multiple_files=True,
                       key="w.c_logs")
csvs = b.file_uploader("Kernel CSVs (perfsim kernel schema)", type=["csv"], accept_multiple_files=True,
                       key="w.c_csvs")
p2ps = c.file_uploader("Point-to-point tables (TransferBench / CSV)", type=["csv", "txt", "log"],
                       accept_multiple_files=True, key="w.c_p2p")
a, b, c = st.columns(3)
examples = a.multiselect("...or shipped example logs", [p.name for p in EXAMPLES], key="w.c_examples",
                         help=f"from {common.DATA_DIR / 'calibration' / 'rccl-tests'} (sources: SOURCES.md there)")
kernel_examples = b.multiselect("...or shipped kernel CSVs", [p.name for p in KERNEL_EXAMPLES], key="w.c_kernel_examples",
                                help=f"from {common.DATA_DIR}")
p2p_examples = c.multiselect("...or shipped p2p tables", [p.name for p in P2P_EXAMPLES], key="w.c_p2p_examples",
                             help=f"from {common.DATA_DIR / 'calibration'}")
a, b = st.columns([2, 1])
tables = a.file_uploader("Multi-node collective tables (collectives_multinode.csv layout: one series per run)",
                         type=["csv"], accept_multiple_files=True, key="w.c_tables")
table_examples = b.multiselect("...or the shipped multi-node table", [p.name for p in TABLE_EXAMPLES],
                               key="w.c_table_examples",
                               help=f"from {common.DATA_DIR / 'multinode'} (sources: SOURCES.md there)")

workdir = Path(st.session_state.setdefault("calibrate.dir", tempfile.mkdtemp(prefix="perfsim-cal-")))


def saved(files) -> list[Path]:
    """Uploaded files written to the session's folder (the readers take paths)."""
    out = []
    for f in files or []:
        path = workdir / Path(f.name).name
        path.write_bytes(f.getvalue())
        out.append(path)
    return out


log_paths = saved(logs) + [p for p in EXAMPLES if p.name in examples]
csv_paths = saved(csvs) + [p for p in KERNEL_EXAMPLES if p.name in kernel_examples]
p2p_paths = saved(p2ps) + [p for p in P2P_EXAMPLES if p.name in p2p_examples]
table_paths = saved(tables) + [p for p in TABLE_EXAMPLES if p.name in table_examples]
if not log_paths and not csv_paths and not p2p_paths and not table_paths:
    st.info("Upload rccl-tests logs, kernel CSVs or multi-node tables, or pick a shipped example.",
            icon=":material/upload_file:")
    st.stop()

parsed, points = {}, []
for path in log_paths:
    with common.shown_errors(f"Cannot read {path.name}"):
        log = read_rccl_log(path)
        parsed[path] = log
        points += derive.rccl_points(log, path.stem)
        if log.num_skipped:
            st.warning(fmt.md(f"{path.name}: skipped {log.num_skipped} unparsable lines "
                              f"(first at line {log.skipped_lines[0]}); used {len(log.rows)} rows."))
        for note in log.env_notes:
            st.warning(fmt.md(note))
found = {}  # series name -> CollectiveSeries, of every multi-node table
for path in table_paths:
    with common.shown_errors(f"Cannot read {path.name}"):
        found.update({x.series: x for x in read_collective_table(path)})
profile_gpu = common.cluster_info(cluster)["gpu"]
chosen = []
if found:
    same_gpu = [name for name, x in found.items() if x.gpu.lower() == profile_gpu.lower()]
    chosen = st.multiselect("Series of the multi-node tables to compare and fit", list(found), default=same_gpu,
                            key="w.c_series", help="by default the series measured on the profile's GPU")
for name in chosen:
    points += derive.series_points(found[name])
kernels = []
for path in csv_paths:
    with common.shown_errors(f"Cannot read {path.name}"):
        kernels += read_kernel_csv(path)


@st.cache_data(max_entries=64, show_spinner=False)
def predict(cluster_ref: str, logs: tuple[str, ...], tables: tuple[str, ...] = (),
            series: tuple[str, ...] = ()) -> dict[tuple[str, float], float]:
    """Predicted time (us) per (log stem or series name, size): `perfsim validate` itself, so
    each log and series is priced as it ran (its rank geometry, launch mode, graph capture
    and forced path)."""
    from perfsim.calibration.validate import validate

    out = {}
    for path in logs:
        for p in validate(cluster_ref, rccl_logs=[path]).points:
            out[(Path(path).stem, p.x)] = p.predicted_s * 1e6
    if series:
        for p in validate(cluster_ref, collective_tables=list(tables), series=list(series)).points:
            out[(p.category.split(" (")[0], p.x)] = p.predicted_s * 1e6
    return out


def compare(cluster_ref: str, title: str) -> None:
    """Busbw curves against the measured points; MAPE and the error panel are of the time per
    call, the figure `perfsim validate` and the fit table report, so the three agree."""
    with common.shown_errors(f"Cannot predict with {title}"):
        predicted = predict(cluster_ref, tuple(str(p) for p in parsed), tuple(str(p) for p in table_paths),
                            tuple(chosen))
        rows = []
        for p in points:
            t = predicted.get((p["series"], p["size_bytes"]))
            if t and p.get("time_us"):
                busbw = bus_bandwidth(Coll(p["op"]), p["size_bytes"], p["ranks"], t * 1e-6)[1] / 1e9
                rows.append({**p, "predicted": busbw, "error": (t - p["time_us"]) / p["time_us"]})
        stats = derive.error_stats([{"measured": p["time_us"], "predicted": p["time_us"] * (1 + p["error"])}
                                    for p in rows])
        st.markdown(f"**{fmt.md(title)}**: MAPE of the time per call {fmt.percent(stats['mape'], 2)} over "
                    f"{stats['points']} sizes, worst {fmt.signed_percent(stats['worst'])}" if stats["points"]
                    else f"**{fmt.md(title)}**: no comparable points")
        st.plotly_chart(charts.predicted_vs_measured(rows), width="stretch", key=f"chart.pvm.{title}")


for path in parsed:
    with common.shown_errors(f"Cannot check the devices of {path.name}"):
        mismatch = derive.vendor_mismatch(path.read_text(errors="replace"), profile_gpu)
        if mismatch:
            st.warning(fmt.md(f"{path.name}: {mismatch}"), icon=":material/warning:")

if points:
    st.subheader("Collectives: predicted vs measured bus bandwidth")
    if parsed:
        st.dataframe([{"log": p.name, "op": lg.op, "ranks": lg.num_ranks, "nodes": lg.num_nodes, "graph": lg.graph,
                       "launch": lg.launch, "forced": " / ".join(x for x in (lg.algorithm, lg.protocol) if x) or "-",
                       "rows": len(lg.rows), "skipped": lg.num_skipped} for p, lg in parsed.items()],
                     hide_index=True, key="c.logs")
    if chosen:
        st.dataframe(derive.series_rows([found[name] for name in chosen]), hide_index=True, key="c.series")
    compare(cluster, f"profile {Path(cluster).stem}")
if kernels:
    st.subheader("Kernel measurements")
    st.dataframe(derive.kernel_rows(kernels), hide_index=True, width="stretch", key="c.kernels")

st.subheader("Fit")
calibrate = perfsim.calibrate
if st.button("Fit the profile to these measurements", type="primary", icon=":material/tune:", key="c.fit"):
    with common.shown_errors("Fit failed"), st.status("Fitting...", expanded=False) as status:
        result = calibrate(cluster, rccl_logs=[str(p) for p in log_paths], kernel_csvs=[str(p) for p in csv_paths],
                           p2p=[str(p) for p in p2p_paths], collective_tables=[str(p) for p in table_paths] if chosen else [],
                           series=list(chosen))
        st.session_state["calibrate.result"] = result
        status.update(label="Fitted", state="complete")
result = st.session_state.get("calibrate.result")
if result is not None:
    fitted = getattr(result, "cluster", result)
    fits = [vars(f) if not isinstance(f, dict) else f for f in getattr(result, "fits", ())]
    if fits:
        st.dataframe(fits, hide_index=True, width="stretch", key="c.fits",
                     column_config={"mape_before": st.column_config.NumberColumn("MAPE before %", format="%.1f"),
                                    "mape_after": st.column_config.NumberColumn("MAPE after %", format="%.1f")})
    for note in getattr(result, "notes", ()):
        st.caption(fmt.md(note))
    path = workdir / "calibrated.toml"
    with common.shown_errors("Cannot use the fitted profile"):
        hardware.write_cluster(fitted, path, overwrite=True)
        if points:
            compare(str(path), "calibrated profile")
        name = st.text_input("Save as", f"{Path(cluster).stem}-calibrated", key="w.c_name")
        if st.button("Save calibrated profile", icon=":material/save:", key="c.save"):
            common.profile_dir().mkdir(parents=True, exist_ok=True)
            out = hardware.write_cluster(fitted, common.profile_dir() / f"{Path(name).stem}.toml")
            st.success(fmt.md(f"Saved {out}; pick it as the cluster on the Plan page."), icon=":material/check_circle:")
