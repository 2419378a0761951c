"""Planner "Measured runs" page (issue 16): the shipped published runs priced as
`perfsim validate --runs` prices them, and a fit that matches `perfsim calibrate --runs`."""

import re
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from perfsim.design.runs import read_all, validate_runs
from perfsim.design.runs_fit import fit_stack

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))
SHIPPED = ROOT / "validation" / "runs" / "published.csv"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFSIM_DB", str(tmp_path / "scenarios.db"))
    monkeypatch.setenv("PERFSIM_PROFILES", str(tmp_path / "profiles"))


def page() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app" / "planner.py"), default_timeout=120).run()
    at.switch_page("views/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def test_shipped_runs_show_the_validate_figures():
    at = page()
    want = validate_runs(read_all([str(SHIPPED)]))
    mape = next(m for m in at.metric if m.label == "MAPE")
    assert mape.value == f"{want.mape:.1f}%"
    assert len(at.dataframe[0].value) == len(want.results)
    notes = [c.value for c in at.caption if "state no routing" in c.value]
    assert len(notes) == 1 and "DROPLESS-DSV3-23" in notes[0]  # the C4 rows, as perfsim validate says
    table = at.dataframe[0].value
    titan = table[table["run"] == "TT2412-L8B-8-CP1"].iloc[0]  # its page prints the peak: perfsim's, its, the error
    ran = next(r for r in want.results if r.case.id == "TT2412-L8B-8-CP1")
    assert titan["printed peak GB"] == pytest.approx(ran.case.measured_peak_bytes / 1e9, abs=0.06)
    assert titan["peak error %"] == pytest.approx(ran.memory_error_pct, abs=0.06)
    memory = [c.value.replace("\\", "") for c in at.caption if c.value.startswith("memory")]  # markdown-escaped
    assert len(memory) == 1 and "printed peaks, median |error|" in memory[0]
    assert bool(re.search(r"\d+ of \d+ runs predicted not to fit", memory[0])) == any(not r.fits for r in want.results)


def test_fit_on_the_page_matches_calibrate_runs():
    at = page()
    # megatron-primus: the smallest shipped stack whose runs span two GPU vendors (27 runs; nemo's 215
    # took seven minutes here on a 2-core machine, for the same check)
    at.selectbox(key="w.r_fit_stack").set_value("megatron-primus").run()
    next(b for b in at.button if b.label == "Fit").click().run(timeout=600)
    assert not at.exception and not at.error
    cases = [c for c in read_all([str(SHIPPED)]) if c.stack == "megatron-primus"]
    want = fit_stack(cases, "megatron-primus")
    shown = at.dataframe[-1].value
    # its runs span two GPU vendors (the Primus-pipeline rows on MI300X / MI355X, the ModelZoo rows on
    # H100): a kernels' speed each, in the order calibrate fits them; the ModelZoo's dropless MoE rows
    # add the dropless experts' speed, its real-data rows beside the forced-balance ones the input
    # pipeline's cost
    assert list(want.values) == ["kernels.speed_amd", "kernels.speed_nvidia", "moe.dropless_speed",
                                 "data.host_s_per_mtoken"]
    assert list(shown["value"]) == pytest.approx([round(v, 4) for v in want.values.values()])


def test_the_page_offers_the_stack_protocol_as_its_default():
    """The free parameters the page proposes are what perfsim calibrate --runs would free:
    nemo's protocol (two parameters), not the five its runs identify."""
    at = page()
    at.selectbox(key="w.r_fit_stack").set_value("nemo").run()
    assert at.multiselect(key="w.r_params.nemo").value == ["kernels.speed_nvidia", "moe.dropless_speed"]
