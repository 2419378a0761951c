"""Every Triton kernel of validation/ against a torch reference, on odd shapes that leave
partial (masked) edge tiles. Without a GPU the kernels run in the Triton interpreter
(validation.env.setup sets TRITON_INTERPRET=1 before triton is imported); with one they
run compiled on it, with the same tolerances.

Tolerance: max |kernel - torch| / max |torch| with torch computing in fp32 from the same
(already rounded) inputs, so the error is output rounding plus summation order: fp32 1e-5
(interpreter; 5e-3 on a GPU, where fp32 tl.dot uses tf32), fp16 2e-3 (1 ulp = 2^-10),
bf16 and fp8 inputs 1e-2 (bf16 output, 1 ulp = 2^-7 = 7.8e-3: the interpreter's
fp32->bf16 cast truncates).
"""

import pytest

torch = pytest.importorskip("torch")

from validation.env import EnvironmentProblem, setup  # noqa: E402

try:
    RUNTIME = setup()
except EnvironmentProblem as exc:
    pytest.skip(str(exc), allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from validation import kernels as K  # noqa: E402

DEV = RUNTIME.device
TOL = {torch.float32: 1e-5 if RUNTIME.interpret else 5e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2,
       torch.float8_e4m3fn: 1e-2}


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV).to(dtype)


# ---- GEMM ---------------------------------------------------------------------------------

GEMM_SHAPES = [(1, 1, 1), (37, 29, 53), (64, 48, 32), (17, 100, 3)]
GEMM_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", GEMM_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
def test_gemm_matches_torch(m, n, k, dtype):
    if dtype in (torch.float8_e4m3fn,) and not K.fp8_supported(torch.device(DEV))[0]:
        pytest.skip(K.fp8_supported(torch.device(DEV))[1])
    a, b = randn(m, k, dtype=dtype, seed=1), randn(k, n, dtype=dtype, seed=2)
    out = K.gemm(a, b)
    assert out.shape == (m, n)
    assert out.dtype == (torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype)
    assert rel_err(out, a.float() @ b.float()) <= TOL[dtype]


def test_gemm_transposed_operands_use_strides():
    a, b = randn(53, 37, dtype=torch.bfloat16), randn(29, 53, dtype=torch.bfloat16, seed=3)
    out = K.gemm(a.t(), b.t())  # non-contiguous views
    assert rel_err(out, a.float().t() @ b.float().t()) <= TOL[torch.bfloat16]


def test_gemm_empty_reduction_is_zero():
    out = K.gemm(randn(5, 0), randn(0, 7))
    assert torch.equal(out, torch.zeros(5, 7, device=DEV))


def test_gemm_rejects_bad_input():
    with pytest.raises(ValueError, match="do not chain"):
        K.gemm(randn(4, 5), randn(6, 7))
    with pytest.raises(K.UnsupportedDtype, match="int8"):
        K.gemm(torch.ones(4, 4, dtype=torch.int8, device=DEV), torch.ones(4, 4, dtype=torch.int8, device=DEV))


def test_fp8_support_says_why():
    ok, why = K.fp8_supported(torch.device(DEV))
    assert isinstance(ok, bool) and why
    if DEV == "cpu":
        assert ok == RUNTIME.interpret and "interpreter" in why


# ---- grouped GEMM (MoE experts) -----------------------------------------------------------

COUNTS = {
    "uneven": [5, 0, 17, 1, 0, 9],
    "empty-ends": [0, 12, 3, 0],
    "one-expert": [0, 0, 21, 0],
    "all-empty": [0, 0, 0],
    "balanced": [16, 16],
}


def expert_reference(x, w, counts):
    parts = torch.split(x.float(), counts)
    return torch.cat([xe @ w[e].float() for e, xe in enumerate(parts)]) if sum(counts) else x.new_zeros(0, w.shape[2]).float()


