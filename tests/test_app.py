"""The Streamlit planner driven headless (streamlit.testing AppTest): every page through
its main interactions, invalid plans shown inline, and never an exception."""

import json
import re
import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import perfsim
import perfsim.calibration.validate
from tests.conftest import fill_search_form

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app" / "planner.py"
sys.path.insert(0, str(ROOT / "app"))

import fmt  # noqa: E402
from scenarios import ScenarioStore  # noqa: E402

EXAMPLE_LOG = ROOT / "validation" / "data" / "calibration" / "rccl-tests" / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """Scenario DB and saved profiles in the test's folder."""
    monkeypatch.setenv("PERFSIM_DB", str(tmp_path / "scenarios.db"))
    monkeypatch.setenv("PERFSIM_PROFILES", str(tmp_path / "profiles"))
    return tmp_path


def start(page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT_S).run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    ok(at)
    return at


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def is_duration(text: str) -> bool:
    """A planner duration: a number and its unit ('445 ms', '2.13 s')."""
    return re.fullmatch(r"[\d,.]+ (µs|ms|s|min|h)", text) is not None


def knob(at: AppTest, name: str, value) -> AppTest:
    at.number_input(key=f"w.{name}").set_value(value).run()
    ok(at)
    return at


# ---- Plan -----------------------------------------------------------------------------------

def test_plan_default_is_zaya1_on_128_mi300x_nodes():
    at = start()
    assert not errors(at)
    direct = perfsim.simulate("zaya1-base", "mi300x-pollara", nodes=128, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096)
    assert metric(at, "Step time") == fmt.duration(direct.step_time_s)
    assert metric(at, "Tokens/s") == fmt.si(direct.tokens_per_s)  # not "0.05 M"; the label carries the unit
    assert metric(at, "MFU") == f"{direct.mfu:.1%}"
    assert len(at.get("plotly_chart")) == 2  # breakdown + memory


def test_plan_errors_render_as_typed_not_as_markdown():
    """Issue 17.7: `tp*pp*cp*dp = 3*1*1*1024` must not become italics."""
    at = start()
    knob(at, "tp", 3)
    shown = errors(at)[0]
    assert r"tp\*pp\*cp\*dp = 3\*1\*1\*1024" in shown
    assert shown.replace("\\", "") .startswith("This plan cannot run: plan: tp*pp*cp*dp = 3*1*1*1024")


def test_plan_page_explains_the_critical_path():
    at = start()
    note = next(m.value for m in at.markdown if "longest chain" in m.value)
    assert "critical" in note.lower() and "bubble" in note
    assert any("sums to the step" in c.value for c in at.caption)


def test_plan_page_says_how_far_to_trust_the_prediction():
    """perfsim.calibration.accuracy: the stack's, the GPU's and the cluster's held-out figures, as the CLI prints them."""
    at = start()
    labels = [e.label for e in at.expander]
    assert any("How far to trust this" in label for label in labels)
    note = next(m.value for m in at.markdown if "adds no framework cost" in m.value)
    assert "kernels mi300x" in note and "collectives mi300x-pollara" in note


def test_plan_page_offers_the_html_run_report():
    """Issue 17.18: the same report as `perfsim simulate --html`, for the plan on the page."""
    at = start()
    labels = [d.proto.label for d in at.get("download_button")]
    assert "Download HTML run report" in labels
    sys.path.insert(0, str(ROOT / "app"))
    import inputs as planner_inputs
    from perfsim.cli import html_report

    text = html_report.render(planner_inputs.simulate(at.session_state["inputs"]))
    assert "zaya1-base" in text and ">Communication" in text and ">Timeline" in text


def test_changing_a_knob_changes_the_step_time():
    at = start()
    before = metric(at, "Step time")
    knob(at, "gbs", 4096)
    assert metric(at, "Step time") != before and not errors(at)
    at.selectbox(key="w.recompute").set_value("full").run()
    ok(at)
    assert not errors(at)


@pytest.mark.parametrize("knobs, message", [
    ({"tp": 3}, "must equal the GPU count"),
    ({"vpp": 2}, "vpp"),
    ({"gbs": 1000}, "gbs"),
    ({"ep": 3}, "ep"),
    ({"dp": 0, "cp": 2, "seq": 4095}, "seq"),
    ({"etp": 3}, "etp"),
])
def test_invalid_plans_show_the_reason_inline(knobs, message):
    at = start()
    for name, value in knobs.items():
        knob(at, name, value)
    assert errors(at) and message in errors(at)[0], errors(at)
    assert not at.metric  # no stale results


