"""Tiled GEMM: C[M, N] = A[M, K] @ B[K, N], fp32 accumulation, any strides.

Tiles of BLOCK_M x BLOCK_N, walked in groups of GROUP_M tile-rows so neighbouring programs
reuse the same B columns from L2 (the usual grouped launch order). Edge tiles are masked,
so odd M, N, K work. Transposed operands are just strides (the backward pass uses them).
"""

import torch
import triton
import triton.language as tl

from validation.kernels._common import INTERPRET, check_dtype, out_dtype


@triton.jit
def _tile_dot(a_ptrs, b_ptrs, stride_ak, stride_bk, k_size, offs_m_ok, offs_n_ok, offs_k,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """sum over k < k_size of A tile x B tile (fp32); the pointers start at k = 0."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_size, BLOCK_K):
        k_ok = (k0 + offs_k) < k_size
        a = tl.load(a_ptrs, mask=offs_m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & offs_n_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = _tile_dot(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_m < M, offs_n < N, offs_k,
                    BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def default_blocks(dtype: torch.dtype) -> dict:
    """Tile sizes: big tiles on a GPU (tensor-core friendly), small ones in the interpreter."""
    if INTERPRET:
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1)
    block_k = 128 if dtype.itemsize == 1 else 64
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k, GROUP_M=8, num_warps=8, num_stages=3)


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, **blocks) -> torch.Tensor:
    """a[M, K] @ b[K, N] -> [M, N] (fp8 inputs give bf16)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not chain")
    if a.dtype != b.dtype:
        raise ValueError(f"gemm: dtypes differ ({a.dtype} vs {b.dtype})")
    check_dtype(a, "gemm")
    (m, k), n = a.shape, b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype(a.dtype), device=a.device)
    cfg = {**default_blocks(a.dtype), **blocks}
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    if m and n:
        gemm_kernel[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                          out.stride(0), out.stride(1), UPCAST=INTERPRET, **cfg)
    return out
