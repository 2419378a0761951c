"""``--workers N`` for ``perfsim calibrate --runs`` and ``perfsim validate --runs``: the runs
priced in a local process pool give the same figures as pricing them here."""

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from perfsim.cli import main
from perfsim.design.runs import read_runs, validate_runs
from perfsim.design.runs_fit import fit_stack
from perfsim.search.executors import PoolExecutor

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "validation" / "runs" / "published.csv"


def _torchtitan(tmp_path: Path) -> Path:
    """torchtitan's runs of two of its sources (8 runs: Trainy's H200 pair and the AsyncTP page):
    a fit and its folds in seconds."""
    rows = list(csv.DictReader(io.StringIO(RUNS.read_text())))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(r for r in rows if r["source_id"] in ("torchtitan-trainy-h200-2506", "torchtitan-asynctp-2506"))
    path = tmp_path / "titan.csv"
    path.write_text(out.getvalue())
    shutil.copytree(RUNS.parent / "profiles", tmp_path / "profiles")  # the Grand Teton cluster the runs name
    return path


def test_a_pool_prices_the_runs_as_this_process_does():
    cases = [c for c in read_runs(RUNS) if c.stack == "torchtitan"][:8]
    pool = PoolExecutor(2)
    try:
        pooled = validate_runs(cases, executor=pool)
        fitted = fit_stack(cases, "torchtitan", executor=pool)
    finally:
        pool.close()
    here = validate_runs(cases)
    assert [r.predicted for r in pooled.results] == [r.predicted for r in here.results]
    assert fitted.values == fit_stack(cases, "torchtitan").values


def test_validate_loso_with_workers_prints_the_same_figures(tmp_path, capsys):
    runs = _torchtitan(tmp_path)
    assert main(["validate", "--runs", str(runs), "--loso", "--json"]) == 0
    serial = json.loads(capsys.readouterr().out)
    assert main(["validate", "--runs", str(runs), "--loso", "--json", "--workers", "2"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert pooled == serial


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_worker_count_is_one_line(tmp_path, capsys, value):
    code = main(["calibrate", "--runs", str(RUNS), "--stack", "composer", "--out", str(tmp_path / "x.toml"),
                 "--workers", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--workers" in err[0] and value in err[0]
    assert not (tmp_path / "x.toml").exists()
