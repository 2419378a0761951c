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

V-shape schedules (``zbv``, ``v-half``, ``v-min``; vpp 2): stage s holds virtual stages s
and 2pp-1-s, so a microbatch runs down the stages and back up, and stage 0 holds both the
first layers and the LM head (Qi'24, ZB-V; Qi'24, "Pipeline Parallelism with Controllable
Memory"). Backward split into B and W as in ZB-H1. The three differ in the activation memory
a stage holds: 1F1B's peak (pp microbatches of the whole stage, 2pp chunks), about half of
it and about a third of it; a chunk's activations count from its F to its B (what its W
still needs, the linear layers' inputs, is left out: assumed). As Primus-pipeline's
zero-bubble scheduler builds them: zbv by a greedy list schedule over the passes' relative
times (``weights``: F, B, W and a send, from the priced stages) -- B first, then F (the chunk
nearer the LM head first) while the stage holds fewer than 2pp chunks, then W; v-half and
v-min from the paper's repeating blocks laid out at equal pass times (``_v_pattern``). Less
memory leaves more bubble (at equal pass times, pp 8, 64 microbatches: zbv 2%, v-half 7%,
v-min 7%, 1F1B 11%; more where B outlasts F).
"""

from collections import deque
from functools import lru_cache

from perfsim.plan.parallel import V_SHAPES, ParallelPlan, Schedule
from perfsim.plan.layout import stage_counts

FWD = "F"
BWD = "B"  # full backward, or the input-gradient half under zb-h1
WGT = "W"  # weight-gradient half of a split backward (zb-h1)

Order = list[tuple[str, int, int]]
Orders = tuple[tuple[tuple[str, int, int], ...], ...]  # every stage's order, immutable (cached)


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


def _interleaved_warmup(pp: int, vpp: int, stage: int, m: int, extra: int = 0) -> int:
    """Forwards ``stage`` runs before its first backward in Megatron's interleaved order
    (megatron/core/pipeline_parallel/schedules.py: (pp - rank - 1) * 2 + (vpp - 1) * pp), plus
    ``extra`` (the expert-parallel all-to-all overlap's one more), at most every one."""
    return min((pp - stage - 1) * 2 + (vpp - 1) * pp + extra, m * vpp)


@lru_cache(maxsize=1024)
def interleaved_peak(pp: int, vpp: int, stage: int, m: int, weights: tuple[float, ...],
                     merged: tuple[float, ...] | None = None) -> float:
    """Most activation ``stage`` holds at once in Megatron's interleaved order (``_interleaved``)
    where chunk c's forward keeps ``weights[c]`` until its backward: the warm-up's forwards,
    then each steady step's forward before the backward that follows it. Both steady
    sequences repeat every pp * vpp steps with every chunk pp times, so what is held repeats
    too: the peak falls within the warm-up and one period. Where chunks hold equal weights
    this is Narayanan'21's (1 + (pp - 1) / (pp * vpp)) pp microbatches on the first stage;
    later stages hold more than (pp - stage) of them, since the (vpp - 1) * pp of the warm-up
    does not shrink with the stage, and a chunk holding fewer layers (the embedding's or the
    loss's under Megatron's account-for-* split, uneven first / last stages) weighs less.

    ``merged`` (the expert-parallel all-to-all overlap: chunk c's largest layer): Megatron-Core
    runs one more warm-up forward, then merges each steady step's forward and backward layer
    by layer (megatron/core/pipeline_parallel: schedule_chunk_1f1b pairs the forward chunk's
    layer i with the backward chunk's layer n - 1 - i), so the backward frees a layer as the
    forward keeps one: a step holds at most one layer more than before it (or, a forward
    chunk with more layers than the backward's, its excess)."""
    total = m * vpp
    warmup = _interleaved_warmup(pp, vpp, stage, m, int(merged is not None))
    held = sum(weights[_virtual(k, pp, vpp, True)[1]] for k in range(warmup))
    peak = held
    for i in range(min(total - warmup, pp * vpp)):
        fwd, bwd = _virtual(warmup + i, pp, vpp, True)[1], _virtual(i, pp, vpp, False)[1]
        step = weights[fwd] if merged is None else max(merged[fwd], weights[fwd] - weights[bwd])
        peak = max(peak, held + step)
        held += weights[fwd] - weights[bwd]
    return peak


def _interleaved(pp: int, vpp: int, stage: int, m: int) -> Order:
    total = m * vpp
    warmup = _interleaved_warmup(pp, vpp, stage, m)
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


UNIT = (1.0, 1.0, 1.0, 0.0)  # relative (F, B, W, send) seconds when no pricing is at hand


def v_limit(schedule: Schedule, pp: int) -> int:
    """Chunk activations zbv lets a stage hold: 1F1B's peak, pp microbatches of the whole
    stage (2pp chunks), as ZB-V states."""
    return 2 * pp


@lru_cache(maxsize=256)
def v_chunks_held(schedule: Schedule, pp: int, m: int) -> int:
    """Most chunk activations a stage holds (F to B) under a V-shape schedule: zbv's limit,
    or the v-half / v-min block's peak over the stages."""
    if schedule == Schedule.ZBV:
        return min(v_limit(schedule, pp), 2 * m)
    return max(peak_chunks(schedule, pp, m, stage) for stage in range(pp))


def virtual_stage(schedule: Schedule, pp: int, stage: int, chunk: int) -> int:
    """Position of (stage, chunk) along the model: Megatron's round robin, or the V."""
    if schedule in V_SHAPES:
        return stage if chunk == 0 else 2 * pp - 1 - stage
    return chunk * pp + stage


def stage_of(schedule: Schedule, pp: int, vs: int) -> int:
    """The stage holding virtual stage ``vs`` (``virtual_stage`` inverted)."""
    if schedule in V_SHAPES:
        return vs if vs < pp else 2 * pp - 1 - vs
    return vs % pp


def layout_key(plan: ParallelPlan) -> tuple:
    """Plan fields that place the layers on the stages (and their chunks)."""
    return (plan.pp, plan.vpp, plan.first_stage_layers, plan.last_stage_layers, plan.accounted, plan.schedule in V_SHAPES,
            plan.mtp_layers, plan.pipeline_layout)


def head_stage(plan: ParallelPlan) -> int:
    """The stage holding the LM head: the last, or under a V-shape schedule the first."""
    return 0 if plan.schedule in V_SHAPES else plan.pp - 1


@lru_cache(maxsize=64)
def _v_orders(schedule: Schedule, pp: int, m: int, weights: tuple = UNIT) -> Orders:
    """Every stage's order under a V-shape schedule: zbv's greedy list schedule over the
    passes' relative ``weights`` (F, B, W, send; deterministic: the pass that can start
    first runs), or v-half's / v-min's repeating block (``_v_pattern``)."""
    if schedule == Schedule.ZBV:
        return _VGreedy(schedule, pp, m, weights).run()
    return _v_pattern(schedule, pp, m)


def _block_offsets(schedule: Schedule, pp: int, stage: int) -> tuple[int, int, int, int]:
    """Unit slots of (F chunk 0, F chunk 1, B chunk 1, B chunk 0) of microbatch 0 on
    ``stage`` in the repeating 6-slot block of Qi'24 ("Pipeline Parallelism with Controllable
    Memory", sec. 4: V-Min's and V-Half's building blocks; a gap keeps the blocks of
    consecutive microbatches from colliding when pp divides by 3 / 2)."""
    if schedule == Schedule.V_MIN:
        gap = 2 if pp % 3 == 0 else 0
        return stage, 2 * pp - 1 - stage, 2 * pp + gap + stage, 4 * pp + gap - 1 - stage
    gap = 3 if pp % 2 == 0 else 0
    return 2 * stage, 3 * pp - 2 - stage, 3 * pp + gap + 2 * stage - 1, 6 * pp + gap - 2 - stage


def _v_pattern(schedule: Schedule, pp: int, m: int) -> Orders:
    """v-half / v-min as Primus-pipeline builds them (its zero-bubble scheduler lays these two
    out from the paper's fixed blocks, at equal pass times): each microbatch's F and B passes
    at the block's slots, six slots per microbatch later for the next; each W in the first
    free slot after its B (chunk 1's first), the rest at the end. Walked at the priced
    passes' lengths, the order keeps its sequence and closes its gaps."""
    orders = []
    for stage in range(pp):
        slots = {}
        for (phase, chunk), first in zip(((FWD, 0), (FWD, 1), (BWD, 1), (BWD, 0)), _block_offsets(schedule, pp, stage)):
            for mb in range(m):
                slots[first + 6 * mb] = (phase, mb, chunk)
        order, waiting = [], {1: deque(), 0: deque()}
        for t in range(max(slots) + 1):
            if t in slots:
                order.append(slots[t])
                if slots[t][0] == BWD:
                    waiting[slots[t][2]].append(slots[t][1])
            elif waiting[1] or waiting[0]:
                chunk = 1 if waiting[1] else 0
                order.append((WGT, waiting[chunk].popleft(), chunk))
        order += [(WGT, mb, chunk) for chunk in (1, 0) for mb in waiting[chunk]]
        orders.append(tuple(order))
    return tuple(orders)


class _VGreedy:
    """The state of the greedy V-shape list schedule (``_v_orders``)."""

    def __init__(self, schedule: Schedule, pp: int, m: int, weights: tuple):
        self.schedule, self.pp, self.m, self.last = schedule, pp, m, 2 * pp - 1
        self.cost, self.send = dict(zip((FWD, BWD, WGT), weights[:3])), weights[3]
        self.limit = v_limit(schedule, pp)
        self.f_end, self.b_end = {}, {}  # (microbatch, virtual stage) -> when its F / B ends (relative seconds)
        self.next_f, self.next_b = [[0, 0] for _ in range(pp)], [[0, 0] for _ in range(pp)]
        self.pending = [deque() for _ in range(pp)]  # (ready time, chunk, microbatch) of each W
        self.held, self.free = [0] * pp, [0] * pp  # chunks between their F and B; when the stage is free
        self.orders = [[] for _ in range(pp)]

    def run(self) -> Orders:
        for _ in range(6 * self.pp * self.m):
            picks = [pick for pick in map(self.pick, range(self.pp)) if pick]
            if not picks:
                raise RuntimeError(f"pipeline schedule {self.schedule} deadlocks (pp {self.pp}, {self.m} microbatches)")
            start, s, phase, chunk, mb = min(picks)  # the pass that can start first runs (stage order on ties)
            end, vs = start + self.cost[phase], virtual_stage(self.schedule, self.pp, s, chunk)
            if phase == FWD:
                self.f_end[(mb, vs)] = end
                self.held[s] += 1
                self.next_f[s][chunk] += 1
            elif phase == BWD:
                self.b_end[(mb, vs)] = end
                self.held[s] -= 1
                self.next_b[s][chunk] += 1
                self.pending[s].append((end, chunk, mb))
            else:
                self.pending[s].popleft()
            self.orders[s].append((phase, mb, chunk))
            self.free[s] = end
        return tuple(tuple(o) for o in self.orders)

    def arrival(self, end, vs: int, stage: int):
        """When a pass of virtual stage ``vs`` that ended at ``end`` reaches ``stage`` (a send,
        unless ``vs`` is on that stage: the V's turn)."""
        if end is None:
            return None
        return end if stage_of(self.schedule, self.pp, vs) == stage else end + self.send

    def pick(self, s: int):
        """(start, stage, phase, chunk, microbatch) of the pass stage ``s`` runs next, or None:
        among the passes ready when it is free, B before F (the chunk nearer the LM head
        first, while the memory limit admits it) before W; if none is ready, the first to be."""
        options = []  # (ready, priority, tie-break, phase, chunk, microbatch)
        for chunk in (0, 1):
            vs, mb = virtual_stage(self.schedule, self.pp, s, chunk), self.next_b[s][chunk]
            if vs == self.last:  # the LM head's B follows its own F
                ready = self.f_end.get((mb, vs))
            else:
                ready = self.arrival(self.b_end.get((mb, vs + 1)), vs + 1, s)
            if mb < self.m and ready is not None:  # B, the lower chunk first (its microbatch is done)
                options.append((ready, 0, chunk, BWD, chunk, mb))
            mb = self.next_f[s][chunk]
            ready = 0 if vs == 0 else self.arrival(self.f_end.get((mb, vs - 1)), vs - 1, s)
            room = self.held[s] + (2 if chunk == 0 else 1) <= self.limit  # a chunk-0 F keeps room for its chunk-1 F
            if mb < self.m and ready is not None and room:
                options.append((ready, 1, -chunk, FWD, chunk, mb))
        if self.pending[s]:
            ready, chunk, mb = self.pending[s][0]
            options.append((ready, 2, 0, WGT, chunk, mb))
        if not options:
            return None
        now = self.free[s]
        waiting = [o for o in options if o[0] <= now]
        ready, _, _, phase, chunk, mb = min(waiting, key=lambda o: o[1:3]) if waiting else min(options)
        return max(now, ready), s, phase, chunk, mb


def peak_chunks(schedule: Schedule, pp: int, m: int, stage: int, weights: tuple = UNIT) -> int:
    """Most chunk activations ``stage`` holds at once under a V-shape schedule (F to B)."""
    held = peak = 0
    for phase, _, _ in _v_orders(schedule, pp, m, weights)[stage]:
        held += {FWD: 1, BWD: -1}.get(phase, 0)
        peak = max(peak, held)
    return peak


def stage_order(plan: ParallelPlan, stage: int, weights: tuple = UNIT) -> Order:
    """The compute order of ``stage``: a list of (phase, microbatch, chunk); ``weights``
    (relative F, B, W, send seconds) shape the V-shape schedules' greedy orders only."""
    return flushed_order(plan.schedule, plan.pp, plan.vpp, stage, plan.flush_microbatches, plan.pipeline_flushes,
                         weights)


def flushed_order(schedule: Schedule, pp: int, vpp: int, stage: int, m: int, flushes: int,
                  weights: tuple = UNIT) -> Order:
    """``flushes`` schedules of ``m`` microbatches one after another (``plan.pipeline_flushes``),
    the microbatches numbered on from one schedule to the next."""
    order = schedule_order(schedule, pp, vpp, stage, m, weights)
    if flushes == 1:
        return order
    return [(phase, mb + k * m, chunk) for k in range(flushes) for phase, mb, chunk in order]


def schedule_order(schedule: Schedule, pp: int, vpp: int, stage: int, m: int, weights: tuple = UNIT) -> Order:
    """``stage_order`` of a schedule over ``m`` microbatches (no plan needed)."""
    if schedule == Schedule.GPIPE:
        return _gpipe(pp, vpp, stage, m)
    if schedule in V_SHAPES:
        return list(_v_orders(schedule, pp, m, weights)[stage])
    if schedule == Schedule.ZB_H1:
        return _zb_h1(pp, vpp, stage, m)
    if schedule == Schedule.INTERLEAVED or vpp > 1:
        return _interleaved(pp, vpp, stage, m)
    return _one_f_one_b(pp, stage, m)


def splits_backward(plan: ParallelPlan) -> bool:
    return plan.schedule == Schedule.ZB_H1 or plan.schedule in V_SHAPES


def stage_layers(num_layers: int, pp: int, vpp: int, stage: int, chunk: int, first: int = 0, last: int = 0,
                 schedule: Schedule = Schedule.ONE_F_ONE_B, accounted: tuple[bool, bool] = (False, False),
                 mtp: int = 0, layout: str = "") -> range:
    """Layers held by virtual stage (stage, chunk): chunk-major round robin (Megatron), or
    under a V-shape schedule the V (``virtual_stage``); with ``first`` / ``last`` set
    (Megatron's --decoder-first/last-pipeline-num-layers, vpp 1; under a V-shape schedule
    the first and last virtual stages, both on stage 0) those hold that many and the
    others split the rest evenly; with ``accounted`` (embedding, loss) the layers and those
    slots split evenly, the first / last virtual stage a layer short (``accounted_counts``);
    with ``layout`` (Megatron's --pipeline-model-parallel-layout) what it places. ``mtp``
    multi-token-prediction layers (indices ``num_layers``..) follow the decoder layers: on
    the last virtual stage (Megatron's default), or where ``layout`` puts them."""
    vs = virtual_stage(schedule, pp, stage, chunk)
    if layout:
        counts = stage_counts(layout)
    elif first or last or any(accounted):
        counts = (uneven_counts(num_layers, pp * vpp, first, last) if first or last
                  else accounted_counts(num_layers, pp * vpp, *accounted))
    elif mtp:
        counts = [num_layers // (pp * vpp)] * (pp * vpp)
    else:
        per_chunk = num_layers // (pp * vpp)
        return range(vs * per_chunk, (vs + 1) * per_chunk)
    if mtp and not layout:
        counts = [*counts[:-1], counts[-1] + mtp]
    start = sum(counts[:vs])
    return range(start, start + counts[vs])


def accounted_counts(num_layers: int, units: int, embedding: bool, loss: bool) -> list[int]:
    """Layers per virtual stage when the embedding and / or the loss take a layer slot
    (Megatron's account-for-embedding/loss-in-pipeline-split): (layers + slots) / units
    each, the first / last a layer short (0 where each holds one slot)."""
    per = (num_layers + embedding + loss) // units
    counts = [per] * units
    counts[0] -= embedding
    counts[-1] -= loss
    return counts


def uneven_counts(num_layers: int, pp: int, first: int, last: int) -> list[int]:
    """Layers per (virtual) stage when the first and/or last hold a set number (0: even share)."""
    middle = pp - bool(first) - bool(last)
    each = (num_layers - first - last) // middle if middle else 0
    counts = [each] * pp
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    return counts
