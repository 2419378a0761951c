"""MoE width trade-off: for a fixed active (or total) parameter budget, sweep the number
of experts and top-k, derive the expert width that spends the budget, and set training
throughput (``api.estimate`` on a dp x ep plan) against inference decode latency per
token on the same hardware; the Pareto front says which widths serve both.

Decode model (one token per sequence per step, batch B over an EP group of ``ep`` GPUs,
attention data-parallel across them, experts sharded E/ep per GPU), per layer:
  attention projections and router: GEMMs with m = ceil(B/ep) (weight reads dominate);
  attention: flash-attention over the context, K/V cache reads of ceil(B/ep) sequences;
  experts: distinct experts the batch touches E_hit = E * (1 - (1 - k/E)^B) (each token
    picks k of E experts; expectation under uniform routing), the busiest GPU holds
    ceil(E_hit/ep) of them and reads their weights (grouped GEMM in ``costs``);
  dispatch + combine all-to-all of ceil(B/ep)*k*hidden bf16 per GPU (``api.collective``).
"""

import math
from dataclasses import dataclass, replace

from perfsim import api
from perfsim.cost.kernels import DTYPE_BYTES, attention_time, gemm_time
from perfsim.errors import ConfigError, InfeasiblePlan
from perfsim.system.hardware import ClusterSpec
from perfsim.model.spec import AttentionKind, ModelSpec
from perfsim.lowering.ops import Gemm
from perfsim.system.specio import check_int, check_number, check_type

