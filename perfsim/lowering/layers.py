"""Per-layer op templates: the forward and backward chains of one transformer block.

A template is a list of ``Step``s built once per layer kind and stamped out per
microbatch by ``graph``. Shapes are per rank: T = mbs*seq/cp tokens; weights are
sharded over tp (dense) or ep x etp (experts). Backward GEMMs do dgrad + wgrad
(batch 2); flash-attention backward does 2.5x the forward matmul work (Dao'23).
"""

import math
from dataclasses import replace

from perfsim.model.spec import AttentionKind, Linear, ModelSpec, causal_keys
from perfsim.lowering.ops import Coll, Gemm, OpKind, Stream
from perfsim.lowering.steps import (ACT_BYTES, FP8_BYTES, FP8_DISPATCH_BYTES, LOGIT_BYTES, Step, coll_step,  # noqa: F401 - re-exported
                                    elementwise_step, fp8_cast_bytes, gemm_step, host_step)
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, LIBRARY_DISPATCH, ParallelPlan, Recompute
from perfsim.plan.routing import UNIFORM, RoutingSpec, expert_capacity, imbalance, slowest_expert_rank
from perfsim.plan.sharding import is_moe_layer, is_mtp_layer
from perfsim.lowering.stack_steps import StackSteps

ATTN_BWD_FACTOR = 2.5
# the casts in front of an FP8 GEMM, named after it (``LayerBuilder._fp8``): the abs-max pass
# (current scaling) and the cast itself
FP8_CAST_STEPS = ("fp8_amax", "fp8_cast")

_BACKWARD_COLL = {
    Coll.ALL_GATHER: Coll.REDUCE_SCATTER,
    Coll.REDUCE_SCATTER: Coll.ALL_GATHER,
    Coll.ALL_REDUCE: Coll.ALL_REDUCE,
    Coll.ALL_TO_ALL: Coll.ALL_TO_ALL,
}


