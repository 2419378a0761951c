"""The library kernels a training step calls, timed through torch (``validation.run --backend torch``).

perfsim prices kernels as the vendor libraries run them, so the sweep that checks it
should time those libraries, not only the project's Triton kernels:

* GEMM: ``torch.matmul`` (cuBLAS / hipBLASLt), FP8 through ``torch._scaled_mm`` with
  per-tensor scales (cuBLASLt / hipBLASLt FP8, BF16 output: Transformer Engine's default
  recipe);
* grouped expert GEMM: ``torch._grouped_mm`` (CUTLASS grouped GEMM on Hopper, the path
  torchtitan's MoE takes); where that op is missing, one ``torch.matmul`` per expert (a
  Megatron SequentialMLP-style loop) and the row says so;
* attention: ``scaled_dot_product_attention`` pinned to one backend at a time (``flash``:
  FlashAttention-2; ``cudnn``: cuDNN fused attention), forward and backward
  (``torch.autograd.grad`` of a kept graph: dq, dk, dv with no gradient accumulation);
* memory: ``Tensor.copy_`` and ``torch.add(..., alpha=)`` (copy and triad).

Each ``prepare_*`` returns ``(run, error, extra)``: the timed call, its error against an
fp32 torch reference, and the CSV cells that name the library. A shape or dtype the
library refuses raises ``Unsupported`` (the sweep reports it as skipped, not failed).
"""

import torch
import torch.nn.functional as F

ATTENTION_BACKENDS = ("flash", "cudnn")


class Unsupported(RuntimeError):
    """The library has no kernel for this shape / dtype on this device."""


def rel_error(out, ref) -> float:
    """max |out - ref| / max |ref| (the sweep's error measure)."""
    scale = ref.float().abs().max().item() or 1.0
    return (out.float() - ref.float()).abs().max().item() / scale


