"""Lowering model + plan into one op graph per pipeline stage.

Every data/tensor-parallel replica of a stage runs the same program, so the graph holds
one representative rank per pipeline stage. Within a microbatch the ops of a block form
a chain; data-parallel gradient reduction and ZeRO parameter gathers run on their own
stream, overlapped with compute where Megatron-Core overlaps them.
"""

from dataclasses import dataclass, field, replace

from perfsim import units
from perfsim.lowering.layers import (
    LayerBuilder,
    Step,
    backward,
    coll_step,
    overlap_ep_comm,
    overlap_shared_experts,
    overlap_tp_comm,
    recompute_steps,
    split_weight_grads,
    summed_dgrad_gemms,
)
from perfsim.model.spec import ModelSpec
from perfsim.lowering.ops import Coll, Op, OpKind, Stream
from perfsim.lowering.steps import host_step
from perfsim.plan.parallel import ParallelPlan, Recompute
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.schedules import (BWD, FWD, UNIT, WGT, splits_backward, stage_of, stage_order,
                                    virtual_stage)
from perfsim.plan.sharding import (NORM_BYTES, REDUCE_GRAD_BYTES, block_param_bytes, chunk_blocks, chunk_layers,
                                   clip_bytes, embedding_sync_params, ends_grad_bytes, gathers_in, is_moe_layer,
                                   is_mtp_layer, layer_grad_bytes, optimizer_bytes, recomputes)


@dataclass
class OpGraph:
    model: ModelSpec
    plan: ParallelPlan
    ops: list[Op] = field(default_factory=list)
    num_microbatches: int = 0  # microbatches actually lowered (may be fewer than the plan's)

    @property
    def num_stages(self) -> int:
        return self.plan.pp


def _dp_step(name: str, coll: Coll, group: str, size: float, category: str) -> Step:
    """A data-parallel collective. Parameter all-gathers and gradient reductions run on
    separate queues, as PyTorch FSDP2 (its own all-gather and reduce-scatter streams) and
    Megatron-Core's distributed optimizer (``overlap_param_gather`` beside
    ``overlap_grad_reduce``) run them: a reduce-scatter never holds a prefetch back in
    line; both share the rank's links (the engine divides them max-min fairly)."""
    step = coll_step(name, coll, "tp", size, category)
    stream = Stream.DP_GATHER if coll is Coll.ALL_GATHER else Stream.DP_COMM
    return replace(step, stream=stream, collective=replace(step.collective, group=group))


