"""The closed-form estimator agrees with the engine where nothing overlaps, and the
simulated pipeline bubble follows Narayanan'21."""

import time

import pytest
from conftest import tiny_dense

from perfsim import estimate, simulate

AGREE = [  # (model, knobs): pp=1, no overlap of gradient reduction
    ("llama3.1-8b", dict(nodes=1, dp=8, gbs=16, zero=1)),
    ("llama3.1-8b", dict(nodes=1, tp=2, dp=4, gbs=16, zero=0)),
    ("llama3.1-8b", dict(nodes=1, tp=2, dp=4, gbs=16, zero=2)),
    ("llama3.1-8b", dict(nodes=1, tp=2, cp=2, dp=2, gbs=8, zero=1)),
    ("zaya1-base", dict(nodes=2, dp=16, gbs=32, zero=1)),
    ("zaya1-base", dict(nodes=2, dp=16, ep=8, gbs=32, zero=1)),
    ("zaya1-base", dict(nodes=2, dp=16, ep=8, gbs=32, zero=2, recompute="full")),
]


@pytest.mark.parametrize("model, knobs", AGREE)
def test_analytic_matches_engine_without_overlap(model, knobs, mi300x):
    kw = dict(seq=4096, overlap_grad_reduce=False, **knobs)
    des = simulate(model, mi300x, **kw)
    closed = estimate(model, mi300x, **kw)
    assert closed.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
    assert closed.peak_memory_bytes == des.peak_memory_bytes


def test_analytic_is_fast(mi300x):
    estimate("zaya1-base", mi300x, nodes=2, dp=16, ep=8, gbs=32, seq=4096)  # warm caches
    t0 = time.perf_counter()
    estimate("zaya1-base", mi300x, nodes=2, dp=16, ep=8, gbs=32, seq=4096)
    assert time.perf_counter() - t0 < 1.0


# ---- pipeline bubble -------------------------------------------------------------------

# Uniform stages: a vocabulary this small makes embedding and head negligible.
# wide enough that compute dwarfs the p2p sends, as in the uniform-stage textbook forms
UNIFORM = tiny_dense(num_layers=16, vocab_size=256, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                     ffn_hidden_size=16384)


def bubble_fraction(pp: int, m: int, vpp: int = 1, estimator: str = "des") -> float:
    r = simulate(UNIFORM, "mi300x-pollara", gpus=pp, pp=pp, vpp=vpp, dp=1, mbs=1, gbs=m, seq=2048, estimator=estimator)
    return r.breakdown["pipeline_bubble"] / r.step_time_s


@pytest.mark.parametrize("pp, m", [(2, 4), (2, 16), (4, 4), (4, 8), (4, 32)])
def test_1f1b_bubble_matches_narayanan(pp, m):
    # Megatron (Narayanan'21) eq.3: bubble = (pp-1)/(m+pp-1) of the step; p2p latency
    # and the optimizer step add a little, hence 10 % relative tolerance.
    expected = (pp - 1) / (m + pp - 1)
    assert bubble_fraction(pp, m) == pytest.approx(expected, rel=0.10)


def test_bubble_shrinks_with_more_microbatches():
    fractions = [bubble_fraction(4, m) for m in (4, 8, 16)]
    assert fractions == sorted(fractions, reverse=True)


def test_no_bubble_without_pipeline():
    assert bubble_fraction(1, 8) < 0.01


@pytest.mark.parametrize("m", [4, 8, 16])
def test_interleaving_shrinks_bubble(m):
    plain, interleaved = bubble_fraction(4, m), bubble_fraction(4, m, vpp=2)
    assert interleaved < plain
    # Narayanan'21 sec. 2.2: the bubble divides by vpp; extra p2p hops keep some of it
    ideal = 1.5 / (m + 1.5)
    assert interleaved == pytest.approx(ideal, rel=0.30)


@pytest.mark.parametrize("pp, m, vpp", [(2, 8, 1), (4, 8, 1), (4, 8, 2)])
def test_analytic_pipeline_close_to_engine(pp, m, vpp):
    """The closed-form bubble is part of the step (it once fell outside the step window)."""
    knobs = dict(gpus=pp, pp=pp, vpp=vpp, dp=1, mbs=1, gbs=m, seq=2048)
    des = simulate(UNIFORM, "mi300x-pollara", **knobs)
    closed = estimate(UNIFORM, "mi300x-pollara", **knobs)
    assert closed.step_time_s == pytest.approx(des.step_time_s, rel=0.05)
    assert bubble_fraction(pp, m, vpp, "analytic") == pytest.approx(bubble_fraction(pp, m, vpp), abs=0.02)
