"""Shared small inputs: tiny dense and MoE models keep lowering and simulation fast."""

import csv
import os
import sys

import pytest

from perfsim.system.hardware import load_cluster
from perfsim.lowering.graph import OpGraph, build_graph
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan, check_plan


def tiny_dense(**overrides) -> ModelSpec:
    spec = dict(
        name="tiny-dense", source="test", num_layers=8, hidden_size=1024, num_heads=16,
        num_kv_heads=4, head_dim=64, ffn_hidden_size=4096, vocab_size=32000,
    )
    return ModelSpec(**{**spec, **overrides})


def tiny_moe(**overrides) -> ModelSpec:
    spec = dict(
        name="tiny-moe", source="test", num_layers=8, hidden_size=1024, num_heads=16,
        num_kv_heads=4, head_dim=64, ffn_hidden_size=0, vocab_size=32000,
        num_experts=8, top_k=2, expert_ffn_hidden_size=2048,
    )
    return ModelSpec(**{**spec, **overrides})


def pytest_collection_modifyitems(config, items):
    """Tests marked ``heavy`` run first (a stable sort keeps the rest in order): under
    pytest-xdist a minutes-long test started last leaves the other workers idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.fixture(scope="session", autouse=True)
def _private_state(tmp_path_factory):
    """The planner's scenario database and saved profiles in this test process's own folder
    (not ~/.perfsim), so tests that save never share them, with the user or with another
    worker of a parallel run (``pytest -n``); a test that sets its own keeps it. The
    variables are put back as they were when the session ends."""
    home = tmp_path_factory.mktemp("perfsim-state")
    before = {var: os.environ.get(var) for var in ("PERFSIM_DB", "PERFSIM_PROFILES")}
    for var, path in (("PERFSIM_DB", home / "scenarios.db"), ("PERFSIM_PROFILES", home / "profiles")):
        os.environ.setdefault(var, str(path))
    yield
    for var, value in before.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@pytest.fixture(scope="session")
def mi300x():
    """The mi300x-pollara cluster as shipped (128 nodes)."""
    return load_cluster("mi300x-pollara")


@pytest.fixture(scope="session")
def dense():
    return tiny_dense()


@pytest.fixture(scope="session")
def moe():
    return tiny_moe()


DENSE = tiny_dense()
MOE = tiny_moe()

PLANS = {  # id -> (model, plan knobs); small enough to lower in milliseconds
    "pp1": (DENSE, dict(dp=2, gbs=4)),
    "pp2-1f1b": (DENSE, dict(pp=2, gbs=4)),
    "pp4-1f1b": (DENSE, dict(pp=4, gbs=8)),
    "pp4-gpipe": (DENSE, dict(pp=4, gbs=8, schedule="gpipe")),
    "pp2-vpp2": (DENSE, dict(pp=2, vpp=2, gbs=4, schedule="interleaved")),
    "pp4-vpp2": (DENSE, dict(pp=4, vpp=2, gbs=8, schedule="interleaved")),
    "tp2-sp": (DENSE, dict(tp=2, dp=2, gbs=4)),
    "tp2-nosp": (DENSE, dict(tp=2, dp=2, gbs=4, sequence_parallel=False)),
    "cp2": (DENSE, dict(cp=2, dp=2, gbs=4)),
    "zero0": (DENSE, dict(dp=4, gbs=8, zero=0)),
    "zero2": (DENSE, dict(dp=4, gbs=8, zero=2)),
    "zero3": (DENSE, dict(dp=4, gbs=8, zero=3)),
    "zero1-nooverlap": (DENSE, dict(dp=4, gbs=8, zero=1, overlap_grad_reduce=False)),
    "recompute-selective": (DENSE, dict(pp=2, dp=2, gbs=4, recompute="selective")),
    "recompute-full": (DENSE, dict(pp=2, dp=2, gbs=4, recompute="full")),
    "moe-ep4": (MOE, dict(dp=4, ep=4, gbs=8)),
    "moe-ep2-etp2": (MOE, dict(tp=2, dp=2, ep=2, etp=2, gbs=4)),
    "moe-pp2-ep2-zero3": (MOE, dict(pp=2, dp=2, ep=2, gbs=4, zero=3)),
}


def pytest_terminal_summary(terminalreporter):
    """tests/fuzz/ counts its cases per surface and outcome; print them at the end
    (tests/fuzz has no conftest of its own: a second 'conftest' module would shadow this one)."""
    harness = sys.modules.get("fuzz_harness")
    if harness is not None:
        harness.print_counts(terminalreporter)


def lower(case: str) -> OpGraph:
    """The op graph of plan case ``case`` (a key of PLANS)."""
    model, knobs = PLANS[case]
    plan = ParallelPlan(seq=1024, **knobs)
    check_plan(plan, model, plan.world_size)
    return build_graph(model, plan)


def fill_search_form(at, model: str, gpus: str, gbs: int, seq: int):
    """The planner's Search page (Streamlit AppTest) set to a small in-process search:
    ``model`` over ``gpus`` (a comma list), one engine confirmation, serial executor."""
    at.selectbox(key="w.s_model").set_value(model).run()
    at.text_input(key="w.s_gpus").input(gpus).run()
    at.number_input(key="w.s_gbs").set_value(gbs).run()
    at.number_input(key="w.s_seq").set_value(seq).run()
    at.number_input(key="w.s_confirm").set_value(1).run()
    at.selectbox(key="w.s_executor").set_value("serial").run()
    return at


def write_kernel_csv(path, rows):
    """Rows (dicts of kernel CSV cells; the rest empty) as a kernel CSV at ``path``; returns ``path``."""
    from perfsim.calibration.readers import KERNEL_CSV_COLUMNS

    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=KERNEL_CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def plan_page(inputs: dict):
    """(the Plan page run headless on ``inputs``, the planner's ``inputs`` module): the
    page's widgets and the functions it prices with."""
    import sys
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "app"))
    import inputs as planner_inputs

    at = AppTest.from_file(str(root / "app" / "planner.py"), default_timeout=90)
    at.session_state["inputs"] = planner_inputs.normalize(inputs)
    at.run()
    return at, planner_inputs


def edited_runs(source, path, run_id: str, **fields):
    """A copy of the runs CSV ``source`` at ``path`` with run ``run_id``'s ``fields`` replaced."""
    import io

    rows = list(csv.DictReader(io.StringIO(source.read_text())))
    next(r for r in rows if r["id"] == run_id).update(fields)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue())
    return path