class _Builder:
    def __init__(self, model: ModelSpec, plan: ParallelPlan, routing: RoutingSpec, ep_speeds=None):
        self.model, self.plan = model, plan
        self.graph = OpGraph(model=model, plan=plan)
        self.layers = LayerBuilder(model, plan, routing, ep_speeds)
        self.blocks: dict = {}  # (is_moe, recompute, is_mtp) / "head" / "embedding" -> (F, B, W) steps
        self.split = splits_backward(plan)
        self.bucket: dict[int, dict[str, float]] = {s: {} for s in range(plan.pp)}
        self.last: dict[int, int] = {}  # stage -> last op of its compute chain
        self.marks: dict[int, list[int]] = {s: [-1, -1] for s in range(plan.pp)}  # layer boundaries
        self.p2p: dict[tuple, int] = {}  # (phase, microbatch, virtual stage) -> send op
        self.grad_ops: dict[int, list[int]] = {s: [] for s in range(plan.pp)}
        self.last_vs = plan.pp * plan.vpp - 1
        self.phase = FWD
        self.deferred: dict[int, list[int]] = {s: [] for s in range(plan.pp)}
        self.grad_mb = 0  # the microbatch whose gradients are being reduced (plan.grad_syncs > 1)
        self.mb_grads = 0  # how many of stage 0's grad_ops came before this microbatch's (grad_syncs > 1: pp 1)

    def add(self, stage: int, step: Step, deps: tuple[int, ...], mb: int, layer: int) -> int:
        op = Op(
            op_id=len(self.graph.ops), stage=stage, name=step.name, kind=step.kind, stream=step.stream,
            category=step.category, deps=tuple(d for d in deps if d >= 0), flops=step.flops, bytes=step.bytes,
            gemm=step.gemm, grouped=step.grouped, collective=step.collective, microbatch=mb, layer=layer,
            phase=self.phase, meta=dict(step.meta),
        )
        self.graph.ops.append(op)
        return op.op_id

    def chain(self, stage: int, steps: list[Step], deps: tuple[int, ...], mb: int, layer: int) -> int:
        """Append ``steps`` to the stage's compute chain; an ``offchain`` step starts
        with the chain but does not block it, a ``join`` step also waits for the oldest
        off-chain step not yet joined (ring attention)."""
        prev, sides = self.last.get(stage, -1), []
        for step in steps:
            if ("offchain", True) in step.meta:
                sides.append(self.add(stage, step, (prev, *deps), mb, layer))
                continue
            join = (sides.pop(0),) if ("join", True) in step.meta and sides else ()
            prev = self.add(stage, step, (prev, *deps, *join), mb, layer)
            deps = ()
        self.last[stage] = prev
        self.marks[stage].append(prev)
        return prev

    def _layers(self, stage: int, chunk: int) -> range:
        return chunk_layers(self.model, self.plan, stage, chunk)

    def _block(self, layer: int) -> tuple[list[Step], list[Step], list[Step]]:
        model = self.model
        key = (is_moe_layer(model, layer), recomputes(model, self.plan, layer), is_mtp_layer(model, layer),
               model.attention_window(layer))
        if key not in self.blocks:
            self.blocks[key] = block_passes(self.layers, self.plan, layer, key[1])
        return self.blocks[key]

    def forward_steps(self, layer: int) -> list[Step]:
        return self._block(layer)[0]

    def backward_steps(self, layer: int) -> list[Step]:
        return self._block(layer)[1]

    def weight_steps(self, layer: int) -> list[Step]:
        return self._block(layer)[2]

    def special(self, block: str) -> tuple[list[Step], list[Step], list[Step]]:
        if block not in self.blocks:
            self.blocks[block] = block_passes(self.layers, self.plan, block)
        return self.blocks[block]

    def _groups(self, layer: int, sizes: tuple[float, float]) -> list[tuple[str, float]]:
        plan = self.plan
        degrees = {"dp_cp": plan.dp * plan.cp, "edp": plan.edp}
        return [(g, s) for g, s in zip(("dp_cp", "edp"), sizes) if s > 0 and degrees[g] > 1]

    def grad_reduce(self, stage: int, layer: int) -> None:
        """Gradient buckets (Megatron-Core DDP): a layer's gradients join the open bucket
        of their group (dense dp_cp, expert edp) once its last backward ends; a bucket
        of at least ``grad_bucket_bytes`` is reduced at once, overlapped with the rest of
        the backward (or after the whole backward when reduction is not overlapped)."""
        if not self.plan.overlap_grad_reduce and layer not in self.deferred[stage]:
            self.deferred[stage].append(layer)
            return
        bucket = self.bucket[stage]
        for group, size in self._groups(layer, layer_grad_bytes(self.model, self.plan, layer)):
            bucket[group] = bucket.get(group, 0.0) + size
            if bucket[group] >= self.plan.grad_bucket_bytes:
                self._reduce_bucket(stage, group, bucket.pop(group), layer)

    def _reduce_bucket(self, stage: int, group: str, size: float, layer: int) -> None:
        coll = Coll.ALL_REDUCE if self.plan.step_zero == 0 else Coll.REDUCE_SCATTER
        step = _dp_step(f"grad_{coll}_{group}", coll, group, size, "dp_grad_reduce")
        after = (self.last[stage],)
        mb = self.grad_mb if self.plan.grad_syncs > 1 else self.plan.num_microbatches - 1
        self.grad_ops[stage].append(self.add(stage, step, after, mb, layer))

    def reduce_rest(self, stage: int) -> None:
        """The reductions left when a backward ends: the layers deferred (reduction not
        overlapped), the embedding / LM head gradients joining the last bucket, the open
        buckets flushed."""
        for layer in self.deferred[stage]:
            self.grad_reduce(stage, layer)
        self.deferred[stage].clear()
        ends = ends_grad_bytes(self.model, self.plan, stage)
        if ends and self.plan.dp * self.plan.cp > 1:
            self.bucket[stage]["dp_cp"] = self.bucket[stage].get("dp_cp", 0.0) + ends
        self.flush_buckets(stage)

    def sync_grads(self, stage: int, mb: int) -> None:
        """A microbatch's own gradient reduction (``plan.grad_syncs`` > 1) when its backward
        ends: the rest reduced, then the stage's compute waits for every reduction of the
        microbatch before the next one starts (FSDP2 finalize_backward)."""
        self.reduce_rest(stage)
        ops = tuple(self.grad_ops[stage][self.mb_grads:])
        self.mb_grads = len(self.grad_ops[stage])
        if ops:
            self.chain(stage, [host_step("grad_reduce_wait", 0.0, "optimizer")], ops, mb, -1)  # no work: a wait

    def flush_buckets(self, stage: int) -> None:
        for group, size in sorted(self.bucket[stage].items()):
            self._reduce_bucket(stage, group, size, -1)
        self.bucket[stage].clear()

    def param_gather(self, stage: int, block: int | str, phase: str, mb: int) -> tuple[int, ...]:
        """ZeRO parameter all-gathers the block (a layer, the embedding or the LM head) must
        wait for: ZeRO-1/2 once per step before the first forward (updated weights), ZeRO-3
        before every pass that needs the weights (``sharding.gathers_in``), prefetched one
        block ahead (``overlap_param_gather``; off: issued when the block before ends)."""
        plan = self.plan
        if plan.step_zero == 0 or (plan.step_zero < 3 and (phase == BWD or mb > 0 or not plan.weights_gathered_ahead)):
            return ()
        if not gathers_in(block, phase):
            return ()
        after = (self.marks[stage][-2 if plan.overlap_param_gather else -1],) if plan.step_zero == 3 else ()
        return self._gather_ops(stage, block, after, mb)

    def _gather_ops(self, stage: int, block: int | str, after: tuple, mb: int) -> tuple[int, ...]:
        """One all-gather per data-parallel group of the block's weights, after ``after``."""
        layer = block if isinstance(block, int) else -1
        return tuple(self.add(stage, _dp_step(f"param_ag_{group}", Coll.ALL_GATHER, group, size, "dp_param_gather"),
                              after, mb, layer)
                     for group, size in self._groups(block, block_param_bytes(self.model, self.plan, block)))

    def send(self, stage: int, phase: str, mb: int, vs: int, after: int) -> None:
        size = self.layers.local_tokens * self.model.hidden_size * 2
        step = coll_step(f"{'act' if phase == FWD else 'grad'}_send", Coll.SEND_RECV, "tp", size, "pp_p2p")
        step = replace(step, kind=OpKind.P2P, stream=Stream.PP_COMM, collective=replace(step.collective, group="pp"))
        self.p2p[(phase, mb, vs)] = self.add(stage, step, (after,), mb, -1)

    def chunk_forward(self, stage: int, mb: int, chunk: int, deps: tuple) -> int:
        self.phase = FWD
        for block in chunk_blocks(self.model, self.plan, stage, chunk):
            layer = block if isinstance(block, int) else -1
            steps = self.forward_steps(block) if layer >= 0 else self.special(block)[0]
            self.chain(stage, steps, deps + self.param_gather(stage, block, FWD, mb), mb, layer)
            deps = ()
        return self.last[stage]

    def chunk_backward(self, stage: int, mb: int, chunk: int, deps: tuple) -> int:
        self.phase = BWD
        vs = virtual_stage(self.plan.schedule, self.plan.pp, stage, chunk)
        if vs == self.last_vs:
            self.chain(stage, self.special("head")[1], deps + self.param_gather(stage, "head", BWD, mb), mb, -1)
            deps = ()
        self.grad_mb = mb
        every = self.plan.grad_syncs > 1
        for layer in reversed(self._layers(stage, chunk)):
            self.chain(stage, self.backward_steps(layer), deps + self.param_gather(stage, layer, BWD, mb), mb, layer)
            deps = ()
            if (mb == self.plan.num_microbatches - 1 or every) and not self.split:
                self.grad_reduce(stage, layer)
                self.phase = BWD
        if vs == 0:
            self.chain(stage, self.special("embedding")[1], deps, mb, -1)
        if every and mb < self.plan.num_microbatches - 1:
            self.sync_grads(stage, mb)
        return self.last[stage]

    def chunk_weights(self, stage: int, mb: int, chunk: int) -> int:
        """The deferred weight-gradient pass W of a split backward (zb-h1)."""
        self.phase = WGT
        vs = virtual_stage(self.plan.schedule, self.plan.pp, stage, chunk)
        if vs == self.last_vs:
            self.chain(stage, self.special("head")[2], (), mb, -1)
        for layer in reversed(self._layers(stage, chunk)):
            self.chain(stage, self.weight_steps(layer), (), mb, layer)
            if mb == self.plan.num_microbatches - 1:
                self.grad_reduce(stage, layer)
                self.phase = WGT
        return self.last[stage]

    def optimizer(self, stage: int) -> None:
        """Deferred gradient reductions, the Adam step, then (without overlap) the ZeRO
        parameter all-gather of the updated weights, all exposed."""
        self.phase = "optimizer"
        self.grad_mb = self.plan.num_microbatches - 1
        self.reduce_rest(stage)  # the embedding / LM head join the last bucket
        steps = optimizer_steps(self.model, self.plan, stage) + input_steps(self.plan)
        end = self.chain(stage, steps, tuple(self.grad_ops[stage]), -1, -1)
        if self.plan.step_zero in (1, 2) and not self.plan.weights_gathered_ahead:
            gathers = [op for chunk in range(self.plan.vpp) for block in chunk_blocks(self.model, self.plan, stage, chunk)
                       for op in self._gather_ops(stage, block, (end,), -1)]
            if gathers:
                self.chain(stage, [_barrier()], tuple(gathers), -1, -1)


