"""The closed-form estimator: the same priced op graph, summed instead of simulated.

Pipeline bubble (uniform-stage textbook forms, F/B/W the per-stage pass times):
1F1B, GPipe and interleaved: (pp-1)/vpp * (F + B) + 2(pp-1) p2p (Narayanan'21 eq.3 and
sec. 2.2); ZB-H1: (pp-1)(F + B - W) with B the input-gradient and W the weight-gradient
pass (Qi'23 sec. 3), divided by vpp with interleaving (see ``schedules``).
Overlapped data-parallel traffic is exposed only where it outlasts the backward (or
forward) it hides behind; the part it hides slows compute by the plan's interference
share. A ring-attention hop is exposed only where it outlasts its attention block.
"""

from collections import defaultdict, deque
from dataclasses import replace

from perfsim.estimators.engine import Span, span_of
from perfsim.lowering.graph import OpGraph
from perfsim.lowering.ops import Op, OpKind, Stream
from perfsim.plan.parallel import Schedule
from perfsim.plan.schedules import BWD, FWD, WGT

_OFF_CHAIN = (Stream.DP_COMM, Stream.PP_COMM)
_PASSES = (FWD, BWD, WGT)
INTERFERENCE = "comm_interference"


def _walk(ops: list[Op], t: float) -> tuple[list[Span], float, dict[int, float]]:
    """Lay a compute chain out from ``t``: off-chain ops (ring hops) start with the
    chain, one after another, and a ``join`` op waits for the oldest one not yet
    joined (as ``graph`` wires them). Returns spans, end, exposed waits."""
    spans, sides, side_free, exposed = [], deque(), t, defaultdict(float)
    for op in ops:
        if op.meta.get("offchain"):
            start = max(t, side_free)  # the cp stream runs one hop at a time
            spans.append(span_of(op, start, start + op.duration_s))
            side_free = start + op.duration_s
            sides.append((side_free, op.op_id))
            continue
        if op.meta.get("join") and sides:
            side_end, side_id = sides.popleft()
            if side_end > t:
                exposed[side_id] += side_end - t
                t = side_end
        spans.append(span_of(op, t, t + op.duration_s))
        t += op.duration_s
    return spans, t, exposed


class _Stage:
    def __init__(self, ops: list[Op]):
        self.chain = [o for o in ops if o.stream not in _OFF_CHAIN and o.phase in _PASSES]
        self.tail = [o for o in ops if o.stream not in _OFF_CHAIN and o.phase not in _PASSES]
        self.grads = [o for o in ops if o.category == "dp_grad_reduce"]
        self.gathers = [o for o in ops if o.category == "dp_param_gather"]
        self.p2p = [o for o in ops if o.kind is OpKind.P2P and o.stream is Stream.PP_COMM]
        first = [o for o in self.chain if o.microbatch == 0]
        self.fwd, self.bwd_in, self.wgt = (_walk([o for o in first if o.phase == p], 0.0)[1] for p in _PASSES)
        self.bwd = self.bwd_in + self.wgt
        self.num_layers = max(1, len({o.layer for o in self.chain if o.layer >= 0}))


def _hidden_exposure(ops: list[Op], window: float, num_layers: int, overlapped: bool, repeat: float = 1.0) -> float:
    total = repeat * sum(o.duration_s for o in ops)
    if not ops or not overlapped:
        return total
    return max(ops[-1].duration_s, total - window * (1 - 1 / num_layers))


def pipeline_bubble(plan, stages: dict) -> float:
    """Idle time of a stage in the uniform-stage closed form (module docstring)."""
    if plan.pp == 1:
        return 0.0
    f = max(s.fwd for s in stages.values())
    b = max(s.bwd_in for s in stages.values())
    w = max(s.wgt for s in stages.values())
    if plan.schedule == Schedule.ZB_H1:
        return (plan.pp - 1) / plan.vpp * max(0.0, f + b - w)
    return (plan.pp - 1) / plan.vpp * (f + b + w)


