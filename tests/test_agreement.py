"""The closed form against the engine, measured: on the seeded 300-plan sample of
``validation/agreement.py`` the disagreement stays within the figures recorded in
``perfsim/estimators/agreement.toml`` (which the search uses to pick the plans it
confirms); the engine's folding of repeated microbatches matches running them all;
overlap never makes a step slower than ``--no-overlap`` in either estimator."""

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import perfsim
from perfsim.estimators.analytic import measured_disagreement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from validation import agreement  # noqa: E402

RECORDED = measured_disagreement()


@pytest.fixture(scope="module")
def errors():
    return sorted(abs(closed / engine - 1) for closed, engine in map(agreement.compare, agreement.sample(300, 0)))


def test_sample_spans_the_knobs():
    cases = agreement.sample(300, 0)
    plans = [c.plan for c in cases]
    assert {p.zero for p in plans} == {0, 1, 2, 3}
    assert {p.keeps_weights_gathered for p in plans if p.zero == 3} == {True, False}  # per-pass and once
    assert any(p.keeps_weights_gathered and p.pp > 1 for p in plans)
    assert {str(p.schedule) for p in plans if p.pp > 1} >= {"1f1b", "gpipe", "zb-h1", "interleaved"}
    assert {str(p.recompute) for p in plans} == {"none", "selective", "full"}
    assert any(p.tp_comm_overlap for p in plans) and any(p.cp > 1 for p in plans) and any(p.vpp > 1 for p in plans)
    assert any(p.ep > 1 for p in plans) and any(p.etp > 1 for p in plans)
    assert any(p.ep_comm_overlap and p.pp > 1 for p in plans) and any(p.ep_comm_overlap and p.pp == 1 for p in plans)
    assert any(c.routing.distribution != "uniform" for c in cases)
    assert {c.cluster for c in cases} == set(agreement.CLUSTERS)


def test_disagreement_within_the_recorded_distribution(errors):
    """Regenerate agreement.toml with validation/bench_estimators.py when this moves."""
    p95 = errors[int(0.95 * len(errors)) - 1]
    assert statistics.median(errors) <= RECORDED["median_rel"] * 1.25 + 0.002
    assert p95 <= RECORDED["p95_rel"] * 1.25
    assert errors[-1] <= RECORDED["max_rel"] * 1.25


def test_closed_form_within_5pct_of_the_engine_on_every_plan(errors):
    """Issue 13's bound: every plan of the seeded sample, not a share of them."""
    assert len(errors) == 300 and errors[-1] <= 0.05


def test_closed_form_within_5pct_under_the_framework_stacks():
    """The first 120 plans of the sample, each under a framework stack (its costs and plan
    defaults: maxtext's unprefetched gathers, nemo's FP8 primary weights, torchtitan's
    pipeline ZeRO-3 policy where the sample leaves it unset): the bound holds there too."""
    cases = agreement.under_stacks(agreement.sample(300, 0), 0)[:120]
    assert {c.plan.stack.name for c in cases} == set(agreement.STACKS)
    errors = [abs(closed / engine - 1) for closed, engine in map(agreement.compare, cases)]
    assert max(errors) <= 0.05


@pytest.mark.parametrize("case", agreement.long_sample(12, 5), ids=lambda c: c.describe())
def test_folded_engine_equals_the_full_simulation(case):
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    kwargs = dict(check_memory=False, routing=case.routing)
    folded = perfsim.simulate(case.model, cluster, case.plan, **kwargs)
    full = perfsim.simulate(case.model, cluster, case.plan, fold=False, **kwargs)
    assert folded.simulated_microbatches and not full.simulated_microbatches
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=0.005)
    assert sum(folded.breakdown.values()) == pytest.approx(folded.step_time_s, rel=1e-9)


def test_folding_answers_a_huge_microbatch_count():
    """65,536 microbatches (the engine would walk every one): three short steps suffice (the
    growth from 18 to 26 microbatches checked against 26 to 34's), and the step grows with
    the steady-state cycle."""
    knobs = dict(gpus=8, pp=8, seq=2048, check_memory=False)
    big = perfsim.simulate("llama3.1-8b", "mi300x-pollara", gbs=65536, **knobs)
    half = perfsim.simulate("llama3.1-8b", "mi300x-pollara", gbs=32768, **knobs)
    assert big.simulated_microbatches == (26, 34) == half.simulated_microbatches
    assert big.step_time_s / half.step_time_s == pytest.approx(2.0, rel=0.01)


