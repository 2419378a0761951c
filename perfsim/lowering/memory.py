"""Per-rank memory: weights, gradients, optimizer states, activations in flight.

Activations per layer and microbatch follow Korthikanti'22 (sec. 4) with flash
attention (no s^2 score matrix kept), counted tensor by tensor from the layer shapes;
tensor/sequence parallelism divide them by tp, context parallelism by cp; the routed
experts' tensors hold the tokens the lowering computes on (``routed_share``: the padded
capacity, or the busiest EP rank's tokens under skewed routing). ZeRO working buffers:
``zero_buffers``.
"""

import dataclasses
import functools
from dataclasses import dataclass

from perfsim.lowering.layers import MLA_UP_LINEARS, LayerBuilder, op_linears
from perfsim.lowering.steps import FP8_BYTES
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, V_SHAPES, ParallelPlan, Recompute, Schedule
from perfsim.plan.routing import UNIFORM, RoutingSpec, expert_capacity, held_imbalance
from perfsim.plan.schedules import head_stage, interleaved_peak, v_chunks_held
from perfsim.plan.sharding import (
    MAIN_GRAD_BYTES,
    chunk_layers,
    embedding_rank_params,
    ends_grad_bytes,
    OPTIMIZER_STATE_BYTES,
    WEIGHT_BYTES,
    is_moe_layer,
    is_mtp_layer,
    layer_grad_bytes,
    layer_param_bytes,
    layer_rank_params,
    shard_degrees,
    recomputes,
    stage_layer_ids,
    stage_rank_params,
)

ACT_BYTES = 2
LOGIT_BYTES = 4
# an MTP layer keeps, beyond a transformer layer, per token in hidden widths (sequence shards
# under SP): the two norms' inputs (the hidden state, the embedding), their joined output
# (2h, the projection's input) and its final norm's input
MTP_KEPT_PER_TOKEN = 5
# Caching-allocator fragmentation of the transient (activation + logits) allocations:
# blocks freed between microbatches cannot always be reused for differently sized
# tensors. GMLake (Guo et al., ASPLOS'24) measures fragmentation of several to ~30 % of
# GPU memory in LLM training; we budget 10 % of the transient bytes (an assumption).
FRAGMENTATION = 0.10
# ZeRO-3 / FSDP working buffers (PyTorch FSDP2 docs and tutorial, docs.pytorch.org: "before
# forward and backward, sharded parameters are all-gathered into unsharded parameters ...
# inside backward, local unsharded gradients are reduce-scattered into sharded gradients";
# the next block's all-gather is issued before the current block computes): a rank holds the
# unsharded weights of the block computing, plus the block prefetched
# (``overlap_param_gather``), and in backward the unsharded gradients of the block computing,
# plus the block whose reduce-scatter is still in flight (``overlap_grad_reduce``). A block
# is a layer, gathered and reduced in the sizes the graph moves; the embedding, LM head and
# final norm stay gathered through the pass (FSDP2's root group; the lowering does not
# gather them: a gap).


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    fragmentation_bytes: float = 0.0
    zero_buffers_bytes: float = 0.0  # ZeRO-3 unsharded weights / gradients in flight, ZeRO-2 gradient buckets
    # the gradients' bytes that reuse memory the activations, logits and fragmentation freed
    # (``gradients_apart``: they are never held at once); subtracted from the parts' sum
    reused_bytes: float = 0.0

    @property
    def states_bytes(self) -> float:
        """What the plan's sharding fixes: weights, gradients, optimizer, ZeRO buffers."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.zero_buffers_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.transient_bytes - self.reused_bytes

    @property
    def transient_bytes(self) -> float:
        """What the step's passes hold for a while: activations, logits, fragmentation."""
        return self.activations_bytes + self.logits_bytes + self.fragmentation_bytes

    def as_dict(self) -> dict:
        return {
            "stage": self.stage, "weights_bytes": self.weights_bytes, "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
            "logits_bytes": self.logits_bytes, "fragmentation_bytes": self.fragmentation_bytes,
            "zero_buffers_bytes": self.zero_buffers_bytes, "reused_bytes": self.reused_bytes,
            "total_bytes": self.total_bytes,
        }


