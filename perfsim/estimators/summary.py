"""What the closed form tells a report, without laying out spans: the step's breakdown,
exposed and overlapped comm per collective, per-layer, per-stage and per-stream seconds;
and, only when a trace is asked for, spans of the critical stage.

In the closed form the critical stage's step is one chain, so its critical path is its
breakdown: the pipeline bubble plus the passes, exposed comm and optimizer in series.
"""

from collections import deque
from dataclasses import dataclass, replace

from perfsim.estimators.analytic import (BUBBLE, GRAD_REDUCE, INTERFERENCE, PARAM_GATHER, ClosedForm, Pass, link_loads,
                                         serial_tail_s)
from perfsim.estimators.engine import Span, span_of
from perfsim.estimators.overlap import link_figures
from perfsim.lowering.ops import Stream
from perfsim.plan.parallel import V_SHAPES, ParallelPlan
from perfsim.plan.schedules import head_stage
from perfsim.plan.sharding import stage_layer_ids

DP = str(Stream.DP_COMM)
PP = str(Stream.PP_COMM)
COMPUTE = str(Stream.COMPUTE)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    step_time_s: float
    critical_stage: int
    breakdown: dict[str, float]  # seconds by category of the critical stage; sums to the step
    exposed_comm_s: float
    bubble_s: float
    overlapped_comm_s: dict[str, float]
    comm_by_collective: dict[str, dict]
    per_layer_s: dict[str, dict]
    per_stage: list[dict]
    per_stream_s: dict[str, float]
    critical_path_s: dict[str, float]
    critical_path_ops: int
    links: dict[str, dict]


# the compute-stream time after the last backward pass, as reported (category, timeline key)
AFTER_BACKWARD = ((INTERFERENCE, "interference_s"), ("optimizer", "optimizer_s"), ("data", "input_s"))


def _add(into: dict, key: str, seconds: float) -> None:
    if seconds > 0:
        into[key] = into.get(key, 0.0) + seconds


def _breakdown(cf: ClosedForm, plan: ParallelPlan, tl: dict) -> tuple[dict, set]:
    m, out, comm = plan.num_microbatches, {}, set()
    for block, n in cf.stage_parts(plan, tl["critical_stage"]):
        for part in block.passes:
            comm |= part.comm
            for cat, seconds in part.categories:
                out[cat] = out.get(cat, 0.0) + m * n * seconds
    for cat, key in ((GRAD_REDUCE, "grad_exposed_s"), (PARAM_GATHER, "gather_exposed_s"), *AFTER_BACKWARD):
        _add(out, cat, tl[key])
    out[BUBBLE] = max(0.0, tl["step_time_s"] - sum(out.values()))
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))), comm


def _gathers_a_step(plan: ParallelPlan, passes: int) -> int:
    """How often a step gathers a block: in ``passes`` passes of every microbatch under ZeRO-3,
    once (the updated weights) under ZeRO-1/2."""
    return plan.num_microbatches * passes if plan.step_zero == 3 else 1


def _gather_count(cf: ClosedForm, plan: ParallelPlan, stage: int) -> int:
    return sum(n * len(cf.layer_gathers(plan, k)) * _gathers_a_step(plan, passes)
               for k, n, passes in cf.gather_blocks(plan, stage))


def _link_loads(cf: ClosedForm, plan: ParallelPlan, tl: dict) -> dict[str, dict[str, float]]:
    """Collective key -> link -> busy seconds on the critical stage over the step."""
    m, crit, out = plan.num_microbatches, tl["critical_stage"], {}

    def put(key, load, times):
        for link, busy in load.items():
            out.setdefault(key, {})[link] = out.get(key, {}).get(link, 0.0) + times * busy
    for block, n in cf.stage_parts(plan, crit):
        for part in block.passes:
            for op in part.ops:
                if op.stream is not Stream.COMPUTE:
                    put(f"{op.category}/{op.collective.coll if op.collective else op.kind}", link_loads([op]), m * n)
    grads = cf.grad_buckets(plan, crit)
    put(f"{GRAD_REDUCE}/{'all_reduce' if plan.step_zero == 0 else 'reduce_scatter'}", grads[3], plan.grad_syncs)
    if plan.pp > 1:  # the stage's pipeline sends (as _collectives counts them)
        put("pp_p2p/send_recv", cf.p2p(plan).demand, _sends(plan, crit))
    if plan.step_zero:
        for kind, count, passes in cf.gather_blocks(plan, crit):
            put(f"{PARAM_GATHER}/all_gather", cf.gather_links(plan, kind), count * _gathers_a_step(plan, passes))
    return out


def _sends(plan: ParallelPlan, stage: int) -> int:
    """Pipeline sends of ``stage`` in a step: one per microbatch each way it has a neighbour
    (a V-shape schedule's two chunks each: the V's turn on the last stage is local)."""
    m = plan.num_microbatches * (2 if plan.schedule in V_SHAPES else 1)
    return 2 * m if 0 < stage < plan.pp - 1 else m


