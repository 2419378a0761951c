"""The closed-form estimator: the op graph's blocks priced once, summed instead of simulated.

Each distinct block (dense or MoE layer, embedding, LM head) is lowered by
``graph.block_passes`` -- the very chains the engine runs -- priced by ``pricing.price``
once per template key and memoised; a stage is its blocks times their counts, and data-
and pipeline-parallel collectives are priced once per (collective, size, placement).
Per plan only dict look-ups and sums remain. ``estimate()`` and ``search`` both call
this; the engine is the reference it is tested against.

Step = pipeline bubble + 2(pp-1) p2p + m (F + B + W) of the critical stage + exposed DP
traffic + interference + optimizer step, with
- bubble (uniform-stage textbook forms, F/B/W per-stage pass times): 1F1B, GPipe and
  interleaved (pp-1)/vpp (F + B) (Narayanan'21 eq.3, sec. 2.2); ZB-H1 (pp-1)(F + B - W)
  with B the input- and W the weight-gradient pass (Qi'23 sec. 3), over vpp;
- overlapped DP traffic exposed only where it outlasts the pass it hides behind, all
  but one layer's share (``exposure``); the hidden part slows compute by the plan's
  interference share (FiCCO);
- a ring-attention hop or an overlapped TP collective exposed only where it outlasts
  the compute it runs beside (``walk``).
"""

from collections import OrderedDict, deque
from dataclasses import dataclass

from perfsim.cost.collectives import collective_cost, local_peers
from perfsim.cost.kernels import elementwise_time
from perfsim.cost.pricing import price
from perfsim.lowering.graph import OpGraph, block_passes
from perfsim.lowering.layers import LayerBuilder, Step
from perfsim.lowering.ops import Coll, Op, OpKind, Stream
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan, Schedule, group_shape
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.schedules import splits_backward
from perfsim.plan.sharding import is_moe_layer, layer_grad_bytes, layer_param_bytes, optimizer_bytes, stage_layer_ids
from perfsim.plan.stragglers import NONE as NO_VARIABILITY
from perfsim.plan.stragglers import VariabilitySpec, ep_rank_speeds, gpu_speeds, stage_slowdowns
from perfsim.system.hardware import ClusterSpec

BUBBLE = "pipeline_bubble"
GRAD_REDUCE = "dp_grad_reduce"
PARAM_GATHER = "dp_param_gather"
INTERFERENCE = "comm_interference"


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass (F, B or W) of a block for one microbatch: its length on the chain, the
    seconds each category adds to it (an off-chain op only its exposed part), and the
    priced ops (for per-stream, per-collective figures and trace spans)."""

    seconds: float
    categories: tuple[tuple[str, float], ...]
    comm: frozenset  # categories that are communication
    ops: tuple[Op, ...]
    exposed: tuple[float, ...]  # per op: seconds it adds to the chain


@dataclass(frozen=True, slots=True)
class Template:
    fwd: Pass
    bwd: Pass  # input gradients and recompute; the whole backward unless split
    wgt: Pass  # weight gradients of a split backward (zb-h1), else empty
    compute_s: float = 0.0  # one microbatch, all passes: compute-stream op seconds
    comm_s: float = 0.0  # ... comm op seconds
    streams: tuple[tuple[str, float], ...] = ()  # busy seconds per stream
    colls: tuple[tuple[str, float, float, int], ...] = ()  # "category/coll", total, exposed, count
    num_ops: int = 0

    @property
    def passes(self) -> tuple[Pass, Pass, Pass]:
        return self.fwd, self.bwd, self.wgt


@dataclass(frozen=True, slots=True)
class StagePasses:  # what pipeline_bubble reads of a stage
    fwd: float
    bwd_in: float
    wgt: float

    @property
    def bwd(self) -> float:
        return self.bwd_in + self.wgt


def walk(ops: list[Op]) -> Pass:
    """Lay a chain out in totals: an ``offchain`` op (ring hop, overlapped TP comm) starts
    with the chain on its own stream, one at a time; a ``join`` op waits for the oldest
    off-chain op not yet joined, whose overrun counts in that op's category."""
    t, side_free, sides = 0.0, 0.0, deque()
    cats, exposed = {}, [0.0] * len(ops)
    for i, op in enumerate(ops):
        if op.meta.get("offchain"):
            side_free = max(t, side_free) + op.duration_s
            sides.append((side_free, i))
            continue
        if op.meta.get("join") and sides:
            end, j = sides.popleft()
            if end > t:
                exposed[j] = end - t
                cats[ops[j].category] = cats.get(ops[j].category, 0.0) + end - t
                t = end
        exposed[i] = op.duration_s
        cats[op.category] = cats.get(op.category, 0.0) + op.duration_s
        t += op.duration_s
    comm = frozenset(o.category for o in ops if o.stream is not Stream.COMPUTE)
    return Pass(seconds=t, categories=tuple(cats.items()), comm=comm, ops=tuple(ops), exposed=tuple(exposed))