@functools.lru_cache(maxsize=1024)  # one answer per (model, plan, routing); every stage of a plan asks
def routed_share(model: ModelSpec, plan: ParallelPlan, routing: RoutingSpec = UNIFORM) -> float:
    """Routed token copies the busiest EP rank's experts hold per microbatch, over the
    balanced share (top_k copies per token): padded to capacity (the stack's dispatch
    path, or the routing's), its experts' full capacity whatever the routing; dropless,
    the routing's max / mean over EP ranks of the tokens a rank holds summed over the MoE
    layers (``routing.held_imbalance``: each layer draws its own hot experts, so the rank
    that waits longest in one layer is not the one in every layer)."""
    if not model.is_moe:
        return 1.0
    builder = LayerBuilder(model, plan, routing)
    routed = builder.local_tokens * model.top_k
    if routed <= 0:
        return 1.0
    if builder._pads():
        return expert_capacity(model, plan, routed) * (model.num_experts // plan.ep) / routed
    return held_imbalance(model, plan, routed, routing)


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer: int, share: float = 1.0) -> float:
    """Bytes one layer keeps for backward per microbatch on one rank (``share``: the routed
    experts' tokens over the balanced share, ``routed_share``)."""
    tokens = plan.mbs * plan.seq / plan.cp
    h = model.hidden_size
    recompute = recomputes(model, plan, layer)
    if recompute == Recompute.FULL:
        return tokens * h * ACT_BYTES / plan.tp  # only the layer input (sequence-parallel shard)
    if recompute == Recompute.OP:
        return tokens * _op_kept_per_token(model, plan) * ACT_BYTES
    qkv = sum(lin.out_features for lin in model.attention_linears()[:-1])
    fp8_copies = plan.keeps_fp8_inputs
    # norm in, its output (the QKV input), q/k/v, the attention output: flash attention keeps it
    # and the output projection keeps its input, one tensor unless that projection keeps an FP8
    # copy of it (Transformer Engine's FP8 Linear saves the cast input, the BF16 one is the
    # attention's)
    attn = 2 * h + qkv + model.v_width * (2 if fp8_copies else 1)
    if model.qk_norm:  # the q/k norms keep their inputs
        attn += model.qk_width
    modules = plan.recompute_modules if recompute == Recompute.SELECTIVE else ()
    if "core_attn" in modules and fp8_copies:
        # the attention core rerun at backward: its BF16 output is not kept, the projection's
        # FP8 copy is (under BF16 the projection keeps that very output: nothing saved)
        attn -= model.v_width
    # + the second norm's input (the residual stream after attention; sharded by SP). No dropout
    # masks: the presets train without dropout, and PyTorch's dropout at p = 0 returns its input
    per_token = attn / plan.tp + h / plan.tp
    per_token += _mlp_per_token(model, plan, layer, share)
    saved = tokens * per_token * ACT_BYTES
    if fp8_copies:
        saved -= tokens * _fp8_inputs_per_token(model, plan, layer, share) * (ACT_BYTES - FP8_BYTES)
    saved += tokens * _gathered_inputs_per_token(model, plan, layer)
    if is_mtp_layer(model, layer):  # an MTP layer (LayerBuilder.mtp_forward): what its extra kernels keep
        saved += tokens * MTP_KEPT_PER_TOKEN * h / plan.tp * ACT_BYTES
    return saved - tokens * _modules_rerun_per_token(model, plan, layer, share, modules)


def _gathered_inputs_per_token(model: ModelSpec, plan: ParallelPlan, layer: int) -> float:
    """Bytes per token a layer keeps beyond the sequence shards counted for its two norm
    outputs (the attention's input and the MLP's) where the column-parallel linears keep the
    input their tensor-parallel all-gather wrote (``stack.memory.tp_gathered_inputs``): the whole
    sequence, in the dtype the gather carries (FP8 under dtype fp8: torchao's float8 tensorwise
    tensor parallelism casts before it gathers; BF16 otherwise). The shards were counted as
    ``layer_activation_bytes`` keeps them: in FP8 where the stack keeps FP8 inputs, but for an
    MoE layer's MLP input (the router's, BF16)."""
    if plan.tp == 1 or not plan.stack.memory.tp_gathered_inputs:
        return 0.0
    gathered = FP8_BYTES if plan.dtype == "fp8" else ACT_BYTES
    attn_shard = FP8_BYTES if plan.keeps_fp8_inputs else ACT_BYTES
    mlp_shard = ACT_BYTES if is_moe_layer(model, layer) else attn_shard
    return model.hidden_size * (2 * gathered - (attn_shard + mlp_shard) / plan.tp)


