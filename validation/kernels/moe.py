"""Grouped GEMM over experts: the MoE expert computation with uneven token counts.

Tokens arrive sorted by expert: rows offsets[e]:offsets[e+1] of X belong to expert e
(an expert may get none). Forward: Y_e = X_e @ W[e] for every e in one launch; the
host builds a table of (expert, first row) per BLOCK_M row tile, so an empty expert
simply owns no tiles. Weight gradient: dW[e] = X_e^T @ dY_e, a GEMM whose reduction
runs over the expert's ragged token range (an empty expert gets dW[e] = 0).
"""

import torch
import triton
import triton.language as tl

from validation.kernels._common import INTERPRET, check_dtype, out_dtype
from validation.kernels.gemm import _tile_dot, default_blocks


@triton.jit
def grouped_gemm_kernel(x_ptr, w_ptr, y_ptr, tile_expert_ptr, tile_row_ptr, offsets_ptr, N, K,
                        stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        UPCAST: tl.constexpr):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile)
    row0 = tl.load(tile_row_ptr + tile)
    row_end = tl.load(offsets_ptr + expert + 1)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = _tile_dot(x_ptrs, w_ptrs, stride_xk, stride_wk, K, offs_m < row_end, offs_n < N, offs_k,
                    BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < row_end)[:, None] & (offs_n < N)[None, :])


@triton.jit
def grouped_wgrad_kernel(x_ptr, dy_ptr, dw_ptr, offsets_ptr, K, N,
                         stride_xm, stride_xk, stride_ym, stride_yn, stride_we, stride_wk, stride_wn,
                         BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                         UPCAST: tl.constexpr):
    expert = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_k = tl.program_id(1) // tiles_n
    pid_n = tl.program_id(1) % tiles_n
    start = tl.load(offsets_ptr + expert)
    count = tl.load(offsets_ptr + expert + 1) - start
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_T)
    # X_e^T tile [BLOCK_K, BLOCK_T]: rows are features, columns tokens
    xt_ptrs = x_ptr + (start + offs_t[None, :]) * stride_xm + offs_k[:, None] * stride_xk
    dy_ptrs = dy_ptr + (start + offs_t[:, None]) * stride_ym + offs_n[None, :] * stride_yn
    acc = _tile_dot(xt_ptrs, dy_ptrs, stride_xm, stride_ym, count, offs_k < K, offs_n < N, offs_t,
                    BLOCK_K, BLOCK_N, BLOCK_T, UPCAST)
    dw_ptrs = dw_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=(offs_k < K)[:, None] & (offs_n < N)[None, :])


def expert_offsets(counts: torch.Tensor) -> torch.Tensor:
    """[E] tokens per expert -> [E + 1] int32 row offsets."""
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(torch.int32)


def _tile_table(counts: torch.Tensor, offsets: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert, first row) of every BLOCK_M row tile; empty experts own no tiles."""
    tiles = (counts + block_m - 1) // block_m
    experts = torch.arange(counts.numel(), device=counts.device)
    tile_expert = torch.repeat_interleave(experts, tiles)
    first_tile = torch.cumsum(tiles, 0) - tiles
    local = torch.arange(tile_expert.numel(), device=counts.device) - first_tile[tile_expert]
    tile_row = offsets[:-1].long()[tile_expert] + local * block_m
    return tile_expert.to(torch.int32), tile_row.to(torch.int32)


def _check(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> None:
    if w.ndim != 3 or x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} do not chain (want [T, K] and [E, K, N])")
    if counts.numel() != w.shape[0] or int(counts.sum()) != x.shape[0] or bool((counts < 0).any()):
        raise ValueError(f"grouped_gemm: counts {counts.tolist()} must be >= 0, one per expert, summing to {x.shape[0]} tokens")
    if x.dtype != w.dtype:
        raise ValueError(f"grouped_gemm: dtypes differ ({x.dtype} vs {w.dtype})")
    check_dtype(x, "grouped_gemm")


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, **blocks) -> torch.Tensor:
    """x[T, K] (sorted by expert, counts[e] rows each) times w[E, K, N] -> y[T, N]."""
    _check(x, w, counts)
    cfg = {**default_blocks(x.dtype), **blocks}
    cfg.pop("GROUP_M")
    y = torch.empty((x.shape[0], w.shape[2]), dtype=out_dtype(x.dtype), device=x.device)
    offsets = expert_offsets(counts)
    tile_expert, tile_row = _tile_table(counts, offsets, cfg["BLOCK_M"])
    grid = (tile_expert.numel(), triton.cdiv(w.shape[2], cfg["BLOCK_N"]))
    if grid[0] and grid[1]:
        grouped_gemm_kernel[grid](x, w, y, tile_expert, tile_row, offsets, w.shape[2], w.shape[1],
                                  x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2),
                                  y.stride(0), y.stride(1), UPCAST=INTERPRET, **cfg)
    return y


def grouped_wgrad(x: torch.Tensor, dy: torch.Tensor, counts: torch.Tensor, **blocks) -> torch.Tensor:
    """dW[e] = x_e^T @ dy_e for x[T, K], dy[T, N] sorted by expert -> dW[E, K, N] (fp32)."""
    if x.shape[0] != dy.shape[0] or int(counts.sum()) != x.shape[0]:
        raise ValueError(f"grouped_wgrad: x {tuple(x.shape)}, dy {tuple(dy.shape)}, counts sum {int(counts.sum())} disagree")
    cfg = {**default_blocks(x.dtype), **blocks}
    num_experts, (k, n) = counts.numel(), (x.shape[1], dy.shape[1])
    dw = torch.empty((num_experts, k, n), dtype=torch.float32, device=x.device)
    grid = (num_experts, triton.cdiv(k, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]))
    grouped_wgrad_kernel[grid](x, dy, dw, expert_offsets(counts), k, n, x.stride(0), x.stride(1),
                               dy.stride(0), dy.stride(1), dw.stride(0), dw.stride(1), dw.stride(2),
                               BLOCK_K=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_T=cfg["BLOCK_K"],
                               UPCAST=INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return dw