def optimizer_steps(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[Step]:
    """The optimizer phase's chain after the last gradient reduction: the word-embedding
    copy's gradient all-reduce over the embedding group where the stage takes part
    (``embedding_sync_params``), the gradient clip, then the Adam step (the closed form
    prices this same chain)."""
    adam = Step(name="optimizer_step", kind=OpKind.OPTIMIZER, stream=Stream.COMPUTE, category="optimizer",
                bytes=optimizer_bytes(model, plan, stage))
    shared = embedding_sync_params(model, plan, stage)
    sync = [_dp_step("embedding_grad_ar", Coll.ALL_REDUCE, "embd", shared * REDUCE_GRAD_BYTES,
                     "embedding_grad_sync")] if shared else []
    return sync + clip_steps(model, plan, stage) + [adam]


def input_steps(plan: ParallelPlan) -> list[Step]:
    """The input pipeline's unhidden host time for the next step's batch, after the
    optimizer step (``input_seconds``; the closed form adds the same seconds); none on
    synthetic data or where the stack's pipeline costs nothing."""
    seconds = input_seconds(plan)
    return [host_step("input_pipeline", seconds, "data")] if seconds > 0 else []


def input_seconds(plan: ParallelPlan) -> float:
    """Host seconds of the input pipeline per step on real data (``stack.data``): the step's
    global batch tokens per GPU times the stack's seconds per million tokens (0 on
    synthetic data)."""
    if not plan.real_data:
        return 0.0
    tokens_per_gpu = plan.gbs * plan.seq / (plan.tp * plan.pp * plan.cp * plan.dp)
    return tokens_per_gpu / units.MEGA * plan.stack.data.host_s_per_mtoken


def clip_steps(model: ModelSpec, plan: ParallelPlan, stage: int) -> list[Step]:
    """Gradient clipping before the optimizer step: the local norm and the in-place scale
    (one HBM-bound pass), and, where ZeRO shards the gradients over the data-parallel
    ranks, the scalar all-reduce of the norm over them (latency-bound; without ZeRO every
    rank holds the reduced gradients and only the model-parallel ranks sum, folded in)."""
    if not plan.clip_grad:
        return []
    steps = [Step(name="grad_clip", kind=OpKind.ELEMENTWISE, stream=Stream.COMPUTE, category="optimizer",
                  bytes=clip_bytes(model, plan, stage))]
    if plan.step_zero and plan.dp * plan.cp > 1:
        steps.append(_dp_step("grad_norm_ar", Coll.ALL_REDUCE, "dp_cp", NORM_BYTES, "grad_norm"))
    return steps


def block_passes(layers: LayerBuilder, plan: ParallelPlan, block: int | str,
                 recompute: Recompute | None = None) -> tuple[list[Step], list[Step], list[Step]]:
    """The forward F, backward B and (zb-h1) weight-gradient W chains of one block,
    exactly as the graph lowers them: ``block`` is a layer index, "embedding" or "head".
    A layer's backward is its recompute then its backward, the shared-expert overlap
    (``overlap_shared_experts``) then TP-comm overlap applied to both passes; the LM head's
    backward is split for zero-bubble schedules, the embedding's never. ``recompute``: the
    layer's own (``sharding.recomputes``; default the plan's). The closed form prices these
    same chains."""
    split = splits_backward(plan)
    if block in ("embedding", "head"):
        fwd = layers.embedding_forward() if block == "embedding" else layers.head_forward()
        bwd, wgt = backward(fwd), []
        if block == "head" and split:
            bwd, wgt = split_weight_grads(bwd)
        return fwd, bwd, wgt
    raw = layers.layer_forward(block)
    overlapped = plan.tp_comm_overlap and plan.tp > 1
    share = plan.stack.overlap.tp_comm_share
    fwd, grads = raw, backward(raw)
    if plan.overlaps_shared_experts:  # before the TP overlap, which leaves the regions it opens alone
        fwd, grads = overlap_shared_experts(fwd), overlap_shared_experts(grads, backward=True)
    fwd = overlap_tp_comm(fwd, share) if overlapped else fwd
    bwd = recompute_steps(raw, plan.recompute if recompute is None else recompute, layers.model,
                          plan.recompute_modules) + grads
    blocking = frozenset() if plan.stack.overlap.tp_summed_dgrad else summed_dgrad_gemms(layers.model)
    bwd = overlap_tp_comm(bwd, share, blocking) if overlapped else bwd
    wgt = []
    if split:
        bwd, wgt = split_weight_grads(bwd)
    if plan.overlaps_ep_comm:
        # plans where the overlap cannot run (full recompute of every layer or a block among
        # them) never get here: ``ep_overlap_conflict`` refuses them in validation and the search
        share = plan.stack.overlap.ep_comm_share
        fwd, bwd = overlap_ep_comm(fwd, share), overlap_ep_comm(bwd, share, backward=True)
    return fwd, bwd, wgt


def _barrier() -> Step:
    return Step(name="param_gather_wait", kind=OpKind.ELEMENTWISE, stream=Stream.COMPUTE, category="optimizer")


def _emit(b: _Builder, orders: dict[int, list]) -> None:
    """Emit the stages' schedules interleaved so that every p2p send precedes its
    consumer: a topological order the engine can run stream by stream."""
    cursor = {s: 0 for s in orders}
    while any(cursor[s] < len(orders[s]) for s in orders):
        progressed = False
        for stage, order in orders.items():
            while cursor[stage] < len(order):
                phase, mb, chunk = order[cursor[stage]]
                if phase == WGT:
                    b.chunk_weights(stage, mb, chunk)
                    cursor[stage] += 1
                    progressed = True
                    continue
                vs = virtual_stage(b.plan.schedule, b.plan.pp, stage, chunk)
                src = (FWD, mb, vs - 1) if phase == FWD else (BWD, mb, vs + 1)
                needs = vs > 0 if phase == FWD else vs < b.last_vs
                if needs and src not in b.p2p:
                    break
                deps = (b.p2p[src],) if needs else ()
                emit = b.chunk_forward if phase == FWD else b.chunk_backward
                end = emit(stage, mb, chunk, deps)
                if (vs < b.last_vs) if phase == FWD else (vs > 0):
                    nxt = vs + 1 if phase == FWD else vs - 1
                    if stage_of(b.plan.schedule, b.plan.pp, nxt) == stage:  # the V's turn: the next one is here
                        b.p2p[(phase, mb, vs)] = end
                    else:
                        b.send(stage, phase, mb, vs, end)
                cursor[stage] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule {b.plan.schedule} deadlocks")


def build_graph(
    model: ModelSpec, plan: ParallelPlan, num_microbatches: int | None = None, routing: RoutingSpec = UNIFORM,
    ep_speeds: tuple[float, ...] | None = None, weights: tuple = UNIT,
) -> OpGraph:
    """Lower ``model`` under ``plan`` into the per-stage op graph of one training step.

    ``num_microbatches`` lowers only that many microbatches (identical to the rest);
    the closed-form estimator scales them up, the engine needs them all. ``ep_speeds``
    (relative GPU speed per EP rank, see ``stragglers``) picks the EP rank that ends
    the MoE layer last and, for speed-aware routing, places the experts. ``weights``:
    the passes' relative (F, B, W, send) seconds a V-shape schedule's order is built from
    (``ClosedForm.pass_weights``, so both estimators run the same order).
    """
    built = plan
    if num_microbatches is not None and num_microbatches < plan.num_microbatches:
        built = plan.with_microbatches(num_microbatches)
    b = _Builder(model, built, routing, ep_speeds)
    _emit(b, {s: stage_order(built, s, weights) for s in range(built.pp)})
    for stage in range(built.pp):
        b.optimizer(stage)
    b.graph.plan = plan
    b.graph.num_microbatches = built.num_microbatches
    return b.graph
