"""MI300X-aware sizing: kernels of a layer, wave-quantization suggestions, what a change
buys (api.estimate), and the heatmap grid."""

import dataclasses
import math

import pytest

import perfsim
from perfsim.design import sizing
from perfsim.errors import ConfigError
from tests.conftest import tiny_dense


@pytest.fixture(scope="module")
def node():
    return perfsim.load_cluster("mi300x-pollara", nodes=1)


@pytest.fixture(scope="module")
def zaya():
    return perfsim.load_model("zaya1-base")


def test_workload_rejects_bad_values():
    with pytest.raises(ConfigError, match="sizing.seq"):
        sizing.Workload(seq=0)
    with pytest.raises(ConfigError, match="sizing.dtype"):
        sizing.Workload(dtype="int3")


def test_layer_kernels_do_the_layers_matmul_flops(zaya, node):
    """Forward GEMM FLOPs of one MoE layer = 2 * tokens * (attention + router + top_k experts) params."""
    work = sizing.Workload(seq=4096)
    kernels = sizing.layer_kernels(zaya, node.gpu, work, head=False)
    gemm = sum(k.flops for k in kernels if k.name != "attn_core")
    params = zaya.attention_params() + zaya.router_params() + zaya.top_k * zaya.expert_params()
    assert gemm == pytest.approx(2 * work.tokens * params, rel=1e-9)
    qkv = next(k for k in kernels if k.name == "qkv")
    assert (qkv.m, qkv.n, qkv.k) == (4096, (8 + 2 * 2) * 128, 2048)
    up = next(k for k in kernels if k.name == "expert_up")
    assert up.groups == zaya.num_experts and up.m == 4096 // zaya.num_experts


def test_every_kernel_is_at_most_peak_and_names_its_bound(zaya, node):
    for k in sizing.layer_kernels(zaya, node.gpu):
        assert 0 < k.efficiency <= 1 and k.bound in ("compute", "memory", "k-loop")
    router_out = next(k for k in sizing.layer_kernels(zaya, node.gpu) if k.name == "router_out")
    # n = 16 experts: a sliver of a tile, far from peak whatever bounds it (reads, the K loop, small-call cost)
    assert router_out.quantization <= 0.25 and router_out.efficiency < 0.05


def test_wave_quantization_suggests_a_width_that_fills_the_cus(node):
    """ffn 2560 (gated: up n = 5120) x 4096 tokens in the 256 x 128 macro tile is 320 tiles >
    304 CUs, but the library picks the least padded tile split (64 x 64 here, 99% of CU
    time on real output), so the default 1% gate suggests nothing; without the gate the
    nearest width that fills one wave of macro tiles exactly is 2432 (19 x 16 = 304)."""
    shipped = node.gpu.gemm_table("bf16")  # a flat size curve, so only the quantization moves the answer
    table = dataclasses.replace(shipped, gflop=(1.0,), efficiency=(max(shipped.efficiency),), k_step_ns=0.0)
    gpu = dataclasses.replace(node.gpu, gemm_dtypes={**node.gpu.gemm_dtypes, "bf16": table})
    model = tiny_dense(hidden_size=2048, ffn_hidden_size=2560, num_heads=16, head_dim=128)
    assert math.ceil(4096 / table.tile_m) * math.ceil(2 * 2560 / table.tile_n) > gpu.num_compute_units
    assert sizing.suggest(model, "ffn_hidden_size", gpu, sizing.Workload(seq=4096)) is None
    tip = sizing.suggest(model, "ffn_hidden_size", gpu, sizing.Workload(seq=4096), min_gain_pct=0.0)
    assert tip is not None and tip.suggested == 2432
    assert tip.quantization_before < 1.0 and tip.quantization_after == pytest.approx(1.0)
    assert 0 < tip.gain_pct < 1


def test_no_suggestion_when_every_kernel_fits_a_wave(zaya, node):
    rows = sizing.sizing_table(zaya, node)
    assert [r["name"] for r in rows][-1] == "lm_head"
    assert all(r["suggestion"] == "" and r["gain_pct"] == 0 for r in rows)


@pytest.mark.parametrize("ffn", [1000, 2560, 3000, 5200, 7000, 11008])
def test_suggestions_only_ever_gain(node, ffn):
    model = tiny_dense(hidden_size=2048, ffn_hidden_size=ffn, head_dim=128)
    tip = sizing.suggest(model, "ffn_hidden_size", node.gpu)
    if tip is not None:
        assert tip.tflops_after > tip.tflops_before and tip.suggested % 64 == 0
        assert abs(tip.suggested - ffn) <= 0.125 * ffn + 64


def test_candidates_are_aligned_and_include_current(zaya):
    values = sizing.candidates(zaya, "hidden_size", align=128, window=0.125)
    assert 2048 in values and all(v % 128 == 0 for v in values)
    assert min(values) >= 2048 * 0.875 and max(values) <= 2048 * 1.125
    heads = sizing.candidates(zaya, "num_heads", window=0.5)
    assert all(h % zaya.num_kv_heads == 0 for h in heads)


def test_grid_grows_with_size_and_marks_invalid_models(zaya, node):
    grid = sizing.efficiency_grid(zaya, node.gpu, "hidden", [1024, 2048, 3072], "ffn", [512, 1024, 2048, 4096])
    assert grid["x_knob"] == "hidden_size" and grid["y_knob"] == "expert_ffn_hidden_size"
    experts = []  # bigger expert GEMMs run faster per FLOP (size falloff of the grouped table)
    for ffn in (512, 1024, 2048, 4096):
        ks = [k for k in sizing.layer_kernels(sizing.with_knob(zaya, "expert_ffn_hidden_size", ffn), node.gpu,
                                              sizing.Workload()) if k.knob == "expert_ffn_hidden_size"]
        experts.append(sizing.aggregate_tflops(ks))
    assert experts == sorted(experts)
    assert all(v is not None and v > 0 for row in grid["tflops"] for v in row)
    heads = sizing.efficiency_grid(zaya, node.gpu, "heads", [7, 8], "head_dim", [128])
    assert heads["tflops"][0][0] is None and heads["tflops"][0][1] is not None  # 2 kv heads do not divide 7
    assert heads["efficiency"][0][1] == pytest.approx(heads["tflops"][0][1] * 1e12 / node.gpu.peak_flops("bf16"))


def test_grid_and_knob_errors(zaya, node):
    with pytest.raises(ConfigError, match="axes must differ"):
        sizing.efficiency_grid(zaya, node.gpu, "hidden", [1024], "hidden_size", [2048])
    with pytest.raises(ConfigError, match="knob"):
        sizing.resolve_knob(zaya, "width")
