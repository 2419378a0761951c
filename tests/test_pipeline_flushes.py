"""Gradient accumulation as separate pipeline schedules (plan.pipeline_flushes, --pipeline-flushes):
each schedule fills and drains the pipeline, as torch.distributed.pipelining runs one schedule
step per accumulation step (torchtitan, NeMo AutoModel); both estimators, memory, the engine's
fold, the CLI, the runs CSV and the planner."""

import csv
import dataclasses
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.errors import ConfigError
from perfsim.lowering.memory import in_flight_microbatches
from perfsim.model.io import load_model
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.schedules import FWD, stage_order

ROOT = Path(__file__).resolve().parents[1]
DENSE = dict(model="llama3.1-8b", cluster="h100-ib", nodes=2, pp=4, dp=4, gbs=64, mbs=1, seq=2048, check_memory=False)


def _step(estimator: str, flushes: int, **knobs):
    return perfsim.simulate(estimator=estimator, pipeline_flushes=flushes, **{**DENSE, **knobs})


def test_each_schedule_runs_its_own_microbatches_after_the_last():
    plan = ParallelPlan(pp=4, dp=4, gbs=64, seq=2048, pipeline_flushes=4)
    order = stage_order(plan, 0)
    assert len(order) == 2 * plan.num_microbatches
    firsts = [mb for phase, mb, _ in order if phase == FWD]
    assert firsts[:4] == [0, 1, 2, 3] and sorted(firsts) == list(range(16))
    # the second schedule's first forward comes after the first schedule's last backward
    assert order.index((FWD, 4, 0)) > max(i for i, (_, mb, _) in enumerate(order) if mb < 4)


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1), ("zb-h1", 1)])
def test_both_estimators_price_the_extra_fills_and_drains(schedule, vpp):
    steps = {(e, k): _step(e, k, schedule=schedule, vpp=vpp) for e in ("analytic", "des") for k in (1, 4)}
    for k in (1, 4):
        assert steps[("analytic", k)].step_time_s == pytest.approx(steps[("des", k)].step_time_s, rel=0.02)
    one, four = steps[("des", 1)], steps[("des", 4)]
    assert four.step_time_s > one.step_time_s
    # the work is the same; the extra time is three more fills and drains of the pipeline (ZB-H1's
    # each a little longer: fewer deferred weight passes to fill its cool-down)
    assert 3.5 < four.breakdown["pipeline_bubble"] / one.breakdown["pipeline_bubble"] < 5


def test_a_schedule_holds_only_its_own_microbatches():
    gpipe = ParallelPlan(pp=4, dp=4, gbs=64, seq=2048, schedule="gpipe")
    assert in_flight_microbatches(gpipe, 0) == 16
    assert in_flight_microbatches(dataclasses.replace(gpipe, pipeline_flushes=4), 0) == 4
    model = load_model("llama3.1-8b")
    one = perfsim.simulate(model, "h100-ib", gpipe, gpus=16, estimator="analytic")
    four = perfsim.simulate(model, "h100-ib", dataclasses.replace(gpipe, pipeline_flushes=4), gpus=16,
                            estimator="analytic")
    assert four.memory[0]["activations_bytes"] == pytest.approx(one.memory[0]["activations_bytes"] / 4, rel=0.01)


def test_the_engine_folds_a_long_run_of_schedules_from_the_first_ones():
    long = dict(gbs=512)  # 128 microbatches as 16 schedules of 8
    folded = _step("des", 16, **long)
    assert folded.simulated_microbatches and folded.simulated_microbatches[0] % 8 == 0
    whole = perfsim.simulate(estimator="des", pipeline_flushes=16, fold=False, **{**DENSE, **long})
    assert folded.step_time_s == pytest.approx(whole.step_time_s, rel=0.01)
    assert _step("analytic", 16, **long).step_time_s == pytest.approx(whole.step_time_s, rel=0.02)


@pytest.mark.parametrize("knobs, match", [
    (dict(pp=1, dp=16, pipeline_flushes=2), r"plan.pipeline_flushes \(2\) needs pp > 1"),
    (dict(pipeline_flushes=3), r"plan.pipeline_flushes \(3\) must divide the step's microbatches \(gbs / mbs\*dp = 16\)"),
    (dict(pipeline_flushes=0), r"plan.pipeline_flushes must be a positive integer, got 0"),
    (dict(pipeline_flushes=True), r"plan.pipeline_flushes must be a positive integer, got True"),
])
def test_bad_flush_counts_are_one_clear_error(knobs, match):
    with pytest.raises(ConfigError, match=match):
        ParallelPlan(**{**dict(pp=4, dp=4, gbs=64, seq=2048), **knobs})


def test_cli_runs_csv_and_planner(tmp_path, capsys):
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--nodes", "2", "--pp", "4", "--gbs", "64",
            "--seq", "2048", "--engine", "analytic", "--pipeline-flushes"]
    assert main(args + ["4"]) == 0
    assert "pipeline_flushes=4" in capsys.readouterr().out
    assert main(args + ["3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["perfsim: error: plan.pipeline_flushes (3) must divide the step's microbatches (gbs / mbs*dp = 16)"]
    with open(ROOT / "validation/runs/published.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == "TT2412-L405B-512-1F1B")
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*row, "pipeline_flushes"])
        w.writeheader()
        w.writerow({**row, "pipeline_flushes": "2"})
    assert dict(read_runs(path)[0].knobs)["pipeline_flushes"] == 2
    sys.path.insert(0, str(ROOT / "app"))
    import inputs as planner_inputs

    assert planner_inputs.fidelity_knobs({"fidelity": {"pipeline_flushes": 4}})["pipeline_flushes"] == 4
    assert planner_inputs.fidelity_knobs({})["pipeline_flushes"] == 1
