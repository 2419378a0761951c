"""The closed-form estimator: the op graph's blocks priced once, summed instead of simulated.

Each distinct block (dense or MoE layer, embedding, LM head) is lowered by
``graph.block_passes`` -- the very chains the engine runs -- priced by ``pricing.price``
once per template key and memoised; a stage is its blocks times their counts, and data-
and pipeline-parallel collectives are priced once per (collective, size, placement).
Per plan only dict look-ups and sums remain. ``estimate()`` and ``search`` both call
this; the engine is the reference it is tested against.

Step = pipeline bubble + 2(pp-1) p2p + m (F + B + W) of the critical stage + exposed DP
traffic + interference + optimizer step, with
- bubble: the textbook forms -- 1F1B and interleaved (pp-1)/vpp (F + B) (Narayanan'21
  eq.3, sec. 2.2), ZB-H1 (pp-1)(F + B - W) with B the input- and W the weight-gradient
  pass (Qi'23 sec. 3), over vpp -- generalised to stages of unequal work
  (``pipeline_bubble``);
- overlapped DP traffic exposed only where it outlasts the pass it hides behind
  (``estimators.overlap``: prefetch windows, the gradient-bucket queue); the hidden part slows compute by the plan's
  interference share (FiCCO);
- a ring-attention hop or an overlapped TP collective exposed only where it outlasts
  the compute it runs beside (``walk``).
"""

import tomllib
from collections import OrderedDict, deque
from importlib import resources
from dataclasses import dataclass

from perfsim.cost.collectives import collective_cost, local_peers
from perfsim.cost.pricing import placement_key, price
from perfsim.estimators.overlap import (Window, add_links, background_rate, drain_s, fluid_chain_s, queue_drain_s,
                                        window_s)
from perfsim.estimators.pipeline import PassCost, StageCosts, Walked, walk as walk_pipeline
from perfsim.lowering.graph import OpGraph, block_passes, input_seconds, optimizer_steps
from perfsim.lowering.layers import LayerBuilder, Step
from perfsim.lowering.ops import Coll, Op, Stream
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import V_SHAPES, ParallelPlan, Recompute, Schedule, group_shape
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.schedules import BWD, FWD, UNIT, WGT, head_stage, layout_key, splits_backward
from perfsim.plan.sharding import (block_param_bytes, chunk_blocks, embedding_sync_params, ends_grad_bytes, gathers_in,
                                   is_moe_layer, is_mtp_layer, recomputes, layer_grad_bytes, stage_layer_ids)
from perfsim.plan.stragglers import NONE as NO_VARIABILITY
from perfsim.plan.stragglers import VariabilitySpec, ep_rank_speeds, gpu_speeds, stage_slowdowns
from perfsim.system.hardware import ClusterSpec

BUBBLE = "pipeline_bubble"
GRAD_REDUCE = "dp_grad_reduce"
PARAM_GATHER = "dp_param_gather"
INTERFERENCE = "comm_interference"
NO_RECOMPUTE = "/norc"  # a layer the plan's recompute_layers leaves out
WINDOWED = "/swa"  # a sliding-window attention layer (ModelSpec.attention_window): a template of its own
ENDS = ("embedding", "head")  # the blocks beside the layers (their gathers: sharding.block_param_bytes)


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
    links: tuple[tuple[str, float], ...] = ()  # link -> seconds its comm keeps the link busy (alone)


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
    off-chain op not yet joined, whose overrun counts in that op's category. Overlapped
    MoE all-to-alls are played against the chain (``fluid_chain_s``): their link
    contention counts in ``ep_a2a``, the compute they slow by the compute units their
    kernels hold (``meta['cu_share']``) in ``comm_interference``."""
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
    beside = [i for i, op in enumerate(ops) if op.meta.get("offchain") and op.category == "ep_a2a"]
    if beside:  # the overlapped all-to-alls share links with the chain's own comm (max-min, as in the engine)
        window = Window(chain_s=t, ops=tuple(ops))
        played = fluid_chain_s(window, contended=True, held=False)
        if played > t:
            j = beside[-1]
            exposed[j] += played - t
            cats[ops[j].category] = cats.get(ops[j].category, 0.0) + played - t
            t = played
        if any(ops[i].meta.get("cu_share") for i in beside):  # and hold compute units the chain's compute loses
            slowed = max(t, fluid_chain_s(window, contended=True))
            cats[INTERFERENCE] = cats.get(INTERFERENCE, 0.0) + slowed - t
            t = slowed
    comm = frozenset(o.category for o in ops if o.stream is not Stream.COMPUTE)
    return Pass(seconds=t, categories=tuple(cats.items()), comm=comm, ops=tuple(ops), exposed=tuple(exposed),
                links=tuple(link_loads(ops).items()))


def link_loads(ops) -> dict[str, float]:
    """Seconds each link is kept busy by these priced comm ops, each moving data alone
    (``pricing``'s ``link_share`` x the op's data time)."""
    out: dict[str, float] = {}
    for op in ops:
        share = op.meta.get("link_share") or {}
        data_s = op.duration_s - op.meta.get("latency_s", 0.0)
        for link, fraction in share.items():
            out[link] = out.get(link, 0.0) + fraction * data_s
    return out


def pipeline_bubble(plan: ParallelPlan, stages: dict, crit: int) -> float:
    """Idle time of the critical stage ``crit`` (the one with the most work per
    microbatch) around its m passes, for stages of unequal work (the first holds the
    embedding, the last the LM head). 1F1B and interleaved: the other stages' F + B
    once, over vpp -- the uniform-stage (pp-1)/vpp (F + B) of Narayanan'21 eq.3 and
    sec. 2.2; GPipe: all forwards, then all backwards, each phase filling the virtual
    pipeline and paced by its slowest stage; ZB-H1: the other stages' F + B - W (Qi'23
    sec. 3: W fills the cool-down), over vpp. With vpp > 1 and fewer microbatches than
    stages a chunk waits for its input to come round the ring: (vpp-1)/vpp (pp-m) passes."""
    if plan.pp == 1 or plan.schedule in V_SHAPES:  # V-shape: no textbook form, the walk prices it (0 bounds it)
        return 0.0
    m, vpp, c = plan.flush_microbatches, plan.vpp, stages[crit]  # one schedule's: each flush pays its own
    others = [s for k, s in stages.items() if k != crit]
    f = max(s.fwd for s in stages.values())
    b = max(s.bwd for s in stages.values())
    wrap = (vpp - 1) / vpp * max(0, plan.pp - m) * (f + b)
    if plan.schedule == Schedule.ZB_H1:
        one = sum(max(0.0, s.fwd + s.bwd_in - s.wgt) for s in others) / vpp + wrap
    elif plan.schedule == Schedule.GPIPE:
        fill = sum(s.fwd + s.bwd for s in stages.values()) / vpp + (m - 1 / vpp) * (f + b)
        one = max(0.0, fill + wrap - m * (c.fwd + c.bwd))
    else:
        one = sum(s.fwd + s.bwd for s in others) / vpp + wrap
    return plan.pipeline_flushes * one


def _scaled(load: dict[str, float], count: float) -> dict[str, float]:
    return {link: busy * count for link, busy in load.items()}


def template_key(plan: ParallelPlan) -> tuple:
    """Plan fields a block template depends on (not dp, pp, vpp, zero or the batch -- but
    the microbatch count where FP8 weight casts are spread over a step's microbatches, and
    the FP8 scaling recipe, the plan's or the stack's)."""
    fp8 = plan.dtype == "fp8"
    # the microbatches an FP8 weight copy is spread over (LayerBuilder._fp8): casts under a
    # cast-once stack, FP8 primary weights' transposes, never under per-pass ZeRO-3
    copies = plan.fp8_copies_per_step(plan.stack.fp8.weights_cast_once or plan.fp8_params) if fp8 else 0
    return (plan.tp, plan.cp, plan.ep, plan.etp, plan.mbs, plan.seq, plan.dtype, plan.recompute, plan.selective_modules,
            plan.sequence_parallel, plan.tp_comm_overlap, plan.ep_comm_overlap, plan.shared_expert_overlap,
            splits_backward(plan), plan.stack,
            plan.dispatch, plan.dispatch_fp8, plan.dispatch_compute_units,
            plan.overlap_param_gather, copies, fp8 and plan.fp8_delayed_scaling,
            plan.fp8_params, plan.mtp_layers)  # the LM head block prices one head per MTP layer more


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


# what a stage runs in series after its last backward pass (``ClosedForm._stage_end`` keys):
# exposed gradient reduction, interference, optimizer, input pipeline, ZeRO-1/2 gathers after it
SERIAL_TAIL = ("grad_exposed_s", "interference_s", "optimizer_s", "input_s", "tail_s")


def serial_tail_s(end: dict) -> float:
    """Seconds of ``SERIAL_TAIL`` in a stage's end (``ClosedForm._stage_end``)."""
    return sum(end[key] for key in SERIAL_TAIL)


