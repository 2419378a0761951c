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
microbatches two short walks past the warm-up are extended linearly once the step's growth
per group of microbatches repeats (``steady_window``: the steady state is periodic, and the
transient can outlast the schedule's warm-up), as the engine's folding does.
"""

from dataclasses import dataclass
from functools import lru_cache

from perfsim.plan.parallel import Schedule
from perfsim.plan.schedules import BWD, FWD, UNIT, WGT, flushed_order, virtual_stage


@dataclass(frozen=True, slots=True)
class PassCost:
    """One chunk pass (F, B or W) of a stage: ``body`` seconds (its windows but the
    last block's, whose spill depends on the pass after it), ``e2`` the spill inside its
    first window that a long enough wait also hides."""

    body: float
    e2: float = 0.0
    ahead: bool = False  # one gathering block: a long wait also gathers the next pass's first layer


@dataclass(frozen=True, slots=True)
class StageCosts:
    passes: tuple[tuple[tuple[str, int], PassCost], ...]  # (phase, chunk) -> cost
    first_e1: float = 0.0  # spill before the stage's first pass (gathers issued at t = 0)
    spills: tuple = ()  # ((pass before, pass after), seconds the after pass's first gather spills past the before pass)
    gathers: tuple[tuple[float, float], ...] = ()  # ZeRO-1/2, per chunk: (when the queue of updated-weight
    # gathers issued at t = 0 has gathered the chunk's layers, the chain after its last one)
    gather_lost: tuple[float, ...] = ()  # ZeRO-1/2, per chunk: seconds that queue loses to one forward pass of
    # the chunk while it is in flight (the forward's own comm goes first on the links they share)


NO_PASS = PassCost(0.0)


def fold_points(pp: int, vpp: int) -> tuple[int, int]:
    """Microbatch counts of the first two short walks a long step may be extended from (as
    the engine's ``api.fold_points``: past the warm-up, a whole number of interleaving groups
    apart); ``steady_window`` moves them on until the step's growth per group is steady."""
    unit = pp if vpp > 1 else 1
    warm = 2 * pp * vpp + 2
    first = -(-warm // unit) * unit
    return first, first + max(unit, pp)


# A long step is extended from two short walks only once its growth per group of microbatches
# repeats: two consecutive groups' growths agree within FOLD_TOLERANCE (relative; a numerical
# convergence test, not a hardware number). The schedule's warm-up is not always the end of
# the transient (link sharing between stages, merged expert-parallel steps, ZeRO gathers can
# take a few groups more), and a growth read in the transient is multiplied by the step's
# remaining groups. FOLD_TRIES bounds the groups walked past the first pair; without a steady
# growth by then the widest window walked is extended.
FOLD_TOLERANCE = 1e-3
FOLD_TRIES = 4


def checks_growth(first: int, second: int, m: int) -> bool:
    """Whether a step of ``m`` leaves room to check the first pair's growth against the next
    group's (``steady_window``): at least twice ``second`` + a group."""
    return m >= 2 * (2 * second - first)


def steady_window(measure, first: int, second: int, m: int) -> tuple[int, int] | None:
    """The two microbatch counts a step of ``m`` is extended from: the first pair of counts a
    group (``second - first``) apart whose growth matches the next pair's, moved on one group
    at a time from (``first``, ``second``) at most ``FOLD_TRIES`` times; without such a pair,
    the widest window walked (``first`` to the last count). ``measure(k)``: the end of a step
    of ``k`` microbatches (asked again for counts it gave: the callers memoise it). Where
    ``m`` leaves room for the first pair but not for checking it against the next (under
    twice ``second`` + a group), the first pair; None under twice ``second``: walk the step
    whole."""
    group = second - first
    if m < 2 * second:
        return None
    if not checks_growth(first, second, m):
        return first, second
    counts = [first, second]
    for _ in range(FOLD_TRIES):
        following = counts[-1] + group
        if 2 * following > m:
            break
        ends = [measure(k) for k in (counts[-2], counts[-1], following)]
        counts.append(following)
        before, after = ends[1] - ends[0], ends[2] - ends[1]
        if abs(after - before) <= FOLD_TOLERANCE * abs(after):
            return counts[-2], counts[-1]
    return counts[0], counts[-1]


@dataclass(frozen=True, slots=True)
class Walked:
    ends: tuple[float, ...]  # per stage: when its last pass ends
    hidden: tuple[float, ...]  # per stage: prefetch seconds its waits hid (negative: first-pass gathers shown)
    grad_passes: tuple[tuple[tuple[float, float], ...], ...]  # per stage, per chunk: (start, end) of the
    # last microbatch's pass that reduces the gradients (B, or W when the backward is split)


@lru_cache(maxsize=4096)
def walk(schedule: Schedule, pp: int, vpp: int, m: int, stages: tuple[StageCosts, ...], p2p_s: float,
         weights: tuple = UNIT, flushes: int = 1) -> Walked:
    """One step's stages laid out (see the module docstring); memoised, since plans that
    differ in what the stages do not see (dp, the bucket size, ...) walk alike. ``weights``:
    the passes' relative times the V-shape schedules' orders are built from. ``flushes``
    (``plan.pipeline_flushes``): the ``m`` microbatches run as that many schedules one after
    another; a long run of them is extended from the first ones, as a long schedule is."""
    if flushes > 1:  # counted in whole schedules: k of them
        def short(k: int) -> Walked:
            return _short_walk(schedule, pp, vpp, m // flushes, stages, p2p_s, weights, k)
        first, second, units = 1, 2, flushes
    else:  # counted in microbatches of the one schedule
        def short(k: int) -> Walked:
            return _short_walk(schedule, pp, vpp, k, stages, p2p_s, weights)
        (first, second), units = fold_points(pp, vpp), m
    window = steady_window(lambda k: max(short(k).ends), first, second, units)
    if window is None:
        return short(units)
    first, second = window
    a, b = short(first), short(second)
    scale = (units - second) / (second - first)

    def ext(x, y):
        return y + scale * (y - x)
    return Walked(ends=tuple(ext(x, y) for x, y in zip(a.ends, b.ends)),
                  hidden=tuple(ext(x, y) for x, y in zip(a.hidden, b.hidden)),
                  grad_passes=tuple(tuple((ext(p[0], q[0]), ext(p[1], q[1])) for p, q in zip(sa, sb))
                                    for sa, sb in zip(a.grad_passes, b.grad_passes)))


@lru_cache(maxsize=256)
def compiled(schedule: Schedule, pp: int, vpp: int, m: int, weights: tuple = UNIT, flushes: int = 1) -> tuple:
    """The stages' orders flattened into one list in dependency order (as ``graph._emit``
    interleaves them): per pass (stage, slot, input pass or -1, slot of the pass before it
    on the stage or -1, first forward of its chunk, gradient pass of the last
    microbatch, chunk, whether the input comes from the same stage: the V's turn, no
    send), slot = phase * vpp + chunk. ``flushes`` schedules of ``m`` microbatches run one
    after another (``schedules.flushed_order``). Depends on the schedule only, so cached."""
    orders = [flushed_order(schedule, pp, vpp, s, m, flushes, weights) for s in range(pp)]
    m *= flushes
    phase_of = {FWD: 0, BWD: 1, WGT: 2}
    grad_phase = WGT if any(p == WGT for p, _, _ in orders[0]) else BWD
    last_vs, index, out = pp * vpp - 1, {}, []
    cursor, prev = [0] * pp, [-1] * pp
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for s in range(pp):
            order = orders[s]
            while cursor[s] < len(order):
                phase, mb, chunk = order[cursor[s]]
                vs = virtual_stage(schedule, pp, s, chunk)
                dep = -1
                if phase == FWD and vs > 0:
                    dep = index.get((FWD, mb, vs - 1), None)
                elif phase == BWD and vs < last_vs:
                    dep = index.get((BWD, mb, vs + 1), None)
                if dep is None:
                    break
                slot = phase_of[phase] * vpp + chunk
                if phase != WGT:
                    index[(phase, mb, vs)] = len(out)
                local = dep >= 0 and out[dep][0] == s  # the V's turn: no send
                out.append((s, slot, dep, prev[s], phase == FWD and mb == 0, phase == grad_phase and mb == m - 1, chunk,
                            local))
                prev[s] = slot
                cursor[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule {schedule} deadlocks")
    return tuple(out)


def _walk(schedule, pp, vpp, m, stages, p2p_s, weights=UNIT, flushes=1):
    steps = compiled(schedule, pp, vpp, m, weights, flushes)
    slots = 3 * vpp
    phase_of = {FWD: 0, BWD: 1, WGT: 2}
    bodies, e2s, aheads, spill, first_e1, gathers, lost = [], [], [], [], [], [], []
    for st in stages:
        body, e2, ahead = [0.0] * slots, [0.0] * slots, [False] * slots
        for (phase, chunk), cost in st.passes:
            k = phase_of[phase] * vpp + chunk
            body[k], e2[k], ahead[k] = cost.body, cost.e2, cost.ahead
        table = [[0.0] * slots for _ in range(slots)]
        for ((pa, ca), (pb, cb)), seconds in st.spills:
            table[phase_of[pa] * vpp + ca][phase_of[pb] * vpp + cb] = seconds
        bodies.append(body), e2s.append(e2), aheads.append(ahead), spill.append(table)
        first_e1.append(st.first_e1), gathers.append(st.gathers), lost.append(st.gather_lost)
    ends = [0.0] * len(steps)
    free, hidden, credit, delay = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    grads = [[(0.0, 0.0)] * vpp for _ in range(pp)]
    for i, (s, slot, dep, before, first_fwd, grad, chunk, local) in enumerate(steps):
        f = free[s]
        start = f
        if dep >= 0:
            ready = ends[dep] + (0.0 if local else p2p_s)
            if ready > f:
                start = ready
        wait = start - f
        if before >= 0:
            nominal = out = spill[s][before][slot]
        else:
            nominal, out = 0.0, first_e1[s]
        if credit[s]:  # gathered in the wait before the pass before (its only gathering block)
            out, credit[s] = max(0.0, out - credit[s]), 0.0
        used = min(e2s[s][slot], wait - out if wait > out else 0.0)
        head = (out - wait if out > wait else 0.0) - used
        if aheads[s][slot] and wait > out + used:
            credit[s] = wait - out - used
        hidden[s] += nominal - head
        end = start + bodies[s][slot] + head
        if lost[s] and slot < vpp and start < gathers[s][-1][0] + delay[s]:  # a forward beside the queue
            delay[s] += lost[s][slot]
        if first_fwd and gathers[s]:  # ZeRO-1/2: the updated weights' gathers
            done_at, tail = gathers[s][chunk]
            shown = done_at + delay[s] + tail - end
            if shown > 0:
                end += shown
                hidden[s] -= shown
        free[s] = ends[i] = end
        if grad:
            grads[s][chunk] = (start, end)
    return Walked(ends=tuple(free), hidden=tuple(hidden), grad_passes=tuple(tuple(g) for g in grads))


# the short walks a long step is extended from, shared by the steps of every length that
# extend them (``walk``): a search prices many batch sizes of one plan
_short_walk = lru_cache(maxsize=4096)(_walk)
