"""Pipeline schedules as orders of (phase, microbatch, chunk) per stage.

GPipe: all forwards then all backwards. 1F1B: warm-up of pp-s-1 forwards, steady
one-forward-one-backward, cool-down (Narayanan'21 PipeDream-Flush). Interleaved 1F1B:
Megatron's virtual-pipeline order over ``vpp`` chunks per stage (Narayanan'21 sec. 2.2).
"""

from perfsim.parallel import ParallelPlan, Schedule

FWD = "F"
BWD = "B"


def _gpipe(num_stages: int, stage: int, m: int) -> list[tuple[str, int, int]]:
    return [(FWD, mb, 0) for mb in range(m)] + [(BWD, mb, 0) for mb in range(m)]


def _one_f_one_b(num_stages: int, stage: int, m: int) -> list[tuple[str, int, int]]:
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


def _interleaved(pp: int, vpp: int, stage: int, m: int) -> list[tuple[str, int, int]]:
    total = m * vpp
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    order = [(FWD, *_virtual(k, pp, vpp, True)) for k in range(warmup)]
    for i in range(total - warmup):
        order.append((FWD, *_virtual(warmup + i, pp, vpp, True)))
        order.append((BWD, *_virtual(i, pp, vpp, False)))
    return order + [(BWD, *_virtual(k, pp, vpp, False)) for k in range(total - warmup, total)]


def stage_order(plan: ParallelPlan, stage: int) -> list[tuple[str, int, int]]:
    """The compute order of ``stage``: a list of (phase, microbatch, chunk)."""
    m = plan.num_microbatches
    if plan.schedule == Schedule.GPIPE:
        return _gpipe(plan.pp, stage, m)
    if plan.schedule == Schedule.INTERLEAVED or plan.vpp > 1:
        return _interleaved(plan.pp, plan.vpp, stage, m)
    return _one_f_one_b(plan.pp, stage, m)


def stage_layers(num_layers: int, pp: int, vpp: int, stage: int, chunk: int) -> range:
    """Layers held by virtual stage (stage, chunk): chunk-major round robin (Megatron)."""
    per_chunk = num_layers // (pp * vpp)
    start = (chunk * pp + stage) * per_chunk
    return range(start, start + per_chunk)