def test_out_of_memory_is_a_warning_with_the_memory_chart():
    at = start()
    knob(at, "nodes", 1)  # invalid until dp follows: cheap intermediate states
    knob(at, "gbs", 8)
    knob(at, "dp", 8)
    knob(at, "zero", 0)
    at.selectbox(key="w.model").set_value("llama3.1-70b").run()
    assert any("out of memory" in w.value for w in at.warning)
    assert "over capacity" in next(m for m in at.metric if m.label == "Peak memory").delta


def test_moe_skew_warns_about_imbalance_and_analytic_estimator_runs():
    at = start()
    knob(at, "ep", 8)
    at.selectbox(key="w.distribution").set_value("zipf").run()
    knob(at, "skew", 1.2)
    assert any("imbalance" in w.value for w in at.warning), [w.value for w in at.warning]
    at.radio(key="w.estimator").set_value("analytic").run()
    ok(at)
    assert not errors(at) and any("estimator analytic" in c.value for c in at.caption)


def test_uploaded_hf_config_and_a_broken_one():
    at = start()
    at.radio(key="w.model_source").set_value("upload config.json").run()
    ok(at)
    assert not at.metric  # waiting for a file
    config = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000}
    at.file_uploader(key="w.model_upload").set_value(("tiny.json", json.dumps(config).encode(), "application/json")).run()
    ok(at)
    assert not errors(at) and is_duration(metric(at, "Step time"))
    at.file_uploader(key="w.model_upload").set_value(("bad.json", b"{not json", "application/json")).run()
    ok(at)
    assert "not valid JSON" in errors(at)[0]


def test_save_scenarios_from_the_plan_page(isolated):
    at = start()
    at.text_input(key="w.scenario_name").input("baseline").run()
    save = next(b for b in at.button if b.label == "Save scenario")
    save.click().run()
    ok(at)
    save = next(b for b in at.button if b.label == "Save scenario")
    save.click().run()
    assert [s.value for s in at.success][-1] == "Saved scenario 'baseline (2)'."
    store = ScenarioStore(isolated / "scenarios.db")
    assert store.names() == ["baseline", "baseline (2)"]
    assert store.get("baseline").results["plan"]["dp"] == 1024


def test_saving_without_a_name_is_an_inline_error():
    at = start()
    next(b for b in at.button if b.label == "Save scenario").click().run()
    ok(at)
    assert "scenario name" in errors(at)[0]


def test_reset_restores_the_default():
    at = start()
    knob(at, "gbs", 4096)
    next(b for b in at.button if "Reset" in b.label).click().run()
    ok(at)
    assert at.number_input(key="w.gbs").value == 2048


# ---- Timeline -------------------------------------------------------------------------------

def test_timeline_gantt_and_trace_download():
    at = start()
    knob(at, "gbs", 256)
    knob(at, "dp", 0)
    knob(at, "pp", 4)
    knob(at, "tp", 2)
    at.switch_page("views/timeline.py").run()
    ok(at)
    assert not errors(at)
    assert at.multiselect(key="w.tl_stages").value == [0, 1, 2, 3]
    assert len(at.get("plotly_chart")) == 1
    labels = [d.proto.label for d in at.get("download_button")]
    assert "Download Perfetto trace (JSON)" in labels and "Download compressed trace (.json.gz)" in labels
    import gzip
    import common
    assert json.loads(gzip.decompress(common.trace_gz(at.session_state["inputs"]))) == json.loads(
        common.trace_json(at.session_state["inputs"]))
    at.multiselect(key="w.tl_streams").set_value(["pp_comm"]).run()
    ok(at)
    at.number_input(key="w.tl_bars").set_value(200).run()
    ok(at)
    assert any("ops simulated" in c.value for c in at.caption)
    links = at.table[-1].value  # per-link busy and exposed comm of the critical stage (issue 13)
    assert {"nic", "xgmi"} <= set(links["link"]) and "exposed comm on it" in links.columns


