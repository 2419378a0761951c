"""ZeRO gathers the embedding and LM head weights as it does a layer's, in both estimators:
ZeRO-1/2 once a step with the updated weights, per-pass ZeRO-3 before the embedding's
forward and the LM head's forward and backward. Their cost grows with the vocabulary."""

import pytest
from conftest import tiny_dense

import perfsim.api as api

GATHER = "dp_param_gather/all_gather"
# 8 MI300X nodes, tp 8 inside a node: dp 8 across the NICs, where gathers cost time
KNOBS = dict(tp=8, dp=8, mbs=1, gbs=16, seq=2048, check_memory=False)


def _cluster():
    return api.load_cluster("mi300x-pollara").with_nodes(8)


@pytest.mark.parametrize("zero", [1, 3])
def test_both_estimators_count_the_same_gathers(zero):
    model = tiny_dense(vocab_size=128_000)
    engine = api.simulate(model, _cluster(), zero=zero, **KNOBS)
    closed = api.estimate(model, _cluster(), zero=zero, **KNOBS)
    m = 16 // 8
    blocks = model.num_layers + 2  # the layers, the embedding, the LM head
    passes = model.num_layers * 2 + 1 + 2  # ZeRO-3: layers and head F and B, embedding F
    expected = blocks if zero == 1 else m * passes
    assert engine.comm_by_collective[GATHER]["count"] == closed.comm_by_collective[GATHER]["count"] == expected
    assert closed.comm_by_collective[GATHER]["total_s"] == pytest.approx(engine.comm_by_collective[GATHER]["total_s"],
                                                                        rel=0.1)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.05)


@pytest.mark.parametrize("estimate", [api.simulate, api.estimate], ids=["engine", "closed_form"])
@pytest.mark.parametrize("zero", [1, 3])
def test_a_larger_vocabulary_gathers_more(estimate, zero):
    """Quadrupling the vocabulary adds only embedding / LM head bytes to the gathers: the
    gathered seconds grow, and so does the step (ZeRO-1's first forward waits for the
    embedding's gather; ZeRO-3 gathers them every microbatch)."""
    small = estimate(tiny_dense(vocab_size=32_000), _cluster(), zero=zero, **KNOBS)
    large = estimate(tiny_dense(vocab_size=128_000), _cluster(), zero=zero, **KNOBS)
    assert large.comm_by_collective[GATHER]["total_s"] > 1.2 * small.comm_by_collective[GATHER]["total_s"]
    assert large.step_time_s > small.step_time_s