def _collectives(cf: ClosedForm, plan: ParallelPlan, tl: dict) -> dict[str, dict]:
    m, crit, out = plan.num_microbatches, tl["critical_stage"], {}

    def put(key, total, exposed, count):
        e = out.setdefault(key, {"total_s": 0.0, "exposed_s": 0.0, "count": 0})
        e["total_s"] += total
        e["exposed_s"] += exposed
        e["count"] += count

    for block, n in cf.stage_parts(plan, crit):
        for key, total, exposed, count in block.colls:
            put(key, m * n * total, m * n * exposed, m * n * count)
    if tl["grads_s"] > 0:
        put(f"{GRAD_REDUCE}/{'all_reduce' if plan.step_zero == 0 else 'reduce_scatter'}", tl["grads_s"],
            tl["grad_exposed_s"], tl["num_buckets"])
    if tl["gathers_s"] > 0:
        put(f"{PARAM_GATHER}/all_gather", tl["gathers_s"], tl["gather_exposed_s"], _gather_count(cf, plan, crit))
    if tl["p2p_s"] > 0:
        sends = _sends(plan, crit)
        put("pp_p2p/send_recv", max(tl["p2p_s"], sends * cf.p2p_s(plan)), tl["p2p_s"], sends)
    for e in out.values():
        e["overlapped_s"] = max(0.0, e["total_s"] - e["exposed_s"])
    return out


