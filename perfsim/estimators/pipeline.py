"""The pipeline in closed form: each stage's schedule walked pass by pass.

The textbook bubbles ((pp-1)/vpp (F + B), ZB-H1's (pp-1)(F + B - W)) hold for equal
stages, many microbatches and passes of fixed length. They miss what the engine sees
when microbatches are few (m < pp: the fill is the step), stages are unequal, and
ZeRO-3 gathers are prefetched: a stage that waits for its input keeps gathering, so the
prefetch of a pass's first layers hides in the wait instead of in the layers before it.

``walk`` lays the stages' orders (``schedules.schedule_order``) out as list scheduling:
a pass starts when its stage is free and its input has arrived (the neighbouring
virtual stage's pass plus one p2p send, as ``graph._emit`` wires them), and lasts
``body + head``. ``head`` is the ZeRO-3 prefetch of the pass's first layer that spills
past the pass before it on the stage (``StageCosts.spills``: the exposure of that
pass's last window, which depends on both passes) less what the wait before the pass
already hid; the wait may also hide the second gather's spill (``e2``: the exposure of
the pass's first window), as the engine's gather queue, issuing a layer's gather when
the block two back ends, runs two gathers in a wait. ZeRO-1/2's gathers of the updated
weights, all issued at t = 0, hold each chunk's first forward until the queue has them. With many
microbatches two short walks past the warm-up are extended linearly (the steady state
is periodic), as the engine's folding does.
"""

from dataclasses import dataclass

from perfsim.plan.parallel import Schedule
from perfsim.plan.schedules import BWD, FWD, WGT, schedule_order


@dataclass(frozen=True, slots=True)
class PassCost:
    """One chunk pass (F, B or W) of a stage: ``body`` seconds (its windows but the
    last block's, whose spill depends on the pass after it), ``e2`` the spill inside its
    first window that a long enough wait also hides."""

    body: float
    e2: float = 0.0


@dataclass(frozen=True, slots=True)
class StageCosts:
    passes: tuple[tuple[tuple[str, int], PassCost], ...]  # (phase, chunk) -> cost
    first_e1: float = 0.0  # spill before the stage's first pass (gathers issued at t = 0)
    spills: tuple = ()  # ((pass before, pass after), seconds the after pass's first gather spills past the before pass)
    gathers: tuple[tuple[float, float], ...] = ()  # ZeRO-1/2, per chunk: (when the queue of updated-weight
    # gathers issued at t = 0 has gathered the chunk's layers, the chain after its last one)


NO_PASS = PassCost(0.0)


def fold_points(pp: int, vpp: int) -> tuple[int, int]:
    """Microbatch counts of the two short walks a long step is extended from (as the
    engine's ``api.fold_points``: past the warm-up, a whole number of interleaving groups apart)."""
    unit = pp if vpp > 1 else 1
    warm = 2 * pp * vpp + 2
    first = -(-warm // unit) * unit
    return first, first + max(unit, pp)


@dataclass(frozen=True, slots=True)
class Walked:
    ends: tuple[float, ...]  # per stage: when its last pass ends
    hidden: tuple[float, ...]  # per stage: prefetch seconds its waits hid (negative: first-pass gathers shown)
    grad_passes: tuple[tuple[tuple[float, float], ...], ...]  # per stage, per chunk: (start, end) of the
    # last microbatch's pass that reduces the gradients (B, or W when the backward is split)


def walk(schedule: Schedule, pp: int, vpp: int, m: int, stages: tuple[StageCosts, ...], p2p_s: float) -> Walked:
    """One step's stages laid out (see the module docstring)."""
    first, second = fold_points(pp, vpp)
    if m < 2 * second:
        return _walk(schedule, pp, vpp, m, stages, p2p_s)
    a, b = _walk(schedule, pp, vpp, first, stages, p2p_s), _walk(schedule, pp, vpp, second, stages, p2p_s)
    scale = (m - second) / (second - first)

    def ext(x, y):
        return y + scale * (y - x)
    return Walked(ends=tuple(ext(x, y) for x, y in zip(a.ends, b.ends)),
                  hidden=tuple(ext(x, y) for x, y in zip(a.hidden, b.hidden)),
                  grad_passes=tuple(tuple((ext(p[0], q[0]), ext(p[1], q[1])) for p, q in zip(sa, sb))
                                    for sa, sb in zip(a.grad_passes, b.grad_passes)))


def _walk(schedule, pp, vpp, m, stages, p2p_s):
    orders = [schedule_order(schedule, pp, vpp, s, m) for s in range(pp)]
    costs = [dict(stages[s].passes) for s in range(pp)]
    spills = [dict(stages[s].spills) for s in range(pp)]
    prev: list = [None] * pp
    last_vs = pp * vpp - 1
    done: dict[tuple, float] = {}
    cursor, free, hidden = [0] * pp, [0.0] * pp, [0.0] * pp
    started = [False] * pp
    grad_phase = WGT if any(p == WGT for p, _, _ in orders[0]) else BWD
    grads = [[(0.0, 0.0)] * vpp for _ in range(pp)]
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for s in range(pp):
            order = orders[s]
            while cursor[s] < len(order):
                phase, mb, chunk = order[cursor[s]]
                vs = chunk * pp + s
                ready = 0.0
                if phase == FWD and vs > 0:
                    src = done.get((FWD, mb, vs - 1))
                    if src is None:
                        break
                    ready = src + p2p_s
                elif phase == BWD and vs < last_vs:
                    src = done.get((BWD, mb, vs + 1))
                    if src is None:
                        break
                    ready = src + p2p_s
                cost = costs[s].get((phase, chunk)) or NO_PASS
                start = max(ready, free[s])
                wait = start - free[s]
                key = (phase, chunk)
                nominal = spills[s].get((prev[s], key), 0.0) if started[s] else 0.0
                spill = nominal if started[s] else stages[s].first_e1
                prev[s] = key
                head = max(0.0, spill - wait) - min(cost.e2, max(0.0, wait - spill))
                hidden[s] += nominal - head
                started[s] = True
                end = start + cost.body + head
                if phase == FWD and mb == 0 and stages[s].gathers:  # ZeRO-1/2: the updated weights' gathers
                    done_at, tail = stages[s].gathers[chunk]
                    shown = max(0.0, done_at + tail - end)
                    end += shown
                    hidden[s] -= shown
                free[s] = end
                if phase == grad_phase and mb == m - 1:
                    grads[s][chunk] = (start, end)
                if phase != WGT:
                    done[(phase, mb, vs)] = free[s]
                cursor[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule {schedule} deadlocks")
    return Walked(ends=tuple(free), hidden=tuple(hidden), grad_passes=tuple(tuple(g) for g in grads))
