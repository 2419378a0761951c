"""GPU variability: seeded speeds, the slowest GPU of a stage sets its pace, the report
prices it, and speed-aware expert placement (ViBE) beats contiguous placement."""

import numpy as np
import pytest
from conftest import tiny_dense, tiny_moe

from perfsim import ConfigError, simulate
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.routing import RoutingSpec
from perfsim.plan.stragglers import VariabilitySpec, ep_rank_speeds, gpu_speeds, stage_slowdowns


def test_speeds_seeded_and_clipped():
    spec = VariabilitySpec(cv=0.05, seed=4, clip_sigma=2.0)
    a, b = gpu_speeds(1024, spec), gpu_speeds(1024, spec)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, gpu_speeds(1024, VariabilitySpec(cv=0.05, seed=5)))
    assert a.min() >= 1 - 2 * 0.05 - 1e-12 and a.max() <= 1 + 2 * 0.05 + 1e-12
    assert np.array_equal(gpu_speeds(8, VariabilitySpec()), np.ones(8))


@pytest.mark.parametrize("bad", [dict(cv=-0.1), dict(cv=1.5), dict(clip_sigma=0), dict(seed=1.5)])
def test_bad_variability(bad):
    with pytest.raises(ConfigError, match="variability"):
        VariabilitySpec(**bad)


def test_slowest_of_more_gpus_is_slower():
    """The expected slowest of N draws grows with N (order statistics of a normal)."""
    def mean_worst(n):
        return np.mean([1 / gpu_speeds(n, VariabilitySpec(cv=0.03, seed=s)).min() for s in range(20)])
    assert mean_worst(8) < mean_worst(64) < mean_worst(1024)


def test_stage_slowdown_is_its_slowest_gpu():
    plan = ParallelPlan(pp=2, dp=4, gbs=8, seq=1024)
    speeds = np.array([1.0, 0.9, 1.1, 1.0, 0.8, 1.0, 1.0, 1.0])
    assert stage_slowdowns(plan, speeds) == pytest.approx([1 / 0.9, 1 / 0.8])
    moe_plan = ParallelPlan(dp=8, ep=4, gbs=8, seq=1024)
    assert ep_rank_speeds(moe_plan, speeds) == pytest.approx((0.8, 0.9, 1.0, 1.0))


DENSE = tiny_dense()
KNOBS = dict(gpus=16, pp=2, dp=8, gbs=16, seq=2048)


@pytest.mark.parametrize("estimator", ["des", "analytic"])
def test_variability_slows_the_step_and_is_priced(estimator):
    base = simulate(DENSE, "mi300x-pollara", estimator=estimator, **KNOBS)
    slow = simulate(DENSE, "mi300x-pollara", estimator=estimator, variability=VariabilitySpec(cv=0.05, seed=1), **KNOBS)
    assert slow.step_time_s > base.step_time_s
    assert slow.straggler_slowdown > 1.0 and slow.straggler_cost_s > 0
    # compute runs at the slowest GPU's pace, communication does not: the step grows less
    assert slow.step_time_s < base.step_time_s * slow.straggler_slowdown


def test_variability_deterministic_for_a_seed():
    spec = VariabilitySpec(cv=0.05, seed=9)
    a = simulate(DENSE, "mi300x-pollara", variability=spec, **KNOBS)
    b = simulate(DENSE, "mi300x-pollara", variability=spec, **KNOBS)
    assert a.to_dict() == b.to_dict()


def test_speed_aware_placement_beats_contiguous():
    """ViBE: hot experts on fast GPUs lower the MoE layer time under skew + variability."""
    model = tiny_moe(num_experts=16, top_k=2)
    knobs = dict(gpus=8, dp=8, ep=8, gbs=16, seq=2048, estimator="analytic")
    spec = VariabilitySpec(cv=0.08, seed=2)
    results = {}
    for aware in (False, True):
        routing = RoutingSpec(distribution="zipf", skew=1.2, seed=5, speed_aware=aware)
        results[aware] = simulate(model, "mi300x-pollara", routing=routing, variability=spec, **knobs)
    assert results[True].breakdown["experts"] < results[False].breakdown["experts"]
    assert results[True].step_time_s < results[False].step_time_s
