"""The MoE dispatch implementation in the user interfaces (issue 15): `perfsim search`'s
table, CSV and JSON name each plan's dispatch ('-' in the table where ep == 1), the
planner's Search page shows it, and the Plan page's "MoE dispatch" selectbox (the chosen
cluster's implementations, only for a model with experts) reaches the simulated plan and
survives a saved scenario; a stored value the cluster does not offer falls back to alltoall."""

import csv
import io
import json
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from perfsim.cli import main
from perfsim.search import search
from tests.conftest import fill_search_form

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))

import derive  # noqa: E402
import inputs as planner_inputs  # noqa: E402
from scenarios import ScenarioStore  # noqa: E402

# a quick MoE search: 16 GPUs of mi300x-pollara, EP over both nodes, dispatch the only open axis but cp/bucket
MOE_SEARCH = ["search", "--model", "deepseek-v2-lite", "--cluster", "mi300x-pollara", "--gpus", "16", "--gbs", "16",
              "--seq", "1024", "--tp", "1", "--pp", "1", "--ep", "16", "--zero", "1", "--mbs", "1", "--max-cp", "1",
              "--dispatch", "alltoall,mori", "--top", "8", "--confirm", "1", "--executor", "serial"]
DENSE_SEARCH = ["search", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "16", "--seq", "2048", "--tp", "1,2",
                "--max-pp", "2", "--max-cp", "1", "--max-mbs", "1", "--top", "3", "--confirm", "1", "--executor", "serial"]


