"""The one closed form (``estimators.analytic``): what ``estimate()`` and ``search`` both
call. It equals the engine where nothing overlaps and nothing contends (1% tolerance), TP
communication overlap included; its memoised fast paths (``ClosedForm``, ``fastmem``)
give the same answers as a fresh one and ``memory.plan_memory``; spans are laid out
only when a trace is asked for."""

import random

import pytest
from conftest import tiny_dense, tiny_moe

import perfsim
from perfsim.errors import ConfigError
from perfsim.cost import pricing
from perfsim.estimators import analytic, summary
from perfsim.estimators.analytic import ClosedForm
from perfsim.estimators.fastmem import MemoryModel
from perfsim.lowering.memory import plan_memory
from perfsim.plan.parallel import ParallelPlan, check_plan

CASES = [  # (model, GPUs)
    ("zaya1-base", 64),
    ("deepseek-v2-lite", 32),
    (tiny_moe(num_dense_layers=2, ffn_hidden_size=4096), 16),
    (tiny_dense(), 16),
]


def random_plans(model, num_gpus: int, count: int, seed: int):
    rng, found = random.Random(seed), []
    while len(found) < count:
        k = dict(tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 2, 4]), cp=rng.choice([1, 1, 2]),
                 zero=rng.choice([0, 1, 2, 3]), mbs=rng.choice([1, 2]), recompute=rng.choice(["none", "selective", "full"]),
                 overlap_grad_reduce=rng.choice([True, True, False]))
        k["vpp"] = rng.choice([1, 2]) if k["pp"] > 1 else 1
        schedules = [s.value for s in perfsim.plan.parallel.Schedule if s.value != ("1f1b" if k["vpp"] > 1 else "interleaved")]
        k["schedule"] = rng.choice(schedules) if k["pp"] > 1 else "1f1b"
        if num_gpus % (k["tp"] * k["pp"] * k["cp"]):
            continue
        k["dp"] = num_gpus // (k["tp"] * k["pp"] * k["cp"])
        if model.is_moe:
            k["ep"] = rng.choice([e for e in (1, 2, 4, 8) if (k["tp"] * k["cp"] * k["dp"]) % e == 0])
            k["etp"] = rng.choice([1, 1, 2])
        try:
            plan = ParallelPlan(gbs=k["dp"] * k["mbs"] * rng.choice([4, 8]), seq=2048, **k)
            check_plan(plan, model, num_gpus)
        except ConfigError:
            continue
        found.append(plan)
    return found


@pytest.mark.parametrize("name, num_gpus", CASES, ids=[str(getattr(m, "name", m)) for m, _ in CASES])
def test_memoised_paths_equal_fresh_ones_and_plan_memory(name, num_gpus):
    model = perfsim.load_model(name)
    cluster = perfsim.load_cluster("mi300x-pollara", gpus=num_gpus)
    shared, memory = ClosedForm(model, cluster), MemoryModel(model)
    for plan in random_plans(model, num_gpus, 12, seed=num_gpus):
        report = perfsim.estimate(model, cluster, plan, check_memory=False)
        fresh = ClosedForm(model, cluster).step_time_s(plan)
        assert shared.step_time_s(plan) == pytest.approx(fresh, rel=1e-12), plan.describe()
        assert report.step_time_s == pytest.approx(fresh, rel=1e-12), plan.describe()
        assert memory.peak(plan)[0] == pytest.approx(report.peak_memory_bytes, rel=1e-9), plan.describe()
        assert shared.lower_bound_s(plan) <= shared.step_time_s(plan)


def test_breakdown_sums_to_step_and_peak_stage_is_worst(mi300x):
    model = perfsim.load_model("zaya1-base")
    cf, memory = ClosedForm(model, mi300x), MemoryModel(model)
    for plan in random_plans(model, 64, 6, seed=7):
        est = summary.estimate(cf, plan)
        assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-9)
        assert 0 <= est.exposed_comm_s <= est.step_time_s
        peak, stage = memory.peak(plan)
        totals = [m.total_bytes for m in plan_memory(model, plan)]
        assert totals[stage] == pytest.approx(max(totals), rel=1e-12)


