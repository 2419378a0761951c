"""Step time responds the right way to every knob: more bandwidth or FLOPS is never
slower, more recompute is never less compute, bigger batches pay until memory runs out,
sharding lowers memory per rank."""

import dataclasses

import pytest
from conftest import tiny_dense, tiny_moe

from perfsim import estimate, InfeasiblePlan, load_model, make_plan, simulate
from perfsim.system.hardware import ClusterSpec
from perfsim.lowering.memory import plan_memory

SCALES = (0.5, 1.0, 2.0, 4.0)

# Plans that touch every resource: TP/EP inside a node, PP and DP across nodes.
PLANS = {
    "dense-tp2-pp2-dp4": (tiny_dense(), dict(tp=2, pp=2, dp=4, gbs=16, zero=1)),
    "moe-ep4-pp2-zero3": (tiny_moe(), dict(pp=2, dp=8, ep=4, gbs=16, zero=3)),
    "moe-tp2-cp2-etp2": (tiny_moe(), dict(tp=2, cp=2, dp=4, ep=2, etp=2, gbs=8, zero=2)),
}


def step_time(cluster: ClusterSpec, case: str, estimator: str = "des") -> float:
    model, knobs = PLANS[case]
    return simulate(model, cluster, seq=2048, estimator=estimator, **knobs).step_time_s


def scaled_gpu_flops(c: ClusterSpec, f: float) -> ClusterSpec:
    peaks = {k: v * f for k, v in c.gpu.peak_tflops.items()}
    return dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, peak_tflops=peaks))


def scaled_hbm(c: ClusterSpec, f: float) -> ClusterSpec:
    return dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, hbm_bw_GBps=c.gpu.hbm_bw_GBps * f))


def scaled_links(c: ClusterSpec, f: float) -> ClusterSpec:
    node = dataclasses.replace(c.node, link_bw_GBps=c.node.link_bw_GBps * f,
                               link_bw_raw_GBps=c.node.link_bw_raw_GBps * f)
    return dataclasses.replace(c, node=node)


def scaled_nics(c: ClusterSpec, f: float) -> ClusterSpec:
    return dataclasses.replace(c, fabric=dataclasses.replace(c.fabric, nic_bw_Gbps=c.fabric.nic_bw_Gbps * f))


KNOBS = {"flops": scaled_gpu_flops, "hbm_bw": scaled_hbm, "link_bw": scaled_links, "nic_bw": scaled_nics}


@pytest.fixture(scope="module")
def two_nodes(mi300x):
    return mi300x.with_nodes(2)


@pytest.mark.parametrize("estimator", ["des", "analytic"])
@pytest.mark.parametrize("case", PLANS)
@pytest.mark.parametrize("knob", KNOBS)
def test_more_of_a_resource_is_never_slower(knob, case, estimator, two_nodes):
    times = [step_time(KNOBS[knob](two_nodes, f), case, estimator) for f in SCALES]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:])), times
    assert times[-1] < times[0]  # and each resource matters for these plans


def test_fp8_gemms_not_slower(two_nodes):
    """FP8 GEMM kernels beat BF16 ones at the sizes real layers have (Llama-3.1-8B, tp 2);
    the step also pays the FP8 casts (issue 14). Tiny GEMMs are not compared: the measured
    MI300X FP8 sweep the FP8 table is fitted to runs 1K-2K cubes at 2-16% of peak."""
    knobs = dict(nodes=1, tp=2, dp=4, gbs=16, seq=4096, zero=1)
    bf16 = estimate("llama3.1-8b", two_nodes, **knobs)
    fp8 = estimate("llama3.1-8b", two_nodes, dtype="fp8", **knobs)
    for category in ("mlp", "attention_proj"):
        assert fp8.breakdown[category] < bf16.breakdown[category]
    assert fp8.breakdown.get("fp8_cast", 0) > 0 and "fp8_cast" not in bf16.breakdown


def compute_s(report) -> float:
    return sum(s.end_s - s.start_s for s in report.spans if s.stream == "compute")


@pytest.mark.parametrize("model", [tiny_dense(), tiny_moe()], ids=["dense", "moe"])
def test_recompute_never_less_compute(model, mi300x):
    runs = {r: simulate(model, mi300x, gpus=4, pp=2, dp=2, gbs=8, seq=2048, recompute=r) for r in
            ("none", "selective", "full")}
    none, selective, full = (compute_s(runs[r]) for r in ("none", "selective", "full"))
    assert none < selective <= full
    assert runs["none"].step_time_s < runs["full"].step_time_s
    mem = {r: runs[r].peak_memory_bytes for r in runs}
    # selective keeps what none does under BF16 (flash attention: the attention output is the
    # output projection's input, kept either way), at more compute
    assert mem["full"] < mem["selective"] <= mem["none"]


def test_bigger_gbs_more_tokens_per_s(mi300x):
    """1F1B amortises the bubble, gradient reduction and optimizer over more microbatches."""
    rates = [simulate(tiny_dense(), mi300x, gpus=8, pp=4, dp=2, gbs=g, seq=2048).tokens_per_s for g in (8, 16, 32, 64)]
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_bigger_mbs_more_tokens_per_s_until_memory_runs_out(mi300x):
    rates, mbs = [], 1
    with pytest.raises(InfeasiblePlan):
        while mbs <= 64:
            rates.append(simulate("llama3.1-8b", mi300x, nodes=1, dp=8, mbs=mbs, gbs=16 * 8, seq=4096).tokens_per_s)
            mbs *= 2
    assert len(rates) >= 2 and rates == sorted(rates)


def test_gpipe_memory_grows_with_gbs_until_it_does_not_fit(mi300x):
    mem = [simulate("llama3.1-8b", mi300x, nodes=1, pp=2, dp=4, gbs=g, seq=4096, schedule="gpipe", check_memory=False)
           .peak_memory_bytes for g in (8, 16, 32)]
    assert mem == sorted(mem) and mem[0] < mem[-1]
    with pytest.raises(InfeasiblePlan):
        simulate("llama3.1-8b", mi300x, nodes=1, pp=2, dp=4, gbs=256, seq=4096, schedule="gpipe")


def memory(model: str, cluster: ClusterSpec, nodes: int, **knobs) -> dict:
    """The most loaded stage's memory (the same model simulate() checks)."""
    plan = make_plan(nodes * cluster.gpus_per_node, seq=2048, **knobs)
    return max(plan_memory(load_model(model), plan), key=lambda m: m.total_bytes).as_dict()


@pytest.mark.parametrize("model", ["llama3.1-8b", "zaya1-base"])
def test_zero_stages_shrink_memory(model, mi300x):
    per_stage = [memory(model, mi300x, nodes=1, dp=8, gbs=8, zero=z)["total_bytes"] for z in (0, 1, 2, 3)]
    assert per_stage[3] < per_stage[2] < per_stage[1] < per_stage[0]


def test_more_tp_lowers_weights_memory(mi300x):
    weights = [memory("llama3.1-8b", mi300x, nodes=1, tp=tp, gbs=8 * 8 // tp)["weights_bytes"] for tp in (1, 2, 4, 8)]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == 4


def test_more_ep_lowers_expert_memory(mi300x):
    totals = [memory("zaya1-base", mi300x, nodes=1, dp=8, ep=ep, gbs=8)["weights_bytes"] for ep in (1, 2, 4, 8)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def test_more_pp_lowers_memory_per_rank(mi300x):
    totals = [memory("llama3.1-8b", mi300x, nodes=1, pp=pp, gbs=8 * 8 // pp)["total_bytes"] for pp in (1, 2, 4)]
    assert totals == sorted(totals, reverse=True)
