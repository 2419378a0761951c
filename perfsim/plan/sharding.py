"""Where the parameters live: per-rank parameter counts by layer, stage and ZeRO stage.

Mixed-precision Adam bookkeeping (Rajbhandari'20 ZeRO, sec. 3): bf16 weights (2 B),
fp32 main gradients (4 B), fp32 master weights + Adam m and v (12 B) per parameter.
"""

from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan, Recompute
from perfsim.plan import layout
from perfsim.plan.schedules import BWD, FWD, WGT, head_stage, stage_layers, stage_of, virtual_stage

WEIGHT_BYTES = 2
MAIN_GRAD_BYTES = 4
REDUCE_GRAD_BYTES = 2  # gradients are reduced in bf16 (Megatron-Core DDP default)
OPTIMIZER_STATE_BYTES = 12
# Adam step traffic per local parameter: read fp32 master, grad, m, v; write master, m, v, bf16 copy
OPTIMIZER_TRAFFIC_BYTES = 4 + 4 + 4 + 4 + 4 + 4 + 4 + 2
# gradient clipping per local parameter: the global norm reads the fp32 main gradient, the
# clip scales it in place (read + write; Megatron clip_grad_by_total_norm_fp32)
CLIP_TRAFFIC_BYTES = 3 * MAIN_GRAD_BYTES
NORM_BYTES = 4  # the fp32 squared norm all-reduced across the data-parallel ranks


def is_moe_layer(model: ModelSpec, layer: int) -> bool:
    return model.is_moe and layer >= model.num_dense_layers


def is_mtp_layer(model: ModelSpec, layer: int) -> bool:
    """A multi-token-prediction layer (``plan.mtp_layers``): numbered after the decoder layers."""
    return layer >= model.num_layers


def layer_params(model: ModelSpec, layer: int) -> tuple[int, int]:
    """(dense, expert) parameters of one layer, unsharded (an MTP layer: a layer like the
    model's last plus ``ModelSpec.mtp_own_params``)."""
    dense = model.attention_params() + model.norm_params_per_layer()
    if is_mtp_layer(model, layer):
        dense += model.mtp_own_params()
    if is_moe_layer(model, layer):
        return dense + model.router_params() + model.shared_expert_params(), model.num_experts * model.expert_params()
    return dense + model.dense_mlp_params(), 0


