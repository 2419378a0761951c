"""NVIDIA's DGX Cloud benchmark recipes (NVIDIA/dgxc-benchmarking) and the NeMo 24.12 page's
GPT-3 / Nemotron rows as nemo cases: one source per recipe release, throughput from the printed
step time by the README's own formula, the full models only (no proxy layer counts), GPT-3 with
learned positions and a GELU MLP, Nemotron-4 with a squared-ReLU MLP, and every run predicted
to fit as it ran."""

import math
from pathlib import Path

import pytest

from perfsim import api
from perfsim.design.runs import predict, read_runs

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "validation" / "runs" / "published.csv"
RELEASES = {"dgxc-benchmarking-24.11": 36, "dgxc-benchmarking-25.01": 28, "dgxc-benchmarking-25.02": 54,
            "dgxc-benchmarking-25.04": 52, "dgxc-benchmarking-25.05": 6}


@pytest.fixture(scope="module")
def cases():
    return [c for c in read_runs(RUNS) if c.source_id.startswith("dgxc-benchmarking-")]


def test_each_release_is_one_nemo_source_of_full_models(cases):
    counts = {s: sum(1 for c in cases if c.source_id == s) for s in RELEASES}
    assert counts == RELEASES
    assert {c.stack for c in cases} == {"nemo"}
    assert {c.model for c in cases} == {"gpt3-175b", "nemotron4-15b", "nemotron4-340b", "llama3.1-8b",
                                         "llama3.1-70b", "llama3.1-405b"}
    # the 405B rows are the whole model: the recipes' proxy configurations (fewer layers below
    # 576 / 512 GPUs) are not cases
    assert min(8 * c.nodes for c in cases if c.model == "llama3.1-405b") >= 512


def test_throughput_is_the_readmes_formula_of_the_printed_step_time(cases):
    gpt3 = next(c for c in cases if c.id == "DGXC2411-GPT3-175B-BF16-128")
    knobs = dict(gpt3.knobs)
    assert gpt3.metric == "tokens_per_s_per_gpu"
    # 8.91 s per step of 256 sequences of 2048 tokens on 128 GPUs (README_175b @35a9aecc)
    assert gpt3.measured == pytest.approx(2048 * 256 / 8.91 / 128, abs=0.05)
    assert knobs["tp"] == 4 and knobs["pp"] == 8 and knobs["vpp"] == 12 and knobs["mbs"] == 1


def test_gpt3_and_nemotron4_presets_have_their_published_shapes():
    gpt3, n340 = api.load_model("gpt3-175b"), api.load_model("nemotron4-340b")
    assert not gpt3.gated_mlp and not gpt3.rotary and gpt3.tied_embeddings and gpt3.ffn_hidden_size == 4 * gpt3.hidden_size
    assert not n340.gated_mlp and n340.rotary and not n340.tied_embeddings and n340.num_kv_heads == 8
    assert math.isclose(n340.params_as_published(active=False), 331.6e9, rel_tol=0.001)


def test_every_dgxc_run_fits_as_it_ran(cases):
    for case in cases:
        result = predict(case)
        assert result.fits, (case.id, result.peak_memory_bytes / 1e9)