def test_timeline_of_an_invalid_plan_says_why():
    at = start()
    knob(at, "tp", 3)
    at.switch_page("views/timeline.py").run()
    ok(at)
    assert "must equal the GPU count" in errors(at)[0]


# ---- Fabric ---------------------------------------------------------------------------------

def test_fabric_sweep_measured_points_and_link_utilization():
    at = start("fabric")
    assert not errors(at)
    charts = at.get("plotly_chart")
    assert len(charts) == 2  # busbw vs size, stream utilization
    assert at.multiselect(key="w.fab_series").value  # measured MI300X series overlaid (shipped in the repo)
    at.multiselect(key="w.fab_ops").set_value(["reduce_scatter"]).run()
    at.multiselect(key="w.fab_gpus").set_value([16]).run()
    ok(at)
    assert not errors(at)


def test_fabric_without_measured_data_and_with_bad_sizes(isolated):
    at = start("fabric")
    at.text_input(key="w.fab_csv").input(str(isolated / "none.csv")).run()
    ok(at)
    assert any("No measured points" in i.value for i in at.info)
    at.text_input(key="w.fab_max").input("lots").run()
    ok(at)
    assert errors(at) and "max size" in errors(at)[0]


# ---- Search ---------------------------------------------------------------------------------

def fake_search(calls):
    def search(model, cluster, progress=None, **kwargs):
        calls.append((model, cluster, kwargs))
        plans = [dict(tp=1, pp=1, dp=1024, zero=1, mbs=1, gbs=kwargs["gbs"], seq=kwargs["seq"]),
                 dict(tp=2, pp=1, dp=512, zero=1, mbs=1, gbs=kwargs["gbs"], seq=kwargs["seq"])]
        rows = []
        for plan in plans:
            report = perfsim.estimate(model, cluster, gpus=1024, check_memory=False, **plan)
            rows.append({**report.to_dict(), "why": "" if not rows else "slower"})
        return sorted(rows, key=lambda r: r["step_time_s"])
    return search


def test_search_page_runs_ranks_and_opens_a_plan(monkeypatch):
    calls = []
    monkeypatch.setattr(perfsim, "search", fake_search(calls), raising=False)
    at = start("search")
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert not errors(at)
    assert calls and calls[0][2]["gpus"] == "1024" and calls[0][2]["gbs"] == 2048
    assert len(at.dataframe) == 1 and len(at.get("plotly_chart")) == 1
    at.selectbox(key="w.s_pick").set_value(1).run()
    ok(at)
    picked = at.session_state["inputs"]
    next(b for b in at.button if b.label == "Open this plan").click().run()
    ok(at)
    assert picked["cluster"] == "mi300x-pollara"
    assert at.number_input(key="w.dp").value in (512, 1024) and is_duration(metric(at, "Step time"))
    assert at.session_state["inputs"]["nodes"] == 128


def test_search_page_names_every_plan_switch_the_plan_page_set(monkeypatch):
    """The Search page says which of the Plan page's choices every plan carries, the counted
    ones too (it raised KeyError on the dispatch's compute units), and passes them on: the
    pipeline schedules per step reach the search's plan_knobs."""
    calls = []
    monkeypatch.setattr(perfsim, "search", fake_search(calls), raising=False)
    at = start()
    inputs = at.session_state["inputs"]
    inputs["fidelity"] = {**(inputs.get("fidelity") or {}), "dispatch_compute_units": 40, "pipeline_flushes": 2}
    at.session_state["inputs"] = inputs
    at.switch_page("views/search.py").run()
    ok(at)
    said = " ".join(c.value for c in at.caption)
    assert "dispatch compute units 40" in said and "pipeline schedules per step 2" in said
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert calls[0][2]["plan_knobs"]["pipeline_flushes"] == 2 and calls[0][2]["plan_knobs"]["dispatch_compute_units"] == 40


def test_search_page_fix_axes_and_bad_input(monkeypatch):
    calls = []
    monkeypatch.setattr(perfsim, "search", fake_search(calls), raising=False)
    at = start("search")
    at.text_input(key="w.s_fix_tp").input("two").run()
    ok(at)
    assert "invalid literal" in errors(at)[0]
    at.text_input(key="w.s_fix_tp").input("1").run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert calls[-1][2]["fixed"] == {"tp": 1}
    at.checkbox(key="w.s_ep_overlap").check().run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert calls[-1][2]["fixed"] == {"tp": 1, "ep_comm_overlap": (False, True)}