def _modules_rerun_per_token(model: ModelSpec, plan: ParallelPlan, layer: int, share: float,
                             modules: tuple[str, ...]) -> float:
    """Bytes per token (one rank) a layer does not keep because selective recompute re-runs
    the modules that made them (Megatron-Core --recompute-modules, as its Transformer Engine
    layer spec builds a layer: the input norm and a dense layer's pre-MLP norm are fused into
    the linear after them, so ``layernorm`` re-runs only an MoE layer's pre-MLP norm):
    ``mla_up_proj`` MLA's up projections' outputs, the attention's queries, keys and values
    (Megatron-Core discards them once the attention has run and rebuilds them from the kept
    latents in front of its backward); ``layernorm`` its output (the router's and the experts'
    input); ``moe_act`` the routed experts' activation output (the down projection's input);
    ``shared_experts`` the shared experts' up and activation outputs; ``mlp`` a dense layer's
    whole MLP but its input; ``moe`` an MoE layer's whole MoE part but its input. An FP8
    linear's input is counted at the bytes it is kept in (``saves_fp8_inputs``)."""
    if not modules or modules == DEFAULT_RECOMPUTE_MODULES:
        return 0.0
    inp = FP8_BYTES if plan.keeps_fp8_inputs else ACT_BYTES  # an FP8 linear layer's kept input
    h, gate = model.hidden_size, 2 if model.gated_mlp else 1
    dropped = 0.0
    if "mla_up_proj" in modules:  # as layer_activation_bytes counts them: the up projections' outputs
        dropped += sum(lin.out_features for lin in model.attention_linears() if lin.name in MLA_UP_LINEARS) * ACT_BYTES
    if not is_moe_layer(model, layer):
        if "mlp" in modules:  # norm output (fc1's input), up output, activation output (fc2's input)
            w = model.ffn_hidden_size
            dropped += h * inp + gate * w * ACT_BYTES + w * inp
        return dropped / plan.tp
    w, sw = model.expert_ffn_hidden_size, model.shared_ffn_hidden_size
    if "layernorm" in modules:
        dropped += h * ACT_BYTES
    if "moe" in modules or "shared_experts" in modules:  # the shared experts' up out, act out
        dropped += gate * sw * ACT_BYTES + sw * inp
    if "moe" in modules:  # the up projection's input (and the probabilities' copy), up out, act out
        copy = h * ACT_BYTES if plan.stack.memory.routed_probs_copy else 0.0
        dropped += share * model.top_k * (copy + h * inp + gate * w * ACT_BYTES + w * inp)
    elif "moe_act" in modules:
        dropped += share * model.top_k * w * inp
    return dropped / plan.tp


def recompute_working_set(model: ModelSpec, plan: ParallelPlan, layers, share: float = 1.0,
                          stored: dict | None = None) -> float:
    """What a recomputed layer holds while its backward runs, beyond what it stored
    (``layer_activation_bytes``): PyTorch's activation checkpointing (torch.utils.checkpoint,
    selective / per-op policies included, and Megatron-LM's CheckpointFunction) reruns the
    dropped part of the layer's forward at its backward with autograd on, so the tensors that
    rerun saves are held, for one microbatch, until the layer's backward frees them
    (Korthikanti et al. 2022, sec. 5, count the stored part only): the layer's activations
    without recompute less those it stored. The largest such layer of the stage; none where
    the stack's compiler schedules the rerun to fit (``stack.memory.recompute_working_set``
    false). ``stored``: the layers' ``layer_activation_bytes`` where the caller has them."""
    if not plan.stack.memory.recompute_working_set:
        return 0.0
    rerun = [l for l in layers if recomputes(model, plan, l) != Recompute.NONE]
    if not rerun:
        return 0.0
    kept = plan.at_recompute(Recompute.NONE)
    stored = stored or {l: layer_activation_bytes(model, plan, l, share) for l in rerun}
    return max(layer_activation_bytes(model, kept, l, share) - stored[l] for l in rerun)