@pytest.mark.parametrize("case", COUNTS)
def test_grouped_gemm_matches_per_expert_loop(case):
    counts = COUNTS[case]
    x, w = randn(sum(counts), 24, dtype=torch.bfloat16), randn(len(counts), 24, 19, dtype=torch.bfloat16, seed=4)
    y = K.grouped_gemm(x, w, torch.tensor(counts, device=DEV))
    assert y.shape == (sum(counts), 19)
    if sum(counts):
        assert rel_err(y, expert_reference(x, w, counts)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("case", ["uneven", "empty-ends"])
def test_grouped_wgrad_matches_and_empty_experts_get_zero(case):
    counts = COUNTS[case]
    x, dy = randn(sum(counts), 21), randn(sum(counts), 18, seed=5)
    dw = K.grouped_wgrad(x, dy, torch.tensor(counts, device=DEV))
    ref = torch.stack([xe.t() @ de for xe, de in zip(torch.split(x, counts), torch.split(dy, counts))])
    assert rel_err(dw, ref) <= TOL[torch.float32]
    for e, c in enumerate(counts):
        if c == 0:
            assert torch.count_nonzero(dw[e]) == 0


def test_grouped_gemm_rejects_counts_that_do_not_add_up():
    with pytest.raises(ValueError, match="summing to 10"):
        K.grouped_gemm(randn(10, 4), randn(2, 4, 3), torch.tensor([3, 3], device=DEV))
    with pytest.raises(ValueError, match=">= 0"):
        K.grouped_gemm(randn(2, 4), randn(2, 4, 3), torch.tensor([3, -1], device=DEV))


# ---- SwiGLU, RMSNorm, memory kernels ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_swiglu_forward_and_backward(dtype):
    h = randn(7, 2 * 45, dtype=dtype).requires_grad_()
    gate, up = h.float().chunk(2, dim=-1)
    ref = F.silu(gate) * up
    dout = randn(7, 45, dtype=dtype, seed=6)
    ref.backward(dout.float())
    assert rel_err(K.swiglu(h.detach()), ref) <= TOL[dtype]
    assert rel_err(K.swiglu_backward(h.detach(), dout), h.grad) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rmsnorm_forward_and_backward(dtype):
    x, w = randn(5, 77, dtype=dtype).requires_grad_(), (1 + 0.1 * randn(77, seed=7)).to(dtype).requires_grad_()
    xf, wf = x.float(), w.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * wf
    dy = randn(5, 77, dtype=dtype, seed=8)
    ref.backward(dy.float())
    y, rstd = K.rmsnorm(x.detach(), w.detach())
    dx, dw = K.rmsnorm_backward(x.detach(), w.detach(), rstd, dy)
    assert rel_err(y, ref) <= TOL[dtype]
    assert rel_err(dx, x.grad) <= TOL[dtype]
    assert rel_err(dw, w.grad) <= TOL[dtype]


def test_copy_and_triad_cover_a_partial_last_block():
    n = 1000 + 3  # not a multiple of any block size
    a, b, c = randn(n), randn(n, seed=9), torch.empty(n, device=DEV)
    assert torch.equal(K.copy(a, c), a)
    out = torch.empty(n, device=DEV)
    assert torch.allclose(K.triad(out, a, b, 0.4), a + 0.4 * b)


# ---- flash attention ----------------------------------------------------------------------

ATTN = [  # (batch, heads, kv_heads, seq, head_dim): MHA, GQA, MQA; odd seq and head_dim
    (1, 2, 2, 23, 16),
    (2, 4, 2, 37, 24),
    (1, 4, 1, 16, 8),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("b,h,hkv,s,d", ATTN)
def test_attention_forward_and_backward(b, h, hkv, s, d, causal):
    q, k, v = randn(b, h, s, d, seed=1), randn(b, hkv, s, d, seed=2), randn(b, hkv, s, d, seed=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
    do = randn(b, h, s, d, seed=4)
    ref.backward(do)
    o, lse = K.attention_forward(q, k, v, causal)
    tol = 1e-4 if RUNTIME.interpret else 1e-2  # fp32 inputs; tf32 tl.dot on a GPU
    assert rel_err(o, ref) <= tol
    for got, leaf in zip(K.attention_backward(q, k, v, o, lse, do, causal), leaves):
        assert rel_err(got, leaf.grad) <= tol


def test_attention_bf16_strided_views():
    qkv = randn(2, 19, 6, 16, dtype=torch.bfloat16)  # [B, S, heads, D] as a QKV projection gives
    q, k, v = (t.transpose(1, 2) for t in qkv.split([4, 1, 1], dim=2))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    assert rel_err(K.attention_forward(q, k, v, True)[0], ref) <= 2e-2


def test_attention_rejects_heads_that_do_not_group():
    with pytest.raises(ValueError, match="must divide"):
        K.attention_forward(randn(1, 3, 8, 16), randn(1, 2, 8, 16), randn(1, 2, 8, 16))
