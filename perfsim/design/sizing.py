"""MI300X-aware sizing: predicted efficiency of one layer's GEMMs and attention as the
model's dimensions vary, the nearest better-quantized sizes, and what a change buys.

Every number comes from the calibrated cost model in ``costs`` (the same one the
simulator prices ops with): GEMM efficiency = size-falloff table x wave quantization of
256x256 output tiles over the GPU's compute units (304 on MI300X), grouped expert GEMMs
pay for tile rows padded per expert, attention uses the flash-attention table, and a
kernel is memory-bound when ``hbm_time(bytes)`` exceeds its compute time. What a change
buys for the whole model is ``api.estimate`` on the modified ModelSpec.
"""

import math
from dataclasses import dataclass, replace

from perfsim import api
from perfsim.cost.kernels import (DTYPE_BYTES, attention_time, gemm_bytes, gemm_time, grouped_gemm_time, hbm_time,
                                  k_loop_time, wave_utilization)
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, GpuSpec
from perfsim.model.spec import ModelSpec
from perfsim.lowering.ops import Gemm
from perfsim.system.specio import check_int, check_number, check_type

ALIASES = {"hidden": "hidden_size", "head_dim": "head_dim", "heads": "num_heads", "vocab": "vocab_size",
           "experts": "num_experts", "expert_ffn": "expert_ffn_hidden_size", "ffn": None}
KNOB_FIELDS = ("hidden_size", "ffn_hidden_size", "expert_ffn_hidden_size", "head_dim", "num_heads",
               "vocab_size", "num_experts")
ATTN_QKV = {"qkv", "q", "q_down", "q_up", "kv_down", "kv_up"}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one rank runs per microbatch: ``mbs`` sequences of ``seq`` tokens, tp/ep shards."""

    seq: int = 4096
    mbs: int = 1
    tp: int = 1
    ep: int = 1
    dtype: str = "bf16"

    def __post_init__(self):
        for key in ("seq", "mbs", "tp", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"sizing.{key} must be a positive integer, got {value!r}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"sizing.dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def tokens(self) -> int:
        return self.mbs * self.seq


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """One forward kernel of a layer with its predicted speed on one GPU."""

    name: str
    knob: str  # the ModelSpec field that sizes it ("" when none is worth tuning)
    m: int
    n: int
    k: int
    groups: int
    flops: float
    time_s: float
    quantization: float  # wave (or per-expert tile-row) utilization in (0, 1]
    bound: str  # "compute", "memory" or "k-loop" (the tiles' serial K loop)
    peak_flops: float

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12

    @property
    def efficiency(self) -> float:
        return self.flops / self.time_s / self.peak_flops

    def as_dict(self) -> dict:
        return {"name": self.name, "knob": self.knob, "m": self.m, "n": self.n, "k": self.k, "groups": self.groups,
                "flops": self.flops, "time_s": self.time_s, "tflops": self.tflops, "efficiency": self.efficiency,
                "quantization": self.quantization, "bound": self.bound}


def resolve_knob(model: ModelSpec, knob: str) -> str:
    """ModelSpec field for a knob alias ('ffn' is the expert width of an all-MoE model)."""
    if knob in KNOB_FIELDS:
        return knob
    if knob not in ALIASES:
        raise ConfigError(f"knob: {knob!r} is not one of {', '.join(sorted(set(ALIASES) | set(KNOB_FIELDS)))}")
    if knob == "ffn":
        return "expert_ffn_hidden_size" if model.is_moe and not model.ffn_hidden_size else "ffn_hidden_size"
    return ALIASES[knob]


def _bound(time_s: float, moved: float, gpu: GpuSpec, k_loop_s: float = 0.0) -> str:
    if k_loop_s and k_loop_s + gpu.kernel_launch_s >= time_s * (1 - 1e-9):
        return "k-loop"  # the output tiles' serial K loop (kernels.k_loop_time)
    return "memory" if hbm_time(moved, gpu) + gpu.kernel_launch_s >= time_s * (1 - 1e-9) else "compute"


def _gemm(name: str, knob: str, g: Gemm, gpu: GpuSpec, dtype: str) -> Kernel:
    t = gemm_time(g, gpu, dtype)
    return Kernel(name=name, knob=knob, m=g.m, n=g.n, k=g.k, groups=1, flops=g.flops, time_s=t,
                  quantization=wave_utilization(g, gpu),
                  bound=_bound(t, gemm_bytes(g, dtype), gpu, k_loop_time(g, gpu, dtype)),
                  peak_flops=gpu.peak_flops(dtype))


def _grouped(name: str, knob: str, groups: tuple[int, ...], n: int, k: int, gpu: GpuSpec, dtype: str) -> Kernel:
    """costs.grouped_gemm_time: each expert's rows pad to whole tiles."""
    t = grouped_gemm_time(groups, n, k, gpu, dtype)
    tokens, tm = sum(groups), gpu.gemm.tile_m
    padded = sum(math.ceil(g / tm) * tm for g in groups) or 1
    moved = (tokens * (k + n) + len(groups) * k * n) * DTYPE_BYTES[dtype]
    return Kernel(name=name, knob=knob, m=max(groups), n=n, k=k, groups=len(groups), flops=2.0 * tokens * n * k,
                  time_s=t, quantization=tokens / padded, bound=_bound(t, moved, gpu), peak_flops=gpu.peak_flops(dtype))