def _op_kept_per_token(model: ModelSpec, plan: ParallelPlan) -> float:
    """Values per token one rank keeps of a dense layer under per-op checkpointing
    (``layers.op_linears``): the layer input (its sequence-parallel shard), the kept matmuls'
    outputs (column-parallel ones sharded by TP; a row-parallel one, wo / w2, is the full-width
    partial sum its reduce-scatter then reads), the attention output, and, with TP, the two
    reduce-scatters' outputs, which it keeps too."""
    h, tp = model.hidden_size, plan.tp
    kept = h / tp + model.v_width / tp
    for _, name, width, keep in op_linears(model):
        if keep:
            kept += width if name in ("wo", "w2") and tp > 1 else width / tp
    return kept + (2 * h / tp if tp > 1 else 0.0)


def _fp8_inputs_per_token(model: ModelSpec, plan: ParallelPlan, layer: int, share: float = 1.0) -> float:
    """Values per token (on one rank) among a layer's kept activations that are the inputs
    of its FP8 linear layers, which a ``fp8.saves_fp8_inputs`` stack keeps in FP8: the
    QKV projection's input (the norm's output) and the output projection's (the attention
    output); the MLP's up projection input and down projection input (the activation's
    output), per routed copy and for the shared experts in an MoE layer. The norms' inputs,
    q / k / v and the activation's input stay BF16 (attention runs in BF16)."""
    h = model.hidden_size
    attn = h + model.v_width
    if not is_moe_layer(model, layer):
        mlp = h + model.ffn_hidden_size
    else:
        w = model.expert_ffn_hidden_size
        mlp = share * model.top_k * (h + w) + model.shared_ffn_hidden_size
    return (attn + mlp) / plan.tp


def _mlp_per_token(model: ModelSpec, plan: ParallelPlan, layer: int, share: float = 1.0) -> float:
    gate = 2 if model.gated_mlp else 1
    if not is_moe_layer(model, layer):
        w = model.ffn_hidden_size
        return model.hidden_size / plan.tp + (gate * w + w) / plan.tp
    w = model.expert_ffn_hidden_size
    # per routed copy: the up projection's input, its output, the activation's output (the down
    # projection's input), and a hidden-width copy where weighing by the router's
    # probabilities keeps one (``stack.memory.routed_probs_copy``)
    h_kept = 2 if plan.stack.memory.routed_probs_copy else 1
    routed = share * model.top_k * (h_kept * model.hidden_size + gate * w + w)
    shared = (gate + 1) * model.shared_ffn_hidden_size
    return (model.hidden_size + routed + shared) / plan.tp


def in_flight_microbatches(plan: ParallelPlan, stage: int) -> float:
    """Microbatches whose activations a stage holds at its peak under the plan's schedule.
    Under the interleaved order the schedule itself is walked (``schedules.interleaved_peak``,
    chunks of equal weight; ``held_activation_bytes`` weighs each chunk by its layers). The
    expert-parallel all-to-all overlap's one more layer is ``held_activation_bytes``'s. One
    schedule's microbatches (``plan.pipeline_flushes``: each schedule drains before the next)."""
    m = plan.flush_microbatches
    if plan.schedule == Schedule.GPIPE:
        return m
    if _interleaved_order(plan):  # chunks of equal weight: Narayanan'21 sec. 2.2 on the first stage
        return min(m, _interleaved_held(plan, stage, (1.0,) * plan.vpp) / plan.vpp)
    if plan.schedule in V_SHAPES:  # the chunks the schedule may hold (F to W), two a stage
        held = v_chunks_held(plan.schedule, plan.pp, m) / plan.vpp
    elif plan.schedule == Schedule.ZB_H1:  # stage s also keeps s deferred W passes' inputs
        held = max(plan.pp - stage, stage + 1)  # peak (stage 0) = 1F1B's (Qi'23)
    else:
        held = plan.pp - stage
    return min(m, held)


def _interleaved_order(plan: ParallelPlan) -> bool:
    """Whether the plan runs Megatron's interleaved order (``schedules.schedule_order``:
    vpp > 1 but GPipe's and the V shapes'; ZB-H1's deferred weight passes left out)."""
    return plan.vpp > 1 and plan.schedule != Schedule.GPIPE and plan.schedule not in V_SHAPES