def _stage_totals(cf: ClosedForm, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(compute, comm) seconds one stage keeps its streams busy in a step."""
    m = plan.num_microbatches
    compute = comm = 0.0
    for block, n in cf.stage_parts(plan, stage):
        compute, comm = compute + m * n * block.compute_s, comm + m * n * block.comm_s
    grads = plan.grad_syncs * cf.grad_buckets(plan, stage)[0]
    fwd, bwd = cf.stage_gather_s(plan, stage) if plan.step_zero else (0.0, 0.0)
    gathers = m * (fwd + bwd) if plan.step_zero == 3 else fwd
    return compute + cf.optimizer_s(plan, stage), comm + grads + gathers


def _per_layer(cf: ClosedForm, plan: ParallelPlan, tl: dict) -> dict[str, dict]:
    m, crit, out = plan.num_microbatches, tl["critical_stage"], {}
    repeat = 2 * m if plan.step_zero == 3 else 1
    for layer in sorted(stage_layer_ids(cf.model, plan, crit)):
        kind = cf.kind(layer)
        block = cf.template(plan, cf.block_kind(plan, layer), crit)
        gathers = repeat * sum(cf.layer_gathers(plan, kind)) if plan.step_zero else 0.0
        out[str(layer)] = {"compute_s": m * block.compute_s, "comm_s": m * block.comm_s + gathers}
    compute, comm = _stage_totals(cf, plan, crit)
    other = {"compute_s": max(0.0, compute - sum(v["compute_s"] for v in out.values())),
             "comm_s": max(0.0, comm - sum(v["comm_s"] for v in out.values())) + tl["p2p_s"]}
    out["other"] = other
    return out


def _per_stream(cf: ClosedForm, plan: ParallelPlan, tl: dict, per_coll: dict) -> dict[str, float]:
    m, out = plan.num_microbatches, {}
    for block, n in cf.stage_parts(plan, tl["critical_stage"]):
        for stream, seconds in block.streams:
            _add(out, stream, m * n * seconds)
    _add(out, COMPUTE, tl["optimizer_s"] + tl["input_s"])
    _add(out, DP, tl["grads_s"] + tl["gathers_s"])
    _add(out, PP, per_coll.get("pp_p2p/send_recv", {}).get("total_s", 0.0))
    return out


def estimate(cf: ClosedForm, plan: ParallelPlan) -> Estimate:
    """The closed form's step with everything a report shows (no spans)."""
    tl = cf.timeline(plan)
    breakdown, comm = _breakdown(cf, plan, tl)
    per_coll = _collectives(cf, plan, tl)
    overlapped = {}
    for key, e in per_coll.items():
        _add(overlapped, key.split("/")[0], e["overlapped_s"])
    exposed = sum(v for k, v in breakdown.items() if k in comm) + tl["grad_exposed_s"] + tl["gather_exposed_s"]
    step = tl["step_time_s"]
    stages = [(s, *_stage_totals(cf, plan, s)) for s in range(plan.pp)]
    chain_ops = sum(n * block.num_ops for block, n in cf.stage_parts(plan, tl["critical_stage"]))
    return Estimate(
        step_time_s=step, critical_stage=tl["critical_stage"], breakdown=breakdown, exposed_comm_s=exposed,
        bubble_s=breakdown[BUBBLE], overlapped_comm_s=overlapped, comm_by_collective=per_coll,
        per_layer_s=_per_layer(cf, plan, tl),
        per_stage=[{"stage": s, "compute_s": c, "comm_s": k, "idle_s": max(0.0, step - c)} for s, c, k in stages],
        per_stream_s=_per_stream(cf, plan, tl, per_coll), critical_path_s={k: v for k, v in breakdown.items() if v > 0},
        critical_path_ops=plan.num_microbatches * chain_ops + 1,
        links=link_figures(_link_loads(cf, plan, tl), per_coll, step),
    )


# ---- spans (a trace, only when asked for) ------------------------------------------------


def _lay(part: Pass, t: float, stage: int, layer: int, phase: str, out: list[Span]) -> float:
    """Spans of one pass from ``t`` as ``analytic.walk`` lays it out (off-chain ops on
    their own stream, a join waits for the oldest one); returns the pass's end."""
    side_free, sides = t, deque()
    for op in part.ops:
        if op.meta.get("offchain"):
            start = max(t, side_free)
            side_free = start + op.duration_s
            sides.append(side_free)
        else:
            if op.meta.get("join") and sides:
                t = max(t, sides.popleft())
            start = t
            t += op.duration_s
        out.append(replace(span_of(op, start, start + op.duration_s), rank=stage, layer=layer, phase=phase, microbatch=0))
    return t


def _one_microbatch(cf: ClosedForm, plan: ParallelPlan, stage: int, t: float, out: list[Span]) -> float:
    layers = sorted(stage_layer_ids(cf.model, plan, stage))
    blocks = ([("embedding", -1)] if stage == 0 else []) + [(cf.block_kind(plan, layer), layer) for layer in layers]
    blocks += [("head", -1)] if stage == head_stage(plan) else []
    for index, phase in enumerate(("F", "B", "W")):
        order = blocks if phase == "F" else blocks[::-1]
        for kind, layer in order:
            part = cf.template(plan, kind, stage).passes[index]
            t = _lay(part, t, stage, layer, phase, out)
    return t


def spans(cf: ClosedForm, plan: ParallelPlan) -> list[Span]:
    """The reported stage laid out: idle until its first forward (pipeline fill), ZeRO
    gathers of the updated weights ahead of it, microbatch 0 op by op and its exposed
    ZeRO-3 gathers, the other microbatches as one span per category, then the exposed
    gradient reduction, interference, optimizer and any gathers after it."""
    tl = cf.timeline(plan)
    crit, m = tl["critical_stage"], plan.num_microbatches
    passes, gathered = cf.stage_passes(plan, crit), cf.windows(plan, crit)["gather_exposed"] if plan.step_zero == 3 else 0.0
    work = m * (passes.fwd + passes.bwd)
    start = max(0.0, tl["step_time_s"] - serial_tail_s(tl) - work)
    out: list[Span] = []
    t = _one_microbatch(cf, plan, crit, start, out)
    first = out[0] if out else None
    if first is None:
        return out
    if tl["gather_shift_s"] > 0:
        _comm(out, first, PARAM_GATHER, "param_gather", tl["gathers_s"], tl["gather_shift_s"], start - tl["gather_shift_s"])
    t = _comm(out, first, PARAM_GATHER, "param_gather_wait", gathered, gathered, t)
    if m > 1:
        per_cat: dict[str, float] = {}
        for block, n in cf.stage_parts(plan, crit):
            for part in block.passes:
                for cat, seconds in part.categories:
                    per_cat[cat] = per_cat.get(cat, 0.0) + n * seconds
        if gathered:
            per_cat[PARAM_GATHER] = per_cat.get(PARAM_GATHER, 0.0) + gathered
        for cat, seconds in per_cat.items():
            out.append(replace(first, op=f"{cat} x{m - 1} microbatches", category=cat, stream=COMPUTE, kind="summary",
                               start_s=t, end_s=t + (m - 1) * seconds, microbatch=-1, layer=-1, phase="", op_id=-1,
                               deps=(), bytes=0.0, flops=0.0, coll=""))
            t += (m - 1) * seconds
    t = _comm(out, first, GRAD_REDUCE, "grad_reduce", tl["grads_s"], tl["grad_exposed_s"], t)
    for cat, key in AFTER_BACKWARD:
        if tl[key] > 0:
            out.append(replace(first, op=cat, category=cat, stream=COMPUTE, kind="elementwise", start_s=t,
                               end_s=t + tl[key], microbatch=-1, layer=-1, phase="optimizer", op_id=-1, deps=(), coll=""))
            t += tl[key]
    _comm(out, first, PARAM_GATHER, "param_gather", tl["tail_s"], tl["tail_s"], t)
    return sorted(out, key=lambda s: (s.start_s, s.end_s))


def _comm(out: list[Span], like: Span | None, category: str, name: str, total: float, exposed: float,
          t: float) -> float:
    """One DP comm span of ``total`` seconds ending ``exposed`` after ``t``."""
    if total <= 0 or like is None:
        return t
    start = t + exposed - total
    out.append(replace(like, op=name, category=category, stream=DP, kind="collective", start_s=start,
                       end_s=t + exposed, microbatch=-1, layer=-1, phase="", op_id=-1, deps=(), bytes=0.0,
                       flops=0.0, coll="all_gather" if category == PARAM_GATHER else "reduce"))
    return t + exposed
