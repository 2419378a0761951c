"""Sweep cases: one kernel call with its inputs, a torch reference, and its CSV row.

A case is built lazily on a device (``prepare``) and gives back ``run`` (the timed call)
and ``error`` (max |kernel - torch| / max |torch|, checked against ``TOLERANCE``).
Row keys are the columns of ``perfsim.calibration.readers.KERNEL_CSV_COLUMNS``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from validation import kernels as K
from validation import library
from validation.library import rel_error

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
# Relative error bound (max abs error / max abs reference) per input dtype: output
# rounding (bf16 2^-8, fp16 2^-11) plus fp32-accumulation order; fp32 on a GPU runs
# tf32 tensor cores (10-bit mantissa). fp8 compares against the same fp8 inputs upcast.
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 5e-3, "fp8": 1e-2}


@dataclass(frozen=True, kw_only=True)
class Case:
    kind: str
    label: str
    row: dict
    prepare: Callable[[str], tuple] = field(repr=False)  # device -> (run, error) or (run, error, extra CSV cells)
    tolerance: float = 1e-2
    backend: str = "triton"  # "triton": the project's kernels; "torch": the libraries (validation.library)


def _randn(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, device=device).to(dtype)


def gemm_case(m: int, n: int, k: int, dtype: str, note: str = "", backend: str = "triton") -> Case:
    def prepare(device):
        gen = torch.Generator(device=device).manual_seed(0)
        a, b = _randn((m, k), DTYPES[dtype], device, gen), _randn((k, n), DTYPES[dtype], device, gen)
        if backend == "torch":
            return library.prepare_gemm(a, b, dtype)
        out = torch.empty((m, n), dtype=torch.bfloat16 if dtype == "fp8" else a.dtype, device=device)
        return (lambda: K.gemm(a, b, out=out)), (lambda: rel_error(K.gemm(a, b), a.float() @ b.float()))
    row = dict(kind="gemm", dtype=dtype, m=m, n=n, k=k, batch=1, note=note)
    return Case(kind="gemm", label=f"gemm {dtype} {m}x{n}x{k}", row=row, prepare=prepare, tolerance=TOLERANCE[dtype],
                backend=backend)


def grouped_case(counts: list[int], n: int, k: int, dtype: str, note: str = "", backend: str = "triton",
                 direction: str = "fwd") -> Case:
    """Grouped GEMM over len(counts) experts; the CSV ``m`` is the mean tokens per expert.
    ``direction`` bwd (the torch backend only): dgrad + wgrad in one timed call."""
    if direction == "bwd" and backend != "torch":
        raise ValueError("grouped GEMM backward cases run on the torch backend only")

    def prepare(device):
        gen = torch.Generator(device=device).manual_seed(0)
        c = torch.tensor(counts, device=device)
        x = _randn((sum(counts), k), DTYPES[dtype], device, gen)
        w = _randn((len(counts), k, n), DTYPES[dtype], device, gen)
        if backend == "torch" and direction == "bwd":
            return library.prepare_grouped_backward(x, w, _randn((sum(counts), n), DTYPES[dtype], device, gen), counts)
        if backend == "torch":
            return library.prepare_grouped(x, w, counts)

        def error():
            ref = torch.cat([xe.float() @ w[e].float() for e, xe in enumerate(torch.split(x, counts))])
            return rel_error(K.grouped_gemm(x, w, c), ref)
        return (lambda: K.grouped_gemm(x, w, c)), error
    total, groups = sum(counts), len(counts)
    even = len(set(counts)) == 1
    row = dict(kind="grouped_gemm", dtype=dtype, m=max(1, round(total / groups)), n=n, k=k, batch=groups,
               note=note or ("balanced" if even else "uneven"), meta_counts=" ".join(map(str, counts)))
    if direction == "bwd":
        row["direction"] = "bwd"
    return Case(kind="grouped_gemm", label=f"grouped {dtype} {direction} E={groups} T={total} {n}x{k} {row['note']}",
                row=row, prepare=prepare, tolerance=TOLERANCE[dtype], backend=backend)


def attention_case(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, direction: str,
                   dtype: str = "bf16", causal: bool = True, backend: str = "triton", sdpa: str = "flash") -> Case:
    """``sdpa``: the torch backend's SDPA kernel (validation.library.ATTENTION_BACKENDS)."""
    def prepare(device):
        gen = torch.Generator(device=device).manual_seed(0)
        dt = DTYPES[dtype]
        q = _randn((batch, heads, seq, head_dim), dt, device, gen)
        kk, v = (_randn((batch, kv_heads, seq, head_dim), dt, device, gen) for _ in range(2))
        do = _randn((batch, heads, seq, head_dim), dt, device, gen)
        if backend == "torch":
            return library.prepare_attention(q, kk, v, do, causal, direction, sdpa)
        o, lse = K.attention_forward(q, kk, v, causal)
        run = {"fwd": lambda: K.attention_forward(q, kk, v, causal),
               "bwd": lambda: K.attention_backward(q, kk, v, o, lse, do, causal)}[direction]

        def error():
            leaves = [t.float().requires_grad_() for t in (q, kk, v)]
            ref = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
            if direction == "fwd":
                return rel_error(K.attention_forward(q, kk, v, causal)[0], ref)
            ref.backward(do.float())
            grads = K.attention_backward(q, kk, v, o, lse, do, causal)
            return max(rel_error(g, leaf.grad) for g, leaf in zip(grads, leaves))
        return run, error
    row = dict(kind="attention", dtype=dtype, batch=batch, seq=seq, heads=heads, kv_heads=kv_heads,
               head_dim=head_dim, causal=int(causal), direction=direction)
    label = f"attention {direction} {dtype} b{batch} h{heads}/{kv_heads} s{seq} d{head_dim}{' causal' if causal else ''}"
    if backend == "torch":
        label += f" [{sdpa}]"
    return Case(kind="attention", label=label, row=row, prepare=prepare, tolerance=2 * TOLERANCE[dtype], backend=backend)