WEIGHT_BYTES = DTYPE_BYTES["bf16"]
KV_BYTES = DTYPE_BYTES["bf16"]
DEFAULT_EXPERTS = (8, 16, 32, 64, 128)
DEFAULT_TOP_K = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class Serving:
    batch: int = 64  # concurrent sequences decoding together over the EP group
    context: int = 4096  # tokens already in each sequence's KV cache
    ep: int = 8  # serving expert-parallel degree (GPUs)

    def __post_init__(self):
        for key in ("batch", "context", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"serving.{key} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Training:
    seq: int = 4096
    gbs: int = 2048
    mbs: int = 1
    zero: int = 1

    def __post_init__(self):
        for key in ("seq", "gbs", "mbs"):
            check_int(f"training.{key}", getattr(self, key), 1, 1 << 24)
        check_int("training.zero", self.zero, 0, 3)


def expert_params_per_width(model: ModelSpec) -> int:
    """Parameters of one expert per unit of expert_ffn_hidden_size (3h gated, 2h plain)."""
    return model.hidden_size * (3 if model.gated_mlp else 2)


def count_params(model: ModelSpec, active: bool) -> int:
    """Counted as the base model's published figure counts them (embeddings or not)."""
    return model.params_as_published(active)


def derive(base: ModelSpec, num_experts: int, top_k: int, active_params: float = 0.0,
           total_params: float = 0.0, align: int = 64) -> ModelSpec | None:
    """``base`` with E experts, top-k routing and the expert width (a multiple of
    ``align``) that spends the active budget (or, without one, the total budget);
    None when the budget leaves less than ``align``."""
    if not base.is_moe:
        raise ConfigError(f"model: {base.name} is dense; the MoE width sweep needs an MoE base model")
    if not 1 <= top_k <= num_experts:
        return None
    probe = replace(base, num_experts=num_experts, top_k=top_k, expert_ffn_hidden_size=align)
    per_w = expert_params_per_width(base) * base.num_moe_layers
    if active_params:
        fixed = count_params(probe, True) - per_w * top_k * align
        width = (active_params - fixed) / (per_w * top_k)
    else:
        fixed = count_params(probe, False) - per_w * num_experts * align
        width = (total_params - fixed) / (per_w * num_experts)
    width = int(round(width / align)) * align
    if width < align:
        return None
    name = f"{base.name}-e{num_experts}k{top_k}w{width}"
    return replace(base, name=name, num_experts=num_experts, top_k=top_k, expert_ffn_hidden_size=width)


def _kv_bytes_per_token(model: ModelSpec) -> float:
    if model.attention is AttentionKind.MLA:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * KV_BYTES
    return 2 * model.num_kv_heads * model.head_dim * KV_BYTES


def experts_hit(num_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts a batch touches: E * (1 - (1 - k/E)^B), uniform routing."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def _attention_s(model: ModelSpec, b: int, context: int, gpu) -> float:
    projections = sum(gemm_time(Gemm(m=b, k=lin.in_features, n=lin.out_features), gpu, "bf16")
                      for lin in model.attention_linears())
    flops = 2.0 * b * context * (model.q_width + model.v_width)  # QK^T and AV over the whole context
    moved = b * context * _kv_bytes_per_token(model)
    return projections + attention_time(flops, moved, gpu, backward=False)


def _experts_s(model: ModelSpec, serving: Serving, ep: int, gpu) -> tuple[float, float]:
    """(time, experts on the busiest GPU) of one MoE layer's routed experts: one grouped
    launch per projection, each expert a GEMM on its few tokens priced by ``costs.gemm_time``
    (weight reads dominate; decode kernels use narrow tiles, so the 256-row padding of
    ``costs.grouped_gemm_time`` would overstate a 4-token expert 64x)."""
    hit = experts_hit(model.num_experts, model.top_k, serving.batch)
    local = min(model.num_experts // ep, max(1, math.ceil(hit / ep - 1e-9)))
    tokens = math.ceil(serving.batch * model.top_k / ep)
    groups = [tokens // local + (1 if i < tokens % local else 0) for i in range(local)]
    w, h = model.expert_ffn_hidden_size, model.hidden_size
    up = w * (2 if model.gated_mlp else 1)
    launch = gpu.kernel_launch_s
    total = 2 * launch
    for m in groups:
        total += gemm_time(Gemm(m=max(m, 1), n=up, k=h), gpu, "bf16") - launch
        total += gemm_time(Gemm(m=max(m, 1), n=h, k=w), gpu, "bf16") - launch
    return total, local


def decode_latency(model: ModelSpec, cluster: ClusterSpec, serving: Serving = Serving()) -> dict:
    """Seconds per decode step (one token for each of ``batch`` sequences) and its parts."""
    gpu = cluster.gpu
    ep = math.gcd(model.num_experts, serving.ep) if model.is_moe else 1
    b = math.ceil(serving.batch / ep)
    attention = _attention_s(model, b, serving.context, gpu)
    router = sum(gemm_time(Gemm(m=b, k=l.in_features, n=l.out_features), gpu, "bf16") for l in model.router_linears())
    experts, local = _experts_s(model, serving, ep, gpu)
    a2a = 0.0
    if ep > 1:
        size = b * model.top_k * model.hidden_size * WEIGHT_BYTES
        a2a = 2 * api.collective("all_to_all", size, ep, cluster)["time_us"] * 1e-6
    shared = 0.0
    if model.shared_ffn_hidden_size:
        s = model.shared_ffn_hidden_size
        shared = (gemm_time(Gemm(m=b, k=model.hidden_size, n=s * (2 if model.gated_mlp else 1)), gpu, "bf16")
                  + gemm_time(Gemm(m=b, k=s, n=model.hidden_size), gpu, "bf16"))
    dense = 0.0
    if model.num_dense_layers:
        f = model.ffn_hidden_size
        dense = (gemm_time(Gemm(m=b, k=model.hidden_size, n=f * (2 if model.gated_mlp else 1)), gpu, "bf16")
                 + gemm_time(Gemm(m=b, k=f, n=model.hidden_size), gpu, "bf16"))
    head = gemm_time(Gemm(m=b, k=model.hidden_size, n=model.vocab_size), gpu, "bf16")
    moe_layer = router + experts + a2a + shared
    parts = {"attention_s": model.num_layers * attention, "experts_s": model.num_moe_layers * experts,
             "all_to_all_s": model.num_moe_layers * a2a, "router_shared_s": model.num_moe_layers * (router + shared),
             "dense_mlp_s": model.num_dense_layers * dense, "lm_head_s": head}
    latency = model.num_layers * attention + model.num_moe_layers * moe_layer + model.num_dense_layers * dense + head
    memory = _serving_memory(model, serving, ep, b)
    hit = experts_hit(model.num_experts, model.top_k, serving.batch)
    return {"latency_s": latency, "tokens_per_s": serving.batch / latency, "ep": ep, "experts_hit": hit,
            "experts_per_gpu_read": local, "memory_bytes": memory, "fits": memory <= gpu.hbm_bytes, **parts}


def _serving_memory(model: ModelSpec, serving: Serving, ep: int, b: int) -> float:
    """bf16 weights (experts sharded E/ep, the rest replicated) + this GPU's KV cache."""
    expert = model.num_moe_layers * model.num_experts * model.expert_params()
    weights = (model.total_params() - expert) + expert / ep
    kv = b * serving.context * model.num_layers * _kv_bytes_per_token(model)
    return weights * WEIGHT_BYTES + kv


def training_throughput(model: ModelSpec, cluster: ClusterSpec, training: Training = Training()) -> dict:
    """``api.estimate`` of one step on all of ``cluster``'s GPUs: dp over every GPU, ZeRO,
    experts sharded over the node (ep = gcd(E, GPUs per node)); ``fits`` False on OOM."""
    ep = math.gcd(model.num_experts, cluster.gpus_per_node) if model.is_moe else 1
    knobs = dict(dp=cluster.num_gpus, ep=ep, zero=training.zero, mbs=training.mbs, gbs=training.gbs, seq=training.seq)
    try:
        r = api.estimate(model, cluster, **knobs)
    except InfeasiblePlan:
        return {"fits": False, "ep": ep, "step_time_s": None, "tokens_per_s_per_gpu": None, "mfu": None}
    return {"fits": True, "ep": ep, "step_time_s": r.step_time_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
            "mfu": r.mfu}


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Non-dominated flags for (maximize x, minimize y) points; None coordinates never qualify."""
    flags = []
    for i, (x, y) in enumerate(points):
        if x is None or y is None:
            flags.append(False)
            continue
        dominated = any(j != i and a is not None and b is not None and a >= x and b <= y and (a > x or b < y)
                        for j, (a, b) in enumerate(points))
        flags.append(not dominated)
    return flags


MAX_EXPERTS = 4096  # input bound: experts per layer one sweep may try
MAX_PARAMS = 1e15  # input bound: parameter budgets


def _counts(name: str, values, most: int) -> None:
    if not isinstance(values, tuple | list) or not values:
        raise ConfigError(f"{name}: expected a non-empty tuple of integers, got {values!r}")
    for v in values:
        check_int(name, v, 1, most)


def _check_sweep_args(base, cluster, active_params, total_params, experts, top_k, serving, training, align,
                      total_tolerance) -> None:
    check_type("base", base, ModelSpec, "a ModelSpec (perfsim.load_model)")
    check_type("cluster", cluster, ClusterSpec, "a ClusterSpec (perfsim.load_cluster)")
    check_number("active_params", active_params, 0.0, MAX_PARAMS)
    check_number("total_params", total_params, 0.0, MAX_PARAMS)
    _counts("experts", experts, MAX_EXPERTS)
    _counts("top_k", top_k, MAX_EXPERTS)
    check_type("serving", serving, Serving, "a moe_width.Serving")
    check_type("training", training, Training, "a moe_width.Training")
    check_int("align", align, 1, 1 << 16)
    check_number("total_tolerance", total_tolerance, 0.0, 1e3)


def sweep(base: ModelSpec, cluster: ClusterSpec, active_params: float = 0.0, total_params: float = 0.0,
          experts: tuple[int, ...] = DEFAULT_EXPERTS, top_k: tuple[int, ...] = DEFAULT_TOP_K,
          serving: Serving = Serving(), training: Training = Training(), align: int = 64,
          total_tolerance: float = 0.25) -> list[dict]:
    """One row per (experts, top-k) that the budget allows: training tokens/s/GPU vs decode
    latency, and ``pareto`` for the rows no other row beats on both. With both budgets,
    the width spends the active one and rows whose total is off by more than
    ``total_tolerance`` are dropped."""
    _check_sweep_args(base, cluster, active_params, total_params, experts, top_k, serving, training, align,
                      total_tolerance)
    if active_params <= 0 and total_params <= 0:
        raise ConfigError("moe-width: give --active-params or --total-params (> 0)")
    if active_params < 0 or total_params < 0:
        raise ConfigError(f"moe-width: parameter budgets must be >= 0, got {active_params!r}, {total_params!r}")
    rows = []
    for e in experts:
        for k in top_k:
            model = derive(base, e, k, active_params, total_params if not active_params else 0.0, align)
            if model is None:
                continue
            total = count_params(model, False)
            if active_params and total_params and abs(total / total_params - 1) > total_tolerance:
                continue
            rows.append(_row(model, cluster, serving, training))
    flags = pareto_front([(r["train_tokens_per_s_per_gpu"] if r["serve_fits"] else None, r["decode_latency_ms"])
                          for r in rows])
    return [{**r, "pareto": f} for r, f in zip(rows, flags)]


def _row(model: ModelSpec, cluster: ClusterSpec, serving: Serving, training: Training) -> dict:
    train = training_throughput(model, cluster, training)
    serve = decode_latency(model, cluster, serving)
    return {
        "model": model.name, "experts": model.num_experts, "top_k": model.top_k,
        "expert_ffn_hidden_size": model.expert_ffn_hidden_size,
        "active_params": count_params(model, True), "total_params": count_params(model, False),
        "train_fits": train["fits"], "train_ep": train["ep"], "train_step_time_s": train["step_time_s"],
        "train_tokens_per_s_per_gpu": train["tokens_per_s_per_gpu"], "train_mfu": train["mfu"],
        "decode_latency_ms": serve["latency_s"] * 1e3, "decode_tokens_per_s": serve["tokens_per_s"],
        "serve_ep": serve["ep"], "experts_hit": serve["experts_hit"], "experts_per_gpu_read": serve["experts_per_gpu_read"],
        "serve_memory_bytes": serve["memory_bytes"], "serve_fits": serve["fits"],
    }
