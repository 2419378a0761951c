"""Pipeline schedules as orders of (phase, microbatch, chunk) per stage.

GPipe: all forwards then all backwards. 1F1B: warm-up of pp-s-1 forwards, steady
one-forward-one-backward, cool-down (Narayanan'21 PipeDream-Flush). Interleaved 1F1B:
Megatron's virtual-pipeline order over ``vpp`` chunks per stage (Narayanan'21 sec. 2.2).
ZB-H1 (Qi'23, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split into
an input-gradient pass B (on the critical path between stages) and a weight-gradient
pass W (local), W deferred to fill the cool-down bubble: uniform bubble
(pp-1)(F+B-W) instead of 1F1B's (pp-1)(F+B+W).

How ``vpp`` combines with each schedule (every one runs with vpp > 1):
- ``interleaved`` and ``1f1b``: Megatron's interleaved 1F1B, bubble / vpp.
- ``gpipe``: breadth-first looped GPipe (Lamy-Poirier'23): all forwards chunk by chunk,
  then all backwards in reverse; activation memory stays that of GPipe.
- ``zb-h1``: the interleaved order with every backward split into B and W, W deferred
  as in ZB-H1: uniform bubble (pp-1)/vpp (F+B-W) (a third of interleaved's at F=B=W;
  an interleaved variant in the spirit of Qi'23, not the paper's ZB-V schedule).
"""

from collections import deque

from perfsim.plan.parallel import ParallelPlan, Schedule

FWD = "F"
BWD = "B"  # full backward, or the input-gradient half under zb-h1
WGT = "W"  # weight-gradient half of a split backward (zb-h1)

Order = list[tuple[str, int, int]]


def _gpipe(pp: int, vpp: int, stage: int, m: int) -> Order:
    fwd = [(FWD, mb, c) for c in range(vpp) for mb in range(m)]
    return fwd + [(BWD, mb, c) for c in reversed(range(vpp)) for mb in range(m)]


def _one_f_one_b(num_stages: int, stage: int, m: int) -> Order:
    warmup = min(num_stages - stage - 1, m)
    order = [(FWD, mb, 0) for mb in range(warmup)]
    for i in range(m - warmup):
        order += [(FWD, warmup + i, 0), (BWD, i, 0)]
    return order + [(BWD, mb, 0) for mb in range(m - warmup, m)]


def _virtual(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """(microbatch, chunk) of the k-th virtual microbatch in Megatron's interleaved order."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return group * pp + within % pp, chunk


def _interleaved(pp: int, vpp: int, stage: int, m: int) -> Order:
    total = m * vpp
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    order = [(FWD, *_virtual(k, pp, vpp, True)) for k in range(warmup)]
    for i in range(total - warmup):
        order.append((FWD, *_virtual(warmup + i, pp, vpp, True)))
        order.append((BWD, *_virtual(i, pp, vpp, False)))
    return order + [(BWD, *_virtual(k, pp, vpp, False)) for k in range(total - warmup, total)]


def split_backward(order: Order, deferred: int) -> Order:
    """Follow every B with its W, keeping up to ``deferred`` Ws pending during the
    steady state; in the cool-down each B releases one pending W into the bubble."""
    last_fwd = max((i for i, item in enumerate(order) if item[0] == FWD), default=-1)
    out, pending = [], deque()
    for i, item in enumerate(order):
        out.append(item)
        if item[0] != BWD:
            continue
        pending.append((WGT, item[1], item[2]))
        limit = deferred if i < last_fwd else len(pending) - 1
        while len(pending) > limit:
            out.append(pending.popleft())
    return out + list(pending)


def _zb_h1(pp: int, vpp: int, stage: int, m: int) -> Order:
    # stage s defers s weight passes: the later stages, idle first in the cool-down of
    # 1F1B, have the most W work to slot in (checked against the uniform
    # (pp-1)(F+B-W) bubble in tests/test_pipeline.py)
    base = _one_f_one_b(pp, stage, m) if vpp == 1 else _interleaved(pp, vpp, stage, m)
    return split_backward(base, stage)


def stage_order(plan: ParallelPlan, stage: int) -> Order:
    """The compute order of ``stage``: a list of (phase, microbatch, chunk)."""
    return schedule_order(plan.schedule, plan.pp, plan.vpp, stage, plan.num_microbatches)


def schedule_order(schedule: Schedule, pp: int, vpp: int, stage: int, m: int) -> Order:
    """``stage_order`` of a schedule over ``m`` microbatches (no plan needed)."""
    if schedule == Schedule.GPIPE:
        return _gpipe(pp, vpp, stage, m)
    if schedule == Schedule.ZB_H1:
        return _zb_h1(pp, vpp, stage, m)
    if schedule == Schedule.INTERLEAVED or vpp > 1:
        return _interleaved(pp, vpp, stage, m)
    return _one_f_one_b(pp, stage, m)


def splits_backward(plan: ParallelPlan) -> bool:
    return plan.schedule == Schedule.ZB_H1


def stage_layers(num_layers: int, pp: int, vpp: int, stage: int, chunk: int, first: int = 0, last: int = 0) -> range:
    """Layers held by virtual stage (stage, chunk): chunk-major round robin (Megatron);
    with ``first`` / ``last`` set (Megatron's --decoder-first/last-pipeline-num-layers,
    vpp 1) the first / last stage holds that many and the others split the rest evenly."""
    if first or last:
        counts = uneven_counts(num_layers, pp, first, last)
        start = sum(counts[:stage])
        return range(start, start + counts[stage])
    per_chunk = num_layers // (pp * vpp)
    start = (chunk * pp + stage) * per_chunk
    return range(start, start + per_chunk)


def uneven_counts(num_layers: int, pp: int, first: int, last: int) -> list[int]:
    """Layers per stage when the first and/or last stage hold a set number (0: even share)."""
    middle = pp - bool(first) - bool(last)
    each = (num_layers - first - last) // middle if middle else 0
    counts = [each] * pp
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    return counts
