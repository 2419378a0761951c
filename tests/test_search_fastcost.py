"""The search's fast path equals the closed form it replaces: ``fastcost.Coster`` vs
``perfsim.estimate`` (step time) and ``fastmem.MemoryModel`` vs ``memory.plan_memory``
(peak bytes), on seeded random plans across dense/MoE/MLA models, every schedule,
ZeRO stage, recompute, cp (ring attention), ep/etp and overlap setting.
Tolerance: 1e-9 relative (same formulas, summed in another order)."""

import random

import pytest
from conftest import tiny_dense, tiny_moe

import perfsim
from perfsim.errors import ConfigError
from perfsim.estimators.fastcost import Coster
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
def test_fast_path_equals_estimate_and_plan_memory(name, num_gpus):
    model = perfsim.load_model(name)
    cluster = perfsim.load_cluster("mi300x-pollara", gpus=num_gpus)
    coster, memory = Coster(model, cluster), MemoryModel(model)
    for plan in random_plans(model, num_gpus, 12, seed=num_gpus):
        report = perfsim.estimate(model, cluster, plan, check_memory=False)
        assert coster.step_time_s(plan) == pytest.approx(report.step_time_s, rel=1e-9), plan.describe()
        assert memory.peak(plan)[0] == pytest.approx(report.peak_memory_bytes, rel=1e-9), plan.describe()
        assert coster.lower_bound_s(plan) <= coster.step_time_s(plan)


def test_breakdown_sums_to_step_and_peak_stage_is_worst(mi300x):
    model = perfsim.load_model("zaya1-base")
    coster, memory = Coster(model, mi300x), MemoryModel(model)
    for plan in random_plans(model, 64, 6, seed=7):
        est = coster.estimate(plan)
        assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-9)
        assert 0 <= est.exposed_comm_s <= est.step_time_s
        peak, stage = memory.peak(plan)
        totals = [m.total_bytes for m in plan_memory(model, plan)]
        assert totals[stage] == pytest.approx(max(totals), rel=1e-12)
