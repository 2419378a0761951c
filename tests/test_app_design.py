"""Design pages of the planner (sizing heatmap, MoE width Pareto, goodput): the pure
charts in app/charts_design.py on real API output, and each page run with AppTest."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
sys.path.insert(0, str(APP))

import charts_design  # noqa: E402

import perfsim  # noqa: E402

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
TIMEOUT = 120


@pytest.fixture(scope="module")
def mi300x_node():
    return perfsim.load_cluster("mi300x-pollara", nodes=1)


def test_heatmap_has_the_grid_and_the_current_size(mi300x_node):
    model = perfsim.load_model("zaya1-base")
    grid = perfsim.efficiency_grid(model, mi300x_node.gpu, "hidden", [1536, 2048, 2560], "ffn", [1024, 2048])
    fig = charts_design.sizing_heatmap(grid)
    heat = fig.data[0]
    assert heat.type == "heatmap" and len(heat.z) == 2 and len(heat.z[0]) == 3
    assert any(t.name == "current" and t.x == ("2048",) and t.y == ("2048",) for t in fig.data)
    eff = charts_design.sizing_heatmap(grid, "efficiency").data[0].z
    assert eff[0][0] == pytest.approx(100 * grid["efficiency"][0][0])


def test_pareto_chart_joins_the_front(mi300x_node):
    rows = perfsim.moe_width_sweep(perfsim.load_model("zaya1-base"), mi300x_node, active_params=0.8e9,
                                   experts=(8, 16, 32), top_k=(1, 2))
    fig = charts_design.moe_pareto(rows)
    front = [t for t in fig.data if t.name == "Pareto front"]
    assert len(front) == 1
    latencies = list(front[0].x)
    assert latencies == sorted(latencies) and len(latencies) == sum(r["pareto"] for r in rows)
    plotted = sum(len(t.x) for t in fig.data if t.name.startswith("top-"))
    assert plotted == sum(r["train_fits"] for r in rows)


def test_goodput_curve_peaks_near_the_optimum():
    out = perfsim.plan_goodput("zaya1-base", "mi300x-pollara", nodes=16, failures=perfsim.FailureModel(
        mtbf_node_s=200 * 3600.0), zero=1, gbs=256, seq=4096)
    fig = charts_design.goodput_curve(out)
    xs, ys = list(fig.data[0].x), list(fig.data[0].y)
    best = xs[ys.index(max(ys))] * 60
    assert best == pytest.approx(out["optimal_interval_s"], rel=0.15)  # 41 log-spaced points over 100x


def test_kernel_bars_split_by_bound(mi300x_node):
    rows = perfsim.sizing_table(perfsim.load_model("zaya1-base"), mi300x_node)
    fig = charts_design.kernel_bars(rows)
    assert sum(len(t.x) for t in fig.data) == len(rows)
    assert {t.name for t in fig.data} == {f"{r['bound']}-bound" for r in rows}


# ---- pages ------------------------------------------------------------------------------------

def run_page(name: str) -> "AppTest":
    at = AppTest.from_file(str(APP / "views" / name), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_sizing_page_shows_table_and_heatmap():
    at = run_page("sizing.py")
    assert not at.error
    assert len(at.dataframe) == 1
    figures = [el.proto.spec for el in at.get("plotly_chart")]
    assert len(figures) == 2 and any('"heatmap"' in f for f in figures)
    at.selectbox(key="w.sz_y").set_value("head_dim").run()
    assert not at.exception and not at.error
    assert any('"heatmap"' in el.proto.spec for el in at.get("plotly_chart"))


def test_moe_width_page_shows_pareto_chart():
    at = AppTest.from_file(str(APP / "views" / "moe_width.py"), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    at.number_input(key="w.mw_nodes").set_value(2)
    at.text_input(key="w.mw_experts").set_value("8, 16")
    at.run()
    assert not at.exception and not at.error
    spec = at.get("plotly_chart")[0].proto.spec
    assert "Pareto front" in spec
    at.text_input(key="w.mw_experts").set_value("eight").run()
    assert not at.exception
    assert len(at.error) == 1 and "Cannot sweep" in at.error[0].value


def test_goodput_page_shows_interval_and_monte_carlo():
    at = AppTest.from_file(str(APP / "views" / "goodput.py"), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    labels = {m.label for m in at.metric}
    assert {"Checkpoint interval", "Goodput", "Tokens/day"} <= labels
    assert len(at.get("plotly_chart")) == 1
    assert any("Monte-Carlo" in i.value and "inside" in i.value for i in at.info)
    at.toggle(key="w.gp_async").set_value(True).run()
    assert not at.exception and not at.error
    # async checkpoints make the interval short: the Monte-Carlo is capped to perfsim's limit, and says so
    capped = [c.value for c in at.caption if "Monte-Carlo:" in c.value]
    assert capped or any("Monte-Carlo" in i.value for i in at.info)


def test_planner_navigation_lists_the_design_pages():
    text = (APP / "planner.py").read_text()
    for page in ("views/sizing.py", "views/moe_width.py", "views/goodput.py"):
        assert page in text and (APP / page).is_file()
