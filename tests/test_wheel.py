"""A non-editable install works: build the wheel from a copy of the tracked tree, install it
into a fresh temporary venv and run `perfsim list` and a simulate from outside the repo.

Offline: the wheel is built without build isolation (setuptools from this interpreter) and
installed with --no-deps; the dependencies (simpy, networkx, numpy, scipy, tomli-w) come
from this interpreter's site-packages on PYTHONPATH, which does not activate the editable
install's finder (that needs a .pth file), so `perfsim` can only come from the wheel. Skipped
only when this interpreter cannot build wheels (no `wheel`/`setuptools`).
"""

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.wheel


def _tracked_copy(dest: Path) -> Path:
    """The working tree as `pip wheel .` would see it, less what git ignores (build/, .venv/):
    tracked files as they are now, and new files not yet committed."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _build_wheel(src: Path, out: Path) -> Path:
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("setuptools not installed: cannot build the wheel offline")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return next(out.glob("perfsim-*.whl"))


def test_wheel_installs_and_simulates(tmp_path):
    wheel = _build_wheel(_tracked_copy(tmp_path / "src"), tmp_path / "dist")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
           "HOME": str(tmp_path)}
    run = lambda *args: subprocess.run([str(env_dir / "bin" / "perfsim"), *args], cwd=tmp_path, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=300)

    where = subprocess.run([str(py), "-c", "import perfsim; print(perfsim.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout  # the wheel's copy, not the tree

    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert "mi300x-pollara" in listed.stdout and "mi300x" in listed.stdout

    sim = run("simulate", "--model", "llama3.1-8b", "--cluster", "mi300x-pollara", "--nodes", "1",
              "--gbs", "16", "--seq", "2048", "--engine", "analytic", "--json")
    assert sim.returncode == 0, sim.stderr
    report = json.loads(sim.stdout)
    assert report["world_size"] == 8 and report["step_time_s"] > 0
    assert len(report["accuracy"]["lines"]) == 3  # perfsim/calibration/accuracy.toml is package data
