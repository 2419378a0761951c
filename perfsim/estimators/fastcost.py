"""Closed-form step time and memory without building an op graph: the search's fast path.

Same formulas as ``analytic.run`` on the lowered graph and ``memory.plan_memory``, but
each distinct block template (dense or MoE layer, embedding, LM head) is lowered by
``layers.LayerBuilder`` and priced by ``pricing.price`` once per ``template_key`` and
multiplied by the layer counts of a stage; data- and pipeline-parallel collectives are
priced once per (collective, size, placement). Per plan only dict look-ups and sums
remain (tens of microseconds instead of ``estimate``'s ~15 ms).

Step (``analytic``): pipeline bubble (``analytic.pipeline_bubble``, Narayanan'21 /
Qi'23) + 2(pp-1) p2p + m (F + B) of the critical stage + exposed DP traffic (a bucket
hides behind the backward, all but one layer's share) + interference + optimizer step.
Agreement with ``perfsim.estimate`` is tested on sampled plans (tests/test_search_fastcost.py).
"""

from dataclasses import dataclass, replace

from perfsim.estimators.analytic import pipeline_bubble
from perfsim.cost.collectives import collective_cost, local_peers
from perfsim.cost.kernels import elementwise_time
from perfsim.lowering.graph import OpGraph
from perfsim.system.hardware import ClusterSpec
from perfsim.lowering.layers import LayerBuilder, Step, backward, split_weight_grads
from perfsim.model.spec import ModelSpec
from perfsim.lowering.ops import Coll, Op, OpKind, Stream
from perfsim.plan.parallel import ParallelPlan, Recompute, group_shape
from perfsim.cost.pricing import price
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.schedules import splits_backward
from perfsim.plan.sharding import is_moe_layer, layer_grad_bytes, layer_param_bytes, optimizer_bytes, stage_layer_ids

BUBBLE = "pipeline_bubble"
GRAD_REDUCE = "dp_grad_reduce"
PARAM_GATHER = "dp_param_gather"
INTERFERENCE = "comm_interference"


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass (F, B or W) of a block for one microbatch: its length on the chain and
    the seconds each category adds to it (a ring hop only its exposed part)."""

    seconds: float
    categories: tuple[tuple[str, float], ...]
    comm: frozenset  # categories that are communication


@dataclass(frozen=True, slots=True)
class Template:
    fwd: Pass
    bwd: Pass  # input gradients (+ recompute); the whole backward unless split
    wgt: Pass  # weight gradients of a split backward (zb-h1), else empty


@dataclass(frozen=True, slots=True)
class _StagePasses:  # what analytic.pipeline_bubble reads of a stage
    fwd: float
    bwd_in: float
    wgt: float

    @property
    def bwd(self) -> float:
        return self.bwd_in + self.wgt


@dataclass(frozen=True, kw_only=True)
class FastEstimate:
    step_time_s: float
    critical_stage: int
    breakdown: dict[str, float]  # seconds by category of the critical stage; sums to the step
    exposed_comm_s: float


def _ops(steps: list[Step], start: int = 0) -> list[Op]:
    return [Op(op_id=start + i, stage=0, name=s.name, kind=s.kind, stream=s.stream, category=s.category,
               flops=s.flops, bytes=s.bytes, gemm=s.gemm, grouped=s.grouped, collective=s.collective,
               microbatch=0, meta=dict(s.meta)) for i, s in enumerate(steps)]


def walk(ops: list[Op]) -> Pass:
    """analytic._walk in totals: off-chain ops (ring hops) run beside the chain and a
    ``join`` op waits for the latest; returns the chain length and its categories."""
    t = side_end = 0.0
    side_cat, cats = "", {}
    for op in ops:
        if op.meta.get("offchain"):
            side_end, side_cat = t + op.duration_s, op.category
            continue
        if op.meta.get("join") and side_end > t:
            cats[side_cat] = cats.get(side_cat, 0.0) + side_end - t
            t = side_end
        cats[op.category] = cats.get(op.category, 0.0) + op.duration_s
        t += op.duration_s
    comm = frozenset(o.category for o in ops if o.stream is not Stream.COMPUTE)
    return Pass(seconds=t, categories=tuple(cats.items()), comm=comm)


def _with_recompute(t: Template, recompute: Recompute, attention_s: float) -> Template:
    """The block with its recompute in front of the backward (graph.backward_steps):
    full re-runs the forward (compute counted as recompute), selective the attention
    cores. Passes add up, so the recompute pass is the forward's (or its cores') time."""
    if recompute == Recompute.NONE:
        return t
    if recompute == Recompute.FULL:
        extra = [(c if c in t.fwd.comm else "recompute", v) for c, v in t.fwd.categories]
        seconds, comm = t.fwd.seconds, t.fwd.comm
    else:
        extra, seconds, comm = [("recompute", attention_s)], attention_s, frozenset()
    cats = dict(t.bwd.categories)
    for c, v in extra:
        cats[c] = cats.get(c, 0.0) + v
    bwd = Pass(seconds=t.bwd.seconds + seconds, categories=tuple(cats.items()), comm=t.bwd.comm | comm)
    return Template(fwd=t.fwd, bwd=bwd, wgt=t.wgt)


def base_key(plan: ParallelPlan) -> tuple:
    """Plan fields a block priced without recompute depends on."""
    return (plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.seq, plan.dtype, plan.sequence_parallel,
            splits_backward(plan))


def template_key(plan: ParallelPlan) -> tuple:
    """Plan fields a block template depends on (not dp, pp, vpp, zero or the batch)."""
    return (plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.seq, plan.dtype, plan.recompute,
            plan.sequence_parallel, splits_backward(plan))


def exposure(total: float, last: float, window: float, num_layers: int, overlapped: bool) -> float:
    """analytic._hidden_exposure: comm hidden behind ``window`` except one layer's share."""
    if total <= 0:
        return 0.0
    if not overlapped:
        return total
    return max(last, total - window * (1 - 1 / num_layers))


