"""One source of defaults (issue 17.8): each planner page opens with the defaults the
matching `perfsim` command uses (both read them from perfsim), and goodput's step time is
the one `perfsim simulate` reports."""

import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import perfsim
from perfsim.cli import build_parser
from perfsim.design import goodput

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFSIM_DB", str(tmp_path / "scenarios.db"))
    monkeypatch.setenv("PERFSIM_PROFILES", str(tmp_path / "profiles"))


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app" / "planner.py"), default_timeout=120).run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def cli_defaults(*argv: str):
    return build_parser().parse_args(list(argv))


def test_search_page_max_memory_is_the_cli_default():
    at = page("search")
    assert at.slider(key="w.s_mem").value == cli_defaults("search", "--model", "x", "--gpus", "8", "--gbs", "8",
                                                          "--seq", "8").max_memory


def test_goodput_page_storage_and_step_time_source_are_the_cli_defaults():
    args = cli_defaults("goodput", "--model", "zaya1-base")
    at = page("goodput")
    assert at.selectbox(key="w.gp_storage").value == args.storage == goodput.DEFAULT_STORAGE
    assert at.radio(key="w.gp_estimator").value == args.engine == "des"


def test_goodput_step_time_is_what_simulate_reports():
    failures = goodput.FailureModel(mtbf_node_s=2000 * 3600.0)
    out = perfsim.plan_goodput("llama3.1-8b", "mi300x-pollara", nodes=2, failures=failures, zero=1, gbs=32, seq=2048)
    direct = perfsim.simulate("llama3.1-8b", "mi300x-pollara", nodes=2, zero=1, gbs=32, seq=2048)
    assert out["estimator"] == direct.estimator == "des" and out["step_time_s"] == direct.step_time_s
    closed = perfsim.plan_goodput("llama3.1-8b", "mi300x-pollara", nodes=2, failures=failures, zero=1, gbs=32,
                                  seq=2048, estimator="analytic")
    assert closed["step_time_s"] == perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=2, zero=1, gbs=32,
                                                     seq=2048).step_time_s


def test_moe_width_page_uses_the_cli_cluster_and_serving_defaults():
    args = cli_defaults("moe-width")
    at = page("moe_width")
    assert at.selectbox(key="w.mw_cluster").value == args.cluster == "mi300x-pollara"
    assert (at.number_input(key="w.mw_batch").value, at.number_input(key="w.mw_context").value,
            at.number_input(key="w.mw_ep").value) == (args.batch, args.context, args.serve_ep)
    assert at.text_input(key="w.mw_experts").value.replace(" ", "") == args.experts
    assert at.text_input(key="w.mw_topk").value.replace(" ", "") == args.top_k