def run(graph: OpGraph) -> list[Span]:
    """Spans of the bottleneck stage laid out in closed form."""
    plan = graph.plan
    by_stage = defaultdict(list)
    for op in graph.ops:
        by_stage[op.stage].append(op)
    stages = {s: _Stage(ops) for s, ops in by_stage.items()}
    crit = max(stages, key=lambda s: (stages[s].fwd + stages[s].bwd, s))
    st = stages[crit]
    bubble = pipeline_bubble(plan, stages)
    if plan.pp > 1:
        p2p = max((o.duration_s for o in st.p2p), default=0.0) or max(
            (o.duration_s for s in stages.values() for o in s.p2p), default=0.0
        )
        bubble += 2 * (plan.pp - 1) * p2p
    extra = plan.num_microbatches - (graph.num_microbatches or plan.num_microbatches)
    return _layout(st, bubble, plan, extra)


def lowered_microbatches(plan) -> int:
    """Microbatches the closed form needs lowered: one, or one round of pp for vpp."""
    return plan.pp if plan.vpp > 1 else 1


def _repeat(st: _Stage, t: float, extra: int, exposed: dict[int, float]) -> tuple[list[Span], float]:
    """One span per category standing for ``extra`` more microbatches like microbatch 0
    (a ring hop counts only its exposed part)."""
    totals: dict[tuple, list] = {}
    for op in st.chain:
        if op.microbatch == 0:
            entry = totals.setdefault((op.stream, op.category), [op, 0.0])
            seconds = exposed.get(op.op_id, 0.0) if op.meta.get("offchain") else op.duration_s
            entry[1] += seconds * extra
    spans = []
    for op, seconds in totals.values():
        spans.append(replace(span_of(op, t, t + seconds), op=f"{op.category} x{extra} microbatches", microbatch=-1))
        t += seconds
    return spans, t


def _layout(st: _Stage, bubble: float, plan, extra: int) -> list[Span]:
    overlap, zero = plan.overlap_grad_reduce, plan.zero
    busy = _walk(st.chain, 0.0)[1] + extra * (st.fwd + st.bwd)
    ag_overlapped = overlap and zero != 3
    ag_window = st.fwd if zero != 3 else busy
    lowered = max(1, len({o.microbatch for o in st.chain}))
    repeat = (lowered + extra) / lowered if zero == 3 else 1.0  # ZeRO-3 gathers every microbatch
    gather_exposed = _hidden_exposure(st.gathers, ag_window, st.num_layers, ag_overlapped or zero == 3, repeat)
    shift = gather_exposed if st.gathers and (overlap or zero == 3) else 0.0
    spans, t, exposed = _walk(st.chain, bubble + shift)
    if extra > 0:
        more, t = _repeat(st, t, extra, exposed)
        spans += more
    grad_exposed = _hidden_exposure(st.grads, st.bwd, st.num_layers, overlap)
    spans += _comm_block(st.grads, t, grad_exposed)
    t += grad_exposed
    hidden = sum(o.duration_s for o in st.grads) - grad_exposed
    if shift:
        hidden += repeat * sum(o.duration_s for o in st.gathers) - gather_exposed
    slowdown = plan.interference * max(0.0, hidden)
    if slowdown > 0:  # compute sharing the GPU with hidden comm kernels (FiCCO)
        spans.append(replace(span_of(st.chain[-1], t, t + slowdown), op=INTERFERENCE, category=INTERFERENCE))
        t += slowdown
    for op in st.tail:
        if op.name == "param_gather_wait":
            spans += _comm_block(st.gathers, t, gather_exposed)
            t += gather_exposed
            continue
        spans.append(span_of(op, t, t + op.duration_s))
        t += op.duration_s
    if shift:  # gathers during the step delay the compute by their exposed part
        spans += _comm_block(st.gathers, 0.0, sum(o.duration_s for o in st.gathers))
    return sorted(spans, key=lambda s: s.start_s)


def _comm_block(ops: list[Op], end_exposed_from: float, exposed: float) -> list[Span]:
    """Lay comm ops back to back so that exactly ``exposed`` seconds stick out past
    ``end_exposed_from``."""
    total = sum(o.duration_s for o in ops)
    t = end_exposed_from + exposed - total
    out = []
    for op in ops:
        out.append(span_of(op, t, t + op.duration_s))
        t += op.duration_s
    return out