def pipeline_bubble(plan: ParallelPlan, stages: dict) -> float:
    """Idle time of a stage in the uniform-stage closed form (module docstring)."""
    if plan.pp == 1:
        return 0.0
    f = max(s.fwd for s in stages.values())
    b = max(s.bwd_in for s in stages.values())
    w = max(s.wgt for s in stages.values())
    if plan.schedule == Schedule.ZB_H1:
        return (plan.pp - 1) / plan.vpp * max(0.0, f + b - w)
    return (plan.pp - 1) / plan.vpp * (f + b + w)


def exposure(total: float, last: float, window: float, num_layers: int, overlapped: bool) -> float:
    """Comm hidden behind ``window`` except one layer's share; the last op always shows."""
    if total <= 0:
        return 0.0
    if not overlapped:
        return total
    return max(last, total - window * (1 - 1 / num_layers))


def template_key(plan: ParallelPlan) -> tuple:
    """Plan fields a block template depends on (not dp, pp, vpp, zero or the batch)."""
    return (plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.seq, plan.dtype, plan.recompute,
            plan.sequence_parallel, plan.tp_comm_overlap, splits_backward(plan))


def _template(fwd: Pass, bwd: Pass, wgt: Pass) -> Template:
    """A block's passes with the per-microbatch totals the report reads."""
    streams, colls, compute, comm = {}, {}, 0.0, 0.0
    for part in (fwd, bwd, wgt):
        for op, shown in zip(part.ops, part.exposed):
            streams[str(op.stream)] = streams.get(str(op.stream), 0.0) + op.duration_s
            if op.stream is Stream.COMPUTE:
                compute += op.duration_s
                continue
            comm += op.duration_s
            key = f"{op.category}/{op.collective.coll if op.collective else op.kind}"
            total, exposed, count = colls.get(key, (0.0, 0.0, 0))
            colls[key] = (total + op.duration_s, exposed + shown, count + 1)
    return Template(fwd=fwd, bwd=bwd, wgt=wgt, compute_s=compute, comm_s=comm, streams=tuple(streams.items()),
                    colls=tuple((k, *v) for k, v in colls.items()), num_ops=len(fwd.ops) + len(bwd.ops) + len(wgt.ops))


def _ops(steps: list[Step], start: int) -> list[Op]:
    return [Op(op_id=start + i, stage=0, name=s.name, kind=s.kind, stream=s.stream, category=s.category,
               flops=s.flops, bytes=s.bytes, gemm=s.gemm, grouped=s.grouped, collective=s.collective,
               microbatch=0, meta=dict(s.meta)) for i, s in enumerate(steps)]


