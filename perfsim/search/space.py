"""The plan space of a search and the sweep worker that prunes and costs one chunk of it.

Enumeration goes axis by axis: (tp, cp, pp, dp, ep, etp) structures that multiply to the
GPU count, then vpp, schedule, mbs, zero, TP-comm overlap (where tp > 1), gradient bucket
size (where gradients cross data parallelism), the MoE dispatch implementation (where
ep > 1; the plan's own, ``alltoall``, unless fixed to a list) and recompute. Every candidate passes
``ParallelPlan`` validation and ``check_plan`` (divisibility), then the memory model
(``fastmem``, = ``memory.plan_memory``) before it is costed in closed form
(``estimators.analytic``, the same one ``estimate()`` uses). Rejections are counted by reason so that an empty answer can say which
constraint binds.
"""

import heapq
import re
import time
from types import SimpleNamespace
from dataclasses import dataclass, field, replace

from perfsim.cost import dispatch as dispatch_impls
from perfsim.errors import ConfigError
from perfsim.estimators.analytic import ClosedForm
from perfsim.estimators.fastmem import MemoryModel
from perfsim.system.hardware import ClusterSpec
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import (V_SHAPES, ParallelPlan, Recompute, Schedule, check_plan, ep_overlap_conflict,
                                   recompute_ladder)
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.sharding import fewest_recompute_layers
from perfsim.system.stacks import IDEAL, StackSpec

AXES = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "recompute", "schedule", "tp_comm_overlap",
        "grad_bucket_bytes", "dispatch", "ep_comm_overlap")
