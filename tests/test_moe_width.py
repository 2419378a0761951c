"""MoE width trade-off: budget-spending widths, decode latency physics, Pareto front."""

import math

import pytest

import perfsim
from perfsim.design import moe_width as mw
from perfsim.cost.kernels import hbm_time
from perfsim.errors import ConfigError


@pytest.fixture(scope="module")
def zaya():
    return perfsim.load_model("zaya1-base")


@pytest.fixture(scope="module")
def cluster():
    return perfsim.load_cluster("mi300x-pollara", nodes=2)


def test_experts_hit_limits():
    assert mw.experts_hit(16, 1, 1) == pytest.approx(1.0)
    assert mw.experts_hit(16, 4, 1) == pytest.approx(4.0)
    assert mw.experts_hit(16, 1, 10_000) == pytest.approx(16.0)
    hits = [mw.experts_hit(64, 2, b) for b in (1, 2, 8, 32, 128)]
    assert hits == sorted(hits) and hits[-1] < 64


@pytest.mark.parametrize("experts,top_k", [(8, 1), (16, 2), (64, 4), (128, 8)])
def test_derive_spends_the_active_budget(zaya, experts, top_k):
    model = mw.derive(zaya, experts, top_k, active_params=0.8e9)
    step = mw.expert_params_per_width(zaya) * zaya.num_moe_layers * top_k * 64  # one alignment step of width
    assert model.num_experts == experts and model.top_k == top_k and model.expert_ffn_hidden_size % 64 == 0
    assert abs(mw.count_params(model, True) - 0.8e9) <= step / 2 + 1


def test_derive_total_budget_and_zaya_itself(zaya):
    published = mw.count_params(zaya, False)
    again = mw.derive(zaya, 16, 1, total_params=published)
    assert again.expert_ffn_hidden_size == zaya.expert_ffn_hidden_size  # ZAYA1's own width comes back


def test_derive_refuses_dense_and_impossible(zaya):
    with pytest.raises(ConfigError, match="dense"):
        mw.derive(perfsim.load_model("llama3.1-8b"), 8, 1, active_params=1e9)
    assert mw.derive(zaya, 8, 16, active_params=0.8e9) is None  # top-k > experts
    assert mw.derive(zaya, 16, 1, active_params=1e8) is None  # budget below the attention and embeddings


def test_decode_is_bounded_by_weight_reads(zaya, cluster):
    """A decode step cannot beat reading the touched experts' weights from HBM."""
    serving = mw.Serving(batch=64, context=4096, ep=8)
    out = mw.decode_latency(zaya, cluster, serving)
    per_gpu = out["experts_per_gpu_read"] * zaya.expert_params() * mw.WEIGHT_BYTES
    assert out["experts_s"] >= zaya.num_moe_layers * hbm_time(per_gpu, cluster.gpu)
    parts = sum(out[k] for k in ("attention_s", "experts_s", "all_to_all_s", "router_shared_s", "dense_mlp_s",
                                 "lm_head_s"))
    assert parts == pytest.approx(out["latency_s"], rel=1e-9)
    assert out["experts_per_gpu_read"] == math.ceil(mw.experts_hit(16, 1, 64) / 8)


def test_decode_latency_rises_with_context_and_batch(zaya, cluster):
    short = mw.decode_latency(zaya, cluster, mw.Serving(batch=32, context=1024))
    long = mw.decode_latency(zaya, cluster, mw.Serving(batch=32, context=32768))
    assert long["attention_s"] > short["attention_s"] and long["memory_bytes"] > short["memory_bytes"]
    one = mw.decode_latency(zaya, cluster, mw.Serving(batch=1, context=4096))
    many = mw.decode_latency(zaya, cluster, mw.Serving(batch=256, context=4096))
    assert one["experts_per_gpu_read"] == 1 and one["experts_hit"] == pytest.approx(1.0)
    assert many["latency_s"] > one["latency_s"] and many["tokens_per_s"] > one["tokens_per_s"]


def test_no_all_to_all_without_expert_parallelism(zaya, cluster):
    out = mw.decode_latency(zaya, cluster, mw.Serving(ep=1))
    assert out["ep"] == 1 and out["all_to_all_s"] == 0


def test_pareto_front_by_hand():
    points = [(10, 5), (8, 3), (12, 9), (9, 6), (None, 1), (8, 3)]
    assert mw.pareto_front(points) == [True, True, True, False, False, True]


def test_sweep_front_is_non_dominated(zaya, cluster):
    rows = mw.sweep(zaya, cluster, active_params=0.8e9, experts=(8, 16, 32), top_k=(1, 2, 4))
    assert len(rows) == 9 and any(r["pareto"] for r in rows)
    front = [r for r in rows if r["pareto"]]
    for r in rows:
        beats = [f for f in front if f is not r and f["train_tokens_per_s_per_gpu"] >= r["train_tokens_per_s_per_gpu"]
                 and f["decode_latency_ms"] <= r["decode_latency_ms"]]
        assert r["pareto"] or beats, r["model"]


def test_sweep_with_both_budgets_keeps_rows_near_the_total(zaya, cluster):
    rows = mw.sweep(zaya, cluster, active_params=0.8e9, total_params=9e9, experts=(8, 16, 32, 64), top_k=(1, 2))
    assert rows and all(abs(r["total_params"] / 9e9 - 1) <= 0.25 for r in rows)


def test_sweep_needs_a_budget(zaya, cluster):
    with pytest.raises(ConfigError, match="active-params"):
        mw.sweep(zaya, cluster)
    with pytest.raises(ConfigError, match="serving.batch"):
        mw.Serving(batch=0)
