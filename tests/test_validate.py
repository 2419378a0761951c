"""validate: signed errors, MAPE overall and per category, HTML report, CI gate exit codes."""

from pathlib import Path

import pytest

import perfsim
from perfsim.cli import main
from perfsim.calibration.validate import write_html

LOGS = Path(__file__).resolve().parents[1] / "validation" / "data" / "calibration" / "rccl-tests"
NOGRAPH = LOGS / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
HIPGRAPH = LOGS / "mi300x_1node_8gpu_mpi_hipgraph_amdblog.log"
GEMM_CSV = Path(__file__).resolve().parents[1] / "validation" / "data" / "gemm_mi300x_measured.csv"
needs_data = pytest.mark.skipif(not LOGS.exists(), reason="shared calibration data not present")


@pytest.fixture(scope="module")
def result():
    return perfsim.validate("mi300x-pollara", rccl_logs=[NOGRAPH, HIPGRAPH], kernel_csvs=[GEMM_CSV])


@needs_data
def test_points_errors_and_categories(result):
    assert len(result.points) == 32 + 32 + 12
    for p in result.points:
        assert p.error_pct == pytest.approx(100 * (p.predicted_s - p.measured_s) / p.measured_s)
        assert p.measured_s > 0 and p.predicted_s > 0
    cats = result.by_category()
    assert len(cats) == 2 + 3  # two logs, gemm fp8/fp16/bf16
    nograph = next(v for k, v in cats.items() if k.startswith("mi300x_1node_8gpu_mpi_nograph"))
    assert nograph == pytest.approx(7.70, abs=0.05)  # the shipped profile (validation/collective_accuracy.py)
    assert min(cats.values()) <= result.mape <= max(cats.values())
    signs = {p.error_pct > 0 for p in result.points}
    assert signs == {True, False}  # signed, not absolute


@needs_data
def test_html_report_works_offline(result, tmp_path):
    page = write_html(result, tmp_path / "r.html").read_text()
    assert '<script src="http' not in page  # nothing fetched from a CDN
    assert "Plotly.newPlot" in page and "MAPE" in page and len(page) > 1_000_000  # plotly.js embedded
    (tmp_path / "d").mkdir()
    small = write_html(result, tmp_path / "d" / "r.html", plotlyjs="directory")
    assert (small.parent / "plotly.min.js").stat().st_size > 1_000_000
    assert 'src="plotly.min.js"' in small.read_text() and small.stat().st_size < 200_000


@needs_data
def test_cli_gate_exit_codes(tmp_path, capsys):
    args = ["validate", "--rccl-log", str(NOGRAPH)]
    assert main(args + ["--max-mape", "10"]) == 0
    assert main(args + ["--max-mape", "5", "--html", str(tmp_path / "v.html")]) == 1  # accuracy gate failed
    err = capsys.readouterr().err
    assert "accuracy gate failed: MAPE 7.70% > --max-mape 5.0%" in err and (tmp_path / "v.html").exists()
    assert main(["validate", "--rccl-log", str(tmp_path / "missing.log")]) == 2  # bad input
    assert main(["validate"]) == 2


@needs_data
def test_calibrated_profile_passes_the_gate(tmp_path):
    out = tmp_path / "cal.toml"
    assert main(["calibrate", "--rccl-log", str(NOGRAPH), "--out", str(out)]) == 0
    assert main(["validate", "--cluster", str(out), "--rccl-log", str(NOGRAPH), "--max-mape", "5", "--json"]) == 0