def table(out: str) -> tuple[list[str], list[str]]:
    """The header line of the ranked table and its rows (until the winner line)."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    rows = []
    for line in lines[head + 1:]:
        if line.startswith("winner"):
            break
        rows.append(line)
    return lines[head], rows


def column(head: str, rows: list[str], name: str) -> list[str]:
    start = head.index(name)
    return [row[start:].split()[0] for row in rows]


# ---- perfsim search --------------------------------------------------------------------------------

def test_search_table_csv_and_json_name_the_dispatch(tmp_path, capsys):
    out_csv = tmp_path / "plans.csv"
    assert main([*MOE_SEARCH, "--csv", str(out_csv)]) == 0
    head, rows = table(capsys.readouterr().out)
    assert "dispatch" in head.split()
    found = column(head, rows, "dispatch")
    assert set(found) == {"alltoall", "mori"}, found
    # the column sits beside the plan, right of it, and each row's value is that plan's
    written = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [r["dispatch"] for r in written] == found
    assert main([*MOE_SEARCH, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["plan"]["dispatch"] for r in listed] == found
    # mori (per-node dedup across the two nodes EP spans) is faster than the library all-to-all
    best = {d: min(r["step_time_s"] for r in listed if r["plan"]["dispatch"] == d) for d in ("alltoall", "mori")}
    assert best["mori"] < best["alltoall"]


def test_search_table_shows_a_dash_without_expert_parallelism(capsys):
    assert main(DENSE_SEARCH) == 0
    head, rows = table(capsys.readouterr().out)
    assert len(rows) == 3 and column(head, rows, "dispatch") == ["-", "-", "-"]


def test_planner_search_rows_carry_the_dispatch():
    result = search("deepseek-v2-lite", "mi300x-pollara", gpus=16, gbs=16, seq=1024, top=8, confirm=0, workers=1,
                    executor="serial", limits={"cp": 1},
                    fixed={"tp": 1, "pp": 1, "ep": 16, "zero": 1, "mbs": 1, "dispatch": ["alltoall", "mori"]})
    rows = derive.search_rows(result)
    assert {r["dispatch"] for r in rows} == {"alltoall", "mori"}
    assert all(r["dispatch"] == r["plan"]["dispatch"] for r in rows)
    assert all(("dispatch=mori" in r["label"]) == (r["dispatch"] == "mori") for r in rows)
    # "Open this plan" carries the dispatch onto the Plan page's inputs
    mori = next(r for r in rows if r["dispatch"] == "mori")
    opened = planner_inputs.with_plan(planner_inputs.default_inputs(), mori["plan"])
    assert opened["fidelity"]["dispatch"] == "mori"
    dense = derive.search_rows([{"plan": {"tp": 1, "pp": 1, "dp": 8, "ep": 1, "dispatch": "alltoall"}, "rank": 1}])
    assert dense[0]["dispatch"] == "-" and "dispatch" not in dense[0]["label"]


# ---- the Plan page ---------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFSIM_DB", str(tmp_path / "scenarios.db"))
    monkeypatch.setenv("PERFSIM_PROFILES", str(tmp_path / "profiles"))


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def start(inputs: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app" / "planner.py"), default_timeout=90)
    if inputs is not None:
        at.session_state["inputs"] = planner_inputs.normalize(inputs)
    at.run()
    ok(at)
    return at


def step_time(at) -> str:
    return next(m for m in at.metric if m.label == "Step time").value


def selectbox_keys(at) -> list[str]:
    return [s.key for s in at.selectbox]


# ZAYA1 (16 experts) on 128 MI300X nodes with EP over two nodes, in closed form (quick)
MOE = {"estimator": "analytic", "knobs": {"ep": 16}}


def test_moe_dispatch_selectbox_reaches_the_simulated_plan():
    at = start(MOE)
    box = at.selectbox(key="w.dispatch")
    assert box.label == "MoE dispatch" and box.value == "alltoall"
    assert list(box.options) == ["alltoall", "rccl", "mori"]  # mi300x-pollara's implementations, alltoall first
    before = step_time(at)
    box.set_value("mori").run()
    ok(at)
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["dispatch"] == "mori"
    assert step_time(at) != before
    assert planner_inputs.simulate(inputs).plan["dispatch"] == "mori"


def test_no_dispatch_selectbox_for_a_dense_model():
    at = start({"model": "llama3.1-8b", "estimator": "analytic", "fidelity": {"dispatch": "mori"}})
    assert "w.dispatch" not in selectbox_keys(at)
    assert at.session_state["inputs"]["fidelity"]["dispatch"] == "alltoall"
    at = start(MOE)
    assert "w.dispatch" in selectbox_keys(at)
    at.selectbox(key="w.model").set_value("llama3.1-8b").run()
    ok(at)
    assert "w.dispatch" not in selectbox_keys(at)
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["dispatch"] == "alltoall"


def test_changing_the_cluster_falls_back_to_alltoall():
    at = start(MOE)
    at.selectbox(key="w.dispatch").set_value("mori").run()
    ok(at)
    at.selectbox(key="w.cluster").set_value("h100-ib").run()
    ok(at)  # mori is not an implementation of h100-ib: no error, alltoall
    box = at.selectbox(key="w.dispatch")
    assert box.value == "alltoall" and "deepep" in box.options and "mori" not in box.options
    assert at.session_state["inputs"]["fidelity"]["dispatch"] == "alltoall"
    box.set_value("deepep").run()
    ok(at)
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["dispatch"] == "deepep"


def test_a_saved_scenario_keeps_the_dispatch_and_an_invalid_one_falls_back(tmp_path):
    at = start(MOE)
    at.selectbox(key="w.dispatch").set_value("mori").run()
    at.text_input(key="w.scenario_name").set_value("zaya1 ep16 mori").run()
    next(b for b in at.button if b.label == "Save scenario").click().run()
    ok(at)
    saved = ScenarioStore().get("zaya1 ep16 mori")
    assert saved.inputs["fidelity"]["dispatch"] == "mori" and saved.results["plan"]["dispatch"] == "mori"
    reopened = start(saved.inputs)  # what Compare's "Open in Plan" does: set_inputs(scenario.inputs)
    assert reopened.selectbox(key="w.dispatch").value == "mori"
    assert planner_inputs.simulate(reopened.session_state["inputs"]).plan["dispatch"] == "mori"
    # the same scenario edited onto a cluster without mori: alltoall, no crash, on the page and off it
    moved = {**saved.inputs, "cluster": "h100-ib"}
    assert planner_inputs.simulate(planner_inputs.normalize(moved)).plan["dispatch"] == "alltoall"
    other = start(moved)
    assert other.selectbox(key="w.dispatch").value == "alltoall"
    # an older scenario without the key: the default
    old = {k: v for k, v in saved.inputs["fidelity"].items() if k != "dispatch"}
    assert planner_inputs.normalize({**saved.inputs, "fidelity": old})["fidelity"]["dispatch"] == "alltoall"


def test_search_page_fixes_and_shows_the_dispatch_and_opens_it_on_the_plan_page():
    at = AppTest.from_file(str(ROOT / "app" / "planner.py"), default_timeout=90).run()
    at.switch_page("views/search.py").run()
    ok(at)
    fill_search_form(at, "deepseek-v2-lite", "16", 16, 1024)
    for axis, value in (("tp", "1"), ("pp", "1"), ("ep", "16"), ("cp", "1"), ("zero", "1"), ("mbs", "1"),
                        ("dispatch", "alltoall, mori")):
        at.text_input(key=f"w.s_fix_{axis}").input(value).run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    table = at.dataframe[0].value
    assert set(table["dispatch"]) == {"alltoall", "mori"}
    pick = list(table["dispatch"]).index("mori")
    at.selectbox(key="w.s_pick").set_value(pick).run()
    next(b for b in at.button if b.label == "Open this plan").click().run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["dispatch"] == "mori"
    assert at.selectbox(key="w.dispatch").value == "mori"


def test_fp8_dispatch_toggle_only_under_fp8_and_reaches_the_plan():
    at = start({**MOE, "knobs": {"ep": 16, "dtype": "bf16"}})
    toggle = at.toggle(key="w.dispatch_fp8")
    assert toggle.label == "FP8 dispatch" and toggle.disabled
    at.selectbox(key="w.dtype").set_value("fp8").run()
    ok(at)
    assert not at.toggle(key="w.dispatch_fp8").disabled
    before = step_time(at)
    at.toggle(key="w.dispatch_fp8").set_value(True).run()
    ok(at)
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["dispatch_fp8"] is True and step_time(at) != before
    assert planner_inputs.simulate(inputs).plan["dispatch_fp8"] is True
    # back to BF16: the stored choice no longer applies, the plan never carries it
    at.selectbox(key="w.dtype").set_value("bf16").run()
    ok(at)
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["dispatch_fp8"] is False
    dense = start({"model": "llama3.1-8b", "estimator": "analytic", "knobs": {"dtype": "fp8"},
                   "fidelity": {"dispatch_fp8": True}})
    assert "w.dispatch_fp8" not in [t.key for t in dense.toggle]
    assert planner_inputs.simulate(dense.session_state["inputs"]).plan["dispatch_fp8"] is False


def test_clip_gradients_toggle_reaches_the_plan():
    at = start(MOE)
    toggle = at.toggle(key="w.clip_grad")
    assert toggle.label == "Clip gradients" and toggle.value is True
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["clip_grad"] is True
    toggle.set_value(False).run()
    ok(at)
    assert at.session_state["inputs"]["fidelity"]["clip_grad"] is False
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["clip_grad"] is False


def test_real_data_toggle_reaches_the_plan_and_the_search():
    """The Plan page's Real data toggle sets plan.real_data (the stack's input pipeline
    cost, `--real-data`); the Search page carries it only when on."""
    at = start({"model": "llama3.1-8b", "estimator": "analytic", "stack": "maxtext"})
    toggle = at.toggle(key="w.real_data")
    assert toggle.label == "Real data" and toggle.value is False
    before = planner_inputs.simulate(at.session_state["inputs"])
    assert before.plan["real_data"] is False and "real_data" not in planner_inputs.search_switches(
        at.session_state["inputs"], planner_inputs.model_spec(at.session_state["inputs"]))
    toggle.set_value(True).run()
    ok(at)
    inputs = at.session_state["inputs"]
    after = planner_inputs.simulate(inputs)
    assert after.plan["real_data"] is True and after.breakdown["data"] > 0
    assert after.step_time_s > before.step_time_s
    assert planner_inputs.search_switches(inputs, planner_inputs.model_spec(inputs))["real_data"] is True


def test_search_page_runs_under_the_plan_pages_dtype_stack_and_switches():
    """The Search page searches the plans the Plan page would price: its dtype, software
    stack, gradient clip and FP8 dispatch (perfsim.search plan_knobs), and says so."""
    inputs = planner_inputs.normalize({"model": "deepseek-v2-lite", "stack": "megatron-primus",
                                       "knobs": {"dtype": "fp8", "ep": 16},
                                       "fidelity": {"clip_grad": False, "dispatch_fp8": True}})
    at = start(inputs)
    at.switch_page("views/search.py").run()
    ok(at)
    assert any("fp8 under the megatron" in c.value and "gradient clip off" in c.value and "FP8 dispatch on" in c.value
               for c in at.caption)
    fill_search_form(at, "deepseek-v2-lite", "16", 16, 1024)
    for axis, value in (("tp", "1"), ("pp", "1"), ("ep", "16"), ("cp", "1"), ("zero", "1"), ("mbs", "1")):
        at.text_input(key=f"w.s_fix_{axis}").input(value).run()
    next(b for b in at.button if b.label == "Run search").click().run()
    ok(at)
    args = at.session_state["search.args"]
    assert args["dtype"] == "fp8" and args["stack"] == "megatron-primus"
    assert args["plan_knobs"] == {"clip_grad": False, "dispatch_fp8": True}
    rows = next(iter(at.session_state["search.results"].values()))["rows"]
    assert rows and all(r["plan"]["dtype"] == "fp8" and r["plan"]["clip_grad"] is False and r["plan"]["dispatch_fp8"]
                        for r in rows)


def test_dispatch_compute_units_box_reaches_the_plan_and_slows_the_overlapped_compute():
    # DeepEP across two H100 nodes with the all-to-all overlap: the SMs it holds slow the compute beside it
    at = start({"estimator": "analytic", "cluster": "h100-ib", "knobs": {"ep": 16},
                "fidelity": {"dispatch": "deepep", "ep_comm_overlap": True}})
    box = at.number_input(key="w.dispatch_compute_units")
    assert box.label == "Dispatch SMs / CUs" and box.value is None  # empty: the profile's (20)
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["dispatch_compute_units"] is None
    before = step_time(at)
    box.set_value(60).run()
    ok(at)
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["dispatch_compute_units"] == 60 and step_time(at) != before
    assert planner_inputs.simulate(inputs).plan["dispatch_compute_units"] == 60
    assert planner_inputs.search_switches(inputs, planner_inputs.model_spec(inputs))["dispatch_compute_units"] == 60
    dense = start({"model": "llama3.1-8b", "estimator": "analytic", "fidelity": {"dispatch_compute_units": 60}})
    assert "w.dispatch_compute_units" not in [n.key for n in dense.number_input]
    assert planner_inputs.simulate(dense.session_state["inputs"]).plan["dispatch_compute_units"] is None
