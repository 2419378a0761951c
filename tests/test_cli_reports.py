"""CLI report options added for issue 17: `validate --html` without plotly is one clear
line and exit 2 (1 means "accuracy gate failed")."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "validation" / "data" / "calibration" / "rccl-tests" / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
NO_PLOTLY = "import sys; sys.modules['plotly'] = None; from perfsim.cli import main; sys.exit(main(sys.argv[1:]))"


def test_validate_html_without_plotly_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", NO_PLOTLY, "validate", "--rccl-log", str(LOG), "--html", str(out),
                           "--max-mape", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--html" in lines[0] and "plotly" in lines[0] and "Traceback" not in done.stderr
    assert not out.exists() and done.stdout == ""  # refused before any work


def test_validate_html_with_plotly_writes_the_report(tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "perfsim", "validate", "--rccl-log", str(LOG), "--html", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 100_000 and "plotly" in out.read_text()[:200_000].lower()