MEMBOUND_BYTES = {"fp8_cast": 3, "permute": 4, "router": 8, "topk": 4, "rmsnorm": 4, "swiglu": 3}  # per input element


def membound_case(kernel: str, rows: int, cols: int) -> Case:
    """One memory-bound library kernel of a step (validation.library.MEMBOUND; torch backend);
    the row's bytes count what the kernel must move (MEMBOUND_BYTES per input element)."""
    def prepare(device):
        gen = torch.Generator(device=device).manual_seed(0)
        logits = kernel in ("router", "topk")
        x = torch.randn((rows, cols), generator=gen, device=device).to(torch.float32 if logits else torch.bfloat16)
        return library.prepare_membound(kernel, x)
    row = dict(kind="memory", dtype="", bytes=MEMBOUND_BYTES[kernel] * rows * cols, kernel=kernel, note=library.MEMBOUND[kernel])
    return Case(kind="memory", label=f"membound {kernel} {rows}x{cols}", row=row, prepare=prepare,
                tolerance=0.07 if kernel == "fp8_cast" else 2e-2, backend="torch")


MEMORY_ARRAYS = {"copy": 2, "triad": 3}  # arrays touched (BabelStream counting: bytes = arrays x n x itemsize)


def memory_case(kernel: str, num_bytes_per_array: int, backend: str = "triton") -> Case:
    n = num_bytes_per_array // 4

    def prepare(device):
        gen = torch.Generator(device=device).manual_seed(0)
        a, b, c = (torch.randn(n, generator=gen, device=device) for _ in range(3))
        if backend == "torch":
            return library.prepare_memory(kernel, a, b, c, 0.4)
        if kernel == "copy":
            return (lambda: K.copy(a, c)), (lambda: rel_error(K.copy(a, c), a))
        return (lambda: K.triad(a, b, c, 0.4)), (lambda: rel_error(K.triad(a, b, c, 0.4), b + 0.4 * c))
    row = dict(kind="memory", dtype="fp32", bytes=MEMORY_ARRAYS[kernel] * n * 4, kernel=kernel)
    return Case(kind="memory", label=f"memory {kernel} {n * 4 / 2**20:.1f} MiB/array", row=row, prepare=prepare, tolerance=1e-6,
                backend=backend)