class ClosedForm:
    """Closed-form costing of many plans of one model on one cluster, memoised."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, routing: RoutingSpec = UNIFORM,
                 variability: VariabilitySpec = NO_VARIABILITY):
        self.model, self.cluster, self.routing, self.variability = model, cluster, routing, variability
        self.gpn = cluster.gpus_per_node
        # "mtp": a multi-token-prediction layer (plan.mtp_layers; index num_layers), priced where a plan has one
        self.kinds = tuple((["dense"] if model.num_mlp_layers else []) + (["moe"] if model.num_moe_layers else [])
                           + ["mtp"])
        # each template's representative layer: the first of its kind (a windowed layer's kind
        # marked WINDOWED: same parameters, its own attention core)
        reps: dict[str, int] = {}
        for layer in range(model.num_layers + 1 if model.sliding_window else 0):  # the decoder layers, an MTP layer
            reps.setdefault(self.template_kind(layer), layer)
        self.rep_layer = {"dense": 0, "moe": model.num_dense_layers, "mtp": model.num_layers} | reps
        self._memo: dict = {}

    def _cached(self, key: tuple, make):
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = make()
        return found

    def kind(self, layer: int) -> str:
        if is_mtp_layer(self.model, layer):
            return "mtp"
        return "moe" if is_moe_layer(self.model, layer) else "dense"

    def template_kind(self, layer: int) -> str:
        """The layer's kind, marked WINDOWED where its attention is a sliding window."""
        return self.kind(layer) + (WINDOWED if self.model.attention_window(layer) else "")

    def block_kind(self, plan: ParallelPlan, layer: int) -> str:
        """The layer's template: its kind (``template_kind``), marked "/norc" where the plan
        recomputes but this layer does not (``recompute_layers``)."""
        base = self.template_kind(layer)
        if plan.recompute_layers and recomputes(self.model, plan, layer) == Recompute.NONE:
            return base + NO_RECOMPUTE
        return base

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
        base = kind.removesuffix(NO_RECOMPUTE)
        own = Recompute.NONE if kind.endswith(NO_RECOMPUTE) else None
        chains = block_passes(builder, plan, self.rep_layer.get(base, base), own)
        passes, start = [], 0
        for steps in chains:
            passes.append(_ops(steps, start))
            start += len(steps)
        graph = OpGraph(model=self.model, plan=plan, ops=[o for p in passes for o in p])
        shared = self._memo.setdefault(("prices", placement_key(plan)), {})  # ops alike across templates
        price(graph, self.cluster, [slowdown] * plan.pp, cache=shared)
        return _template(*(walk(p) for p in passes))

    # ---- communicators ---------------------------------------------------------------------

    def coll(self, coll: Coll, size: float, ranks: int, stride: int):
        """One collective priced as ``pricing`` prices it (its ``demand`` is link busy seconds)."""
        def make():
            shape = group_shape(ranks, stride, self.gpn)
            return collective_cost(coll, size, shape, self.cluster, peers=local_peers(shape, stride))
        return self._cached(("coll", coll, size, ranks, stride), make)

    def coll_s(self, coll: Coll, size: float, ranks: int, stride: int) -> float:
        return self.coll(coll, size, ranks, stride).time_s

    def _groups(self, plan: ParallelPlan) -> dict[str, tuple[int, int]]:
        return {"dp_cp": (plan.dp * plan.cp, plan.tp), "edp": (plan.edp, plan.etp * plan.ep)}

    def _sizes(self, plan: ParallelPlan, kind: str, what) -> list[tuple[str, float]]:
        """(group, bytes) of one block's DP traffic, groups of one rank skipped (graph._groups):
        ``what`` of the kind's representative layer, or of the embedding / LM head itself."""
        groups = self._groups(plan)
        sizes = what(self.model, plan, kind if kind in ENDS else self.rep_layer[kind])
        return [(g, s) for g, s in zip(("dp_cp", "edp"), sizes) if s > 0 and groups[g][0] > 1]

    def _gather_sizes(self, plan: ParallelPlan, kind: str) -> list[tuple[str, float]]:
        """(group, bytes) of one block's ZeRO all-gathers (``sharding.block_param_bytes``)."""
        return self._sizes(plan, kind, block_param_bytes)

    def _gathers_next(self, block: tuple) -> bool:
        """Whether ``block`` = (pass index, kind, layer or -1) gathers its weights in its pass."""
        pi, kind, layer = block
        return gathers_in(layer if layer >= 0 else kind, (FWD, BWD, WGT)[pi])

    def gather_blocks(self, plan: ParallelPlan, stage: int) -> tuple[tuple[str, int, int], ...]:
        """(block kind, blocks, passes per microbatch that gather it) of a stage's ZeRO
        all-gathers: its layers (forward and backward), the embedding (forward), the LM head
        (forward and backward); ZeRO-1/2 gather each block once per step."""
        nd, nm, _, _, nt = self.layout(plan, stage)
        counts = {"dense": nd, "moe": nm, "mtp": nt, "embedding": int(stage == 0), "head": int(stage == head_stage(plan))}
        rep = {**self.rep_layer, "embedding": "embedding", "head": "head"}
        return tuple((k, counts[k], sum(gathers_in(rep[k], phase) for phase in (FWD, BWD)))
                     for k in (*self.kinds, *ENDS) if counts[k])

    def stage_gather_s(self, plan: ParallelPlan, stage: int) -> tuple[float, float]:
        """All-gather seconds of a stage's forward and of its backward (alone, back to back)."""
        fwd = bwd = 0.0
        for kind, n, passes in self.gather_blocks(plan, stage):
            seconds = n * sum(self.layer_gathers(plan, kind))
            fwd, bwd = fwd + seconds, bwd + (passes - 1) * seconds
        return fwd, bwd

    def grad_buckets(self, plan: ParallelPlan, stage: int) -> tuple[float, float, int, dict]:
        """(total, last op, count, link loads) seconds of a stage's gradient reduction in Megatron-Core
        DDP buckets of ``grad_bucket_bytes`` per group, filled in backward (descending)
        layer order, remainders flushed in group order (graph.grad_reduce / flush_buckets)."""
        key = ("grads", *self._bucket_key(plan, stage))
        return self._cached(key, lambda: self._bucket_costs(plan, stage))

    def _bucket_costs(self, plan: ParallelPlan, stage: int) -> tuple[float, float, int, dict]:
        coll = Coll.ALL_REDUCE if plan.step_zero == 0 else Coll.REDUCE_SCATTER
        groups = self._groups(plan)
        per_kind = {k: self._sizes(plan, k, layer_grad_bytes) for k in self.kinds}
        bucket, ops, closed = {}, [], []
        for done, layer in enumerate(sorted(stage_layer_ids(self.model, plan, stage), reverse=True), 1):
            for group, size in per_kind[self.kind(layer)]:
                bucket[group] = bucket.get(group, 0.0) + size
                if bucket[group] >= plan.grad_bucket_bytes:
                    ops.append(self.coll(coll, bucket.pop(group), *groups[group]))
                    closed.append(done)
        ends = ends_grad_bytes(self.model, plan, stage)  # the embedding / LM head: in the last bucket (graph.optimizer)
        if ends and groups["dp_cp"][0] > 1:
            bucket["dp_cp"] = bucket.get("dp_cp", 0.0) + ends
        flushed = sorted(bucket.items())
        ops += [self.coll(coll, size, *groups[g]) for g, size in flushed]
        closed += [None] * len(flushed)  # flushed when the backward ends
        times = [o.time_s for o in ops]
        self._memo[("bucket_order", *self._bucket_key(plan, stage))] = tuple(zip(closed, times, (o.demand for o in ops)))
        return sum(times), (times[-1] if ops else 0.0), len(ops), add_links(*(o.demand for o in ops))

    def _bucket_key(self, plan: ParallelPlan, stage: int) -> tuple:
        """What a stage's buckets and their drain depend on: ZeRO-3 too, whose backward gathers
        slow the buckets (``_grad_rate``)."""
        return (self.signature(plan, stage), plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp, plan.step_zero == 0,
                plan.step_zero == 3, plan.grad_bucket_bytes)

    def bucket_drain_s(self, plan: ParallelPlan, stage: int, bwd_s: float) -> float:
        """Seconds the gradient buckets run past the last backward (``bwd_s``) on their
        queue: bucket i is issued when the backward finishes the layer that fills it
        (remainders when it ends) and runs after the ones before it, at the backward's
        average leftover rate (``_grad_rate``), or under ZeRO-3 with prefetched gathers
        played against them in time (``_gathered_drain_s``); (seconds, first issue)."""
        def make():
            self.grad_buckets(plan, stage)
            order = self._memo[("bucket_order", *self._bucket_key(plan, stage))]
            ends = self._layer_backward_ends(plan, stage)
            share = [e / ends[-1] if ends and ends[-1] > 0 else 1.0 for e in ends]
            rate = self._grad_rate(plan, stage)
            return tuple((1.0 if done is None else share[done - 1], seconds, rate(demand)) for done, seconds, demand in order)
        buckets = self._cached(("drain_buckets", *self._bucket_key(plan, stage), *template_key(plan)), make)
        items = [(where * bwd_s, seconds, rate) for where, seconds, rate in buckets]
        first = min((i[0] for i in items), default=bwd_s)
        if plan.step_zero == 3 and plan.overlap_param_gather:
            key = ("gathered_drain", *self._bucket_key(plan, stage), *template_key(plan), plan.param_bytes, bwd_s)
            return self._cached(key, lambda: self._gathered_drain_s(plan, stage, bwd_s, items)), first
        return queue_drain_s(items, bwd_s), first

    def _gathered_drain_s(self, plan: ParallelPlan, stage: int, bwd_s: float, items: list) -> float:
        """``bucket_drain_s`` under ZeRO-3 with prefetched gathers, played in time: each
        layer's backward runs the next layer's gathers from its start, which go first on the
        links (a bucket moves only at what they leave of its busiest link), stretched by the
        part of the window's own comm on their links that falls while they run (that comm
        taken as spread evenly over the window); the rest of the window the buckets move at
        the backward's average leftover rate beside its own comm. ``items``: the buckets'
        (issue, seconds alone, average rate), in ``bucket_drain_s``'s queue order."""
        order = self._memo[("bucket_order", *self._bucket_key(plan, stage))]  # their link demands
        ends = self._layer_backward_ends(plan, stage)
        scale = bwd_s / ends[-1] if ends and ends[-1] > 0 else 0.0
        ids = sorted(stage_layer_ids(self.model, plan, stage), reverse=True)
        head = self.template(plan, "head", stage).bwd.seconds if stage == head_stage(plan) else 0.0
        groups = self._groups(plan)
        gathers = []  # (start, end, link shares) of the next layer's gathers in each layer's window
        for i, layer in enumerate(ids[:-1]):
            start = (ends[i - 1] if i else head) * scale
            nxt = self.block_kind(plan, ids[i + 1]).removesuffix(NO_RECOMPUTE)
            own = self.template(plan, self.block_kind(plan, layer), stage)
            busy = add_links(dict(own.bwd.links), dict(own.wgt.links))  # the window's own comm on the links
            window = max(ends[i] * scale - start, 1e-12)  # that comm spread over it
            t = start
            for g, size in self._gather_sizes(plan, nxt):
                c = self.coll(Coll.ALL_GATHER, size, *groups[g])
                data = c.time_s - c.latency_s
                if data > 0:  # sharing a link with the window's comm (max-min) stretches it by their overlap
                    stretch = max((min(scale * busy.get(l, 0.0) * min(1.0, c.time_s / window), data)
                                   for l in c.demand), default=0.0)
                    end = min(ends[i] * scale, t + c.time_s + stretch)
                    gathers.append((t, end, {l: b / data for l, b in c.demand.items()}))
                    t = end
                else:
                    t += c.time_s
        fg = self._backward_comm(plan, stage)
        t = 0.0
        for (issue, work, _), (_, _, demand) in zip(items, order):
            t = max(t, issue)
            top = max(demand.values(), default=0.0)
            mine = {l: b / top for l, b in demand.items() if b > 0} if top > 0 else {}
            out = background_rate(fg, bwd_s, demand)
            while work > 1e-12 and t < bwd_s:
                seg = next(((a, b, sh) for a, b, sh in gathers if a <= t < b), None)
                if seg is None:  # between gathers: until the next one starts or the pass ends
                    stop = min([a for a, _, _ in gathers if a > t] + [bwd_s])
                    rate = out
                else:
                    stop = seg[1]
                    rate = max(0.0, min(((1.0 - seg[2].get(l, 0.0)) / s for l, s in mine.items()), default=1.0))
                    rate = min(rate, out)
                if rate > 0 and (stop - t) * rate >= work:
                    t, work = t + work / rate, 0.0
                else:
                    work -= (stop - t) * rate
                    t = stop
            t += work
        return max(0.0, t - bwd_s)

    def _backward_comm(self, plan: ParallelPlan, stage: int) -> tuple:
        """(data seconds, link shares) of a stage's backward comm ops per microbatch: the
        foreground a gradient bucket moves beside."""
        def make():
            return tuple((n * (op.duration_s - op.meta.get("latency_s", 0.0)), op.meta.get("link_share") or {})
                         for t, n in self.stage_parts(plan, stage) for part in (t.bwd, t.wgt)
                         for op in part.ops if op.is_comm and op.meta.get("link_share"))
        return self._cached(("bwd_comm", self.signature(plan, stage), *template_key(plan)), make)

    def _grad_rate(self, plan: ParallelPlan, stage: int):
        """How fast a gradient bucket (given its link demand) moves beside the backward
        (``overlap.background_rate``): behind the backward's own comm and, under ZeRO-3, its
        parameter gathers, which go first on the links (the engine serves the reduction last)."""
        def make():
            fg = list(self._backward_comm(plan, stage))
            if plan.step_zero == 3:  # the backward's parameter gathers go first too (foreground)
                groups = self._groups(plan)
                for kind, n, passes in self.gather_blocks(plan, stage):
                    for g, size in (self._gather_sizes(plan, kind) if passes > 1 else ()):
                        c = self.coll(Coll.ALL_GATHER, size, *groups[g])
                        data = c.time_s - c.latency_s
                        if data > 0:
                            fg.append((n * data, {link: busy / data for link, busy in c.demand.items()}))
            bwd, rates = self.stage_passes(plan, stage).bwd, {}

            def rate(demand: dict) -> float:
                key = tuple(sorted(demand.items()))
                if key not in rates:
                    rates[key] = background_rate(fg, bwd, demand)
                return rates[key]
            return rate
        return self._cached(("grad_rate", self.signature(plan, stage), plan.step_zero, plan.dp * plan.cp, plan.edp,
                             plan.grad_bucket_bytes, *template_key(plan)), make)

    def _gather_lost(self, plan: ParallelPlan, stage: int, chunk: int) -> float:
        """Seconds a ZeRO-1/2 updated-weight gather queue loses to one forward pass of a
        chunk (``overlap.background_rate``): the forward's own comm goes first on the links
        it shares with the gathers (the engine serves the data-parallel queues last)."""
        def make():
            demand, fg, fwd = {}, [], 0.0
            for kind, _ in self._chunk_blocks(plan, stage, chunk):
                demand = add_links(demand, self.gather_links(plan, kind.removesuffix(NO_RECOMPUTE)))
                part = self.template(plan, kind, stage).fwd
                fwd += part.seconds
                fg += [(op.duration_s - op.meta.get("latency_s", 0.0), op.meta.get("link_share") or {})
                       for op in part.ops if op.is_comm and op.meta.get("link_share")]
            return fwd * (1.0 - background_rate(fg, fwd, demand)) if fg and demand else 0.0
        return self._cached(("gather_lost", self.signature(plan, stage), chunk, plan.dp * plan.cp, plan.edp,
                             plan.param_bytes, *layout_key(plan), *template_key(plan)), make)

    def walked_drain_s(self, plan: ParallelPlan, stage: int, passes: tuple, end: float) -> tuple[float, float]:
        """``bucket_drain_s`` with each layer finished where the walk put its chunk's last
        backward (``passes``: per chunk (start, end)): (seconds past ``end``, when the
        first bucket is issued)."""
        items, first = [], end
        for where, seconds, rate in self._walked_buckets(plan, stage):
            if where is None:
                issue = end
            else:
                start, stop = passes[where[0]]
                issue = start + where[1] * (stop - start)
            first = min(first, issue)
            items.append((issue, seconds, rate))
        return queue_drain_s(items, end), first

    def _walked_buckets(self, plan: ParallelPlan, stage: int) -> tuple:
        """Per gradient bucket in queue order: (chunk, share of that chunk's gradient pass
        done when the bucket fills) or None (flushed at the end), seconds alone, rate."""
        def make():
            self.grad_buckets(plan, stage)
            order = self._memo[("bucket_order", *self._bucket_key(plan, stage))]
            pi = 2 if splits_backward(plan) else 1
            where = {}
            for chunk in range(plan.vpp):
                blocks = self._chunk_blocks(plan, stage, chunk)[::-1]
                chain = [self.template(plan, k, stage).passes[pi].seconds for k, _ in blocks]
                total, t = sum(chain), 0.0
                for (_, layer), seconds in zip(blocks, chain):
                    t += seconds
                    if layer >= 0:
                        where[layer] = (chunk, t / total if total > 0 else 1.0)
            ids = sorted(stage_layer_ids(self.model, plan, stage), reverse=True)
            rate = self._grad_rate(plan, stage)
            return tuple((None if done is None else where[ids[done - 1]], seconds, rate(demand))
                         for done, seconds, demand in order)
        return self._cached(("walked_buckets", *self._bucket_key(plan, stage), *layout_key(plan),
                             *template_key(plan)), make)

    def _layer_backward_ends(self, plan: ParallelPlan, stage: int) -> list[float]:
        """When the backward of one microbatch on a stage finishes each of its layers
        (highest first, the LM head before them), in chain seconds; the last entry ends the pass."""
        def make():
            t = self.template(plan, "head", stage).bwd.seconds if stage == head_stage(plan) else 0.0
            out = []
            for layer in sorted(stage_layer_ids(self.model, plan, stage), reverse=True):
                block = self.template(plan, self.block_kind(plan, layer), stage)
                t += block.bwd.seconds + block.wgt.seconds
                out.append(t)
            if stage == 0:
                t += self.template(plan, "embedding", stage).bwd.seconds
            return out + [t]
        return self._cached(("bwd_ends", self.signature(plan, stage), *template_key(plan)), make)

    def layer_gathers(self, plan: ParallelPlan, kind: str) -> tuple[float, ...]:
        """ZeRO all-gather seconds of one block's parameters (a layer kind, the embedding, the
        LM head), per group."""
        key = ("gather", kind, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp, plan.param_bytes,
               kind == "head" and head_stage(plan) == 0)
        groups = self._groups(plan)
        return self._cached(key, lambda: tuple(self.coll_s(Coll.ALL_GATHER, s, *groups[g])
                                               for g, s in self._gather_sizes(plan, kind)))

    def gather_links(self, plan: ParallelPlan, kind: str) -> dict[str, float]:
        """Link busy seconds of one block's parameter all-gathers (as ``layer_gathers``)."""
        key = ("gather_links", kind, plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp, plan.param_bytes,
               kind == "head" and head_stage(plan) == 0)
        groups = self._groups(plan)
        return self._cached(key, lambda: add_links(*(self.coll(Coll.ALL_GATHER, s, *groups[g]).demand
                                                     for g, s in self._gather_sizes(plan, kind))))

    def p2p_s(self, plan: ParallelPlan) -> float:
        """One pipeline send: graph._Builder.send (bf16 activations of the local tokens)."""
        return self.p2p(plan).time_s if plan.pp > 1 else 0.0

    def pass_weights(self, plan: ParallelPlan) -> tuple:
        """Relative (F, B, W, send) seconds of a chunk pass, averaged over the stages, to two
        significant digits: what a V-shape schedule's greedy order is built from (``UNIT``
        for the other schedules, whose orders are fixed)."""
        if plan.schedule not in V_SHAPES:
            return UNIT

        def make():
            sigs, firsts = self.stage_signatures(plan)
            passes = [self.stage_passes(plan, firsts[sig]) for sig in sigs]
            f, b, w = (sum(getattr(p, k) for p in passes) for k in ("fwd", "bwd_in", "wgt"))
            if f <= 0:
                return UNIT
            send = self.walk_p2p_s(plan) * plan.pp * plan.vpp
            return tuple(float(f"{x / f:.2g}") for x in (f, b, w, send))
        return self._cached(("weights", plan), make)

    def walk_p2p_s(self, plan: ParallelPlan) -> float:
        """A pipeline send as the walk prices it: under ZeRO-3 with prefetched gathers the
        send shares its links with the gather queue, busy for the share of a pass its
        gathers take (fair sharing: the send runs at half speed while they overlap)."""
        base = self.p2p_s(plan)
        if plan.step_zero != 3 or not plan.overlap_param_gather or base <= 0:
            return base
        links = set(self.p2p(plan).demand)
        if not any(links & set(self.gather_links(plan, k)) for k, _, _ in self.gather_blocks(plan, 0)):
            return base
        st = self.stage_passes(plan, 0)
        busy = sum(self.stage_gather_s(plan, 0)) / max(st.fwd + st.bwd, 1e-30)
        return base * (1 + min(1.0, busy))

    def p2p(self, plan: ParallelPlan):
        """One pipeline send's cost (its ``demand``: the links it keeps busy); pp > 1."""
        tokens = plan.mbs * plan.seq // plan.cp
        local = tokens // plan.tp if plan.sequence_parallel and plan.tp > 1 else tokens
        return self.coll(Coll.SEND_RECV, local * self.model.hidden_size * 2, plan.pp, plan.tp * plan.cp * plan.dp)

    # ---- stages ----------------------------------------------------------------------------

    def layout(self, plan: ParallelPlan, stage: int) -> tuple[int, int, int, int, int]:
        """(dense layers, MoE layers, lowest layer, highest layer, MTP layers) of a stage
        (the first two count decoder layers only)."""
        def make():
            ids = stage_layer_ids(self.model, plan, stage)
            mtp = sum(1 for layer in ids if is_mtp_layer(self.model, layer))
            moe = sum(1 for layer in ids if is_moe_layer(self.model, layer) and not is_mtp_layer(self.model, layer))
            return len(ids) - moe - mtp, moe, min(ids, default=0), max(ids, default=-1), mtp
        return self._cached(("layout", *layout_key(plan), stage), make)

    def signature(self, plan: ParallelPlan, stage: int) -> tuple:
        """What a stage's blocks, their order and its GPUs' speed depend on: stages alike
        in it (the middle ones, mostly) are priced once."""
        nd, nm, lo, _, nt = self.layout(plan, stage)
        slow, ep_speeds = self.speeds(plan)
        return (nd, nm, nt, self.kind(lo), stage == 0, stage == head_stage(plan), plan.schedule in V_SHAPES, slow[stage],
                ep_speeds,
                self.block_counts(plan, stage) if plan.recompute_layers or self.model.sliding_window else ())

    def stage_signatures(self, plan: ParallelPlan) -> tuple[list, dict]:
        """(signature per stage, first stage of each signature)."""
        def make():
            sigs = [self.signature(plan, s) for s in range(plan.pp)]
            firsts: dict = {}
            for s, sig in enumerate(sigs):
                firsts.setdefault(sig, s)
            return sigs, firsts
        return self._cached(("sigs", *layout_key(plan),
                             self.speeds(plan)), make)

    def optimizer_s(self, plan: ParallelPlan, stage: int) -> float:
        """The optimizer phase's chain (``graph.optimizer_steps``: gradient clip, Adam step)
        priced as the engine prices it, in line after the last gradient reduction."""
        key = ("opt", self.signature(plan, stage), plan.step_zero, plan.clip_grad, plan.param_bytes, self.speeds(plan)[0][stage],
               embedding_sync_params(self.model, plan, stage), *placement_key(plan))

        def make():
            graph = OpGraph(model=self.model, plan=plan, ops=_ops(optimizer_steps(self.model, plan, stage), 0))
            shared = self._memo.setdefault(("prices", placement_key(plan)), {})
            price(graph, self.cluster, [self.speeds(plan)[0][stage]] * plan.pp, cache=shared)
            return sum(op.duration_s for op in graph.ops)
        return self._cached(key, make)

    def stage_parts(self, plan: ParallelPlan, stage: int) -> list[tuple[Template, int]]:
        """(template, count) of a stage's blocks: its layers, the embedding, the LM head."""
        parts = [(self.template(plan, k, stage), n) for k, n in self.block_counts(plan, stage)]
        parts += [(self.template(plan, "embedding", stage), 1)] if stage == 0 else []
        parts += [(self.template(plan, "head", stage), 1)] if stage == head_stage(plan) else []
        return parts

    def block_counts(self, plan: ParallelPlan, stage: int) -> tuple[tuple[str, int], ...]:
        """(block kind, layers) of a stage, in order of first appearance."""
        def make():
            counts: dict[str, int] = {}
            for layer in sorted(stage_layer_ids(self.model, plan, stage)):
                kind = self.block_kind(plan, layer)
                counts[kind] = counts.get(kind, 0) + 1
            return tuple(counts.items())
        key = ("counts", *layout_key(plan), plan.recompute_layers,
               plan.recompute == Recompute.NONE, stage)
        return self._cached(key, make)

    def chain_passes(self, plan: ParallelPlan, stage: int) -> StagePasses:
        """F, B, W of a stage per microbatch: its blocks' chains alone."""
        def make():
            f = b = w = 0.0
            for t, n in self.stage_parts(plan, stage):
                f, b, w = f + n * t.fwd.seconds, b + n * t.bwd.seconds, w + n * t.wgt.seconds
            return StagePasses(fwd=f, bwd_in=b, wgt=w)
        return self._cached(("chain", self.signature(plan, stage), *template_key(plan)), make)

    def stage_passes(self, plan: ParallelPlan, stage: int) -> StagePasses:
        """F, B, W of a stage per microbatch, ZeRO-3 prefetch windows included."""
        if plan.step_zero != 3:
            return self.chain_passes(plan, stage)
        w = self.windows(plan, stage)
        return w["passes"]

    def pass_links(self, plan: ParallelPlan, stage: int) -> list[dict]:
        """Link busy seconds of a stage's F, B and W passes per microbatch (ZeRO-3 gathers in)."""
        if plan.step_zero == 3:
            return self.windows(plan, stage)["links"]

        def make():
            out = [{}, {}, {}]
            for t, n in self.stage_parts(plan, stage):
                for i, part in enumerate(t.passes):
                    out[i] = add_links(out[i], _scaled(dict(part.links), n))
            return out
        return self._cached(("pass_links", self.signature(plan, stage), *template_key(plan)), make)

    def first_extra(self, plan: ParallelPlan, stage: int) -> float:
        """ZeRO-1/2 with overlap: what gathering the updated weights, a block ahead, adds
        to the first forward of a step."""
        def make():
            first = [(c, w) for pi, c, w in self._window_list(plan, stage, (0,), cyclic=False) if pi == 0]
            blocks = self._sequence(plan, stage)  # the first block waits for its own gather, issued at t = 0
            own = sum(self.layer_gathers(plan, blocks[0][1].removesuffix(NO_RECOMPUTE))) if blocks else 0.0
            return own + sum(c * (window_s(w) - w.chain_s) for c, w in first)
        key = ("first", self.signature(plan, stage), plan.dp * plan.cp, plan.edp, *template_key(plan))
        return self._cached(key, make)

    # ---- overlap windows ---------------------------------------------------------------------

    def _sequence(self, plan: ParallelPlan, stage: int) -> list[tuple[int, str, int]]:
        """(pass index, block kind, layer or -1) of one microbatch on a stage, in order:
        the forward, the backward (input gradients), the weight-gradient pass."""
        layers = [(self.block_kind(plan, layer), layer) for layer in sorted(stage_layer_ids(self.model, plan, stage))]
        fwd = ([("embedding", -1)] if stage == 0 else []) + layers + ([("head", -1)] if stage == head_stage(plan) else [])
        out = [(0, k, layer) for k, layer in fwd] + [(1, k, layer) for k, layer in fwd[::-1]]
        if splits_backward(plan):
            out += [(2, k, layer) for k, layer in fwd[::-1] if k != "embedding"]
        return out

    def _pairs(self, plan: ParallelPlan, stage: int, cyclic: bool) -> tuple:
        """((pass, kind, next kind, next pass), count) over a stage's block sequence: each
        block with the block after it (the next microbatch's first when ``cyclic``).
        Depends on the layout only, so it is shared by every plan with these stages."""
        def make():
            seq = self._sequence(plan, stage)
            counts: dict[tuple, int] = {}
            for j, (pi, kind, _) in enumerate(seq):
                nxt = seq[j + 1] if j + 1 < len(seq) else (seq[0] if cyclic else None)
                key = (pi, kind, nxt[1] if nxt and self._gathers_next(nxt) else None, nxt[0] if nxt else None)
                counts[key] = counts.get(key, 0) + 1
            return tuple(counts.items())
        return self._cached(("pairs", *layout_key(plan),
                             plan.recompute_layers, plan.recompute == Recompute.NONE, stage, splits_backward(plan),
                             cyclic), make)

    def _window_list(self, plan: ParallelPlan, stage: int, gathers_in: tuple[int, ...], cyclic: bool) -> list:
        """(pass index, count, Window): each block holds the gathers of the next layer
        block in passes ``gathers_in``."""
        return [(key[0], count, self._window(plan, stage, key, gathers_in))
                for key, count in self._pairs(plan, stage, cyclic)]

    @staticmethod
    def _window_s(plan: ParallelPlan, w: Window) -> float:
        """A window's length: the prefetch played against the chain (``overlap.window_s``),
        or, without ``overlap_param_gather``, after it (the next layer waits for it)."""
        return window_s(w) if plan.overlap_param_gather else w.chain_s + w.prefetch_s

    def _window(self, plan: ParallelPlan, stage: int, key: tuple, gathers_in: tuple[int, ...]) -> Window:
        """The window of block ``key`` = (pass, kind, next kind, next pass): the block's
        pass with the next layer block's gathers prefetched if that pass gathers."""
        pi, kind, next_kind, next_pass = key
        part = self.template(plan, kind, stage).passes[pi]
        prefetch, links = 0.0, {}
        if next_kind is not None and next_pass in gathers_in:
            base = next_kind.removesuffix(NO_RECOMPUTE)
            prefetch, links = sum(self.layer_gathers(plan, base)), self.gather_links(plan, base)
        return Window(chain_s=part.seconds, links=dict(part.links), prefetch_s=prefetch, prefetch_links=links,
                      ops=part.ops)

    def _exposure(self, plan: ParallelPlan, stage: int, key: tuple) -> tuple[float, float]:
        """(chain, prefetch spill) seconds of a ZeRO-3 window (``_window``)."""
        def make():
            w = self._window(plan, stage, key, (0, 1))
            return w.chain_s, self._window_s(plan, w) - w.chain_s
        return self._cached(("exposure", key, self.signature(plan, stage), plan.dp * plan.cp, plan.edp,
                             *template_key(plan)), make)

    def stage_costs(self, plan: ParallelPlan, stage: int) -> StageCosts:
        """A stage's chunk passes for the pipeline walk (``pipeline.walk``): ZeRO-3's
        spills split at pass boundaries, ZeRO-1/2's first-forward gathers up front."""
        key = ("stage_costs", self.signature(plan, stage), plan.step_zero, plan.overlap_grad_reduce, plan.vpp,
               plan.overlap_param_gather,
               plan.dp * plan.cp, plan.edp, *template_key(plan))
        return self._cached(key, lambda: self._stage_costs(plan, stage))

    def _chunk_blocks(self, plan: ParallelPlan, stage: int, chunk: int) -> list[tuple[str, int]]:
        """(block kind, layer or -1) of one virtual stage's forward, in order."""
        def make():
            return [(b, -1) if isinstance(b, str) else (self.block_kind(plan, b), b)
                    for b in chunk_blocks(self.model, plan, stage, chunk)]
        return self._cached(("chunk_blocks", *layout_key(plan),
                             plan.recompute_layers, plan.recompute == Recompute.NONE, stage, chunk), make)

    def _stage_costs(self, plan: ParallelPlan, stage: int) -> StageCosts:
        """Per chunk: its F, B (and W) passes; under ZeRO-3 each block's window spills its
        prefetch (``_exposure``), the last block's spill, which depends on the pass that
        follows on the stage, tabled per pair of passes (``StageCosts.spills``)."""
        phases, split = (FWD, BWD, WGT), splits_backward(plan)
        zero3 = plan.step_zero == 3
        passes, ends, first = [], {}, 0.0
        tpl: dict[str, Template] = {}
        exposures: dict[tuple, tuple[float, float]] = {}

        def seconds(kind: str, pi: int) -> float:
            if kind not in tpl:
                tpl[kind] = self.template(plan, kind, stage)
            return tpl[kind].passes[pi].seconds

        def exposure(key: tuple) -> tuple[float, float]:
            if key not in exposures:
                exposures[key] = self._exposure(plan, stage, key)
            return exposures[key]
        for chunk in range(plan.vpp):
            fwd = self._chunk_blocks(plan, stage, chunk)
            blocks = {0: fwd, 1: fwd[::-1], 2: [b for b in fwd[::-1] if b[0] != "embedding"] if split else []}
            for pi, phase in enumerate(phases):
                seq = blocks[pi]
                if not zero3:
                    passes.append(((phase, chunk), PassCost(sum(seconds(k, pi) for k, _ in seq))))
                    continue
                spills, body = [], 0.0
                for j, (kind, _) in enumerate(seq[:-1]):
                    nxt = seq[j + 1]
                    chain, spill = exposure((pi, kind, nxt[0] if self._gathers_next((pi, *nxt)) else None, pi))
                    spills.append(spill)
                    body += chain + spill
                if seq:
                    body += seconds(seq[-1][0], pi)
                    ends[(phase, chunk)] = (pi, seq[-1][0], seq[0])
                e2 = spills[0] if spills and plan.overlap_param_gather else 0.0  # unprefetched: waits hide one
                ahead = plan.overlap_param_gather and sum(1 for _, layer in seq if layer >= 0) == 1
                passes.append(((phase, chunk), PassCost(body=body, e2=e2, ahead=ahead)))
            if chunk == 0 and zero3 and fwd:
                first = sum(self.layer_gathers(plan, fwd[0][0].removesuffix(NO_RECOMPUTE)))
        table = []
        for before, (pi, last_kind, _) in ends.items():
            for after, (qi, _, (first_kind, layer)) in ends.items():
                if not self._gathers_next((qi, first_kind, layer)):  # W gathers nothing, nor the embedding's B
                    continue
                table.append(((before, after), exposure((pi, last_kind, first_kind, qi))[1]))
        gathers = []
        if plan.weights_gathered_ahead:  # issued at t = 0, beside the forwards' own comm
            queue = 0.0
            for chunk in range(plan.vpp):
                fwd, tail = self._chunk_blocks(plan, stage, chunk), 0.0
                for kind, layer in fwd:  # every block's forward gathers
                    queue, tail = queue + sum(self.layer_gathers(plan, kind.removesuffix(NO_RECOMPUTE))), 0.0
                    tail += seconds(kind, 0)
                gathers.append((queue, tail))
        lost = tuple(self._gather_lost(plan, stage, chunk) for chunk in range(plan.vpp)) if gathers else ()
        return StageCosts(passes=tuple(passes), first_e1=first, gathers=tuple(gathers) if any(g for g, _ in gathers) else (),
                          gather_lost=lost if any(lost) else (),
                          spills=tuple(table))

    def windows(self, plan: ParallelPlan, stage: int) -> dict:
        """ZeRO-3, per microbatch on a stage: pass seconds with the gathers prefetched a
        block ahead (``overlap.window_s``), their exposed seconds, each pass's link loads."""
        key = ("windows", self.signature(plan, stage), plan.dp * plan.cp, plan.edp, *template_key(plan))
        return self._cached(key, lambda: self._windows(plan, stage))

    def _windows(self, plan: ParallelPlan, stage: int) -> dict:
        wins = self._window_list(plan, stage, (0, 1), cyclic=True)
        totals, exposed, links = [0.0, 0.0, 0.0], 0.0, [{}, {}, {}]
        for pi, count, w in wins:
            seconds = self._window_s(plan, w)
            totals[pi] += count * seconds
            exposed += count * (seconds - w.chain_s)
            links[pi] = add_links(links[pi], _scaled(w.links, count), _scaled(w.prefetch_links, count))
        return {"passes": StagePasses(fwd=totals[0], bwd_in=totals[1], wgt=totals[2]), "gather_exposed": exposed,
                "links": links}


    # ---- step time -------------------------------------------------------------------------

    def pipeline(self, plan: ParallelPlan) -> tuple[int, StagePasses, float]:
        """(critical stage, its passes, compute part of the bubble)."""
        def make():  # the fill and drain cost other stages' compute; their gathers prefetch in the wait
            sigs, firsts = self.stage_signatures(plan)
            windowed = {sig: self.stage_passes(plan, s) for sig, s in firsts.items()}
            chain = {sig: self.chain_passes(plan, s) for sig, s in firsts.items()}
            crit = max(range(plan.pp), key=lambda s: (windowed[sigs[s]].fwd + windowed[sigs[s]].bwd, s))
            stages = {s: chain[sigs[s]] for s in range(plan.pp)}
            stages[crit] = windowed[sigs[crit]]
            return crit, stages[crit], pipeline_bubble(plan, stages, crit)
        gathers = (plan.dp * plan.cp, plan.edp) if plan.step_zero == 3 else ()  # only ZeRO-3 gathers shape the passes
        return self._cached(("pipe", *template_key(plan), *layout_key(plan), plan.recompute_layers, plan.schedule,
                             plan.step_zero == 3, gathers, self.speeds(plan)), make)

    def timeline(self, plan: ParallelPlan) -> dict:
        """The parts of the step, in seconds (memoised per plan)."""
        return self._cached(("timeline", plan), lambda: self._timeline(plan))

    def _grad_exposed(self, plan: ParallelPlan, stage: int, st: StagePasses) -> tuple[float, float, int]:
        """(total, exposed, buckets) of one reduction of a stage's gradients: overlapped, it
        drains behind a microbatch's backward and shares its links (``overlap.drain_s``); the
        step pays it ``plan.grad_syncs`` times (``_stage_end``)."""
        grads, last, num_buckets, loads = self.grad_buckets(plan, stage)
        if not plan.overlap_grad_reduce or grads <= 0:
            return grads, grads, num_buckets
        drain, issued = self.bucket_drain_s(plan, stage, st.bwd)
        return grads, self._drain(plan, stage, st.bwd, st.bwd - issued, max(last, drain), loads), num_buckets

    def _drain(self, plan: ParallelPlan, stage: int, bwd_s: float, window: float, alone: float, loads: dict) -> float:
        """Seconds the gradient buckets add past the last backward: ``alone`` on their
        queue, or more where a link must carry them and the foreground traffic of the
        ``window`` since the first bucket was issued (the backward's link load per second)."""
        links = self.pass_links(plan, stage)
        scale = window / bwd_s if bwd_s > 0 else 0.0
        return drain_s(window, alone, _scaled(add_links(links[1], links[2]), scale), loads)

    def _gathers(self, plan: ParallelPlan, stage: int) -> tuple[float, float, float]:
        """(total, exposed, exposed before the stage's first forward) ZeRO all-gather seconds."""
        if not plan.step_zero:
            return 0.0, 0.0, 0.0
        per_step, backward = self.stage_gather_s(plan, stage)
        if per_step <= 0:
            return 0.0, 0.0, 0.0
        if plan.step_zero == 3:  # gathered before every pass of every microbatch (inside the passes)
            exposed = self.windows(plan, stage)["gather_exposed"]
            return plan.num_microbatches * (per_step + backward), plan.num_microbatches * exposed, 0.0
        if plan.weights_gathered_ahead:  # ZeRO-1/2: behind the first forward
            extra = self.first_extra(plan, stage)
            return per_step, extra, extra
        return per_step, per_step, 0.0  # after the optimizer, all exposed

    def _stage_end(self, plan: ParallelPlan, stage: int, st: StagePasses, drain: bool = True) -> dict:
        """What a stage adds after its last backward, and before its first forward
        (``drain`` False: the gradient drain left to the caller, as exposed in full)."""
        if drain:
            grads, grad_x, num_buckets = self._grad_exposed(plan, stage, st)
        else:
            grads, _, num_buckets, _ = self.grad_buckets(plan, stage)
            grad_x = grads
        syncs = plan.grad_syncs  # > 1: every microbatch reduces its own and waits for it (pp 1)
        grads, grad_x, num_buckets = syncs * grads, syncs * grad_x, syncs * num_buckets
        gathers, gather_x, shift = self._gathers(plan, stage)
        hidden = grads - grad_x + gathers - gather_x
        tail = gather_x if gathers and plan.step_zero in (1, 2) and not plan.weights_gathered_ahead else 0.0
        return {"grads_s": grads, "grad_exposed_s": grad_x, "num_buckets": num_buckets, "gathers_s": gathers,
                "gather_exposed_s": gather_x, "gather_shift_s": shift, "tail_s": tail,
                "interference_s": plan.interference * max(0.0, hidden),  # FiCCO: hidden comm slows compute
                "optimizer_s": self.optimizer_s(plan, stage), "input_s": input_seconds(plan)}

    def _timeline(self, plan: ParallelPlan) -> dict:
        """1F1B-family pipeline: stage s starts its first forward after the stages before
        it ran theirs (warm-up) and ends its last backward that much earlier (cool-down),
        so its gradient drain and optimizer step may hide there; the step ends when the
        last stage to finish is done."""
        crit, st, bubble = self.pipeline(plan)
        p2p = 2 * (plan.pp - 1) * self.p2p_s(plan)
        m = plan.num_microbatches
        sigs, firsts = self.stage_signatures(plan)  # alike stages differ only in their offsets
        passes = {sig: self.stage_passes(plan, s) for sig, s in firsts.items()}
        ends = {sig: self._stage_end(plan, s, passes[sig], drain=plan.pp == 1) for sig, s in firsts.items()}
        warm = cool = 0.0
        offsets = {}
        for s, sig in enumerate(sigs):
            offsets[s] = (warm / plan.vpp, cool / plan.vpp)
            warm, cool = warm + passes[sig].fwd, cool + passes[sig].bwd
        shift = max(max(0.0, ends[sigs[s]]["gather_shift_s"] - offsets[s][0]) for s in range(plan.pp))
        if plan.pp == 1:
            last = (bubble + p2p + shift + m * (st.fwd + st.bwd),)
            stage_end = {0: ends[sigs[0]]}
        else:  # the stages' schedules walked: unequal stages, few microbatches, gathers hidden in waits
            walked = self.walk(plan)
            last = walked.ends
            stage_end = {s: self._walked_end(plan, s, ends[sigs[s]], walked, passes[sigs[s]]) for s in range(plan.pp)}

        step = max(last[s] + serial_tail_s(stage_end[s]) for s in range(plan.pp))
        e = stage_end[crit]  # reported: the stage with the most work
        return {"step_time_s": step, "critical_stage": crit, "bubble_s": max(0.0, last[crit] - m * (st.fwd + st.bwd)),
                "p2p_s": p2p, "busy_s": m * (st.fwd + st.bwd), **e, "gather_shift_s": shift}

    def walk(self, plan: ParallelPlan) -> Walked:
        """Each stage's passes laid out by its schedule (``pipeline.walk``)."""
        def make():
            sigs, firsts = self.stage_signatures(plan)
            costs = {sig: self.stage_costs(plan, s) for sig, s in firsts.items()}
            return walk_pipeline(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches,
                                 tuple(costs[sig] for sig in sigs), self.walk_p2p_s(plan), self.pass_weights(plan),
                                 plan.pipeline_flushes)
        return self._cached(("walk", plan), make)

    def _walked_end(self, plan: ParallelPlan, stage: int, e: dict, walked: Walked, st: StagePasses) -> dict:
        """A stage's end figures from the walk: the gathers its waits hid taken off its
        exposure; the gradient buckets issued when the walked last backward of each
        chunk finishes the layer that fills them."""
        out = dict(e)
        hidden = walked.hidden[stage]
        if plan.step_zero == 3:
            out["gather_exposed_s"] = max(0.0, e["gather_exposed_s"] - hidden)
        elif plan.weights_gathered_ahead:
            out["gather_exposed_s"] = max(0.0, -hidden)
        grads, last, _, loads = self.grad_buckets(plan, stage)
        if plan.overlap_grad_reduce and grads > 0:
            end = walked.ends[stage]
            drain, issued = self.walked_drain_s(plan, stage, walked.grad_passes[stage], end)
            out["grad_exposed_s"] = self._drain(plan, stage, st.bwd, end - issued, max(last, drain), loads)
        shown = e["grads_s"] - out["grad_exposed_s"] + e["gathers_s"] - out["gather_exposed_s"]
        out["interference_s"] = plan.interference * max(0.0, shown)
        return out

    def step_time_s(self, plan: ParallelPlan) -> float:
        return self.timeline(plan)["step_time_s"]

    def lower_bound_s(self, plan: ParallelPlan) -> float:
        """A cheap bound below ``step_time_s``: the bubble's compute part plus m (F + B)
        of the critical stage (every other term of the step is >= 0)."""
        _, st, bubble = self.pipeline(plan)
        return bubble + plan.num_microbatches * (st.fwd + st.bwd)


def measured_disagreement() -> dict:
    """The closed form's measured distance from the engine (``agreement.toml``: median,
    p95 and max of |estimate / simulate - 1| over a seeded plan sample, with its source)."""
    text = resources.files("perfsim.estimators").joinpath("agreement.toml").read_text()
    return tomllib.loads(text)


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