def _refuse(what: str, exc: Exception) -> Unsupported:
    return Unsupported(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")


def _blas() -> str:
    return "hipBLASLt" if torch.version.hip else "cuBLAS"


def prepare_gemm(a, b, dtype: str):
    """a [m, k] @ b [k, n]; FP8 inputs through torch._scaled_mm (b column-major, BF16 out)."""
    if dtype != "fp8":
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        run = lambda: torch.matmul(a, b, out=out)  # noqa: E731
        return run, (lambda: rel_error(torch.matmul(a, b), a.float() @ b.float())), \
            {"library": f"{_blas()} (torch.matmul)"}
    if not hasattr(torch, "_scaled_mm"):
        raise Unsupported("fp8 GEMM: this torch has no torch._scaled_mm")
    b_cm = b.t().contiguous().t()  # column-major, as cuBLASLt's FP8 GEMM requires
    one = torch.ones((), dtype=torch.float32, device=a.device)

    def run():
        return torch._scaled_mm(a, b_cm, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    try:
        run()
    except (RuntimeError, TypeError) as exc:
        raise _refuse(f"fp8 GEMM {tuple(a.shape)} x {tuple(b.shape)}", exc) from None
    return run, (lambda: rel_error(run(), a.float() @ b.float())), \
        {"library": f"{_blas()}Lt FP8 (torch._scaled_mm, per-tensor scales, bf16 out)"}


def prepare_grouped(x, w, counts: list[int]):
    """x [tokens, k] split by ``counts`` over w [experts, k, n]."""
    def reference():
        return torch.cat([xe.float() @ w[e].float() for e, xe in enumerate(torch.split(x, counts))])
    if hasattr(torch, "_grouped_mm"):
        offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
        layouts = (("", w), ("column-major weights", w.transpose(1, 2).contiguous().transpose(1, 2)))
        errors = []
        for layout, wl in layouts:
            def run(wl=wl):
                return torch._grouped_mm(x, wl, offs=offs)
            try:
                run()
            except (RuntimeError, TypeError) as exc:
                errors.append(exc)
                continue
            tag = f", {layout}" if layout else ""
            return run, (lambda: rel_error(run(), reference())), \
                {"library": f"torch._grouped_mm (grouped GEMM{tag})", "kernel": ""}
        raise _refuse(f"grouped GEMM E={len(counts)} {tuple(w.shape[1:])}", errors[-1])
    parts = [int(c) for c in counts]

    def loop():
        return torch.cat([xe @ w[e] for e, xe in enumerate(torch.split(x, parts))])
    return loop, (lambda: rel_error(loop(), reference())), {"library": f"{_blas()} (torch.matmul per expert, loop)"}


def prepare_grouped_backward(x, w, dy, counts: list[int]):
    """The backward of x [tokens, k] @ w [experts, k, n] split by ``counts``: dgrad (dy @ w^T
    per expert) and wgrad (x^T @ dy per expert), both through torch._grouped_mm, as one
    timed call (a kernel CSV ``bwd`` row: dgrad + wgrad)."""
    if not hasattr(torch, "_grouped_mm"):
        raise Unsupported("grouped GEMM backward: this torch has no torch._grouped_mm")
    offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
    w_t = w.transpose(1, 2)  # [experts, n, k], column-major: the layout torchtitan's forward passes

    def run():
        return torch._grouped_mm(dy, w_t, offs=offs), torch._grouped_mm(x.t(), dy, offs=offs)
    try:
        run()
    except (RuntimeError, TypeError) as exc:
        raise _refuse(f"grouped GEMM backward E={len(counts)} {tuple(w.shape[1:])}", exc) from None

    def error():
        dx, dw = run()
        xs, dys = torch.split(x, counts), torch.split(dy, counts)
        ref_dx = torch.cat([d.float() @ w[e].float().t() for e, d in enumerate(dys)])
        ref_dw = torch.stack([xe.float().t() @ d.float() for xe, d in zip(xs, dys)])
        return max(rel_error(dx, ref_dx), rel_error(dw, ref_dw))
    return run, error, {"library": "torch._grouped_mm (grouped GEMM dgrad + wgrad)"}


# memory-bound kernels of a step, each one library kernel: (bytes per element moved, tolerance)
MEMBOUND = {
    "fp8_cast": "bf16 -> fp8 e4m3 (Tensor.to): 2 B read, 1 B written per element",
    "permute": "token permute (index_select of bf16 rows): 2 B read, 2 B written per element",
    "router": "router softmax over the experts (fp32 logits): 4 B read, 4 B written per element",
    "topk": "router top-8 (torch.topk over fp32 logits): 4 B read per element",
    "rmsnorm": "RMSNorm, torch.compile'd into one kernel (bf16): 2 B read, 2 B written per element",
    "swiglu": "SwiGLU silu(gate) * up, torch.compile'd into one kernel (bf16): 4 B read, 2 B written per output",
}


def prepare_membound(kernel: str, x):
    """One memory-bound library kernel on x (bf16 [rows, cols]; fp32 logits for router / topk)."""
    if kernel == "fp8_cast":
        fp8 = torch.float8_e4m3fn
        return (lambda: x.to(fp8)), (lambda: rel_error(x.to(fp8), x)), {"library": "torch (Tensor.to float8_e4m3fn)"}
    if kernel == "permute":
        order = torch.randperm(x.shape[0], device=x.device)
        return (lambda: x.index_select(0, order)), (lambda: rel_error(x.index_select(0, order), x[order])), \
            {"library": "torch (index_select)"}
    if kernel == "router":
        return (lambda: torch.softmax(x, dim=-1)), \
            (lambda: rel_error(torch.softmax(x, dim=-1), torch.softmax(x.double(), dim=-1))), {"library": "torch (softmax)"}
    if kernel == "topk":
        return (lambda: torch.topk(x, 8, dim=-1)), \
            (lambda: rel_error(torch.topk(x, 8, dim=-1).values, torch.sort(x, dim=-1, descending=True).values[:, :8])), \
            {"library": "torch (topk)"}
    weight = torch.ones(x.shape[-1] // (2 if kernel == "swiglu" else 1), dtype=x.dtype, device=x.device)

    def rmsnorm(t):
        return (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(t.dtype) * weight

    def swiglu(t):
        gate, up = t.chunk(2, dim=-1)
        return F.silu(gate) * up
    eager = {"rmsnorm": rmsnorm, "swiglu": swiglu}[kernel]
    if x.device.type != "cuda":
        raise Unsupported(f"{kernel}: torch.compile'd kernels are timed on a GPU only")
    try:
        fused = torch.compile(eager, dynamic=False)
        fused(x)
    except Exception as exc:  # noqa: BLE001 - any compile failure: this kernel is not measured here
        raise _refuse(f"{kernel} (torch.compile)", exc) from None
    return (lambda: fused(x)), (lambda: rel_error(fused(x), eager(x.float()).to(x.dtype))), \
        {"library": f"torch.compile (inductor / Triton) {kernel}"}


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def prepare_attention(q, k, v, do, causal: bool, direction: str, backend: str):
    """SDPA pinned to ``backend``; GQA through enable_gqa, or K/V repeated where the backend
    refuses it (same FLOPs; the row's note says so)."""
    from torch.nn.attention import sdpa_kernel

    if backend not in ATTENTION_BACKENDS:
        raise Unsupported(f"attention backend {backend!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
    group = q.shape[1] // k.shape[1]
    variants = [("", k, v, dict(enable_gqa=group > 1))]
    if group > 1:
        variants.append(("K/V repeated to the query heads", k.repeat_interleave(group, 1),
                         v.repeat_interleave(group, 1), {}))
    errors = []
    for note, kk, vv, kw in variants:
        leaves = [t.detach().clone().requires_grad_() for t in (q, kk, vv)]
        try:
            with sdpa_kernel(_sdpa_backend(backend)):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal, **kw)
                if direction == "bwd":
                    torch.autograd.grad(out, leaves, do, retain_graph=True)
        except (RuntimeError, TypeError, ValueError) as exc:
            errors.append(exc)
            continue
        break
    else:
        raise _refuse(f"attention {backend} {direction}", errors[-1])

    def forward():
        with sdpa_kernel(_sdpa_backend(backend)):
            return F.scaled_dot_product_attention(*leaves, is_causal=causal, **kw)
    run = forward if direction == "fwd" else (lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))

    def error():
        ref_leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        rq, rk, rv = ref_leaves  # fp32 reference, K/V repeated (no backend's GQA support needed)
        ref = F.scaled_dot_product_attention(rq, rk.repeat_interleave(group, 1), rv.repeat_interleave(group, 1),
                                             is_causal=causal)
        if direction == "fwd":
            return rel_error(forward(), ref)
        ref.backward(do.float())
        grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
        if note:  # dk, dv of repeated heads sum back to the kv heads
            grads = (grads[0], *(g.unflatten(1, (k.shape[1], group)).sum(2) for g in grads[1:]))
        return max(rel_error(g, leaf.grad) for g, leaf in zip(grads, ref_leaves))
    name = {"flash": "FlashAttention-2 (torch SDPA flash backend)", "cudnn": "cuDNN fused attention (torch SDPA cudnn backend)"}
    return run, error, {"library": name[backend], "note": "; ".join(filter(None, [backend, note]))}


def prepare_memory(kernel: str, a, b, c, scalar: float):
    if kernel == "copy":
        return (lambda: c.copy_(a)), (lambda: rel_error(c.copy_(a), a)), {"library": "torch (Tensor.copy_)"}
    return (lambda: torch.add(b, c, alpha=scalar, out=a)), \
        (lambda: rel_error(torch.add(b, c, alpha=scalar, out=a), b + scalar * c)), {"library": "torch (torch.add, alpha)"}