class LayerBuilder(StackSteps):
    """Builds the step chains of one rank's layers for a model and plan."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, routing: RoutingSpec = UNIFORM,
                 ep_speeds: tuple[float, ...] | None = None):
        self.model, self.plan, self.routing, self.ep_speeds = model, plan, routing, ep_speeds
        self.tokens = plan.mbs * plan.seq // plan.cp
        self.sp = plan.sequence_parallel and plan.tp > 1
        self.local_tokens = self.tokens // plan.tp if self.sp else self.tokens
        self.fp8 = plan.dtype == "fp8"
        self.stack = plan.stack

    def _fp8(self, step: Step, from_norm: bool = False) -> list[Step]:
        """A GEMM step, behind the casts of its BF16 inputs (activations and weights) when
        the plan runs FP8; the casts carry the GEMM's meta (an EP rank's speed). A stack
        that casts each weight once per step (``fp8.weights_cast_once``) pays its weight
        casts once over the step's microbatches: spread over them here. ``from_norm``: the
        GEMM's input is a norm's output, which a ``fp8.norm_fused_cast`` stack writes in FP8
        directly (no cast pass for it). Under delayed scaling (the plan's ``fp8_recipe``, else
        the stack's ``fp8.delayed_scaling``) the scales come from earlier steps' amax history:
        the cast records the amax, no amax pass reads the input first.
        The backward casts the GEMM's output gradient (rows x n) once, with its transpose, for
        the dgrad and wgrad GEMMs, whatever the forward fused: the cast steps' ``backward_bytes``
        (the forward cast-transpose wrote the input's and weights' transposes; a norm that
        wrote the FP8 input itself wrote no transpose, so the backward transposes it for the
        wgrad: Transformer Engine's fp8_transpose of LayerNormLinear's ln_out). Under FP8 primary
        weights (``plan.fp8_params``) no weight is cast: the FP8 copy the optimizer wrote is
        transposed once per step for the dgrad GEMMs (read + write, one byte each). Under
        per-pass ZeRO-3 the weights are gathered pass by pass, so neither copy outlives a
        microbatch (``plan.fp8_copies_per_step``: cast / transposed every microbatch)."""
        if not self.fp8:
            return [step]
        fp8 = self.stack.fp8
        g, groups = step.gemm, len(step.grouped) or 1
        tokens = sum(step.grouped) if step.grouped else g.m
        rows = 0 if from_norm and fp8.norm_fused_cast else tokens
        weights = groups * g.k * g.n / self.plan.fp8_copies_per_step(fp8.weights_cast_once)
        transpose = 0.0
        if self.plan.fp8_params:  # FP8 primary weights: no cast; their FP8 copy transposed once a step
            transpose = 2 * FP8_BYTES * groups * g.k * g.n / self.plan.fp8_copies_per_step(True)
            weights = 0
        amax, cast = (b * fp8.cast_bytes_factor for b in fp8_cast_bytes(rows * g.k + weights))
        cast += transpose
        grad_amax, grad_cast = (b * fp8.cast_bytes_factor for b in fp8_cast_bytes(tokens * g.n))
        if fp8.amax_fused:  # the activations' and gradients' abs-max ran in their producers
            amax = fp8_cast_bytes(weights)[0] * fp8.cast_bytes_factor
            grad_amax = 0.0
        if rows < tokens:  # the norm-written FP8 input, transposed in the backward (read + write)
            grad_cast += 2 * FP8_BYTES * (tokens - rows) * g.k * fp8.cast_bytes_factor

        def cast_step(name: str, size: float, backward_size: float) -> Step:
            return replace(elementwise_step(f"{step.name}_{name}", size, "fp8_cast"),
                           meta=step.meta + (("backward_bytes", backward_size),))

        amax_name, cast_name = FP8_CAST_STEPS
        steps = [] if self.plan.fp8_delayed_scaling or not amax else [cast_step(amax_name, amax, grad_amax)]
        if fp8.backward_split_accumulator:  # its dgrad and wgrad (the backward copies keep the meta)
            step = replace(step, meta=step.meta + (("split_acc", True),))
        return steps + [cast_step(cast_name, cast, grad_cast), step]

    def _tp_enter(self, name: str) -> list[Step]:
        if not self.sp:
            return []
        size = self.tokens * self.model.hidden_size * ACT_BYTES
        return [coll_step(f"{name}_ag", Coll.ALL_GATHER, "tp", size, "tp_comm")]

    def _tp_exit(self, name: str) -> list[Step]:
        if self.plan.tp == 1:
            return []
        size = self.tokens * self.model.hidden_size * ACT_BYTES
        coll = Coll.REDUCE_SCATTER if self.sp else Coll.ALL_REDUCE
        return [coll_step(f"{name}_{'rs' if self.sp else 'ar'}", coll, "tp", size, "tp_comm")]

    def _norm(self, name: str) -> Step:
        # read x and residual, write normed x and the new residual
        return elementwise_step(name, 4 * self.local_tokens * self.model.hidden_size * ACT_BYTES, "norm")

    def _qk_norm(self) -> list[Step]:
        """The query/key RMSNorm of ``model.qk_norm`` models: read q and k, write them normed."""
        m = self.model
        if not m.qk_norm:
            return []
        return [elementwise_step("qk_norm", 2 * self.tokens * (m.qk_width / self.plan.tp) * ACT_BYTES, "norm")]

    def _linears(self, linears: list[Linear], category: str, shard_out: bool = True) -> list[Step]:
        tp = self.plan.tp
        steps = []
        for lin in linears:
            if shard_out and lin.name != "attn_out":  # the attention's input projections: fed by a norm
                steps += self._fp8(gemm_step(lin.name, self.tokens, lin.in_features, lin.out_features // tp, category),
                                   from_norm=True)
            else:
                steps += self._fp8(gemm_step(lin.name, self.tokens, lin.in_features // tp, lin.out_features, category))
        return steps

    def attention_forward(self, window: int = 0) -> list[Step]:
        """The attention block's forward; ``window`` > 0: sliding-window attention over that
        many keys per query (``ModelSpec.attention_window``)."""
        m, plan = self.model, self.plan
        linears = m.attention_linears()
        steps = [*self._norms("attn_norm"), *self._tp_enter("attn")]
        steps += self._linears(linears[:-1], "attention_proj")
        steps += self._qk_norm()
        steps += self._rope()
        if plan.cp > 1:
            kv = 2 * m.num_kv_heads * (m.head_dim + m.qk_rope_head_dim) // min(plan.tp, m.num_kv_heads)
            steps += ring_attention(self._attention_core(window), plan.cp, self.tokens * kv * ACT_BYTES)
        else:
            steps.append(self._attention_core(window))
        steps += self._linears(linears[-1:], "attention_proj", shard_out=False)
        return _casts_before_gather(steps + self._tp_exit("attn"))

    def _attention_core(self, window: int = 0) -> Step:
        """QK^T and AV of a causal attention: each query attends within its own sequence (all
        cp shards of it), on average over ``causal_keys`` of it (half of it; under a sliding
        window shorter than the sequence, the window less its ramp at the sequence start), and
        under a window the kernel runs at its efficiency over W keys (a windowed
        flash kernel visits only the key tiles inside the band; assumed alike a causal kernel
        of that length). Context parallelism splits a windowed layer's work over the ring's
        blocks as a full layer's (each block's share of the band, not only the neighbours')."""
        m, plan = self.model, self.plan
        seq = plan.seq
        keys = causal_keys(seq, window)
        width = (m.q_width + m.v_width) / plan.tp
        flops = 2.0 * self.tokens * keys * width  # QK^T and AV
        moved = self.tokens * (m.q_width + 2 * m.v_width) / plan.tp * ACT_BYTES
        span = min(window, seq) if window else seq  # the keys a query block's kernel walks
        shape = (("seq", span), ("head_dim", m.head_dim + m.qk_rope_head_dim), ("causal", True))
        if plan.stack.kernels.attention:  # the stack's attention kernel library (its GPU table where fitted)
            shape += (("attention_library", plan.stack.kernels.attention),)
        return Step(name="attn_core", kind=OpKind.ATTENTION, stream=Stream.COMPUTE, category="attention_core",
                    flops=flops, bytes=moved, meta=shape)

    def mlp_forward(self) -> list[Step]:
        return [*self._norms("mlp_norm"), *self._tp_mlp("mlp", self.model.ffn_hidden_size, "mlp", from_norm=True)]

    def _tp_mlp(self, name: str, ffn: int, category: str, from_norm: bool = False) -> list[Step]:
        """A tensor-parallel MLP (Megatron-Core's MLP: column-parallel up, row-parallel down)
        of ``ffn`` width: the sequence-parallel all-gather of its input, the up GEMM on the
        rank's share of the width, the activation, the down GEMM and the reduce-scatter (an
        all-reduce without sequence parallelism). A dense layer's MLP (``from_norm``: its
        input is the norm's output, which a fused norm may write in FP8) and an MoE layer's
        shared experts (``SharedExpertMLP`` is that MLP; the pre-MLP norm feeds the router too)."""
        m = self.model
        width = ffn // self.plan.tp
        up_width = width * (2 if m.gated_mlp else 1)
        steps = [*self._tp_enter(name)]
        steps += self._fp8(gemm_step(f"{name}_up", self.tokens, m.hidden_size, up_width, category), from_norm=from_norm)
        steps.append(elementwise_step(f"{name}_act", self.tokens * (up_width + width) * ACT_BYTES, "activation"))
        steps += self._unfused_act(f"{name}_act", self.tokens, width)
        steps += self._fp8(gemm_step(f"{name}_down", self.tokens, width, m.hidden_size, category))
        return _casts_before_gather(steps + self._tp_exit(name))

    def moe_forward(self) -> list[Step]:
        m = self.model
        t, h = self.local_tokens, m.hidden_size
        routed = t * m.top_k
        steps = [*self._norms("moe_norm")]
        router = [gemm_step(lin.name, t, lin.in_features, lin.out_features, "router") for lin in m.router_linears()]
        steps += [replace(g, meta=(("dtype", "bf16"),)) for g in router]  # routers stay BF16 under FP8 recipes
        # softmax + top-k: read the fp32 logits, write the top-k probabilities (fp32) and indices (int32)
        steps.append(elementwise_step("router_topk", t * (m.num_experts + 2 * m.top_k) * LOGIT_BYTES, "router"))
        steps += self._moe_host_sync()
        dispatch, combine = self._a2a_steps(routed)
        einsums = self._mask_einsums()
        if einsums:  # the one-hot einsums scatter straight into the expert-major layout
            steps += [einsums[0], *dispatch, *self._experts(routed, batched=True), *combine, einsums[1]]
        else:
            steps.append(elementwise_step("permute", 2 * routed * h * ACT_BYTES, "moe_permute"))
            steps += dispatch + self._local_regroup("local_sort", dispatch)
            steps += self._experts(routed)
            steps += self._local_regroup("local_unsort", combine) + combine
            steps.append(elementwise_step("unpermute", 2 * routed * h * ACT_BYTES, "moe_permute"))
        if m.shared_ffn_hidden_size:
            steps += self._tp_mlp("shared", m.shared_ffn_hidden_size, "shared_expert")
        return steps

    def _mask_einsums(self) -> list[Step]:
        """Dispatch and combine of a stack whose capacity path multiplies by one-hot masks
        (``stack.moe.mask_einsum``; MaxText dense_matmul): per sequence of S tokens,
        dispatch BSM,BSEC->EBCM is a [E*C, S] x [S, hidden] GEMM and combine
        EBCM,BSEC->BSM a [S, E*C] x [E*C, hidden] one, with C = ceil(S * top_k / E) *
        capacity factor slots per expert -- work growing with S * top_k * capacity factor
        per token. BF16 (the masks are BF16 one-hots). The dispatch mask takes no gradient:
        its backward is the input gradient only; the combine's also reaches the router
        probabilities in the mask (a dgrad and a wgrad)."""
        m = self.model
        if not (self.stack.moe.mask_einsum and self._pads()):
            return []
        seq = max(self.plan.seq // self.plan.cp, 1)
        sequences = max(round(self.local_tokens / seq), 1)
        per_expert = int(max(math.ceil(seq * m.top_k / m.num_experts) * m.capacity_factor, m.capacity_factor))
        slots = m.num_experts * per_expert  # generate_masks: expert_capacity_per_batch, an int per expert
        bf16 = (("dtype", "bf16"),)
        dispatch = gemm_step("dispatch_einsum", sequences * slots, seq, m.hidden_size, "moe_dispatch")
        combine = gemm_step("combine_einsum", sequences * seq, slots, m.hidden_size, "moe_dispatch")
        return [replace(dispatch, meta=bf16 + (("input_grad_only", True),)), replace(combine, meta=bf16)]

    def _a2a_values(self, routed: int) -> float:
        """Hidden values of an all_to_allv as the busiest rank sees it: it receives
        ``imbalance`` x its share. Padded to capacity (dense dispatch), the exchange moves
        the static [experts, capacity, hidden] buffer, empty slots included (MaxText's
        EBCM einsum output resharded to the expert axis; Megatron's drop-and-pad splits),
        so the rank receives its experts' full capacity whatever the routing."""
        m = self.model
        if self._pads():
            return expert_capacity(m, self.plan, routed) * (m.num_experts // self.plan.ep) * m.hidden_size
        return routed * m.hidden_size * imbalance(m, self.plan, routed, self.routing, self.ep_speeds)

    def _local_regroup(self, name: str, a2a: list[Step]) -> list[Step]:
        """The library all-to-all delivers tokens grouped by source rank; with several
        experts per rank they are regrouped by expert after the dispatch and back before the
        combine (Megatron-Core MoEAlltoAllTokenDispatcher.sort_chunks_by_idxs; MaxText's
        ragged path does the same local permute): the received tokens read and written once.
        Dedicated dispatch kernels (deepep, mori) write the expert-major layout directly."""
        local_experts = self.model.num_experts // self.plan.ep
        if not a2a or local_experts < 2 or self.plan.dispatch not in LIBRARY_DISPATCH:
            return []
        return [elementwise_step(name, 2 * a2a[0].collective.size_bytes, "moe_permute")]

    def _a2a_steps(self, routed: int) -> tuple[list[Step], list[Step]]:
        """The dispatch and combine all-to-alls (none without expert parallelism). Under FP8
        dispatch the dispatch direction carries FP8 + scales, forward (tokens) and backward
        (the combine's gradients flowing into the experts); the combine direction stays BF16."""
        if self.plan.ep == 1:
            return [], []
        values, fp8 = self._a2a_values(routed), self.plan.dispatch_fp8
        per_value = FP8_DISPATCH_BYTES if fp8 else ACT_BYTES
        blocked = self.routing.topk_block
        dispatch = coll_step("dispatch_a2a", Coll.ALL_TO_ALL, "ep", values * per_value, "ep_a2a",
                             token_bytes=self.model.hidden_size * FP8_DISPATCH_BYTES if fp8 else 0.0, blocked=blocked)
        combine = coll_step("combine_a2a", Coll.ALL_TO_ALL, "ep", values * ACT_BYTES, "ep_a2a", blocked=blocked)
        if fp8:  # the backward swaps the payloads: each direction keeps its dtype
            dispatch, combine = (replace(dispatch, meta=(("backward_call", combine.collective),)),
                                 replace(combine, meta=(("backward_call", dispatch.collective),)))
        return [dispatch], [combine]

    def _experts(self, routed: int, batched: bool = False) -> list[Step]:
        """The routed experts' GEMMs on this rank; ``batched``: run as one batched dense GEMM
        over the padded capacity (the mask-einsum path's EBCM,EMH->EBCH)."""
        m, plan = self.model, self.plan
        tokens, speed = slowest_expert_rank(m, plan, routed, self.routing, self.ep_speeds)
        if self._pads():  # dense dispatch computes the padding
            tokens = (expert_capacity(m, plan, routed),) * len(tokens)
        loads = tuple(x * plan.etp for x in tokens)
        meta = (("speed", speed),) if speed != 1.0 else ()  # the EP rank's own GPU speed
        if batched:
            meta += (("batched", True),)
        width = m.expert_ffn_hidden_size // plan.etp
        up = width * (2 if m.gated_mlp else 1)
        received = sum(loads)
        steps = []
        if plan.etp > 1:
            steps.append(coll_step("etp_ag", Coll.ALL_GATHER, "etp", received * m.hidden_size * ACT_BYTES, "tp_comm"))
        # the stack's grouped-GEMM library (its GPU table where fitted); a batched einsum is dense
        library = (("grouped_library", plan.stack.kernels.grouped),) if plan.stack.kernels.grouped and not batched else ()
        pad, unpad = self._fp8_padding(tokens, received, meta)
        steps += pad
        steps += self._fp8(replace(_grouped("expert_up", loads, up, m.hidden_size), meta=meta + library))
        steps.append(replace(elementwise_step("expert_act", received * (up + width) * ACT_BYTES, "activation"), meta=meta))
        steps += self._unfused_act("expert_act", received, width, meta)
        steps += self._fp8(replace(_grouped("expert_down", loads, m.hidden_size, width), meta=meta + library))
        steps += unpad
        if plan.etp > 1:
            steps.append(coll_step("etp_rs", Coll.REDUCE_SCATTER, "etp", received * m.hidden_size * ACT_BYTES, "tp_comm"))
        return steps

    def _fp8_padding(self, tokens: tuple, received: float, meta: tuple) -> tuple[list[Step], list[Step]]:
        """The copies a stack's FP8 grouped GEMMs need where a per-expert token count is not a
        multiple of ``stack.fp8.grouped_pad_align`` (Megatron-Core TEGroupedMLP's fp8_padding
        before the first expert GEMM, fp8_unpadding after the last): the received tokens read
        and written once each way, and the same copies of their gradients in the backward.
        Dropless routing's counts are data-dependent, so they are taken as unaligned; a
        padded capacity is checked. None under BF16 or where the stack's kernels take any split."""
        align = self.stack.fp8.grouped_pad_align
        if not (self.fp8 and align) or (self._pads() and not any(x % align for x in tokens)):
            return [], []
        copy = 2 * received * self.model.hidden_size * ACT_BYTES
        steps = [replace(elementwise_step(name, copy, "moe_permute"), meta=meta + (("backward_bytes", copy),))
                 for name in ("fp8_pad", "fp8_unpad")]
        return steps[:1], steps[1:]

    def embedding_forward(self) -> list[Step]:
        return self._kernel_speed([elementwise_step("embedding", 2 * self.local_tokens * self.model.hidden_size * ACT_BYTES, "embedding")])

    def head_forward(self) -> list[Step]:
        """The final norm, the LM head (vocabulary-parallel) and the cross-entropy; with MTP
        layers (``plan.mtp_layers``) the head and the loss once more per MTP layer on its
        output (Megatron-Core computes each MTP depth's logits and loss on the loss stage,
        with the shared output layer)."""
        m, tp = self.model, self.plan.tp
        steps = [*self._norms("final_norm")]
        for depth in range(1 + self.plan.mtp_layers):
            prefix = f"mtp{depth}_" if depth else ""
            steps += self._tp_enter(f"{prefix}head")
            head = gemm_step(f"{prefix}lm_head", self.tokens, m.hidden_size, m.vocab_size // tp, "lm_head")
            steps.append(replace(head, meta=(("dtype", "bf16"),)) if self.fp8 else head)  # FP8 recipes keep the head BF16
            steps.append(elementwise_step(f"{prefix}loss", 3 * self.tokens * m.vocab_size // tp * LOGIT_BYTES, "loss"))
            if not self.stack.fused("loss"):  # softmax written out, read back by the NLL kernel
                steps.append(elementwise_step(f"{prefix}loss_unfused", 2 * self.tokens * m.vocab_size // tp * LOGIT_BYTES,
                                              "loss"))
        return self._kernel_speed(steps)

    def mtp_forward(self) -> list[Step]:
        """What an MTP layer runs before its transformer layer (DeepSeek-V3 sec. 2.2;
        Megatron-Core MultiTokenPredictionLayer): the embedding of the tokens one further
        ahead (a lookup, as ``embedding_forward``), an RMSNorm of it and one of the hidden
        state, the two joined ([tokens, 2h]), and the 2h -> h projection, a column-parallel
        linear: its input gathered over the sequence shards, its output gathered over the
        TP ranks' columns (and split back to sequence shards, no traffic)."""
        m, tp = self.model, self.plan.tp
        h = m.hidden_size
        steps = [elementwise_step("mtp_embedding", 2 * self.local_tokens * h * ACT_BYTES, "embedding"),
                 *self._norms("mtp_enorm"), *self._norms("mtp_hnorm"),
                 elementwise_step("mtp_concat", 4 * self.local_tokens * h * ACT_BYTES, "mtp")]
        if self.sp:
            steps.append(coll_step("mtp_eh_proj_ag", Coll.ALL_GATHER, "tp", self.tokens * 2 * h * ACT_BYTES, "tp_comm"))
        steps += self._fp8(gemm_step("mtp_eh_proj", self.tokens, 2 * h, h // tp, "mtp"))
        if tp > 1:
            steps.append(coll_step("mtp_eh_proj_gather", Coll.ALL_GATHER, "tp", self.tokens * h * ACT_BYTES, "tp_comm"))
        return steps

    def layer_forward(self, layer: int) -> list[Step]:
        """A decoder layer's forward; an MTP layer (index >= the model's layers) is
        ``mtp_forward``, a layer like the model's last, and its own final norm."""
        m = self.model
        mlp = self.moe_forward() if is_moe_layer(m, layer) else self.mlp_forward()
        mtp = is_mtp_layer(m, layer)
        body = self.attention_forward(m.attention_window(layer)) + mlp
        steps = self._kernel_speed((self.mtp_forward() if mtp else []) + body + (self._norms("mtp_final_norm") if mtp else []))
        return steps + self._host_overhead(steps)



def _casts_before_gather(steps: list[Step]) -> list[Step]:
    """FP8 casts that follow a sequence-parallel all-gather move in front of it
    (Transformer Engine gathers the FP8 tensor), so the gather stays next to the GEMM it
    feeds (``overlap_tp_comm``)."""
    out = list(steps)
    for i, step in enumerate(out):
        if step.kind is OpKind.COLLECTIVE and step.collective.coll is Coll.ALL_GATHER:
            j = i + 1
            while j < len(out) and out[j].category == "fp8_cast":
                j += 1
            out[i:j] = out[i + 1:j] + [step]
    return out


def _grouped(name: str, loads: tuple[int, ...], n: int, k: int) -> Step:
    g = Gemm(m=max(max(loads, default=1), 1), n=n, k=k)
    flops = sum(2.0 * x * n * k for x in loads)
    return Step(name=name, kind=OpKind.GROUPED_GEMM, stream=Stream.COMPUTE, category="experts", flops=flops, gemm=g, grouped=loads)


def ring_attention(core: Step, cp: int, block_bytes: float, backward_pass: bool = False) -> list[Step]:
    """Ring attention (Liu'23; Megatron-Core context parallelism): the attention core in
    ``cp`` blocks, one per KV shard; while block i computes, the KV shard for block i+1
    arrives from the ring neighbour (cp-1 p2p steps, each overlapped with a block).
    Backward also passes the dK/dV accumulators around: twice the bytes per step.

    Off-chain steps (meta ``offchain``) start with the preceding compute and run on the
    cp stream; a step marked ``join`` also waits for the oldest off-chain step not yet
    joined: hop i starts when block i-1 frees its buffer (double buffering) and block i
    waits for hop i-1."""
    seq = dict(core.meta).get("seq")
    per_block = (("seq", seq / cp),) if seq else ()  # each block attends over one KV shard
    block = replace(core, flops=core.flops / cp, bytes=core.bytes / cp,
                    meta=core.meta + per_block + (("ring", cp), ("ring_bytes", block_bytes)))
    size = block_bytes * (2 if backward_pass else 1)
    suffix = "_bwd" if backward_pass else ""
    steps = []
    for i in range(cp):
        if i < cp - 1:
            hop = coll_step(f"cp_ring_kv{suffix}", Coll.SEND_RECV, "cp", size, "cp_comm")
            steps.append(replace(hop, kind=OpKind.P2P, meta=(("offchain", True), ("ring", cp), ("ring_bytes", block_bytes))))
        meta = block.meta + ((("join", True),) if i > 0 else ())
        steps.append(replace(block, name=f"{core.name}{suffix}", meta=meta))
    return steps


def _meta(step: Step, key: str, default=None):
    return dict(step.meta).get(key, default)


def backward(steps: list[Step]) -> list[Step]:
    """The backward chain of a forward chain: reversed, GEMMs dgrad+wgrad, comm mirrored;
    a ring-attention region is re-expanded as a backward ring."""
    out, i = [], len(steps) - 1
    while i >= 0:
        step = steps[i]
        cp = _meta(step, "ring")
        if cp is None:
            if _meta(step, "backward_bytes") != 0.0:  # an FP8 amax with nothing to read in the backward: no kernel
                out.append(_backward_step(step))
            i -= 1
            continue
        core = next(s for s in steps[i - 2 * cp + 2:i + 1] if s.kind is OpKind.ATTENTION)
        bare = dict(core.meta)
        bare.pop("ring"), bare.pop("join", None)
        block_bytes = bare.pop("ring_bytes")
        if "seq" in bare:
            bare["seq"] *= cp  # back to the whole sequence; ring_attention splits it again
        whole = replace(core, flops=core.flops * cp, bytes=core.bytes * cp, meta=tuple(bare.items()))
        out += ring_attention(_backward_step(whole), cp, block_bytes, backward_pass=True)
        i -= 2 * cp - 1
    return out


def split_weight_grads(chain: list[Step]) -> tuple[list[Step], list[Step]]:
    """Split a backward chain into the input-gradient chain B (GEMMs do dgrad only) and
    the weight-gradient chain W (the wgrad GEMMs), for zero-bubble schedules (Qi'23)."""
    inputs, weights = [], []
    for step in chain:
        if step.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM) and step.gemm.batch == 2:
            half = replace(step, flops=step.flops / 2, gemm=replace(step.gemm, batch=1))
            bare = tuple(kv for kv in step.meta if kv[0] != "grad")
            inputs.append(replace(half, meta=bare + (("grad", "dgrad"),)))
            weights.append(replace(half, name=step.name.replace("_bwd", "_wgrad"), meta=bare + (("grad", "wgrad"),)))
        else:
            inputs.append(step)
    return inputs, weights


def _backward_step(step: Step) -> Step:
    name = f"{step.name}_bwd"
    if step.kind is OpKind.GEMM and _flag(step, "input_grad_only"):  # no weight: the input gradient alone
        return replace(step, name=name, meta=step.meta + (("grad", "dgrad"),))
    if step.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM):  # dgrad + wgrad (costs.gemm_backward_time)
        return replace(step, name=name, flops=2 * step.flops, gemm=replace(step.gemm, batch=2),
                       meta=step.meta + (("grad", "both"),))
    if step.kind is OpKind.ATTENTION:
        return replace(step, name=name, flops=ATTN_BWD_FACTOR * step.flops, bytes=2 * step.bytes,
                       meta=step.meta + (("backward", True),))
    if step.kind is OpKind.COLLECTIVE:
        call = _meta(step, "backward_call") or step.collective
        mirrored = replace(call, coll=_BACKWARD_COLL.get(call.coll, call.coll))
        if call.group == "cp":  # ring attention backward sends dK, dV back: a reduce-scatter
            mirrored = replace(call, coll=Coll.REDUCE_SCATTER)
        return replace(step, name=name, collective=mirrored)
    backward_bytes = _meta(step, "backward_bytes")  # an FP8 cast: the output gradient's cast (``_fp8``)
    return replace(step, name=name, bytes=2 * step.bytes if backward_bytes is None else backward_bytes)


def _is_tp_comm(step: Step) -> bool:
    return step.kind is OpKind.COLLECTIVE and step.collective.group == "tp"


def _flag(step: Step, key: str) -> bool:
    return bool(_meta(step, key, False))


def summed_dgrad_gemms(model: ModelSpec) -> frozenset[str]:
    """The backward GEMM steps whose input gradient is a sum over separate matmuls when the
    model code runs each projection on its own (torchtitan's Llama: wq, wk, wv; w1, w3 for a
    gated MLP, a dense layer's or the shared experts'; MLA: the query path and wkv_a both read
    the normed input, the first of them being the step the TP all-gather feeds, ``q`` or
    ``q_down``): their reduce-scatter drains a sum, not one matmul."""
    attention = ("q_bwd", "q_down_bwd") if model.attention is AttentionKind.MLA else ("qkv_bwd",)
    return frozenset({*attention, *(("mlp_up_bwd", "shared_up_bwd") if model.gated_mlp else ())})


def overlap_tp_comm(steps: list[Step], share: float = 1.0, blocking: frozenset[str] = frozenset()) -> list[Step]:
    """Tensor-parallel communication overlap (Megatron-Core ``--tp-comm-overlap``): an
    all-gather feeding a GEMM, or a reduce-scatter draining one, runs off the chain beside
    that GEMM; the step after the GEMM waits for both. Chunked pipelining is taken as full
    concurrency: the pair costs max(GEMM, comm). ``share`` (the stack's
    ``overlap.tp_comm_share``): the part of the comm's bytes that runs beside the GEMM; the
    rest is a blocking call on the chain (before an all-gather's GEMM, after a
    reduce-scatter's). Regions with ring-attention hops in flight, and a comm with no step
    after its GEMM, stay blocking; so does a reduce-scatter draining a GEMM named in
    ``blocking`` (``summed_dgrad_gemms``, where the stack's overlap cannot pipeline a sum)."""
    out, pending, i = [], 0, 0
    while i < len(steps):
        step = steps[i]
        pending += _flag(step, "offchain") - (_flag(step, "join") and pending > 0)
        pair = _overlap_pair(steps, i) if pending == 0 else None
        if pair is not None and pair[1].name in blocking and pair[0].collective.coll is Coll.REDUCE_SCATTER:
            pair = None
        if pair is None:
            out.append(step)
            i += 1
            continue
        comm, gemm, after = pair
        hidden, exposed = _split_hidden(comm, share)
        before, behind = (exposed, []) if steps[i] is comm else ([], exposed)
        out += [*before, hidden, gemm, *behind, replace(after, meta=after.meta + (("join", True),))]
        i += 3
    return out


def overlap_ep_comm(steps: list[Step], share: float = 1.0, backward: bool = False) -> list[Step]:
    """Expert-parallel all-to-all overlap (Megatron-Core ``--overlap-moe-expert-parallel-comm``,
    Megatron-Bridge ``moe_a2a_overlap``): its combined 1F1B step runs one microbatch's forward
    of a layer beside another microbatch's backward of it, on two streams, in pairs
    (its combined-1F1B schedule plan's schedule_layer_1f1b): the
    forward's attention and router beside the backward's combine all-to-all, the backward's
    experts beside the forward's dispatch, the forward's experts beside the backward's
    dispatch, the backward's attention beside the forward's combine; each all-to-all waits
    for the compute that feeds it, so each pair lasts the longer of its two. Within one pass
    (a forward chain of attention, dispatch, experts, combine; a backward chain of combine,
    experts, dispatch, attention, the all-to-alls mirrored at the same sizes) that is each
    all-to-all off the chain beside one block of compute, joined at that block's end: in the
    forward the block before it (since the last all-to-all, or the layer's start), in the
    backward the block after it (to the next all-to-all, or the layer's end), so that the two
    passes together pair every block with one all-to-all as the merged step does. ``share``
    (the stack's ``overlap.ep_comm_share``): the part of each all-to-all's bytes hidden so;
    the rest is a blocking call where the all-to-all was."""
    at = [i for i, step in enumerate(steps) if step.category == "ep_a2a" and step.collective is not None]
    if not at:
        return steps
    bounds = [-1, *at, len(steps)]
    # the block each all-to-all runs beside: (first, last + 1) step indices of the chain; one
    # with no compute beside it (two all-to-alls in a row, one at the chain's edge) stays blocking
    spans = {i: (bounds[k + 1] + 1, bounds[k + 2]) if backward else (bounds[k] + 1, i) for k, i in enumerate(at)}
    blocks = {i: (first, last) for i, (first, last) in spans.items() if first < last}
    split = {i: _split_hidden(steps[i], share) for i in blocks}
    starts = {first: i for i, (first, _) in blocks.items()}
    ends = {last: i for i, (_, last) in blocks.items()}
    out = []
    for j in range(len(steps) + 1):
        if j in ends:  # the block beside an all-to-all ends here: wait for it
            wait = host_step(f"{steps[ends[j]].name}_wait", 0.0, "ep_a2a")
            out.append(replace(wait, meta=wait.meta + (("join", True),)))
        if j in starts:
            out.append(split[starts[j]][0])
        if j < len(steps):  # an all-to-all's own place keeps only its exposed part
            out += split[j][1] if j in split else [steps[j]]
    return out


def overlap_shared_experts(steps: list[Step], backward: bool = False) -> list[Step]:
    """Megatron-Core ``--moe-shared-expert-overlap``: the shared experts run on a stream of
    their own beside the expert-parallel exchange, their input's TP gather, up projection and
    activation beside the dispatch all-to-all, their down projection and its TP scatter beside
    the combine (in the backward chain, where the exchanges come mirrored, the down
    projection's gradients and the gather in front of them beside the combine's, the rest
    beside the dispatch's). Each all-to-all runs off the chain beside its part of the shared
    MLP and the step after that part waits for it. A chain without two all-to-alls or without
    the shared block (``LayerBuilder._tp_mlp`` named ``shared``) is returned as it is."""
    a2a = [i for i, step in enumerate(steps) if step.category == "ep_a2a" and step.collective is not None]
    block = [i for i, step in enumerate(steps) if step.name.startswith("shared_")]
    if len(a2a) < 2 or not block or block != list(range(block[0], block[-1] + 1)):
        return steps
    shared = steps[block[0]:block[-1] + 1]
    down = [i for i, step in enumerate(shared) if step.name.startswith("shared_down")]
    cut = down[-1] + 1 if backward else down[0]
    parts = {a2a[0]: shared[:cut], a2a[-1]: shared[cut:]}
    out = []
    for i, step in enumerate(steps):
        if block[0] <= i <= block[-1]:
            continue
        if i not in parts:
            out.append(step)
            continue
        wait = host_step(f"{step.name}_wait", 0.0, "ep_a2a")
        out += [replace(step, meta=step.meta + (("offchain", True),)), *parts[i],
                replace(wait, meta=wait.meta + (("join", True),))]
    return out


def _split_hidden(comm: Step, share: float) -> tuple[Step, list[Step]]:
    """An overlapped collective split by ``share`` (a stack's ``overlap.*_share``): the part
    that runs off the chain (``offchain``) and, below 1, the rest as a blocking call
    (``<name>_exposed``) for the caller to place where the collective was."""
    hidden = replace(comm, meta=comm.meta + (("offchain", True),))
    if share >= 1.0:
        return hidden, []
    call = comm.collective
    return (replace(hidden, collective=replace(call, size_bytes=call.size_bytes * share)),
            [replace(comm, name=f"{comm.name}_exposed", collective=replace(call, size_bytes=call.size_bytes * (1.0 - share)))])


def _overlap_pair(steps: list[Step], i: int) -> tuple[Step, Step, Step] | None:
    """(comm, gemm, step after) when steps[i:i+3] is comm->GEMM->x or GEMM->comm->x."""
    if i + 2 >= len(steps):
        return None
    a, b, after = steps[i], steps[i + 1], steps[i + 2]
    if _flag(after, "offchain") or _flag(after, "join"):
        return None
    if _is_tp_comm(a) and b.kind is OpKind.GEMM:
        return a, b, after
    if a.kind is OpKind.GEMM and _is_tp_comm(b):
        return b, a, after
    return None


def op_linears(model: ModelSpec) -> list[tuple[str, str, int, bool]]:
    """A dense layer's linear layers in the order torchtitan's Llama calls them (wq, wk, wv,
    wo, then w1, w3 for a gated MLP, w2): (perfsim GEMM step, name, output width, kept),
    where ``kept`` is what per-op selective checkpointing does with its output: it counts the
    matmuls of a layer's forward and keeps every other one's (the 1st, 3rd, ...), recomputing
    the rest (torchtitan activation checkpointing, selective_ac_option = "op")."""
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    h, w = model.hidden_size, model.ffn_hidden_size
    calls = [("qkv", "wq", q), ("qkv", "wk", kv), ("qkv", "wv", kv), ("attn_out", "wo", h), ("mlp_up", "w1", w)]
    calls += [("mlp_up", "w3", w)] if model.gated_mlp else []
    calls += [("mlp_down", "w2", h)]
    return [(step, name, width, i % 2 == 0) for i, (step, name, width) in enumerate(calls)]


def _op_recompute_share(model: ModelSpec) -> dict[str, float]:
    """Per fused GEMM step, the share of its output width per-op checkpointing recomputes."""
    total, redo = {}, {}
    for step, _, width, kept in op_linears(model):
        total[step] = total.get(step, 0) + width
        redo[step] = redo.get(step, 0) + (0 if kept else width)
    return {step: redo[step] / total[step] for step in total}


def _op_picked(forward: list[Step], model: ModelSpec) -> list[Step]:
    """What per-op checkpointing re-runs of a dense layer's forward: the elementwise steps
    (norms, activation, casts), the TP all-gathers (only reduce-scatters are kept), and the
    recomputed matmuls' part of each fused GEMM; never the attention core (kept)."""
    share = _op_recompute_share(model)
    picked = []
    for s in forward:
        if s.kind is OpKind.ATTENTION:
            continue
        if s.collective is not None:  # the CP ring's K/V hops belong to the kept attention
            if s.collective.coll is not Coll.REDUCE_SCATTER and s.collective.group != "cp":
                picked.append(s)
            continue
        if s.kind is OpKind.GEMM and s.gemm is not None:
            part = share.get(s.name, 1.0)
            if part > 0:
                g = replace(s.gemm, n=max(1, round(s.gemm.n * part)))
                picked.append(replace(s, gemm=g, flops=g.flops))
            continue
        picked.append(s)
    return picked


# MLA's up projections (``ModelSpec.attention_linears``): the query's, or its one projection
# without a query latent, and the keys' and values'
MLA_UP_LINEARS = ("q", "q_up", "kv_up")


def _tp_mlp_steps(name: str) -> tuple[str, ...]:
    """The steps ``LayerBuilder._tp_mlp`` names after ``name`` (its gather, up GEMM,
    activation and unfused SwiGLU pass, down GEMM, reduce-scatter or all-reduce)."""
    return tuple(f"{name}_{part}" for part in ("ag", "up", "act", "act_unfused", "down", "rs", "ar"))


# the forward steps each --recompute-modules module re-runs (plan.RECOMPUTE_MODULES; the
# attention core by kind): MLA's up projections and the rope after them, an MoE layer's
# pre-MLP norm (the other norms are fused into the linear after them under Megatron-Core's
# Transformer Engine spec), the routed experts' activation, the shared experts with their TP
# collectives, and a dense layer's whole MLP, its fused norm and TP collectives with it
MODULE_STEPS = {"mla_up_proj": (*MLA_UP_LINEARS, "rope"), "layernorm": ("moe_norm",),
                "moe_act": ("expert_act", "expert_act_unfused"), "shared_experts": _tp_mlp_steps("shared"),
                "mlp": ("mlp_norm", *_tp_mlp_steps("mlp"))}


def _module_picked(forward: list[Step], modules: tuple[str, ...]) -> list[Step]:
    """What selective recompute of ``modules`` re-runs of a layer's forward, in its order, a
    re-run GEMM with its FP8 casts: ``moe`` the whole MoE part after its norm (router,
    dispatch, experts, combine)."""
    names = {name for m in modules for name in MODULE_STEPS.get(m, ())}
    names |= {f"{name}_{cast}" for name in names for cast in FP8_CAST_STEPS}  # the rerun casts its input again
    moe_from = next((i for i, s in enumerate(forward) if s.name == "moe_norm"), None) if "moe" in modules else None
    picked = []
    for i, s in enumerate(forward):
        if ("core_attn" in modules and s.kind is OpKind.ATTENTION) or s.name in names \
                or (moe_from is not None and i > moe_from and s.category != "framework"):
            picked.append(s)
    return picked


def recompute_steps(forward: list[Step], recompute: Recompute, model: ModelSpec,
                    modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES) -> list[Step]:
    """The forward work re-run in front of a layer's backward: all of it (full), the
    selective ``modules`` (default the attention cores; ``_module_picked``) or what per-op
    checkpointing does not keep (op, ``_op_picked``); compute re-run counts as ``recompute``."""
    if recompute == Recompute.FULL:
        picked = forward
    elif recompute == Recompute.SELECTIVE:
        picked = _module_picked(forward, modules)
    elif recompute == Recompute.OP:
        picked = _op_picked(forward, model)
    else:
        return []
    return [replace(s, name=f"{s.name}_recompute",
                    category="recompute" if s.stream is Stream.COMPUTE else s.category) for s in picked]


def routed_tokens(model: ModelSpec, plan: ParallelPlan) -> int:
    """Routed token copies one EP rank sends per microbatch and MoE layer."""
    return LayerBuilder(model, plan).local_tokens * model.top_k