@pytest.mark.parametrize("name", ["llama3.1-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("tp_comm_overlap", [False, True])
def test_equals_engine_without_dp_overlap(name, tp, tp_comm_overlap):
    """pp=1, no DP overlap: the engine has nothing to contend over, so the closed form's
    sum of the same priced chains must equal it (TP overlap pairs included)."""
    model, cluster = perfsim.load_model(name), perfsim.load_cluster("mi300x-pollara", gpus=16)
    knobs = dict(tp=tp, gbs=16, seq=2048, tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=False,
                 check_memory=False)
    closed = perfsim.estimate(model, cluster, **knobs).step_time_s
    engine = perfsim.simulate(model, cluster, **knobs).step_time_s
    assert closed == pytest.approx(engine, rel=0.01)


def test_tp_comm_overlap_is_priced_by_the_closed_form():
    model, cluster = perfsim.load_model("llama3.1-8b"), perfsim.load_cluster("mi300x-pollara", gpus=16)
    plain = perfsim.estimate(model, cluster, tp=8, gbs=16, seq=2048, check_memory=False)
    overlapped = perfsim.estimate(model, cluster, tp=8, gbs=16, seq=2048, tp_comm_overlap=True, check_memory=False)
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.breakdown.get("tp_comm", 0.0) < plain.breakdown["tp_comm"]


def test_warm_call_prices_nothing(monkeypatch):
    """Blocks are priced once per template; a second estimate of the plan re-prices none."""
    model, cluster = perfsim.load_model("llama3.1-70b"), perfsim.load_cluster("mi300x-pollara", nodes=8)
    knobs = dict(tp=8, dp=8, gbs=256, seq=8192, check_memory=False)
    first = perfsim.estimate(model, cluster, **knobs)
    calls = []
    monkeypatch.setattr(analytic, "price", lambda *a, **k: calls.append(a) or pricing.price(*a, **k))
    again = perfsim.estimate(model, cluster, **knobs)
    other_batch = perfsim.estimate(model, cluster, **{**knobs, "gbs": 512})
    assert calls == []
    assert again.step_time_s == first.step_time_s
    assert other_batch.step_time_s > first.step_time_s
    perfsim.estimate(model, cluster, **{**knobs, "mbs": 2})  # a new template key is priced
    assert calls


def test_spans_only_when_asked_and_they_match_the_step():
    model, cluster = perfsim.load_model("mixtral-8x7b"), perfsim.load_cluster("mi300x-pollara", gpus=16)
    knobs = dict(pp=2, ep=8, tp=1, gbs=32, seq=2048, zero=1, check_memory=False)
    bare = perfsim.estimate(model, cluster, **knobs)
    traced = perfsim.estimate(model, cluster, trace=True, **knobs)
    assert bare.spans == [] and traced.spans
    assert traced.step_time_s == bare.step_time_s
    assert max(s.end_s for s in traced.spans) == pytest.approx(bare.step_time_s, rel=1e-9)
    assert {s.rank for s in traced.spans} == {bare.critical_stage}


def test_report_figures_are_consistent():
    model, cluster = perfsim.load_model("deepseek-v2-lite"), perfsim.load_cluster("mi300x-pollara", gpus=32)
    r = perfsim.estimate(model, cluster, pp=1, ep=8, zero=3, gbs=64, seq=2048, check_memory=False)
    for entry in r.comm_by_collective.values():
        assert 0 <= entry["exposed_s"] <= entry["total_s"] + 1e-12
        assert entry["overlapped_s"] == pytest.approx(entry["total_s"] - entry["exposed_s"], abs=1e-12)
    assert sum(v["compute_s"] for v in r.per_layer_s.values()) == pytest.approx(
        r.per_stage[r.critical_stage]["compute_s"], rel=1e-9)
    assert r.per_stream_s["compute"] == pytest.approx(r.per_stage[r.critical_stage]["compute_s"], rel=1e-9)
    assert sum(r.critical_path_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def _neighbours(knobs: dict) -> list[dict]:
    """The same plan with one field changed: what a search prices just before it."""
    out = [dict(knobs, gbs=knobs["gbs"] * 2), dict(knobs, gbs=max(knobs["gbs"] // 2, 1)),
           dict(knobs, zero=(knobs["zero"] + 1) % 4), dict(knobs, real_data=not knobs.get("real_data", False))]
    if knobs["dtype"] == "fp8":
        out.append(dict(knobs, fp8_params=not knobs.get("fp8_params", False)))
    if knobs["zero"] == 3:
        out.append(dict(knobs, zero3_gather="per-pass" if knobs.get("zero3_gather") == "once" else "once"))
    return out


def test_a_plans_answer_does_not_depend_on_the_plan_priced_before_it():
    """The closed form memoises blocks, drains and walks across plans: a neighbour priced first
    (another batch, ZeRO stage, FP8 weights, ZeRO-3 policy, data) must not change the answer
    (two such bugs were found: a ZeRO-3 drain lent to ZeRO-1; FP8 primary weights' transposes
    shared between batch sizes)."""
    rng = random.Random(11)
    model = tiny_moe(num_dense_layers=1, ffn_hidden_size=4096)
    clusters = {name: perfsim.load_cluster(name, gpus=16) for name in ("mi300x-pollara", "h100-ib")}
    checked = 0
    while checked < 25:
        knobs = dict(tp=rng.choice([1, 2]), pp=rng.choice([1, 2]), zero=rng.choice([0, 1, 2, 3]), mbs=1, seq=2048,
                     stack=rng.choice(["ideal", "nemo", "maxtext", "torchtitan"]), dtype=rng.choice(["bf16", "fp8"]),
                     ep=rng.choice([1, 2]))
        knobs["gbs"] = 16 // (knobs["tp"] * knobs["pp"]) * rng.choice([1, 2, 4])
        if knobs["dtype"] == "fp8" and rng.random() < 0.7:
            knobs["fp8_params"] = rng.random() < 0.5
        cluster = clusters[rng.choice(list(clusters))]
        try:
            analytic._CACHE.clear()
            fresh = perfsim.estimate(model, cluster, check_memory=False, **knobs).step_time_s
        except ConfigError:
            continue
        checked += 1
        for other in _neighbours(knobs):
            analytic._CACHE.clear()
            try:
                perfsim.estimate(model, cluster, check_memory=False, **other)
            except ConfigError:
                continue
            shared = perfsim.estimate(model, cluster, check_memory=False, **knobs).step_time_s
            assert shared == pytest.approx(fresh, rel=1e-9), (knobs, other)