class Coster:
    """Fast closed-form costing of many plans of one model on one cluster (memoized)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, routing: RoutingSpec = UNIFORM):
        self.model, self.cluster, self.routing = model, cluster, routing
        self.gpn = cluster.gpus_per_node
        kinds = (["dense"] if model.num_mlp_layers else []) + (["moe"] if model.num_moe_layers else [])
        self.kinds = tuple(kinds)
        self.rep_layer = {"dense": 0, "moe": model.num_dense_layers}
        self._memo: dict = {}

    def _cached(self, key: tuple, make):
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = make()
        return found

    def kind(self, layer: int) -> str:
        return "moe" if is_moe_layer(self.model, layer) else "dense"

    # ---- templates -------------------------------------------------------------------------

    def template(self, plan: ParallelPlan, kind: str) -> Template:
        key = ("tpl", kind, *template_key(plan))
        found = self._memo.get(key)
        if found is None:
            base, attention_s = self._cached(("base", kind, *base_key(plan)), lambda: self._price_template(plan, kind))
            recompute = plan.recompute if kind in ("dense", "moe") else Recompute.NONE
            found = self._memo[key] = _with_recompute(base, recompute, attention_s)
        return found

    def _price_template(self, plan: ParallelPlan, kind: str) -> tuple[Template, float]:
        """The block priced without recompute, and its attention cores' seconds."""
        builder = LayerBuilder(self.model, plan, self.routing)
        if kind == "embedding":
            fwd = builder.embedding_forward()
        else:
            fwd = builder.head_forward() if kind == "head" else builder.layer_forward(self.rep_layer[kind])
        bwd, wgt = backward(fwd), []
        if kind != "embedding" and splits_backward(plan):
            bwd, wgt = split_weight_grads(bwd)
        passes = [_ops(fwd), _ops(bwd, len(fwd)), _ops(wgt, len(fwd) + len(bwd))]
        price(OpGraph(model=self.model, plan=plan, ops=[o for p in passes for o in p]), self.cluster)
        attention_s = sum(o.duration_s for o in passes[0] if o.kind is OpKind.ATTENTION)
        return Template(*(walk(p) for p in passes)), attention_s

    # ---- communicators -----------------------------------------------------------------

    def coll_s(self, coll: Coll, size: float, ranks: int, stride: int) -> float:
        """Duration of one collective, priced as ``pricing`` prices it."""
        def make():
            shape = group_shape(ranks, stride, self.gpn)
            return collective_cost(coll, size, shape, self.cluster, peers=local_peers(shape, stride)).time_s
        return self._cached(("coll", coll, size, ranks, stride), make)

    def _groups(self, plan: ParallelPlan) -> dict[str, tuple[int, int]]:
        return {"dp_cp": (plan.dp * plan.cp, plan.tp), "edp": (plan.edp, plan.etp * plan.ep)}

    def _sizes(self, plan: ParallelPlan, kind: str, what) -> list[tuple[str, float]]:
        """graph._groups: (group, bytes) of one layer's DP traffic, groups of one rank skipped."""
        groups = self._groups(plan)
        sizes = what(self.model, plan, self.rep_layer[kind])
        return [(g, s) for g, s in zip(("dp_cp", "edp"), sizes) if s > 0 and groups[g][0] > 1]

    def grad_buckets(self, plan: ParallelPlan, stage: int) -> tuple[float, float]:
        """(total, last op) seconds of a stage's gradient reduction in Megatron-Core DDP
        buckets of ``grad_bucket_bytes`` per group, filled in backward (descending) layer
        order, remainders flushed in group order (graph.grad_reduce / flush_buckets)."""
        key = ("grads", plan.pp, plan.vpp, stage, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp,
               plan.zero == 0, plan.grad_bucket_bytes)
        return self._cached(key, lambda: self._bucket_costs(plan, stage))

    def _bucket_costs(self, plan: ParallelPlan, stage: int) -> tuple[float, float]:
        coll = Coll.ALL_REDUCE if plan.zero == 0 else Coll.REDUCE_SCATTER
        groups = self._groups(plan)
        per_kind = {k: self._sizes(plan, k, layer_grad_bytes) for k in self.kinds}
        bucket, ops = {}, []
        for layer in sorted(stage_layer_ids(self.model, plan, stage), reverse=True):
            for group, size in per_kind[self.kind(layer)]:
                bucket[group] = bucket.get(group, 0.0) + size
                if bucket[group] >= plan.grad_bucket_bytes:
                    ops.append(self.coll_s(coll, bucket.pop(group), *groups[group]))
        ops += [self.coll_s(coll, size, *groups[g]) for g, size in sorted(bucket.items())]
        return sum(ops), (ops[-1] if ops else 0.0)

    def layer_gathers(self, plan: ParallelPlan, kind: str) -> tuple[float, ...]:
        """ZeRO all-gather seconds of one layer's parameters, per group."""
        key = ("gather", kind, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp)
        groups = self._groups(plan)
        return self._cached(key, lambda: tuple(self.coll_s(Coll.ALL_GATHER, s, *groups[g])
                                               for g, s in self._sizes(plan, kind, layer_param_bytes)))

    def p2p_s(self, plan: ParallelPlan) -> float:
        """One pipeline send: graph._Builder.send (bf16 activations of the local tokens)."""
        if plan.pp == 1:
            return 0.0
        key = ("p2p", plan.mbs, plan.seq, plan.cp, plan.tp, plan.sequence_parallel, plan.pp, plan.dp)
        found = self._memo.get(key)
        if found is None:
            tokens = plan.mbs * plan.seq // plan.cp
            local = tokens // plan.tp if plan.sequence_parallel and plan.tp > 1 else tokens
            size = local * self.model.hidden_size * 2
            found = self._memo[key] = self.coll_s(Coll.SEND_RECV, size, plan.pp, plan.tp * plan.cp * plan.dp)
        return found

    # ---- stages --------------------------------------------------------------------------

    def layout(self, plan: ParallelPlan, stage: int) -> tuple[int, int, int, int]:
        """(dense layers, MoE layers, lowest layer, highest layer) of a stage."""
        def make():
            ids = stage_layer_ids(self.model, plan, stage)
            moe = sum(1 for l in ids if is_moe_layer(self.model, l))
            return len(ids) - moe, moe, min(ids), max(ids)
        return self._cached(("layout", plan.pp, plan.vpp, stage), make)

    def optimizer_s(self, plan: ParallelPlan, stage: int) -> float:
        key = ("opt", plan.tp, plan.ep, plan.etp, plan.pp, plan.vpp, stage, plan.zero == 0, plan.dp * plan.cp, plan.edp)
        return self._cached(key, lambda: elementwise_time(optimizer_bytes(self.model, plan, stage), self.cluster.gpu))

    def stage_parts(self, plan: ParallelPlan, stage: int, blocks: dict) -> list[tuple[Template, int]]:
        nd, nm, _, _ = self.layout(plan, stage)
        parts = [(blocks[k], n) for k, n in (("dense", nd), ("moe", nm)) if n]
        parts += [(blocks["embedding"], 1)] if stage == 0 else []
        parts += [(blocks["head"], 1)] if stage == plan.pp - 1 else []
        return parts

    def stage_passes(self, plan: ParallelPlan, stage: int, blocks: dict) -> _StagePasses:
        f = b = w = 0.0
        for t, n in self.stage_parts(plan, stage, blocks):
            f, b, w = f + n * t.fwd.seconds, b + n * t.bwd.seconds, w + n * t.wgt.seconds
        return _StagePasses(fwd=f, bwd_in=b, wgt=w)

    # ---- step time (analytic.run / _layout) ----------------------------------------------

    def _blocks(self, plan: ParallelPlan) -> dict:
        return {k: self.template(plan, k) for k in (*self.kinds, "embedding", "head")}

    def _last_gather(self, plan: ParallelPlan, layout: tuple, lowest: bool) -> float:
        """The all-gather the graph creates last: ZeRO-3's in the last backward (lowest
        layer), ZeRO-1/2's in the first forward (highest layer)."""
        nd, nm, lo, hi = layout
        first = self.kind(lo if lowest else hi)
        for kind in (first, "moe" if first == "dense" else "dense"):
            if (nd if kind == "dense" else nm) and self.layer_gathers(plan, kind):
                return self.layer_gathers(plan, kind)[-1]
        return 0.0

    def stage_gathers(self, plan: ParallelPlan, layout: tuple) -> tuple[float, float, float]:
        """(all-gather seconds of a stage's layers, last one in a backward, in a forward)."""
        def make():
            counts = {"dense": layout[0], "moe": layout[1]}
            per_step = sum(counts[k] * sum(self.layer_gathers(plan, k)) for k in self.kinds)
            return per_step, self._last_gather(plan, layout, True), self._last_gather(plan, layout, False)
        return self._cached(("stage_gathers", layout, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp), make)

    def _gathers(self, plan, layout, fwd, busy, n_layers) -> tuple[float, float, float, float]:
        """(total, exposed, shift before compute, lowered sum) of the ZeRO parameter
        all-gathers; exposed after the optimizer when not shifted (analytic._layout)."""
        if not plan.zero:
            return 0.0, 0.0, 0.0, 0.0
        per_step, last_lo, last_hi = self.stage_gathers(plan, layout)
        if per_step <= 0:
            return 0.0, 0.0, 0.0, 0.0
        if plan.zero == 3:  # gathered before every pass of every microbatch, prefetched a layer ahead
            lowered = min(plan.pp if plan.vpp > 1 else 1, plan.num_microbatches)
            total = 2 * plan.num_microbatches * per_step
            exposed = exposure(total, last_lo, busy, n_layers, True)
            return total, exposed, exposed, 2 * lowered * per_step
        if plan.overlap_grad_reduce:  # ZeRO-1/2: updated weights gathered behind the first forward
            exposed = exposure(per_step, last_hi, fwd, n_layers, True)
            return per_step, exposed, exposed, per_step
        return per_step, per_step, 0.0, 0.0

    def pipeline(self, plan: ParallelPlan) -> tuple[dict, int, _StagePasses, float]:
        """(blocks, critical stage, its passes, compute part of the bubble): the same for
        every plan with these templates, stages and schedule."""
        def make():
            blocks = self._blocks(plan)
            stages = {s: self.stage_passes(plan, s, blocks) for s in range(plan.pp)}
            crit = max(stages, key=lambda s: (stages[s].fwd + stages[s].bwd, s))
            return blocks, crit, stages[crit], pipeline_bubble(plan, stages)
        return self._cached(("pipe", *template_key(plan), plan.pp, plan.vpp, plan.schedule), make)

    def timeline(self, plan: ParallelPlan) -> dict:
        """The parts of ``analytic.run``'s step, in seconds."""
        blocks, crit, st, bubble = self.pipeline(plan)
        if plan.pp > 1:
            bubble += 2 * (plan.pp - 1) * self.p2p_s(plan)
        layout = self.layout(plan, crit)
        n_layers = max(1, layout[0] + layout[1])
        busy = plan.num_microbatches * (st.fwd + st.bwd)
        grads, last = self.grad_buckets(plan, crit)
        grad_x = exposure(grads, last, st.bwd, n_layers, plan.overlap_grad_reduce)
        gathers, gather_x, shift, lowered = self._gathers(plan, layout, st.fwd, busy, n_layers)
        hidden = grads - grad_x + (gathers - gather_x if shift else 0.0)
        slowdown = plan.interference * max(0.0, hidden)  # FiCCO: hidden comm slows compute
        tail = gather_x if gathers and not shift else 0.0
        opt = self.optimizer_s(plan, crit)
        step = bubble + shift + busy + grad_x + slowdown + opt + tail
        if shift:
            step = max(step, lowered)
        return {"step_time_s": step, "critical_stage": crit, "bubble_s": bubble, "grad_exposed_s": grad_x,
                "gather_exposed_s": gather_x, "interference_s": slowdown, "optimizer_s": opt, "blocks": blocks}

    def step_time_s(self, plan: ParallelPlan) -> float:
        return self.timeline(plan)["step_time_s"]

    def lower_bound_s(self, plan: ParallelPlan) -> float:
        """A cheap bound below ``step_time_s``: the bubble's compute part plus m (F + B)
        of the critical stage (every other term of the step is >= 0)."""
        _, _, st, bubble = self.pipeline(plan)
        return bubble + plan.num_microbatches * (st.fwd + st.bwd)

    def estimate(self, plan: ParallelPlan) -> FastEstimate:
        """Step time with a breakdown by category of the critical stage."""
        tl = self.timeline(plan)
        m, breakdown, comm = plan.num_microbatches, {}, set()
        for block, n in self.stage_parts(plan, tl["critical_stage"], tl["blocks"]):
            for part in (block.fwd, block.bwd, block.wgt):
                comm |= part.comm
                for cat, seconds in part.categories:
                    breakdown[cat] = breakdown.get(cat, 0.0) + m * n * seconds
        extra = {GRAD_REDUCE: tl["grad_exposed_s"], PARAM_GATHER: tl["gather_exposed_s"],
                 INTERFERENCE: tl["interference_s"], "optimizer": tl["optimizer_s"]}
        for cat, seconds in extra.items():
            if seconds > 0:
                breakdown[cat] = breakdown.get(cat, 0.0) + seconds
        breakdown[BUBBLE] = max(0.0, tl["step_time_s"] - sum(breakdown.values()))
        exposed = sum(v for k, v in breakdown.items() if k in comm) + tl["grad_exposed_s"] + tl["gather_exposed_s"]
        return FastEstimate(step_time_s=tl["step_time_s"], critical_stage=tl["critical_stage"],
                            breakdown=dict(sorted(breakdown.items(), key=lambda kv: (-kv[1], kv[0]))),
                            exposed_comm_s=exposed)