class ClosedForm:
    """Closed-form costing of many plans of one model on one cluster, memoised."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, routing: RoutingSpec = UNIFORM,
                 variability: VariabilitySpec = NO_VARIABILITY):
        self.model, self.cluster, self.routing, self.variability = model, cluster, routing, variability
        self.gpn = cluster.gpus_per_node
        self.kinds = tuple((["dense"] if model.num_mlp_layers else []) + (["moe"] if model.num_moe_layers else []))
        self.rep_layer = {"dense": 0, "moe": model.num_dense_layers}
        self._memo: dict = {}

    def _cached(self, key: tuple, make):
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = make()
        return found

    def kind(self, layer: int) -> str:
        return "moe" if is_moe_layer(self.model, layer) else "dense"

    # ---- GPU speeds (stragglers) -----------------------------------------------------------

    def speeds(self, plan: ParallelPlan) -> tuple[tuple[float, ...], tuple[float, ...] | None]:
        """(compute slowdown per stage, relative speed per EP rank or None)."""
        if self.variability.cv == 0:
            return (1.0,) * plan.pp, None

        def make():
            speeds = gpu_speeds(plan.world_size, self.variability)
            ep = ep_rank_speeds(plan, speeds) if self.model.is_moe and plan.ep > 1 else None
            return tuple(stage_slowdowns(plan, speeds)), ep
        return self._cached(("speeds", plan), make)

    # ---- templates -------------------------------------------------------------------------

    def template(self, plan: ParallelPlan, kind: str, stage: int = 0) -> Template:
        slow, ep_speeds = self.speeds(plan)
        key = ("tpl", kind, slow[stage], ep_speeds, *template_key(plan))
        return self._cached(key, lambda: self._price_template(plan, kind, slow[stage], ep_speeds))

    def _price_template(self, plan: ParallelPlan, kind: str, slowdown: float, ep_speeds) -> Template:
        builder = LayerBuilder(self.model, plan, self.routing, ep_speeds)
        chains = block_passes(builder, plan, self.rep_layer.get(kind, kind))
        passes, start = [], 0
        for steps in chains:
            passes.append(_ops(steps, start))
            start += len(steps)
        graph = OpGraph(model=self.model, plan=plan, ops=[o for p in passes for o in p])
        price(graph, self.cluster, [slowdown] * plan.pp)
        return _template(*(walk(p) for p in passes))

    # ---- communicators ---------------------------------------------------------------------

    def coll_s(self, coll: Coll, size: float, ranks: int, stride: int) -> float:
        """Duration of one collective, priced as ``pricing`` prices it."""
        def make():
            shape = group_shape(ranks, stride, self.gpn)
            return collective_cost(coll, size, shape, self.cluster, peers=local_peers(shape, stride)).time_s
        return self._cached(("coll", coll, size, ranks, stride), make)

    def _groups(self, plan: ParallelPlan) -> dict[str, tuple[int, int]]:
        return {"dp_cp": (plan.dp * plan.cp, plan.tp), "edp": (plan.edp, plan.etp * plan.ep)}

    def _sizes(self, plan: ParallelPlan, kind: str, what) -> list[tuple[str, float]]:
        """(group, bytes) of one layer's DP traffic, groups of one rank skipped (graph._groups)."""
        groups = self._groups(plan)
        sizes = what(self.model, plan, self.rep_layer[kind])
        return [(g, s) for g, s in zip(("dp_cp", "edp"), sizes) if s > 0 and groups[g][0] > 1]

    def grad_buckets(self, plan: ParallelPlan, stage: int) -> tuple[float, float, int]:
        """(total, last op, count) seconds of a stage's gradient reduction in Megatron-Core
        DDP buckets of ``grad_bucket_bytes`` per group, filled in backward (descending)
        layer order, remainders flushed in group order (graph.grad_reduce / flush_buckets)."""
        key = ("grads", plan.pp, plan.vpp, stage, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp,
               plan.zero == 0, plan.grad_bucket_bytes)
        return self._cached(key, lambda: self._bucket_costs(plan, stage))

    def _bucket_costs(self, plan: ParallelPlan, stage: int) -> tuple[float, float, int]:
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
        return sum(ops), (ops[-1] if ops else 0.0), len(ops)

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

        def make():
            tokens = plan.mbs * plan.seq // plan.cp
            local = tokens // plan.tp if plan.sequence_parallel and plan.tp > 1 else tokens
            size = local * self.model.hidden_size * 2
            return self.coll_s(Coll.SEND_RECV, size, plan.pp, plan.tp * plan.cp * plan.dp)
        return self._cached(("p2p", plan.mbs, plan.seq, plan.cp, plan.tp, plan.sequence_parallel, plan.pp, plan.dp), make)

    # ---- stages ----------------------------------------------------------------------------

    def layout(self, plan: ParallelPlan, stage: int) -> tuple[int, int, int, int]:
        """(dense layers, MoE layers, lowest layer, highest layer) of a stage."""
        def make():
            ids = stage_layer_ids(self.model, plan, stage)
            moe = sum(1 for layer in ids if is_moe_layer(self.model, layer))
            return len(ids) - moe, moe, min(ids), max(ids)
        return self._cached(("layout", plan.pp, plan.vpp, stage), make)

    def optimizer_s(self, plan: ParallelPlan, stage: int) -> float:
        key = ("opt", plan.tp, plan.ep, plan.etp, plan.pp, plan.vpp, stage, plan.zero == 0, plan.dp * plan.cp,
               plan.edp, self.speeds(plan)[0][stage])
        return self._cached(key, lambda: self.speeds(plan)[0][stage] * elementwise_time(
            optimizer_bytes(self.model, plan, stage), self.cluster.gpu))

    def stage_parts(self, plan: ParallelPlan, stage: int) -> list[tuple[Template, int]]:
        """(template, count) of a stage's blocks: its layers, the embedding, the LM head."""
        nd, nm, _, _ = self.layout(plan, stage)
        parts = [(self.template(plan, k, stage), n) for k, n in (("dense", nd), ("moe", nm)) if n]
        parts += [(self.template(plan, "embedding", stage), 1)] if stage == 0 else []
        parts += [(self.template(plan, "head", stage), 1)] if stage == plan.pp - 1 else []
        return parts

    def stage_passes(self, plan: ParallelPlan, stage: int) -> StagePasses:
        f = b = w = 0.0
        for t, n in self.stage_parts(plan, stage):
            f, b, w = f + n * t.fwd.seconds, b + n * t.bwd.seconds, w + n * t.wgt.seconds
        return StagePasses(fwd=f, bwd_in=b, wgt=w)

    # ---- step time -------------------------------------------------------------------------

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
        all-gathers; exposed after the optimizer when not shifted."""
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

    def pipeline(self, plan: ParallelPlan) -> tuple[int, StagePasses, float]:
        """(critical stage, its passes, compute part of the bubble): the same for every
        plan with these templates, stages and schedule."""
        def make():
            stages = {s: self.stage_passes(plan, s) for s in range(plan.pp)}
            crit = max(stages, key=lambda s: (stages[s].fwd + stages[s].bwd, s))
            return crit, stages[crit], pipeline_bubble(plan, stages)
        return self._cached(("pipe", *template_key(plan), plan.pp, plan.vpp, plan.schedule, self.speeds(plan)), make)

    def timeline(self, plan: ParallelPlan) -> dict:
        """The parts of the step, in seconds (memoised per plan)."""
        return self._cached(("timeline", plan), lambda: self._timeline(plan))

    def _timeline(self, plan: ParallelPlan) -> dict:
        crit, st, bubble = self.pipeline(plan)
        p2p = 2 * (plan.pp - 1) * self.p2p_s(plan)
        layout = self.layout(plan, crit)
        n_layers = max(1, layout[0] + layout[1])
        busy = plan.num_microbatches * (st.fwd + st.bwd)
        grads, last, num_buckets = self.grad_buckets(plan, crit)
        grad_x = exposure(grads, last, st.bwd, n_layers, plan.overlap_grad_reduce)
        gathers, gather_x, shift, lowered = self._gathers(plan, layout, st.fwd, busy, n_layers)
        hidden = grads - grad_x + (gathers - gather_x if shift else 0.0)
        slowdown = plan.interference * max(0.0, hidden)  # FiCCO: hidden comm slows compute
        tail = gather_x if gathers and not shift else 0.0
        opt = self.optimizer_s(plan, crit)
        step = bubble + p2p + shift + busy + grad_x + slowdown + opt + tail
        if shift:
            step = max(step, lowered)
        return {"step_time_s": step, "critical_stage": crit, "bubble_s": bubble, "p2p_s": p2p, "busy_s": busy,
                "grads_s": grads, "grad_exposed_s": grad_x, "num_buckets": num_buckets, "gathers_s": gathers,
                "gather_exposed_s": gather_x, "gather_shift_s": shift, "interference_s": slowdown,
                "optimizer_s": opt}

    def step_time_s(self, plan: ParallelPlan) -> float:
        return self.timeline(plan)["step_time_s"]

    def lower_bound_s(self, plan: ParallelPlan) -> float:
        """A cheap bound below ``step_time_s``: the bubble's compute part plus m (F + B)
        of the critical stage (every other term of the step is >= 0)."""
        _, st, bubble = self.pipeline(plan)
        return bubble + plan.num_microbatches * (st.fwd + st.bwd)


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 32


def closed_form(model: ModelSpec, cluster: ClusterSpec, routing: RoutingSpec = UNIFORM,
                variability: VariabilitySpec = NO_VARIABILITY) -> ClosedForm:
    """The memoised ``ClosedForm`` of these inputs (a small LRU; the cluster is matched
    by identity, since profiles are immutable and loaders return one object per file)."""
    key = (id(cluster), model, routing, variability)
    found = _CACHE.get(key)
    if found is not None and found.cluster is cluster:
        _CACHE.move_to_end(key)
        return found
    found = _CACHE[key] = ClosedForm(model, cluster, routing, variability)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found
