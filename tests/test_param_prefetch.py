"""ZeRO parameter all-gathers with and without prefetch (``overlap_param_gather``,
Megatron-Core's overlap_param_gather / FSDP2's prefetch): turning the prefetch off never
makes a step faster, costs the gathers a ZeRO-3 step hides, agrees between the two
estimators, and can be set by a software stack and from the CLI."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.stacks import OverlapPolicy, StackSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from validation import agreement  # noqa: E402

ZERO_CASES = [c for c in agreement.sample(300, 3) if c.plan.zero and c.plan.dp * c.plan.cp > 1][:12]


@pytest.mark.parametrize("case", ZERO_CASES, ids=lambda c: c.describe())
def test_prefetch_never_slower_and_estimators_agree(case):
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    kwargs = dict(check_memory=False, routing=case.routing)
    off = replace(case.plan, overlap_param_gather=False)
    for run in (perfsim.simulate, perfsim.estimate):
        on_s = run(case.model, cluster, case.plan, **kwargs).step_time_s
        off_s = run(case.model, cluster, off, **kwargs).step_time_s
        assert on_s <= off_s * (1 + 1e-9)
    engine = perfsim.simulate(case.model, cluster, off, **kwargs).step_time_s
    closed = perfsim.estimate(case.model, cluster, off, **kwargs).step_time_s
    assert closed == pytest.approx(engine, rel=0.05)


def test_zero3_without_prefetch_shows_every_gather():
    knobs = dict(gpus=16, dp=16, zero=3, gbs=32, seq=2048, check_memory=False)
    on = perfsim.simulate("llama3.1-8b", "mi300x-pollara", **knobs)
    off = perfsim.simulate("llama3.1-8b", "mi300x-pollara", overlap_param_gather=False, **knobs)
    gathers = off.comm_by_collective["dp_param_gather/all_gather"]
    assert gathers["exposed_s"] == pytest.approx(gathers["total_s"], rel=0.02)
    assert off.step_time_s - on.step_time_s > 0.5 * on.comm_by_collective["dp_param_gather/all_gather"]["overlapped_s"]


def test_stack_sets_the_default_and_the_plan_overrides():
    stack = StackSpec(name="no-prefetch", overlap=OverlapPolicy(param_gather=False))
    assert stack.plan_defaults()["overlap_param_gather"] is False
    with pytest.raises(ConfigError, match="stack.overlap.param_gather"):
        OverlapPolicy(param_gather="no")
    with pytest.raises(ConfigError, match="plan.overlap_param_gather"):
        ParallelPlan(gbs=8, seq=1024, overlap_param_gather="off")


def test_cli_flag():
    base = [sys.executable, "-m", "perfsim", "simulate", "--model", "llama3.1-8b", "--gpus", "16", "--dp", "16",
            "--zero", "3", "--gbs", "32", "--seq", "2048", "--engine", "analytic", "--allow-oom", "--json"]
    import json
    on = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    off = json.loads(subprocess.run(base + ["--no-param-prefetch"], capture_output=True, text=True, check=True).stdout)
    assert off["step_time_s"] > on["step_time_s"]
