"""The README's "Calibration and validation" block runs as written on a clone (only repo
paths, no ../shared), its gated validate passes its own gate, and the figures the README
states for the in-sample and held-out checks are what `perfsim validate` measures.

When a cost-model change moves these figures, update the README's numbers with it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MIB = 1 << 20


def _block() -> str:
    section = README.split("## Calibration and validation", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def _validate_json(cwd: Path, log: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "perfsim", "validate", "--cluster", "my-cluster.toml",
                          "--rccl-log", f"validation/data/calibration/rccl-tests/{log}", "--json"],
                         cwd=cwd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def _stated(pattern: str) -> float:
    """A figure the README states (first capture group of ``pattern``)."""
    return float(re.search(pattern, README, re.S).group(1))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The block run in a fresh folder that holds the repo's validation/ data (as a clone would)."""
    cwd = tmp_path_factory.mktemp("readme")
    (cwd / "validation").symlink_to(ROOT / "validation")
    block = _block()
    assert "../shared" not in block
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return cwd, done


def test_the_block_runs_and_every_gate_passes(ran):
    cwd, done = ran
    assert done.returncode == 0, done.stderr
    assert "accuracy gate failed" not in done.stderr
    assert (cwd / "my-cluster.toml").is_file() and (cwd / "report.html").stat().st_size > 100_000


def test_in_sample_figure_is_what_the_readme_says(ran):
    cwd, _ = ran
    got = _validate_json(cwd, "mi300x_1node_8gpu_mpi_nograph_amdblog.log")["mape_pct"]
    stated = _stated(r"fitted on \((\d+\.\d)% MAPE\)")
    gate = _stated(r"nograph_amdblog\.log --max-mape (\d+)")
    assert round(got, 1) == stated and got < gate


def test_held_out_figures_are_what_the_readme_says(ran):
    cwd, _ = ran
    points = _validate_json(cwd, "mi300x_1node_8gpu_mpi_hipgraph_amdblog.log")
    assert round(points["mape_pct"], 1) == _stated(r"priced as captured \((\d+\.\d)% MAPE overall")
    large = [abs(p["error_pct"]) for p in points["points"] if p["x"] >= 2 * MIB]
    small = [p["error_pct"] for p in points["points"] if 32 <= p["x"] <= MIB]
    assert round(sum(large) / len(large), 1) <= _stated(r"within (\d+\.\d)% MAPE")
    assert round(max(large), 1) <= _stated(r"worst (\d+\.\d)%")
    low, high = map(float, re.search(r"from 32 B to 1 MiB by (\d+)-(\d+)%", README).groups())
    assert all(low <= e <= high for e in small), small