def test_search_page_real_errors_are_inline():
    try:
        import perfsim.search  # noqa: F401
    except ImportError:
        pytest.skip("perfsim.search not written yet")
    at = start("search")
    at.text_input(key="w.s_gpus").input("lots").run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert "gpus" in errors(at)[0]


def test_search_page_with_the_real_search_or_unavailable():
    """With perfsim.search present this runs it for real (a small space, in process);
    without, the page says so."""
    at = start("search")
    try:
        import perfsim.search  # noqa: F401
    except ImportError:
        assert any("unavailable" in w.value for w in at.warning)
        return
    fill_search_form(at, "llama3.1-8b", "8,16", 64, 2048)
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert not errors(at), errors(at)
    table = at.dataframe[0].value
    assert len(table) >= 2 and set(table["world_size"]) == {8, 16}
    assert table["step_time_s"].notna().all() and "enumerated" in at.caption[-1].value
    assert len(at.get("plotly_chart")) == 1  # Pareto: GPU count vs tokens/s
    assert any("How far to trust these" in e.label for e in at.expander)  # perfsim.calibration.accuracy, once
    assert any("kernels mi300x" in m.value for m in at.markdown)
    next(b for b in at.button if b.label == "Open this plan").click().run()
    ok(at)
    assert not errors(at) and is_duration(metric(at, "Step time"))
    assert at.session_state["inputs"]["model"] == "llama3.1-8b" and at.session_state["inputs"]["nodes"] in (1, 2)


def _pool_workers() -> list:
    """Live multiprocessing workers spawned by this process (the resource tracker is not one)."""
    psutil = pytest.importorskip("psutil")
    kids = psutil.Process().children(recursive=True)
    return [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE
            and "spawn_main" in " ".join(k.cmdline())]


def test_search_page_default_pool_is_spawned_and_closed():
    """Issue 17.2: a forked pool inherited Streamlit's SIGTERM handler and hung the page;
    the page's default is a spawn pool, shows progress, and leaves no worker behind."""
    at = start("search")
    assert at.selectbox(key="w.s_executor").value == "local-spawn"
    at.selectbox(key="w.s_model").set_value("llama3.1-8b").run()
    at.text_input(key="w.s_gpus").input("8").run()
    at.number_input(key="w.s_gbs").set_value(64).run()
    at.number_input(key="w.s_seq").set_value(2048).run()
    at.number_input(key="w.s_confirm").set_value(1).run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    assert not errors(at), errors(at)
    assert len(at.dataframe[0].value) >= 1 and "local-spawn" in at.caption[-1].value
    assert _pool_workers() == []


def test_search_page_cost_objective_has_a_dollar_column():
    """Issue 17.13 on the page: a cost search shows $ per million tokens, in dollars."""
    at = start("search")
    at.selectbox(key="w.s_model").set_value("llama3.1-8b").run()
    at.text_input(key="w.s_gpus").input("8").run()
    at.number_input(key="w.s_gbs").set_value(64).run()
    at.number_input(key="w.s_seq").set_value(2048).run()
    at.number_input(key="w.s_confirm").set_value(1).run()
    at.selectbox(key="w.s_executor").set_value("serial").run()
    at.selectbox(key="w.s_objective").set_value("cost").run()
    at.number_input(key="w.s_price").set_value(2.5).run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    table = at.dataframe[0].value
    assert table["usd_per_mtoken"].notna().all() and (table["usd_per_mtoken"] > 0).all()
    spec = json.loads(at.dataframe[0].proto.columns)
    assert spec["usd_per_mtoken"]["label"] == "$ per M tokens" and spec["step_time_s"]["label"] == "step time (ms)"


# ---- Calibrate ------------------------------------------------------------------------------

