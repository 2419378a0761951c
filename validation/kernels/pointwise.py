"""Row-wise and element-wise kernels: fused SwiGLU, RMSNorm, and the HBM kernels.

SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"): h = [gate | up] of width 2F,
out = silu(gate) * up, silu(g) = g * sigmoid(g). RMSNorm (Zhang & Sennrich 2019):
y = x / sqrt(mean(x^2) + eps) * w. Copy (c = a) and triad (a = b + s * c) are the
BabelStream kernels (Deakin et al.), used to measure HBM bandwidth.
Math runs in fp32; results are stored in the input dtype.
"""

import torch
import triton
import triton.language as tl

from validation.kernels._common import INTERPRET

ELEMENT_BLOCK = 256 if INTERPRET else 1024


@triton.jit
def swiglu_fwd_kernel(h_ptr, out_ptr, F, stride_h, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    gate = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * stride_h + F + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def swiglu_bwd_kernel(h_ptr, dout_ptr, dh_ptr, F, stride_h, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    gate = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * stride_h + F + cols, mask=ok, other=0.0).to(tl.float32)
    dout = tl.load(dout_ptr + row * stride_o + cols, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    # d silu(g)/dg = sig * (1 + g * (1 - sig))
    dgate = dout * up * sig * (1.0 + gate * (1.0 - sig))
    dup = dout * gate * sig
    tl.store(dh_ptr + row * stride_h + cols, dgate.to(dh_ptr.dtype.element_ty), mask=ok)
    tl.store(dh_ptr + row * stride_h + F + cols, dup.to(dh_ptr.dtype.element_ty), mask=ok)


def _swiglu_grid(h: torch.Tensor) -> tuple[int, int, int]:
    if h.ndim != 2 or h.shape[1] % 2:
        raise ValueError(f"swiglu: want [T, 2F], got {tuple(h.shape)}")
    f = h.shape[1] // 2
    block = min(ELEMENT_BLOCK, triton.next_power_of_2(max(f, 1)))
    return (h.shape[0], triton.cdiv(f, block)), f, block


def swiglu(h: torch.Tensor) -> torch.Tensor:
    grid, f, block = _swiglu_grid(h)
    out = torch.empty((h.shape[0], f), dtype=h.dtype, device=h.device)
    if out.numel():
        swiglu_fwd_kernel[grid](h, out, f, h.stride(0), out.stride(0), BLOCK=block)
    return out


def swiglu_backward(h: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    grid, f, block = _swiglu_grid(h)
    h, dout = h.contiguous(), dout.contiguous()
    dh = torch.empty_like(h)
    if dout.numel():
        swiglu_bwd_kernel[grid](h, dout, dh, f, h.stride(0), dout.stride(0), BLOCK=block)
    return dh


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, D, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(rstd_ptr + row, rstd)
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def rmsnorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, D, stride_x, BLOCK: tl.constexpr):
    # dx = rstd * (w*dy - xhat * mean(xhat * w*dy)), xhat = x * rstd
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    xhat = x * rstd
    wdy = w * dy
    dx = rstd * (wdy - xhat * (tl.sum(xhat * wdy, axis=0) / D))
    tl.store(dx_ptr + row * stride_x + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """x[T, D] -> (y[T, D], rstd[T] fp32); one program per row (D up to 64K)."""
    if x.ndim != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: want x [T, D] and w [D], got {tuple(x.shape)} and {tuple(w.shape)}")
    x = x.contiguous()
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    if x.numel():
        rmsnorm_fwd_kernel[(x.shape[0],)](x, w, y, rstd, x.shape[1], x.stride(0), y.stride(0), eps,
                                          BLOCK=triton.next_power_of_2(x.shape[1]))
    return y, rstd


def rmsnorm_backward(x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw); dw = sum over rows of dy * xhat is a column reduction left to torch."""
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    if x.numel():
        rmsnorm_bwd_kernel[(x.shape[0],)](x, w, dy, rstd, dx, x.shape[1], x.stride(0),
                                          BLOCK=triton.next_power_of_2(x.shape[1]))
    dw = (dy.float() * (x.float() * rstd[:, None])).sum(0).to(w.dtype)
    return dx, dw


@triton.jit
def copy_kernel(a_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=ok), mask=ok)


@triton.jit
def triad_kernel(a_ptr, b_ptr, c_ptr, scalar, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    b = tl.load(b_ptr + offs, mask=ok)
    c = tl.load(c_ptr + offs, mask=ok)
    tl.store(a_ptr + offs, b + scalar * c, mask=ok)


def copy(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """c[:] = a (contiguous, same size); moves 2 x a.nbytes through HBM."""
    if a.numel() != c.numel() or not (a.is_contiguous() and c.is_contiguous()):
        raise ValueError("copy: a and c must be contiguous and the same size")
    copy_kernel[(triton.cdiv(a.numel(), ELEMENT_BLOCK),)](a, c, a.numel(), BLOCK=ELEMENT_BLOCK)
    return c


def triad(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, scalar: float) -> torch.Tensor:
    """a[:] = b + scalar * c; moves 3 x a.nbytes through HBM."""
    if not a.numel() == b.numel() == c.numel():
        raise ValueError("triad: a, b, c must be the same size")
    triad_kernel[(triton.cdiv(a.numel(), ELEMENT_BLOCK),)](a, b, c, scalar, a.numel(), BLOCK=ELEMENT_BLOCK)
    return a