def _interleaved_held(plan: ParallelPlan, stage: int, weights: tuple[float, ...],
                      merged: tuple[float, ...] | None = None) -> float:
    """``schedules.interleaved_peak`` of the plan's stage (``merged``: the expert-parallel overlap's)."""
    return interleaved_peak(plan.pp, plan.vpp, stage, plan.flush_microbatches, weights, merged)


def held_activation_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, stored: dict[int, float]) -> float:
    """Activation bytes ``stage`` holds at its peak, ``stored`` the bytes each of its layers
    keeps per microbatch: under the interleaved order the schedule walked with each chunk
    weighing its own layers (``schedules.interleaved_peak``), else the stage's layers times
    ``in_flight_microbatches``. Under the expert-parallel all-to-all overlap Megatron-Core
    runs one more forward before the steady steps ("if overlap_moe_expert_parallel_comm:
    num_warmup_microbatches + 1", megatron/core/pipeline_parallel/schedules.py) and merges
    each steady step's forward and backward layer by layer (schedule_chunk_1f1b: the
    forward's layer i beside the backward's layer n - 1 - i), the backward freeing a layer as
    the forward keeps one: the peak holds one layer more than the schedule's own, not one
    more chunk (``schedules.interleaved_peak``'s ``merged``)."""
    if not _interleaved_order(plan):
        held = in_flight_microbatches(plan, stage)
        merged = plan.overlaps_ep_comm and plan.flush_microbatches > held  # a merged steady step runs
        return sum(stored.values()) * held + (max(stored.values(), default=0.0) if merged else 0.0)
    chunks = [chunk_layers(model, plan, stage, c) for c in range(plan.vpp)]
    weights = tuple(sum(stored[l] for l in chunk) for chunk in chunks)
    merged = tuple(max((stored[l] for l in chunk), default=0.0) for chunk in chunks) if plan.overlaps_ep_comm else None
    return _interleaved_held(plan, stage, weights, merged)


def _policy(plan: ParallelPlan, key: str, default: float) -> float:
    """The stack's memory value (system.stacks.MemoryPolicy), else perfsim's default."""
    value = getattr(plan.stack.memory, key)
    return default if value is None else value


def zero_buffers(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes of a rank's ZeRO working buffers beyond its shards. ZeRO-3: the largest layer's
    unsharded weights, (1 + prefetched) of them, beside the stage's embedding / LM head /
    final norm (FSDP2's root group, unsharded from forward to backward: the PyTorch 2.9
    fully_shard docs, reshard_after_forward None is False for the root), and the largest
    unit's unsharded gradients, (1 + in flight) of them; in the groups that shard (degree
    > 1; a group of one rank keeps its weights whole and gathers nothing). ZeRO-2: the
    gradient buckets being reduced, (1 + in flight) buckets of ``grad_bucket_bytes`` at
    most. ZeRO-0/1 reduce in place in the full gradient buffer: none."""
    if plan.step_zero < 2:
        return 0.0
    d_shard, e_shard = shard_degrees(plan)
    shards = (d_shard > 1, e_shard > 1)  # (dense, expert) parameters sharded

    def per_layer(sizes) -> list[float]:
        return [sum(b for b, on in zip(sizes(model, plan, l), shards) if on) for l in stage_layer_ids(model, plan, stage)]

    # the embedding, LM head and final norm on the stages holding them, sharded over the dense group
    ends = embedding_rank_params(model, plan, stage) if shards[0] else 0.0
    ends_grads = ends_grad_bytes(model, plan, stage) if shards[0] else 0.0
    if plan.step_zero == 2:
        total = sum(per_layer(layer_grad_bytes)) + ends_grads
        return (1 + plan.overlap_grad_reduce) * min(plan.grad_bucket_bytes, total)
    # ZeRO-3: the ends are FSDP2's root group, kept gathered from its forward to its backward
    # (root modules do not reshard after forward), beside the layer computing
    weights = ends * plan.param_bytes + (1 + plan.overlap_param_gather) * max(per_layer(layer_param_bytes), default=0.0)
    grads = max(per_layer(layer_grad_bytes) + [ends_grads])
    return weights + (1 + plan.overlap_grad_reduce) * grads


def fp8_weight_cache(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes of FP8 weight copies a stage's rank keeps through a step where the stack casts
    each weight once a step (``fp8.weights_cast_once``: Transformer Engine's weight
    workspaces under is_first_microbatch): every linear weight of the stage's layers in FP8,
    rowwise for the forward GEMM and columnwise (its transpose) for the dgrad GEMM, one byte
    each (the cast writes both, as ``LayerBuilder._fp8`` prices it). Under FP8 primary
    weights (``plan.fp8_params``) the weight itself is the rowwise copy and only its
    transpose is cached (Megatron-Core's FP8 transpose cache), on any stack: the step prices
    that transpose once (``LayerBuilder._fp8``). None on BF16, with BF16 working weights on
    stacks that cast every microbatch, and under per-pass ZeRO-3, whose weights are gathered pass by pass
    (Megatron-FSDP turns the transpose cache off: keep_fp8_transpose_cache = False in
    Megatron-Bridge's FSDP overrides). The embedding and LM head stay BF16."""
    if plan.dtype != "fp8" or not plan.fp8_copies_kept(plan.stack.fp8.weights_cast_once or plan.fp8_params):
        return 0.0
    params = sum(sum(layer_rank_params(model, plan, layer)) for layer in stage_layer_ids(model, plan, stage))
    return params * FP8_BYTES * (1 if plan.fp8_params else 2)