def layer_rank_params(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank holds for ``layer`` before ZeRO sharding."""
    dense, expert = layer_params(model, layer)
    return dense / plan.tp, expert / (plan.ep * plan.etp)


def layer_grad_bytes(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    dense, expert = layer_rank_params(model, plan, layer)
    return dense * REDUCE_GRAD_BYTES, expert * REDUCE_GRAD_BYTES


def layer_param_bytes(model: ModelSpec, plan: ParallelPlan, layer: int) -> tuple[float, float]:
    """(dense, expert) bytes of one layer's working weights on a rank: what ZeRO gathers
    (BF16, or FP8 under ``plan.fp8_params``)."""
    dense, expert = layer_rank_params(model, plan, layer)
    return dense * plan.param_bytes, expert * plan.param_bytes


def chunk_layers(model: ModelSpec, plan: ParallelPlan, stage: int, chunk: int) -> range:
    """The layers virtual stage (stage, chunk) holds under ``plan`` (``stage_layers`` with the
    plan's pipeline layout)."""
    return stage_layers(model.num_layers, plan.pp, plan.vpp, stage, chunk, plan.first_stage_layers,
                        plan.last_stage_layers, plan.schedule, plan.accounted, plan.mtp_layers, plan.pipeline_layout)


def mtp_stages(model: ModelSpec, plan: ParallelPlan) -> frozenset[int]:
    """The pipeline stages holding an MTP layer: the last virtual stage's, or where the
    plan's layout puts an ``m``."""
    if not plan.mtp_layers:
        return frozenset()
    if not plan.pipeline_layout:
        return frozenset({stage_of(plan.schedule, plan.pp, plan.pp * plan.vpp - 1)})
    stages = layout.parse(plan.pipeline_layout)
    return frozenset(stage_of(plan.schedule, plan.pp, vs) for vs, symbols in enumerate(stages) if "m" in symbols)


def chunk_blocks(model: ModelSpec, plan: ParallelPlan, stage: int, chunk: int) -> list[int | str]:
    """The blocks of virtual stage (stage, chunk) in forward order: "embedding" on the first
    virtual stage, its layers (``chunk_layers``), "head" on the last (both estimators walk
    this order)."""
    vs = virtual_stage(plan.schedule, plan.pp, stage, chunk)
    return ((["embedding"] if vs == 0 else []) + list(chunk_layers(model, plan, stage, chunk))
            + (["head"] if vs == plan.pp * plan.vpp - 1 else []))


def stage_layer_ids(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[int]:
    return [l for c in range(plan.vpp) for l in chunk_layers(model, plan, stage, c)]


def recomputes(model: ModelSpec, plan: ParallelPlan, layer: int) -> Recompute:
    """The recompute a layer runs: the plan's, or none past the first ``recompute_layers``
    layers of its stage chunk (Megatron's block method)."""
    if not plan.recompute_layers or plan.recompute == Recompute.NONE:
        return plan.recompute
    for stage in range(plan.pp):
        for chunk in range(plan.vpp):
            held = chunk_layers(model, plan, stage, chunk)
            if layer in held:
                return plan.recompute if layer - held.start < plan.recompute_layers else Recompute.NONE
    return plan.recompute


def fewest_recompute_layers(model: ModelSpec, plan: ParallelPlan, fits) -> int:
    """The smallest N for which ``fits(N)``: full recompute of the first N layers of each
    pipeline chunk (Megatron's --recompute-method block --recompute-num-layers N), searched
    by bisection since memory falls as more layers recompute; 0 where only every layer
    (N >= the deepest chunk) would do."""
    deepest = max(len(chunk_layers(model, plan, stage, chunk)) for stage in range(plan.pp) for chunk in range(plan.vpp))
    low, high = 1, deepest  # fits(high) holds once high < deepest
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return low if low < deepest else 0


def embedding_rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Vocabulary-parallel embedding on the first stage, LM head on ``head_stage`` (the
    last, or the first under a V-shape schedule); tied embeddings keep a copy on both
    ends when those are different stages, as Megatron does; a stage holding MTP layers
    (``plan.mtp_layers``) other than the first holds the embedding too (Megatron-Core's
    GPTModel builds it where ``pre_process or mtp_process``), or shares the tied head's."""
    table = model.vocab_size * model.hidden_size / plan.tp
    head = head_stage(plan)
    count = 0.0
    if stage == 0:
        count += table
    if stage == head and (not model.tied_embeddings or head != 0):
        count += table
    if stage != 0 and plan.mtp_layers and stage in mtp_stages(model, plan) and not (model.tied_embeddings and stage == head):
        count += table  # the MTP layers embed tokens too: Megatron builds the embedding on their stage
    return count + (model.hidden_size if stage == head else 0)


def end_block_params(model: ModelSpec, plan: ParallelPlan, block: str) -> float:
    """Parameters one rank's ``block`` ("embedding" or "head") holds on its stage
    (``embedding_rank_params`` split by block): the vocabulary-parallel table; the LM head
    with the final norm, less the table where tied embeddings put the head on the
    embedding's stage (one tensor, gathered with the embedding)."""
    table = model.vocab_size * model.hidden_size / plan.tp
    if block == "embedding":
        return table
    tied_here = model.tied_embeddings and head_stage(plan) == 0
    return (0.0 if tied_here else table) + model.hidden_size


def block_param_bytes(model: ModelSpec, plan: ParallelPlan, block: int | str) -> tuple[float, float]:
    """(dense, expert) bytes of a block's working weights that ZeRO gathers: a layer's
    (``layer_param_bytes``), the embedding's or the LM head's (``end_block_params``: dense,
    gathered over the dp x cp group like the other dense weights)."""
    if isinstance(block, int):
        return layer_param_bytes(model, plan, block)
    return end_block_params(model, plan, block) * plan.param_bytes, 0.0


def gathers_in(block: int | str, phase: str) -> bool:
    """Whether a block's pass ``phase`` ("F", "B", "W") needs its gathered weights: a
    layer's and the LM head's forward and input-gradient passes; the embedding's forward
    only (its backward scatters the output gradient into the table's gradient, no
    weights); never the weight-gradient pass (inputs and output gradients)."""
    if phase == WGT:
        return False
    return phase == FWD or (phase == BWD and block != "embedding")


def embedding_sync_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Word-embedding parameters whose gradients one rank of ``stage`` all-reduces with its
    peer over Megatron-Core's embedding group (finalize_model_grads'
    _allreduce_word_embedding_grads, after the data-parallel reduction, before the optimizer):
    where a stage other than the first holds a copy of the table (``embedding_rank_params``:
    the head tied to the embedding, or the MTP layers' embedding), the first stage and that
    stage sum their gradients of it. The pair is priced as the first and the last stage
    (Megatron's embedding group; an MTP stage placed elsewhere by a layout is priced at that
    distance too)."""
    if plan.pp == 1:
        return 0.0
    head = head_stage(plan)
    copies = {head} if model.tied_embeddings and head != 0 else set()
    copies |= set(mtp_stages(model, plan)) - {0}
    if not copies or stage not in copies | {0}:
        return 0.0
    return model.vocab_size * model.hidden_size / plan.tp


def ends_grad_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes of the stage's embedding / LM head / final norm gradients its data-parallel
    reduction moves (dense parameters: the dp x cp group): ready when the backward ends
    (the embedding's last; the graph and the closed form put the head's there too), so they
    join the stage's last gradient bucket."""
    return embedding_rank_params(model, plan, stage) * REDUCE_GRAD_BYTES


def stage_rank_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of ``stage`` holds before ZeRO sharding."""
    dense, expert = embedding_rank_params(model, plan, stage), 0.0
    for layer in stage_layer_ids(model, plan, stage):
        d, e = layer_rank_params(model, plan, layer)
        dense, expert = dense + d, expert + e
    return dense, expert


def shard_degrees(plan: ParallelPlan) -> tuple[int, int]:
    """Data-parallel shard degree of (dense, expert) parameters."""
    return plan.dp * plan.cp, plan.edp


def local_optimizer_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    dense, expert = stage_rank_params(model, plan, stage)
    if plan.zero == 0:
        return dense + expert
    d_shard, e_shard = shard_degrees(plan)
    return dense / d_shard + expert / e_shard


def clip_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """HBM traffic of the gradient clip (norm + scale) on this rank's gradient shard."""
    return local_optimizer_params(model, plan, stage) * CLIP_TRAFFIC_BYTES if plan.clip_grad else 0.0


def optimizer_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """HBM traffic of one Adam step on this rank's parameter shard."""
    # the step writes the working copy in its own width (BF16, or FP8 primary weights)
    return local_optimizer_params(model, plan, stage) * (OPTIMIZER_TRAFFIC_BYTES - WEIGHT_BYTES + plan.param_bytes)
