"""Steps: the unit a layer template is made of (one kernel, collective or host wait), and
the helpers that build them. ``layers`` re-exports them."""

from dataclasses import dataclass, field

from perfsim.lowering.ops import CollectiveCall, Coll, Gemm, OpKind, Stream

ACT_BYTES = 2  # bf16 activations
FP8_BYTES = 1
# FP8 dispatch payload per hidden value: the FP8 value plus one FP32 scale per 128 values
# (DeepSeek-V3's 1x128 activation tiles, arXiv 2412.19437 sec. 3.3; DeepEP's FP8 dispatch)
FP8_DISPATCH_BYTES = FP8_BYTES + 4 / 128
LOGIT_BYTES = 4  # fp32 logits for the loss

_COLL_STREAM = {"tp": Stream.TP_COMM, "etp": Stream.TP_COMM, "ep": Stream.EP_COMM, "cp": Stream.CP_COMM}


@dataclass(frozen=True, kw_only=True)
class Step:
    name: str
    kind: OpKind
    stream: Stream
    category: str
    flops: float = 0.0
    bytes: float = 0.0
    gemm: Gemm | None = None
    grouped: tuple[int, ...] = ()
    collective: CollectiveCall | None = None
    meta: tuple = field(default_factory=tuple)


def gemm_step(name: str, m: int, k: int, n: int, category: str) -> Step:
    g = Gemm(m=max(m, 1), n=max(n, 1), k=max(k, 1))
    return Step(name=name, kind=OpKind.GEMM, stream=Stream.COMPUTE, category=category, flops=g.flops, gemm=g)


def fp8_cast_bytes(elements: float) -> tuple[float, float]:
    """Bytes of the two HBM-bound kernels of a current-scaling FP8 cast of a BF16 tensor
    (Transformer Engine / Primus-Turbo): amax reads it; the fused cast-transpose reads it
    again and writes the FP8 values and their transpose (for the wgrad GEMM)."""
    return elements * ACT_BYTES, elements * (ACT_BYTES + 2 * FP8_BYTES)


def fp8_rowwise_cast_bytes(elements: float) -> float:
    """Bytes of a dynamic per-token (row-wise) FP8 cast of a BF16 activation: one kernel
    that takes each row's amax and casts the row in the same pass (vLLM's
    ``dynamic_per_token_scaled_fp8_quant``), reading BF16 once and writing FP8 once
    (the per-row scales are negligible); no transpose (no wgrad reads it)."""
    return elements * (ACT_BYTES + FP8_BYTES)


def elementwise_step(name: str, num_bytes: float, category: str) -> Step:
    return Step(name=name, kind=OpKind.ELEMENTWISE, stream=Stream.COMPUTE, category=category, bytes=num_bytes)


def host_step(name: str, seconds: float, category: str) -> Step:
    """Host time a software stack adds on the compute stream (a sync, framework code)."""
    return Step(name=name, kind=OpKind.ELEMENTWISE, stream=Stream.COMPUTE, category=category, meta=(("host_s", seconds),))


def coll_step(name: str, coll: Coll, group: str, size: float, category: str, token_bytes: float = 0.0,
              blocked: bool = False) -> Step:
    """A collective; ``token_bytes``: one token copy of an MoE all-to-all (0: BF16 hidden);
    ``blocked``: the all-to-all of a blocked routing (``CollectiveCall.blocked``). A step
    whose backward is not its call mirrored carries ``meta['backward_call']``."""
    call = CollectiveCall(coll=coll, group=group, size_bytes=size, token_bytes=token_bytes, blocked=blocked)
    return Step(name=name, kind=OpKind.COLLECTIVE, stream=_COLL_STREAM[group], category=category, collective=call)