def gradients_apart(plan: ParallelPlan) -> bool:
    """Whether a rank's gradients and its activations are never held at once: the stack
    keeps no gradient buffer through the step (``memory.gradient_buffer`` false: XLA's
    compiled step, whose backward writes each layer's gradients as it frees the activations
    that layer kept, and the logits before them) and the step runs one microbatch, so no
    gradient is accumulated while a later microbatch's activations are held. The peak is
    then the larger of the two (the end of the forward, or the end of the backward), not
    their sum."""
    return not plan.stack.memory.gradient_buffer and plan.num_microbatches == 1


def stage_memory(model: ModelSpec, plan: ParallelPlan, stage: int, routing: RoutingSpec = UNIFORM) -> MemoryBreakdown:
    dense, expert = stage_rank_params(model, plan, stage)
    d_shard, e_shard = shard_degrees(plan)
    params = dense + expert
    sharded = dense / d_shard + expert / e_shard
    weight_bytes = plan.param_bytes if plan.fp8_params else _policy(plan, "weight_bytes", WEIGHT_BYTES)
    if plan.step_zero == 3 and plan.stack.memory.sharded_master:
        weight_bytes = 0.0  # the shards are the FP32 master (optimizer bytes); the compute copy only gathered
    weights = (sharded if plan.step_zero == 3 else params) * weight_bytes + fp8_weight_cache(model, plan, stage)
    grads = (sharded if plan.step_zero >= 2 else params) * _policy(plan, "grad_bytes", MAIN_GRAD_BYTES)
    opt = (sharded if plan.step_zero >= 1 else params) * _policy(plan, "optimizer_bytes", OPTIMIZER_STATE_BYTES)
    share = routed_share(model, plan, routing)
    layers = stage_layer_ids(model, plan, stage)
    stored = {l: layer_activation_bytes(model, plan, l, share) for l in layers}
    acts = held_activation_bytes(model, plan, stage, stored) + recompute_working_set(
        model, plan, layers, share, stored)
    logits = 0.0
    if stage == head_stage(plan):  # logits + their gradient (FP32 each by default)
        logits = plan.mbs * plan.seq / plan.cp * model.vocab_size / plan.tp * _policy(plan, "logit_bytes", 2 * LOGIT_BYTES)
        logits *= 1 + plan.mtp_layers  # each MTP layer's logits too, all held until the backward
    held = MemoryBreakdown(stage=stage, weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt,
                           activations_bytes=acts, logits_bytes=logits,
                           fragmentation_bytes=_policy(plan, "fragmentation", FRAGMENTATION) * (acts + logits),
                           zero_buffers_bytes=zero_buffers(model, plan, stage))
    if not gradients_apart(plan):
        return held
    return dataclasses.replace(held, reused_bytes=min(grads, held.transient_bytes))


def plan_memory(model: ModelSpec, plan: ParallelPlan, routing: RoutingSpec = UNIFORM) -> list[MemoryBreakdown]:
    return [stage_memory(model, plan, s, routing) for s in range(plan.pp)]