def test_steady_window_waits_for_the_growth_to_repeat():
    """The fold's window moves past a transient longer than the schedule's warm-up, takes
    the widest window walked when the growth never repeats, and walks a short step whole."""
    from perfsim.estimators.pipeline import FOLD_TRIES, steady_window
    calls = []

    def transient(k):  # 1.0 a microbatch from 28 on, growing into it before
        calls.append(k)
        return k + max(0, 28 - k) ** 2 / 16
    assert steady_window(transient, 20, 24, 200) == (32, 36)  # growths 1, 3, 4, 4
    assert sorted(set(calls)) == [20, 24, 28, 32, 36]
    assert steady_window(lambda k: 1.0 * k, 20, 24, 200) == (24, 28)  # steady at once: one pair checked
    assert steady_window(lambda k: k + 0.5 * (k % 8 == 4), 20, 24, 400) == (20, 20 + 4 * (FOLD_TRIES + 1))
    assert steady_window(lambda k: 1.0 * k, 20, 24, 55) == (20, 24)  # no room to check the first pair
    assert steady_window(lambda k: 1.0 * k, 20, 24, 47) is None  # nor for the pair: walk it whole
    assert steady_window(transient, 20, 24, 60) == (20, 28)  # the room ran out before a steady pair


def test_folding_waits_out_a_long_transient():
    """An interleaved plan whose step grows unevenly for a few groups past the schedule's
    warm-up (the expert-parallel overlap's merged steps under a skewed routing): the fold
    moves past the first pair of counts, and the folded engine and the closed form follow the
    full simulation. (Session 34's case, seed 7's gbs176 plan, was 9.8% and 4.6% short when
    extended from the warm-up's first groups; since the shared experts run as the tensor-
    parallel MLP they are (session 36), its growth settles at once.)"""
    model = next(m for m in agreement.models() if m.name == "deepseek-v2-lite-8l")
    case = next(c for c in agreement.long_sample(30, 10) if c.model.name == model.name and "gbs88" in c.describe())
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    plan = case.plan
    kwargs = dict(check_memory=False, routing=case.routing)
    full = perfsim.simulate(model, cluster, plan, fold=False, **kwargs)
    folded = perfsim.simulate(model, cluster, plan, **kwargs)
    closed = perfsim.estimate(model, cluster, plan, **kwargs)
    assert folded.simulated_microbatches[0] > 20  # moved past the first pair
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=0.005)
    assert closed.step_time_s == pytest.approx(full.step_time_s, rel=0.02)


@pytest.mark.parametrize("seed", range(40))
def test_overlap_never_slower_than_no_overlap(seed):
    """Property over random plans: overlapping DP traffic (and TP comm) with compute
    never makes the step slower, in both estimators."""
    case = agreement.sample(1, 1000 + seed)[0]
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    plan = replace(case.plan, overlap_grad_reduce=True)
    serial = replace(plan, overlap_grad_reduce=False, tp_comm_overlap=False)
    kwargs = dict(check_memory=False, routing=case.routing)
    for run in (perfsim.estimate, perfsim.simulate):
        overlapped, plain = run(case.model, cluster, plan, **kwargs), run(case.model, cluster, serial, **kwargs)
        assert overlapped.step_time_s <= plain.step_time_s * (1 + 1e-9), (run.__name__, case.describe())


def test_zero3_traffic_cannot_hide_beyond_the_nic():
    """The issue's DeepSeek-V3 plan: nearly 10 s of ZeRO-3 gathers, gradient reduce-scatters
    and all-to-all on one NIC cannot hide behind about 6 s of compute: the step is at least
    the NIC's busy time, well over the compute; both estimators agree."""
    knobs = dict(dp=64, ep=8, zero=3, mbs=4, gbs=256, seq=4096, recompute="full", check_memory=False)
    model = replace(perfsim.load_model("deepseek-v3"), capacity_factor=1.25)
    closed = perfsim.estimate(model, "mi355x-pollara", nodes=8, **knobs)
    engine = perfsim.simulate(model, "mi355x-pollara", nodes=8, **knobs)
    serial = perfsim.simulate(model, "mi355x-pollara", nodes=8, overlap_grad_reduce=False, **knobs)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.10)
    assert engine.step_time_s <= serial.step_time_s
    compute = sum(v for k, v in engine.breakdown.items() if k not in engine.overlapped_comm_s and k != "pipeline_bubble")
    assert closed.step_time_s > compute * 1.3
    assert closed.step_time_s >= closed.links["nic"]["busy_s"] > compute
    for r in (closed, engine):  # the report shows why: the NIC is saturated, and what was exposed on it
        nic = r.links["nic"]
        assert 0.9 < nic["utilization"] <= 1.0 + 1e-6 and nic["exposed_s"] > 0
        assert r.comm_by_collective["dp_param_gather/all_gather"]["links"]["nic"] > 0