def test_calibrate_with_a_shipped_log_fit_and_save(isolated):
    at = start("calibrate")
    assert any("Upload" in i.value for i in at.info) and not at.warning  # the readers are part of perfsim
    at.multiselect(key="w.c_examples").set_value([EXAMPLE_LOG.name]).run()
    ok(at)
    assert not errors(at)
    assert any("MAPE" in m.value for m in at.markdown)
    next(b for b in at.button if b.label.startswith("Fit")).click().run()
    ok(at)
    assert not errors(at), errors(at)
    assert sum("MAPE" in m.value for m in at.markdown) == 2  # before and after the fit
    next(b for b in at.button if b.label == "Save calibrated profile").click().run()
    ok(at)
    saved = list((isolated / "profiles").glob("*.toml"))
    assert len(saved) == 1 and perfsim.load_cluster(str(saved[0])).num_gpus > 0
    at.switch_page("views/plan.py").run()
    assert str(saved[0]) in at.selectbox(key="w.cluster").options


def _mape_pct(markdown: str) -> float:
    return float(re.search(r"MAPE of the time per call ([\d.]+)%", markdown).group(1))


def test_calibrate_mape_figures_agree_with_the_fit_table_and_validate():
    """Issue 17.12: the page's MAPE, the fit table's and `perfsim validate`'s are one figure
    (time per call), and the error panel sits on its own axis below the curves."""
    at = start("calibrate")
    at.multiselect(key="w.c_examples").set_value([EXAMPLE_LOG.name]).run()
    next(b for b in at.button if b.label.startswith("Fit")).click().run()
    ok(at)
    before, after = (_mape_pct(m.value) for m in at.markdown if "MAPE of the time" in m.value)
    fits = at.dataframe[-1].value
    row = fits[fits["name"] == "collectives"].iloc[0]
    assert before == pytest.approx(row["mape_before"], abs=0.01) and after == pytest.approx(row["mape_after"], abs=0.01)
    validated = perfsim.calibration.validate.validate("mi300x-pollara", rccl_logs=[str(EXAMPLE_LOG)])
    assert before == pytest.approx(validated.mape, abs=0.01)
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {t.get("yaxis", "y") for t in chart["data"]} == {"y", "y2"}
    assert chart["layout"]["yaxis"]["title"]["text"] == "bus bandwidth (GB/s)"
    assert len(chart["layout"]["xaxis2"]["ticktext"]) <= 10  # one tick per factor of 16: no overlap
    assert not [w for w in at.warning if "NVIDIA" in w.value]


def test_calibrate_prices_a_graph_captured_log_as_validate_does():
    """The page prices each log as it ran (launch mode, graph capture, a forced path), as
    `perfsim validate` does: the hipGraph example's MAPE is validate's, not the plain launch's."""
    graph_log = EXAMPLE_LOG.with_name("mi300x_1node_8gpu_mpi_hipgraph_amdblog.log")
    at = start("calibrate")
    at.multiselect(key="w.c_examples").set_value([graph_log.name]).run()
    ok(at)
    page = next(_mape_pct(m.value) for m in at.markdown if "MAPE of the time" in m.value)
    validated = perfsim.calibration.validate.validate("mi300x-pollara", rccl_logs=[str(graph_log)])
    assert page == pytest.approx(validated.mape, abs=0.01)
    plain = [perfsim.collective("all_reduce", p.x, 8, "mi300x-pollara")["time_us"] for p in validated.points]
    assert validated.mape < 0.5 * 100 * sum(abs(t / (p.measured_s * 1e6) - 1) for t, p in zip(plain, validated.points)) \
        / len(plain)  # the plain launch is more than twice as far off
    assert at.dataframe[0].value["graph"].tolist() == [True]