DEFAULT_BUCKET = ParallelPlan.__dataclass_fields__["grad_bucket_bytes"].default  # Megatron-Core DDP's 40M params, bf16
# bucket sizes tried where gradients are reduced over data parallelism: the default and a
# quarter of it (a smaller last bucket drains sooner behind the backward, more calls pay latency)
BUCKETS = (DEFAULT_BUCKET // 4, DEFAULT_BUCKET)
STRUCTURE = ("tp", "cp", "pp", "dp", "ep", "etp")
INNER = ("vpp", "schedule", "mbs", "zero", "recompute")
DEFAULT_LIMITS = {"cp": 8, "vpp": 8, "mbs": 8, "pp": 64}  # tp and etp: the GPUs of a node
OOM = "out of memory"
GBS_RULE = "plan.gbs must be divisible by mbs*dp"
DOMINATED = "dominated: the same plan with less recompute fits"


@dataclass(frozen=True, kw_only=True)
class Space:
    """The values each axis may take; a fixed axis holds one value (None: derived)."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    dp: tuple[int, ...] | None
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    vpp: tuple[int, ...]
    mbs: tuple[int, ...]
    zero: tuple[int, ...]
    recompute: tuple[Recompute, ...]
    schedule: tuple[Schedule, ...]
    tp_comm_overlap: tuple[bool, ...] = (False, True)  # tried only where tp > 1
    grad_bucket_bytes: tuple[int, ...] = BUCKETS  # tried only where gradients cross data parallelism
    # MoE dispatch implementations tried where ep > 1; None: the plan's own (alltoall, or the stack's)
    dispatch: tuple[str, ...] | None = None
    # the expert-parallel all-to-all overlap (ep_comm_overlap), tried only where Megatron-Core can
    # run it (``ep_overlaps``); default the stack's setting alone
    ep_comm_overlap: tuple[bool, ...] = (False,)


def _up_to(limit: int) -> tuple[int, ...]:
    return tuple(range(1, limit + 1))


def _values(axis: str, value) -> tuple:
    values = tuple(value) if isinstance(value, list | tuple | set | frozenset) else (value,)
    if not values:
        raise ConfigError(f"fixed.{axis}: needs at least one value")
    if axis == "recompute":
        return tuple(Recompute(v) if v in {r.value for r in Recompute} else _bad(axis, v) for v in values)
    if axis == "schedule":
        return tuple(Schedule(v) if v in {s.value for s in Schedule} else _bad(axis, v) for v in values)
    if axis == "dispatch":  # names; the cluster's [dispatch] tables are checked per chunk (cost_chunk)
        return tuple(dict.fromkeys(v if isinstance(v, str) and v else _bad(axis, v) for v in values))
    if axis in ("tp_comm_overlap", "ep_comm_overlap"):
        return tuple(sorted({v if isinstance(v, bool) else _bad(axis, v) for v in values}))
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 and axis != "zero" or axis == "zero" and v not in (0, 1, 2, 3):
            _bad(axis, v)
    return tuple(sorted(set(values)))


def _bad(axis: str, value):
    raise ConfigError(f"fixed.{axis}: {value!r} is not a valid value")


def build_space(model: ModelSpec, gpus_per_node: int, fixed: dict | None = None, limits: dict | None = None,
                stack: StackSpec = IDEAL) -> Space:
    """Default ranges (tp, etp within a node; cp, vpp, mbs up to ``DEFAULT_LIMITS``; the
    recompute settings ``stack`` offers, ``stack.recompute.auto``), narrowed by ``limits``
    ({axis: max}) and replaced by ``fixed`` ({axis: value(s)})."""
    fixed, limits = dict(fixed or {}), {**DEFAULT_LIMITS, "tp": gpus_per_node, "etp": gpus_per_node, **(limits or {})}
    for name, table in (("fixed", fixed), ("limits", limits)):
        unknown = sorted(set(table) - set(AXES))
        if unknown:
            raise ConfigError(f"{name}: unknown axis {unknown[0]!r} (axes: {', '.join(AXES)})")
    moe = model.is_moe
    axes = {
        "tp": _up_to(limits["tp"]), "cp": _up_to(limits["cp"]), "pp": _up_to(limits["pp"]), "dp": None,
        "ep": _up_to(min(limits.get("ep", model.num_experts), model.num_experts)) if moe else (1,),
        "etp": _up_to(limits["etp"]) if moe else (1,), "vpp": _up_to(limits["vpp"]), "mbs": _up_to(limits["mbs"]),
        # the stack's recompute settings (per-op checkpointing only where it is modelled: dense layers)
        "zero": (0, 1, 2, 3),
        "recompute": tuple(Recompute(v) for v in recompute_ladder(stack.recompute.levels(), model)),
        "schedule": tuple(Schedule),
        "tp_comm_overlap": (False, True), "grad_bucket_bytes": BUCKETS, "dispatch": None,
        "ep_comm_overlap": (bool(stack.overlap.ep_comm),),
    }
    for axis, value in fixed.items():
        axes[axis] = _values(axis, value)
    return Space(**axes)


def _divisors(n: int, allowed: tuple[int, ...]) -> list[int]:
    return [v for v in allowed if n % v == 0]


def structures(space: Space, num_gpus: int) -> list[tuple[int, ...]]:
    """(tp, cp, pp, dp, ep, etp) combinations whose sizes multiply to ``num_gpus`` and
    whose expert groups fit inside tp*cp*dp, in a fixed order."""
    out = []
    for tp in _divisors(num_gpus, space.tp):
        for cp in _divisors(num_gpus // tp, space.cp):
            for pp in _divisors(num_gpus // (tp * cp), space.pp):
                dp = num_gpus // (tp * cp * pp)
                if space.dp is not None and dp not in space.dp:
                    continue
                for ep in _divisors(tp * cp * dp, space.ep):
                    out += [(tp, cp, pp, dp, ep, etp) for etp in _divisors(tp * cp * dp // ep, space.etp)]
    return out


def schedules(space: Space, pp: int, vpp: int) -> list[Schedule]:
    """Schedules that differ for this (pp, vpp): the first without pipelining; 1f1b is
    the interleaved schedule once vpp > 1 and interleaved needs vpp > 1, so only one of
    the two is kept; the V-shape schedules only at vpp 2."""
    if pp == 1:
        usable = [s for s in space.schedule if s not in V_SHAPES]
        return [Schedule.ONE_F_ONE_B] if Schedule.ONE_F_ONE_B in space.schedule else usable[:1]
    pair = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    keep = [s for s in space.schedule if s not in pair and (vpp == 2 or s not in V_SHAPES)]
    if any(s in space.schedule for s in pair) and (vpp > 1 or Schedule.ONE_F_ONE_B in space.schedule):
        keep.insert(0, Schedule.INTERLEAVED if vpp > 1 else Schedule.ONE_F_ONE_B)
    return keep


_RECOMPUTE_ORDER = {r: i for i, r in enumerate(Recompute)}
_SCHEDULE_ORDER = {s: i for i, s in enumerate(Schedule)}


def plan_key(plan: ParallelPlan) -> tuple:
    """Deterministic tie-break order of plans (the search's plan tuple)."""
    return (plan.tp, plan.pp, plan.vpp, plan.dp, plan.ep, plan.etp, plan.cp, plan.zero, plan.mbs,
            _RECOMPUTE_ORDER[plan.recompute], _SCHEDULE_ORDER[plan.schedule], plan.tp_comm_overlap,
            -plan.grad_bucket_bytes, plan.dispatch != dispatch_impls.LIBRARY, _name_order(plan.dispatch),
            plan.ep_comm_overlap)


def _name_order(name: str) -> int:
    """A name as a number that sorts as the name does (plan keys are negated numbers)."""
    return int.from_bytes(name.encode().ljust(24, b"\0")[:24], "big")


def reason_of(exc: Exception) -> str:
    """A rejection message without its numbers in parentheses, to count alike ones together."""
    return re.sub(r"\s+", " ", re.sub(r"\([^)]*\)", "", str(exc))).strip()


# ---- the sweep worker -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Context:
    """What every chunk of one GPU count shares."""

    key: str  # identifies (model, cluster, routing) for the worker's memo
    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    gbs: int
    seq: int
    dtype: str = "bf16"
    routing: RoutingSpec = UNIFORM
    max_bytes: float
    stack: StackSpec = IDEAL  # the software stack every plan runs under (its overlap policy seeds the plans)
    plan_knobs: tuple[tuple[str, bool], ...] = ()  # plan switches every plan carries (search's plan_knobs)


@dataclass(frozen=True, kw_only=True)
class Chunk:
    context: Context
    space: Space
    structures: tuple[tuple[int, ...], ...]
    keep: int
    dominance: bool = True
    bound: bool = True  # skip plans whose lower bound cannot make the best ``keep``


@dataclass(kw_only=True)
class ChunkResult:
    num_gpus: int
    enumerated: int = 0
    costed: int = 0
    bounded: int = 0  # valid plans skipped because a lower bound proved them out of the best
    rejected: dict[str, int] = field(default_factory=dict)
    best: list[tuple[float, tuple, ParallelPlan]] = field(default_factory=list)
    smallest: tuple[float, tuple, ParallelPlan] | None = None  # least memory of the plans that do not fit
    seconds: float = 0.0  # CPU seconds of the worker


_MODELS: dict[str, tuple[ClosedForm, MemoryModel]] = {}


def _models(ctx: Context) -> tuple[ClosedForm, MemoryModel]:
    if ctx.key not in _MODELS:
        _MODELS.clear()
        _MODELS[ctx.key] = (ClosedForm(ctx.model, ctx.cluster, ctx.routing), MemoryModel(ctx.model, ctx.routing))
    return _MODELS[ctx.key]


def _reject(res: ChunkResult, reason: str, count: int = 1) -> None:
    res.rejected[reason] = res.rejected.get(reason, 0) + count


def _base_plans(chunk: Chunk, res: ChunkResult):
    """Plans with the structure and vpp set; a whole sub-space is rejected at once."""
    ctx, space = chunk.context, chunk.space
    for tp, cp, pp, dp, ep, etp in chunk.structures:
        reduced = dp * cp > 1 or tp * cp * dp > ep * etp
        knobs = (len(space.tp_comm_overlap) if tp > 1 else 1) * (len(space.grad_bucket_bytes) if reduced else 1)
        knobs *= len(space.dispatch) if ep > 1 and space.dispatch else 1
        inner = len(space.mbs) * len(space.zero) * len(space.recompute) * knobs
        for vpp in space.vpp if pp > 1 else (1,):
            scheds = schedules(space, pp, vpp)
            if not scheds:
                continue
            eps = len(ep_overlaps(space, SimpleNamespace(tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, tp_comm_overlap=False)))
            res.enumerated += inner * eps * len(scheds)
            carried = dict(ctx.plan_knobs)
            if pp == 1:  # without a pipeline the microbatches run back to back: nothing to flush
                carried.pop("pipeline_flushes", None)
            try:
                base = ParallelPlan(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp, vpp=vpp, gbs=ctx.gbs, seq=ctx.seq,
                                    dtype=ctx.dtype, mbs=1, schedule=scheds[0], stack=ctx.stack,
                                    **{**ctx.stack.plan_defaults(ctx.dtype), **carried,
                                       "ep_comm_overlap": False})  # its variants set it (ep_overlaps)
                check_plan(base, ctx.model, ctx.num_gpus)
            except ConfigError as exc:
                _reject(res, reason_of(exc), inner * eps * len(scheds))
                continue
            yield base, scheds


def ep_overlaps(space: Space, shape) -> tuple[bool, ...]:
    """The expert-parallel all-to-all overlap values worth trying for a structure (``shape``:
    its tp, cp, pp, vpp, ep, no TP-comm overlap): only where there is expert parallelism and
    the overlap can run (``ep_overlap_conflict``, plan validation's rule)."""
    return space.ep_comm_overlap if shape.ep > 1 and not ep_overlap_conflict(shape) else (False,)


def _variant(plan: ParallelPlan, zero: int, recompute: Recompute, overlap: bool, bucket: int,
             impl: str, ep_overlap: bool = False) -> ParallelPlan:
    """``plan`` with another zero stage, recompute, TP-comm overlap, bucket size and dispatch,
    without re-running validation: each only needs to be a member of its set, which
    ``build_space`` checked (this is the sweep's hot loop; replace() would double its cost).
    A variant with the expert-parallel overlap drops the shared-expert overlap, which plan
    validation refuses beside it (its merged step schedules the shared experts itself)."""
    new = object.__new__(ParallelPlan)
    new.__dict__.update(plan.__dict__, zero=zero, recompute=recompute, tp_comm_overlap=overlap,
                        grad_bucket_bytes=bucket, dispatch=impl, ep_comm_overlap=ep_overlap,
                        shared_expert_overlap=plan.shared_expert_overlap and not ep_overlap)
    return new


def knob_values(space: Space, plan: ParallelPlan) -> tuple[tuple[bool, ...], tuple[int, ...], tuple[str, ...]]:
    """TP-comm overlap, bucket sizes and dispatch implementations worth trying for this
    structure: overlap needs tp > 1, bucket size matters only where gradients are reduced
    over more than one rank, the dispatch only where there is expert parallelism."""
    overlaps = space.tp_comm_overlap if plan.tp > 1 else space.tp_comm_overlap[:1]
    reduced = plan.dp * plan.cp > 1 or plan.edp > 1
    buckets = space.grad_bucket_bytes if reduced else (DEFAULT_BUCKET if DEFAULT_BUCKET in space.grad_bucket_bytes
                                                        else space.grad_bucket_bytes[-1],)
    impls = space.dispatch or (plan.dispatch,)
    return overlaps, buckets, impls if plan.ep > 1 else impls[:1]


def _groups(chunk: Chunk, res: ChunkResult):
    """Validated plans, grouped by everything but recompute (lightest recompute first)."""
    ctx, space = chunk.context, chunk.space
    recomputes = sorted(space.recompute, key=list(Recompute).index)
    for base, scheds in _base_plans(chunk, res):
        overlaps, buckets, impls = knob_values(space, base)
        eps = ep_overlaps(space, base)
        variants = len(space.zero) * len(recomputes) * len(overlaps) * len(buckets) * len(impls) * len(eps)
        for schedule in scheds:
            for mbs in space.mbs:
                if ctx.gbs % (mbs * base.dp):  # ParallelPlan's rule, without building the plan
                    _reject(res, GBS_RULE, variants)
                    continue
                try:
                    plan = replace(base, schedule=schedule, mbs=mbs)
                    check_plan(plan, ctx.model, ctx.num_gpus)
                except ConfigError as exc:
                    _reject(res, reason_of(exc), variants)
                    continue
                for zero in space.zero:
                    for overlap in overlaps:
                        for bucket in buckets:
                            for impl in impls:
                                for ep_overlap in eps:
                                    group = [_variant(plan, zero, r, overlap, bucket, impl, ep_overlap)
                                             for r in recomputes]
                                    if ep_overlap:  # beside this variant's TP-comm overlap or full recompute
                                        whys = [ep_overlap_conflict(p) for p in group]
                                        for why in filter(None, whys):
                                            _reject(res, reason_of(f"plan.ep_comm_overlap {why}"))
                                        group = [p for p, why in zip(group, whys) if not why]
                                    if group:
                                        yield group


def cost_chunk(chunk: Chunk) -> ChunkResult:
    """Prune (divisibility, memory, dominance) and cost every plan of a chunk; keep the
    best ``keep``. Recompute only adds work (the step never shortens: the longer backward
    hides at most one microbatch's worth of it), so once a lighter recompute fits, the
    heavier ones of the same plan are dominated and not costed (``Chunk.dominance``)."""
    t0 = time.process_time()
    for impl in chunk.space.dispatch or ():
        dispatch_impls.check_impl(chunk.context.cluster, impl)
    coster, memory = _models(chunk.context)
    res = ChunkResult(num_gpus=chunk.context.num_gpus)
    worst: list[tuple[float, tuple, ParallelPlan]] = []  # max-heap (negated) of the best ``keep``
    for group in _groups(chunk, res):
        fitted = False
        for plan in group:
            if fitted and chunk.dominance:
                _reject(res, DOMINATED)
                continue
            peak, _ = memory.peak(plan)
            if peak > chunk.context.max_bytes:
                _reject(res, OOM)
                _smallest(res, peak, plan)
                continue
            fitted = True
            if (plan.recompute == Recompute.FULL and not plan.recompute_layers and chunk.dominance
                    and chunk.space.recompute != (Recompute.FULL,)  # not where full is pinned or every variant asked
                    and "block" in chunk.context.stack.recompute.auto):  # a framework that recomputes N layers
                plan = _least_block(plan, memory, chunk.context)
            if chunk.bound and len(worst) == chunk.keep and coster.lower_bound_s(plan) > -worst[0][0]:
                res.bounded += 1  # cannot enter the best ``keep``: its bound is already slower
                continue
            _push(worst, chunk.keep, coster.step_time_s(plan), plan)
            res.costed += 1
    res.best = sorted(((-s, tuple(-k for k in key), p) for s, key, p in worst), key=lambda e: e[:2])
    res.seconds = time.process_time() - t0
    return res


def _least_block(plan: ParallelPlan, memory: MemoryModel, ctx) -> ParallelPlan:
    """A plan that fits only under full recompute, with full recompute of the first N
    layers of each pipeline chunk for the smallest N that fits instead (Megatron's block
    method; ``api.least_recompute``'s ladder): the same plan with less recompute, so the
    every-layer one is dominated. ``plan`` itself where no block of fewer layers fits."""
    def block(layers: int) -> ParallelPlan:
        new = object.__new__(ParallelPlan)  # as _variant: no re-validation in the hot loop
        new.__dict__.update(plan.__dict__, recompute_layers=layers)
        return new

    layers = fewest_recompute_layers(ctx.model, plan, lambda n: memory.peak(block(n))[0] <= ctx.max_bytes)
    return block(layers) if layers else plan


def _smallest(res: ChunkResult, peak: float, plan: ParallelPlan) -> None:
    entry = (peak, plan_key(plan), plan)
    if res.smallest is None or entry[:2] < res.smallest[:2]:
        res.smallest = entry


def _push(heap: list, keep: int, step: float, plan: ParallelPlan) -> None:
    """Keep the ``keep`` smallest (step, plan tuple) in a heap of negated entries."""
    entry = (-step, tuple(-k for k in plan_key(plan)), plan)
    if len(heap) < keep:
        heapq.heappush(heap, entry)
    elif entry[:2] > heap[0][:2]:
        heapq.heapreplace(heap, entry)
