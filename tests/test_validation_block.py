"""validation.block: the transformer block built from the Triton kernels computes the
same forward and gradients as the same block in plain torch (fp32, interpreter on CPU),
and the perfsim side of the comparison is the block alone."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from validation.env import EnvironmentProblem, setup  # noqa: E402

try:
    RUNTIME = setup()
except EnvironmentProblem as exc:
    pytest.skip(str(exc), allow_module_level=True)

import perfsim  # noqa: E402
from validation import block  # noqa: E402


def tiny(moe: bool = True):
    """zaya1-base's structure (GQA, MLP router, SwiGLU experts) shrunk to interpreter size."""
    base = perfsim.load_model("zaya1-base")
    small = dict(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, router_hidden_size=16)
    if moe:
        return dataclasses.replace(base, **small, num_experts=4, top_k=2, expert_ffn_hidden_size=24)
    return dataclasses.replace(base, **{**small, "router_hidden_size": 0}, num_experts=0, top_k=0,
                               expert_ffn_hidden_size=0, ffn_hidden_size=40)


def run(model, ops, params, x, dy):
    for t in [*params.values(), x]:
        t.grad = None
    y = block.block_forward(model, ops, params, x)
    y.backward(dy)
    return y.detach().clone(), {k: v.grad.clone() for k, v in params.items()}, x.grad.clone()


@pytest.mark.parametrize("moe", [True, False], ids=["moe", "dense"])
def test_kernel_block_matches_torch_block_forward_and_backward(moe):
    model = tiny(moe)
    params = block.init_params(model, RUNTIME.device, torch.float32)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, model.hidden_size, generator=gen).to(RUNTIME.device).requires_grad_()
    dy = torch.randn(2, 9, model.hidden_size, generator=gen).to(RUNTIME.device)
    y1, g1, dx1 = run(model, block.kernel_ops(), params, x, dy)
    y2, g2, dx2 = run(model, block.torch_ops(), params, x, dy)
    tol = 1e-4 if RUNTIME.interpret else 2e-2  # fp32 (tf32 tl.dot on a GPU)
    assert torch.allclose(y1, y2, rtol=tol, atol=tol)
    assert torch.allclose(dx1, dx2, rtol=tol, atol=tol)
    for name in params:
        assert torch.allclose(g1[name], g2[name], rtol=tol, atol=tol), name


def test_prediction_is_the_block_alone():
    model = perfsim.load_model("zaya1-base")
    pred = block.predicted_block_s(model, "h200-ib", mbs=1, seq=2048)
    whole = perfsim.simulate(block.one_layer(model), "h200-ib", gpus=1, mbs=1, gbs=1, seq=2048, check_memory=False)
    assert 0 < pred["F"] < pred["B"]  # backward does ~2x the GEMM work
    assert pred["F"] + pred["B"] < whole.step_time_s  # no LM head, loss or optimizer


def test_mla_blocks_are_refused_with_a_message():
    with pytest.raises(EnvironmentProblem, match="only GQA"):
        block.one_layer(perfsim.load_model("deepseek-v2-lite"))


def test_block_command_without_gpu_exits_2(capsys):
    if not RUNTIME.interpret:
        pytest.skip("a GPU is present")
    assert block.main(["--model", "zaya1-base"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no GPU") and err.count("\n") == 1