def test_calibrate_prices_a_log_on_its_own_rank_geometry():
    """A 16-rank log over 4 hosts of 4 GPUs is priced on that geometry (validate's), not as 16
    consecutive GPUs of the profile's 8-GPU nodes."""
    text = EXAMPLE_LOG.read_text()
    for rank in range(8):
        text = text.replace(f"on     node0 device  {rank}", f"on     node{rank // 4} device  {rank % 4}")
    assert text.count("node1 device") == 4
    at = start("calibrate")
    at.file_uploader(key="w.c_logs").set_value([("four_by_two.log", text.encode(), "text/plain")]).run()
    ok(at)
    page = next(_mape_pct(m.value) for m in at.markdown if "MAPE of the time" in m.value)
    assert at.dataframe[0].value["nodes"].tolist() == [2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "four_by_two.log"
        path.write_text(text)
        validated = perfsim.calibration.validate.validate("mi300x-pollara", rccl_logs=[str(path)])
    assert page == pytest.approx(validated.mape, abs=0.01)
    one_node = perfsim.calibration.validate.validate("mi300x-pollara", rccl_logs=[str(EXAMPLE_LOG)])
    assert abs(validated.mape - one_node.mape) > 1.0  # two nodes of four price differently from one of eight


def test_calibrate_compares_and_fits_multinode_table_series(isolated):
    """The shipped multi-node table: by default the series measured on the profile's GPU,
    priced as `perfsim validate --collective-csv` prices them (same MAPE), and the fit is
    `perfsim calibrate --collective-csv --series` on them."""
    table = ROOT / "validation" / "data" / "multinode" / "collectives_multinode.csv"
    at = start("calibrate")
    at.selectbox(key="w.c_cluster").set_value("mi355x-pollara-rccl227").run()
    at.multiselect(key="w.c_table_examples").set_value([table.name]).run()
    ok(at)
    chosen = at.multiselect(key="w.c_series").value
    assert chosen and all("MI355X" in name for name in chosen)
    pick = ["alibaba_readme_MI355X_2node_pollara_allreduce", "ylerman_amddev_MI355X_3node_pollara_allreduce_tree_ll128"]
    at.multiselect(key="w.c_series").set_value(pick).run()
    ok(at)
    assert not errors(at), errors(at)
    page = next(_mape_pct(m.value) for m in at.markdown if "MAPE of the time" in m.value)
    validated = perfsim.calibration.validate.validate("mi355x-pollara-rccl227", collective_tables=[str(table)],
                                                      series=pick)
    assert page == pytest.approx(validated.mape, abs=0.01)
    shown = at.dataframe[0].value
    assert shown["forced"].tolist() == ["-", "tree / ll128"] and shown["nodes"].tolist() == [2, 3]
    next(b for b in at.button if b.label.startswith("Fit")).click().run()
    ok(at)
    assert not errors(at), errors(at)
    fits = at.dataframe[-1].value
    assert fits[fits["name"] == "fabric"].iloc[0]["num_points"] == 31 + 18


def test_calibrate_with_every_shipped_example_fits_like_the_readme():
    """The README's calibrate example (nograph log + GEMM CSV + p2p table) from the page's
    shipped-example pickers: same fit as `perfsim calibrate` on those files."""
    at = start("calibrate")
    assert at.multiselect(key="w.c_kernel_examples").options == ["gemm_mi300x_measured.csv"]
    assert at.multiselect(key="w.c_p2p_examples").options == ["xgmi_p2p_measured.csv"]
    at.multiselect(key="w.c_examples").set_value([EXAMPLE_LOG.name]).run()
    at.multiselect(key="w.c_kernel_examples").set_value(["gemm_mi300x_measured.csv"]).run()
    at.multiselect(key="w.c_p2p_examples").set_value(["xgmi_p2p_measured.csv"]).run()
    ok(at)
    next(b for b in at.button if b.label.startswith("Fit")).click().run()
    ok(at)
    assert not errors(at), errors(at)
    fits = at.dataframe[-1].value
    data = ROOT / "validation" / "data"
    direct = perfsim.calibrate("mi300x-pollara", rccl_logs=[str(EXAMPLE_LOG)],
                               kernel_csvs=[str(data / "gemm_mi300x_measured.csv")],
                               p2p=[str(data / "calibration" / "xgmi_p2p_measured.csv")])
    names = {f.name for f in direct.fits}
    assert set(fits["name"]) == names and {"collectives", "links"} <= names
    assert any(n.startswith("gemm") for n in names)  # the kernel CSV was fitted too


def test_calibrate_warns_when_an_nvidia_log_meets_an_amd_profile():
    at = start("calibrate")
    at.multiselect(key="w.c_examples").set_value(["azure_ndh100v5_1node_8gpu_nccl_nvls.log"]).run()
    ok(at)
    warned = [w.value for w in at.warning if "NVIDIA" in w.value]
    assert len(warned) == 1 and "H100" in warned[0] and "mi300x" in warned[0].lower()
    at.selectbox(key="w.c_cluster").set_value("h100-ib").run()
    ok(at)
    assert not [w for w in at.warning if "NVIDIA" in w.value]  # an H100 log for an H100 profile is fine


def test_calibrate_garbled_uploads_are_inline_errors():
    at = start("calibrate")
    if any("unavailable" in w.value for w in at.warning):
        return
    at.file_uploader(key="w.c_logs").set_value([("garbled.log", b"hello\nworld\n", "text/plain")]).run()
    ok(at)
    assert any("garbled.log" in e for e in errors(at))
    at.file_uploader(key="w.c_csvs").set_value([("k.csv", b"kind,bogus\ngemm,1\n", "text/csv")]).run()
    ok(at)
    assert any("k.csv" in e and "bogus" in e for e in errors(at))


# ---- Compare --------------------------------------------------------------------------------

def test_compare_scenarios_side_by_side(isolated):
    store = ScenarioStore(isolated / "scenarios.db")
    steps = {}
    for name, gbs in (("a", 2048), ("b", 4096)):
        report = perfsim.estimate("zaya1-base", "mi300x-pollara", nodes=128, dp=1024, gbs=gbs, seq=4096)
        steps[name] = report
        inputs = {"model": "zaya1-base", "cluster": "mi300x-pollara", "nodes": 128, "knobs": {"gbs": gbs},
                  "estimator": "analytic"}
        store.save(name, inputs, report.to_dict())
    at = start("compare")
    assert at.multiselect(key="w.cmp_names").value == ["a", "b"]
    table = at.dataframe[0].value
    assert "b vs a" in table.columns and len(at.get("plotly_chart")) == 1
    step = table[table["metric"] == "step time"].iloc[0]  # shown with units (issue 17.9)
    a, b = steps["a"], steps["b"]
    assert (step["a"], step["b"]) == (fmt.duration(a.step_time_s), fmt.duration(b.step_time_s))
    assert step["b vs a"] == fmt.signed_percent(b.step_time_s / a.step_time_s - 1)
    memory = table[table["metric"] == "peak memory"].iloc[0]
    assert memory["a"].endswith(" GB") and memory["a"] == fmt.num_bytes(a.peak_memory_bytes)
    assert len(at.dataframe) == 2  # the knobs that differ (gbs)
    at.selectbox(key="w.cmp_target").set_value("b").run()
    next(b for b in at.button if b.label == "Open in Plan").click().run()
    ok(at)
    assert at.number_input(key="w.gbs").value == 4096 and at.radio(key="w.estimator").value == "analytic"


def test_compare_empty_and_delete(isolated):
    at = start("compare")
    assert any("No saved scenarios" in i.value for i in at.info)
    ScenarioStore(isolated / "scenarios.db").save("only", {"knobs": {}}, {"step_time_s": 1.0})
    at.run()
    next(b for b in at.button if b.label == "Delete").click().run()
    ok(at)
    assert ScenarioStore(isolated / "scenarios.db").names() == []


def test_compare_survives_a_scenario_deleted_by_another_session(isolated):
    """Another tab deletes a scenario this page has selected: the page drops it from the
    selection and says so, no KeyError; the store's ``all`` reads in one query."""
    store = ScenarioStore(isolated / "scenarios.db")
    for name in ("a", "b", "c"):
        store.save(name, {"knobs": {}}, {"step_time_s": 1.0, "plan": {}})
    at = start("compare")
    at.multiselect(key="w.cmp_names").set_value(["a", "b", "c"]).run()
    ok(at)
    store.delete("b")  # the other session
    at.run()
    ok(at)
    assert at.multiselect(key="w.cmp_names").value == ["a", "c"]
    assert any("No longer saved" in i.value and i.value.endswith(" b") for i in at.info)
    assert [s.name for s in store.all()] == ["a", "c"] and store.find("b") is None
    with pytest.raises(KeyError, match="'b' not found"):
        store.get("b")


# ---- Navigation -----------------------------------------------------------------------------

def test_every_listed_page_that_exists_renders():
    source = APP.read_text()
    assert "st.navigation" in source
    at = start()
    pages = [line.split('"')[1] for line in source.splitlines() if line.strip().startswith('("views/')]
    present = [p for p in pages if (APP.parent / p).is_file()]
    assert len(present) >= 6
    for page in present:
        at.switch_page(page).run()
        ok(at)
        assert at.title, page