def _attention(model: ModelSpec, w: Workload, gpu: GpuSpec) -> Kernel:
    """Flash-attention forward, causal half: 2 * T * s * (q_width + v_width) / 2 FLOPs (layers.py)."""
    width = (model.q_width + model.v_width) / w.tp
    flops = w.tokens * w.seq * width
    moved = w.tokens * (model.q_width + 2 * model.v_width) / w.tp * DTYPE_BYTES[w.dtype]
    t = attention_time(flops, moved, gpu, backward=False)
    return Kernel(name="attn_core", knob="", m=w.seq, n=w.seq, k=model.head_dim, groups=model.num_heads // w.tp,
                  flops=flops, time_s=t, quantization=1.0, bound=_bound(t, moved, gpu), peak_flops=gpu.peak_flops("bf16"))


def _attention_kernels(model: ModelSpec, w: Workload, gpu: GpuSpec) -> list[Kernel]:
    out = []
    for lin in model.attention_linears():
        if lin.name == "attn_out":
            g = Gemm(m=w.tokens, k=max(lin.in_features // w.tp, 1), n=lin.out_features)
            out.append(_gemm(lin.name, "hidden_size", g, gpu, w.dtype))
        else:
            g = Gemm(m=w.tokens, k=lin.in_features, n=max(lin.out_features // w.tp, 1))
            out.append(_gemm(lin.name, "head_dim" if lin.name in ATTN_QKV else "", g, gpu, w.dtype))
    return out[:-1] + [_attention(model, w, gpu)] + out[-1:]


def _mlp_kernels(model: ModelSpec, w: Workload, gpu: GpuSpec) -> list[Kernel]:
    width = max(model.ffn_hidden_size // w.tp, 1)
    up = width * (2 if model.gated_mlp else 1)
    return [_gemm("mlp_up", "ffn_hidden_size", Gemm(m=w.tokens, k=model.hidden_size, n=up), gpu, w.dtype),
            _gemm("mlp_down", "ffn_hidden_size", Gemm(m=w.tokens, k=width, n=model.hidden_size), gpu, w.dtype)]


def _moe_kernels(model: ModelSpec, w: Workload, gpu: GpuSpec) -> list[Kernel]:
    """Balanced routing: each rank runs E/ep experts on tokens*top_k routed tokens."""
    h, width = model.hidden_size, model.expert_ffn_hidden_size
    out = [_gemm(lin.name, "", Gemm(m=w.tokens, k=lin.in_features, n=lin.out_features), gpu, w.dtype)
           for lin in model.router_linears()]
    local = max(model.num_experts // w.ep, 1)
    per_expert = max(round(w.tokens * model.top_k / local), 1)
    groups = (per_expert,) * local
    up = width * (2 if model.gated_mlp else 1)
    out.append(_grouped("expert_up", "expert_ffn_hidden_size", groups, up, h, gpu, w.dtype))
    out.append(_grouped("expert_down", "expert_ffn_hidden_size", groups, h, width, gpu, w.dtype))
    if model.shared_ffn_hidden_size:
        s = model.shared_ffn_hidden_size
        out.append(_gemm("shared_up", "", Gemm(m=w.tokens, k=h, n=s * (2 if model.gated_mlp else 1)), gpu, w.dtype))
        out.append(_gemm("shared_down", "", Gemm(m=w.tokens, k=s, n=h), gpu, w.dtype))
    return out


def layer_kernels(model: ModelSpec, gpu: GpuSpec, workload: Workload = Workload(), head: bool = True) -> list[Kernel]:
    """Forward kernels of one transformer block (MoE block when the model has experts),
    plus the LM head when ``head``."""
    out = _attention_kernels(model, workload, gpu)
    out += _moe_kernels(model, workload, gpu) if model.is_moe else _mlp_kernels(model, workload, gpu)
    if model.is_moe and model.num_dense_layers and model.ffn_hidden_size:
        out += [replace(k, name=f"dense_{k.name}") for k in _mlp_kernels(model, workload, gpu)]
    if head:
        g = Gemm(m=workload.tokens, k=model.hidden_size, n=max(model.vocab_size // workload.tp, 1))
        out.append(_gemm("lm_head", "vocab_size", g, gpu, workload.dtype))
    return out


def aggregate_tflops(kernels: list[Kernel]) -> float:
    """Achieved TFLOPS over a set of kernels run back to back."""
    return sum(k.flops for k in kernels) / sum(k.time_s for k in kernels) / 1e12


def with_knob(model: ModelSpec, field: str, value: int) -> ModelSpec:
    """``model`` with one dimension changed (dataclasses.replace; ConfigError if invalid)."""
    changes = {field: value}
    if field == "expert_ffn_hidden_size" and not model.is_moe:
        raise ConfigError(f"knob: {model.name} has no experts")
    return replace(model, name=f"{model.name}[{field}={value}]", **changes)


def candidates(model: ModelSpec, field: str, align: int = 64, window: float = 0.125) -> list[int]:
    """Values of ``field`` within +-window of the current one, multiples of ``align``
    (of the KV-head count for heads, any integer >= 2 for experts), plus the current."""
    value = getattr(model, field)
    step = {"num_heads": model.num_kv_heads, "num_experts": 1}.get(field, align)
    lo, hi = max(step, math.floor(value * (1 - window))), math.ceil(value * (1 + window))
    found = {v for v in range(-(-lo // step) * step, hi + 1, step) if v >= 1}
    return sorted(found | {value})


def _quantization(kernels: list[Kernel]) -> float:
    flops = sum(k.flops for k in kernels)
    return sum(k.flops * k.quantization for k in kernels) / flops if flops else 1.0


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    field: str
    current: int
    suggested: int
    quantization_before: float
    quantization_after: float
    tflops_before: float
    tflops_after: float

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.tflops_after / self.tflops_before - 1.0)


def suggest(model: ModelSpec, field: str, gpu: GpuSpec, workload: Workload = Workload(), align: int = 64,
            window: float = 0.125, min_gain_pct: float = 1.0) -> Suggestion | None:
    """The nearest size of ``field`` whose kernels quantize best over the CUs (ties:
    nearest the current value); None when that buys less than ``min_gain_pct`` TFLOPS
    on the kernels ``field`` sizes."""
    def score(m: ModelSpec) -> tuple[float, float]:
        ks = [k for k in layer_kernels(m, gpu, workload) if k.knob == field]
        return (_quantization(ks), aggregate_tflops(ks)) if ks else (1.0, 0.0)

    base_q, base_t = score(model)
    if base_t == 0.0:
        return None
    best, best_key = getattr(model, field), (round(base_q, 6), 0)
    for value in candidates(model, field, align, window):
        try:
            q, _ = score(with_knob(model, field, value))
        except ConfigError:
            continue
        key = (round(q, 6), -abs(value - getattr(model, field)))
        if key > best_key:
            best, best_key = value, key
    if best == getattr(model, field):
        return None
    q, t = score(with_knob(model, field, best))
    out = Suggestion(field=field, current=getattr(model, field), suggested=best, quantization_before=base_q,
                     quantization_after=q, tflops_before=base_t, tflops_after=t)
    return out if out.gain_pct >= min_gain_pct else None


def _plan_knobs(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> dict:
    dp = cluster.num_gpus // workload.tp
    ep = workload.ep if model.is_moe else 1
    return dict(tp=workload.tp, dp=dp, ep=ep, mbs=workload.mbs, seq=workload.seq, gbs=dp * workload.mbs,
                dtype=workload.dtype, zero=1)


def step_impact(model: ModelSpec, changed: ModelSpec, cluster: ClusterSpec, workload: Workload = Workload()) -> dict:
    """``api.estimate`` of both models on ``cluster`` (one step, plan from the workload):
    step-time and model-TFLOPS/GPU change in percent (the model FLOPs change too)."""
    knobs = _plan_knobs(model, cluster, workload)
    before = api.estimate(model, cluster, check_memory=False, **knobs)
    after = api.estimate(changed, cluster, check_memory=False, **knobs)
    return {"step_time_s": before.step_time_s, "step_time_after_s": after.step_time_s,
            "step_time_change_pct": 100.0 * (after.step_time_s / before.step_time_s - 1.0),
            "tflops_per_gpu": before.tflops_per_gpu, "tflops_per_gpu_after": after.tflops_per_gpu,
            "tflops_per_gpu_change_pct": 100.0 * (after.tflops_per_gpu / before.tflops_per_gpu - 1.0)}


MAX_ALIGN = 1 << 16  # input bound: multiples a dimension is rounded to
MAX_GRID = 256  # input bound: sizes per axis of an efficiency grid
MAX_CANDIDATES = 8192  # input bound: candidate sizes one table prices (a few seconds)


def _check_table_args(model, cluster, workload, align, window, min_gain_pct) -> None:
    """Argument checks: the search window scales the work (a 1e30 window never ends)."""
    check_type("model", model, ModelSpec, "a ModelSpec (perfsim.load_model)")
    check_type("cluster", cluster, ClusterSpec, "a ClusterSpec (perfsim.load_cluster)")
    check_type("workload", workload, Workload, "a sizing.Workload")
    check_int("align", align, 1, MAX_ALIGN)
    check_number("window", window, 0.0, 1.0, lo_open=True)
    check_number("min_gain_pct", min_gain_pct, 0.0, 1e4)
    fields = {k.knob for k in layer_kernels(model, cluster.gpu, workload) if k.knob}
    count = sum(len(candidates(model, f, align, window)) for f in fields)
    if count > MAX_CANDIDATES:
        raise ConfigError(f"align: {count:,} candidate sizes at align {align} within +-{window:g} (limit "
                          f"{MAX_CANDIDATES:,}, ~3,000 priced a second); raise --align or narrow --window")


def sizing_table(model: ModelSpec, cluster: ClusterSpec, workload: Workload = Workload(), align: int = 64,
                 window: float = 0.125, min_gain_pct: float = 1.0) -> list[dict]:
    """One row per kernel of a layer (+ LM head): shape, predicted TFLOPS and efficiency,
    and where a nearby size quantizes better, the suggestion and what it buys."""
    _check_table_args(model, cluster, workload, align, window, min_gain_pct)
    gpu = cluster.gpu
    tips = {f: suggest(model, f, gpu, workload, align, window, min_gain_pct)
            for f in {k.knob for k in layer_kernels(model, gpu, workload)} if f}
    impacts = {f: step_impact(model, with_knob(model, f, s.suggested), cluster, workload)
               for f, s in tips.items() if s is not None}
    rows = []
    for k in layer_kernels(model, gpu, workload):
        row = k.as_dict()
        tip = tips.get(k.knob)
        row["suggestion"] = f"{tip.field}={tip.suggested}" if tip else ""
        row["gain_pct"] = tip.gain_pct if tip else 0.0
        row.update({key: impacts[k.knob][key] for key in ("step_time_change_pct", "tflops_per_gpu_change_pct")}
                   if tip else {"step_time_change_pct": 0.0, "tflops_per_gpu_change_pct": 0.0})
        rows.append(row)
    return rows


def efficiency_grid(model: ModelSpec, gpu: GpuSpec, x_knob: str, x_values: list[int], y_knob: str,
                    y_values: list[int], workload: Workload = Workload()) -> dict:
    """Achieved TFLOPS and efficiency of one layer's kernels (the LM head only when a
    vocab axis is swept) over a grid of two dimensions; None where the model is invalid."""
    for name, values in (("x_values", x_values), ("y_values", y_values)):
        if not isinstance(values, list | tuple) or not 1 <= len(values) <= MAX_GRID:
            raise ConfigError(f"grid: {name} must be a list of 1 to {MAX_GRID} sizes, got {values!r}")
        for v in values:
            check_int(f"grid.{name}", v, 1, 1 << 24)
    xf, yf = resolve_knob(model, x_knob), resolve_knob(model, y_knob)
    if xf == yf:
        raise ConfigError(f"grid: the two axes must differ, got {x_knob!r} twice")
    head = "vocab_size" in (xf, yf)
    tflops, eff = [], []
    for y in y_values:
        row_t, row_e = [], []
        for x in x_values:
            try:
                ks = layer_kernels(with_knob(with_knob(model, xf, int(x)), yf, int(y)), gpu, workload, head=head)
            except ConfigError:
                row_t.append(None)
                row_e.append(None)
                continue
            t = aggregate_tflops(ks)
            row_t.append(t)
            row_e.append(t * 1e12 / gpu.peak_flops(workload.dtype))
        tflops.append(row_t)
        eff.append(row_e)
    return {"x_knob": xf, "y_knob": yf, "x": list(x_values), "y": list(y_values), "tflops": tflops,
            "efficiency": eff, "current": [getattr(model, xf), getattr(model, yf)]}
