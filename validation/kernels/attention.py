"""Flash attention (causal or not, GQA), forward and backward.

Forward follows FlashAttention-2 (Dao 2023, Alg. 1): one program per (BLOCK_M query rows,
batch x head) streams K/V blocks with an online softmax and stores O and the row
log-sum-exp (base 2). Backward follows FA2 Alg. 2: delta = rowsum(dO * O); one kernel
accumulates dK, dV per K/V block (looping over the query heads that share the KV head),
another accumulates dQ per query block. Layout [batch, heads, seq, head_dim], any strides;
q has H heads, k/v have H / group heads (GQA: query head h reads KV head h // group).
"""

import math

import torch
import triton
import triton.language as tl

from validation.kernels._common import INTERPRET

LOG2E = 1.4426950408889634


def blocks() -> dict:
    if INTERPRET:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


@triton.jit
def _load_rows(base, offs, stride_s, offs_d, S, D, UPCAST: tl.constexpr):
    """Rows offs of a [S, D] slab -> [len(offs), BLOCK_D] (zero outside)."""
    t = tl.load(base + offs[:, None] * stride_s + offs_d[None, :],
                mask=(offs < S)[:, None] & (offs_d < D)[None, :], other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _keep(offs_m, offs_n, S, CAUSAL: tl.constexpr, ROWS: tl.constexpr):
    """[M, N] mask of scores that exist: key in range (query too if ROWS) and, if causal,
    key <= query. The forward leaves padded query rows unmasked so no row is all -inf."""
    keep = (offs_n < S)[None, :] & (offs_m >= 0)[:, None]
    if ROWS:
        keep = keep & (offs_m < S)[:, None]
    if CAUSAL:
        keep = keep & (offs_m[:, None] >= offs_n[None, :])
    return keep


@triton.jit
def attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s,
                    sv_b, sv_h, sv_s, so_b, so_h, so_s, H, GROUP, S, D, qk_scale,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr + b * sq_b + h * sq_h, offs_m, sq_s, offs_d, S, D, UPCAST)
    k_base = k_ptr + b * sk_b + (h // GROUP) * sk_h
    v_base = v_ptr + b * sv_b + (h // GROUP) * sv_h
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, S) if CAUSAL else S
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, sk_s, offs_d, S, D, UPCAST)
        v = _load_rows(v_base, offs_n, sv_s, offs_d, S, D, UPCAST)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # base-2 logits
        s = tl.where(_keep(offs_m, offs_n, S, CAUSAL, False), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    row_ok = offs_m < S
    tl.store(lse_ptr + (b * H + h) * S + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    o_ptrs = o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_s + offs_d[None, :]
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, H, HKV, GROUP, S, D, qk_scale, sm_scale,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    # q/do/dk/dv share q's strides for batch/seq (contiguous copies); k/v/dk/dv share k's.
    pid_n = tl.program_id(0)
    b = tl.program_id(1) // HKV
    hk = tl.program_id(1) % HKV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_rows(k_ptr + b * sk_b + hk * sk_h, offs_n, sk_s, offs_d, S, D, UPCAST)
    v = _load_rows(v_ptr + b * sk_b + hk * sk_h, offs_n, sk_s, offs_d, S, D, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for g in range(0, GROUP):
        h = hk * GROUP + g
        for m0 in range(lo, S, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q = _load_rows(q_ptr + b * sq_b + h * sq_h, offs_m, sq_s, offs_d, S, D, UPCAST)
            do = _load_rows(do_ptr + b * sq_b + h * sq_h, offs_m, sq_s, offs_d, S, D, UPCAST)
            lse = tl.load(lse_ptr + (b * H + h) * S + offs_m, mask=offs_m < S, other=0.0)
            delta = tl.load(delta_ptr + (b * H + h) * S + offs_m, mask=offs_m < S, other=0.0)
            p_t = tl.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])  # [N, M] = P^T
            p_t = tl.where(tl.trans(_keep(offs_m, offs_n, S, CAUSAL, True)), p_t, 0.0)
            dv += tl.dot(p_t.to(do.dtype), do)
            ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q)
    mask = (offs_n < S)[:, None] & (offs_d < D)[None, :]
    out = b * sk_b + hk * sk_h + offs_n[:, None] * sk_s + offs_d[None, :]
    tl.store(dk_ptr + out, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                       sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, H, GROUP, S, D, qk_scale, sm_scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(q_ptr + b * sq_b + h * sq_h, offs_m, sq_s, offs_d, S, D, UPCAST)
    do = _load_rows(do_ptr + b * sq_b + h * sq_h, offs_m, sq_s, offs_d, S, D, UPCAST)
    lse = tl.load(lse_ptr + (b * H + h) * S + offs_m, mask=offs_m < S, other=0.0)
    delta = tl.load(delta_ptr + (b * H + h) * S + offs_m, mask=offs_m < S, other=0.0)
    k_base = k_ptr + b * sk_b + (h // GROUP) * sk_h
    v_base = v_ptr + b * sk_b + (h // GROUP) * sk_h
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, S) if CAUSAL else S
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, sk_s, offs_d, S, D, UPCAST)
        v = _load_rows(v_base, offs_n, sk_s, offs_d, S, D, UPCAST)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        p = tl.where(_keep(offs_m, offs_n, S, CAUSAL, True), p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    mask = (offs_m < S)[:, None] & (offs_d < D)[None, :]
    out = b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :]
    tl.store(dq_ptr + out, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=mask)


def _shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[::2] != k.shape[::2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention: want q [B, H, S, D], k = v [B, Hkv, S, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"attention: kv heads {k.shape[1]} must divide query heads {q.shape[1]}")
    b, h, s, d = q.shape
    return b, h, k.shape[1], s, d


def attention_forward(q, k, v, causal: bool = True, sm_scale: float | None = None):
    """-> (o [B, H, S, D], lse [B, H, S] base-2 log-sum-exp of the scaled logits)."""
    b, h, hkv, s, d = _shapes(q, k, v)
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    cfg = blocks()
    grid = (triton.cdiv(s, cfg["BLOCK_M"]), b * h)
    attn_fwd_kernel[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                          h, h // hkv, s, d, sm_scale * LOG2E, CAUSAL=causal,
                          BLOCK_D=max(16, triton.next_power_of_2(d)), UPCAST=INTERPRET, **cfg)
    return o, lse


def attention_backward(q, k, v, o, lse, do, causal: bool = True, sm_scale: float | None = None):
    """-> (dq, dk, dv); delta = rowsum(dO * O) is a small torch reduction (glue)."""
    b, h, hkv, s, d = _shapes(q, k, v)
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    delta = (do.float() * o.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    cfg = blocks()
    common = dict(CAUSAL=causal, BLOCK_D=max(16, triton.next_power_of_2(d)), UPCAST=INTERPRET, **cfg)
    strides = (*q.stride()[:3], *k.stride()[:3])
    attn_bwd_dkdv_kernel[(triton.cdiv(s, cfg["BLOCK_N"]), b * hkv)](
        q, k, v, do, lse, delta, dk, dv, *strides, h, hkv, h // hkv, s, d, sm_scale * LOG2E, sm_scale, **common)
    attn_bwd_dq_kernel[(triton.cdiv(s, cfg["BLOCK_M"]), b * h)](
        q, k, v, do, lse, delta, dq, *strides, h, h // hkv, s, d, sm_scale * LOG2E, sm_scale, **common)
    return dq, dk, dv
