"""torch.autograd wrappers around the Triton kernels: forward and backward both run the
project's kernels; only reshapes, gathers and small reductions are left to torch."""

import torch

from validation import kernels as K


class Linear(torch.autograd.Function):
    """y = x @ w for x [T, K], w [K, N]: dgrad dy @ w^T, wgrad x^T @ dy (transposes are strides)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return K.gemm(x, w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        return K.gemm(dy, w.t()), K.gemm(x.t(), dy)


class GroupedLinear(torch.autograd.Function):
    """y_e = x_e @ w[e] over experts (x sorted by expert, counts[e] rows each)."""

    @staticmethod
    def forward(ctx, x, w, counts):
        ctx.save_for_backward(x, w, counts)
        return K.grouped_gemm(x, w, counts)

    @staticmethod
    def backward(ctx, dy):
        x, w, counts = ctx.saved_tensors
        dy = dy.contiguous()
        dx = K.grouped_gemm(dy, w.transpose(1, 2), counts)
        return dx, K.grouped_wgrad(x, dy, counts).to(w.dtype), None


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return K.swiglu(h)

    @staticmethod
    def backward(ctx, dout):
        (h,) = ctx.saved_tensors
        return K.swiglu_backward(h, dout)


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, rstd = K.rmsnorm(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = K.rmsnorm_backward(x, w, rstd, dy)
        return dx, dw, None


class Attention(torch.autograd.Function):
    """Causal GQA flash attention on [B, H, S, D] / [B, Hkv, S, D]."""

    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = K.attention_forward(q, k, v, causal=True)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return K.attention_backward(q, k, v, o, lse, do, causal=True)


def linear(x, w):
    return Linear.apply(x, w)


def grouped_linear(x, w, counts):
    return GroupedLinear.apply(x, w, counts)


def swiglu(h):
    return SwiGLU.apply(h)


def rmsnorm(x, w, eps: float = 1e-6):
    return RMSNorm.apply(x, w, eps)


def attention(q, k, v):
    return Attention.apply(q, k, v)
