"""The closed-form estimator: the same priced op graph, summed instead of simulated.

Pipeline: m * max_s(F_s + B_s) + (pp-1)/vpp * (max F + max B) + 2(pp-1) p2p
(Narayanan'21 eq. for 1F1B / interleaved bubbles). Overlapped data-parallel traffic is
exposed only where it outlasts the backward (or forward) it hides behind.
"""

from collections import defaultdict
from dataclasses import replace

from perfsim.engine import Span, span_of
from perfsim.graph import OpGraph
from perfsim.ops import Op, OpKind, Stream
from perfsim.schedules import BWD, FWD

_OFF_CHAIN = (Stream.DP_COMM, Stream.PP_COMM)


class _Stage:
    def __init__(self, ops: list[Op]):
        self.chain = [o for o in ops if o.stream not in _OFF_CHAIN and o.phase in (FWD, BWD)]
        self.tail = [o for o in ops if o.stream not in _OFF_CHAIN and o.phase not in (FWD, BWD)]
        self.grads = [o for o in ops if o.category == "dp_grad_reduce"]
        self.gathers = [o for o in ops if o.category == "dp_param_gather"]
        self.p2p = [o for o in ops if o.kind is OpKind.P2P]
        first = [o for o in self.chain if o.microbatch == 0]
        self.fwd = sum(o.duration_s for o in first if o.phase == FWD)
        self.bwd = sum(o.duration_s for o in first if o.phase == BWD)
        self.num_layers = max(1, len({o.layer for o in self.chain if o.layer >= 0}))

    @property
    def busy(self) -> float:
        return sum(o.duration_s for o in self.chain)


def _hidden_exposure(ops: list[Op], window: float, num_layers: int, overlapped: bool, repeat: float = 1.0) -> float:
    total = repeat * sum(o.duration_s for o in ops)
    if not ops or not overlapped:
        return total
    return max(ops[-1].duration_s, total - window * (1 - 1 / num_layers))


def run(graph: OpGraph) -> list[Span]:
    """Spans of the bottleneck stage laid out in closed form."""
    plan = graph.plan
    by_stage = defaultdict(list)
    for op in graph.ops:
        by_stage[op.stage].append(op)
    stages = {s: _Stage(ops) for s, ops in by_stage.items()}
    crit = max(stages, key=lambda s: (stages[s].fwd + stages[s].bwd, s))
    st = stages[crit]
    bubble = 0.0
    if plan.pp > 1:
        p2p = max((o.duration_s for o in st.p2p), default=0.0) or max(
            (o.duration_s for s in stages.values() for o in s.p2p), default=0.0
        )
        bubble = (plan.pp - 1) / plan.vpp * (max(s.fwd for s in stages.values()) + max(s.bwd for s in stages.values()))
        bubble += 2 * (plan.pp - 1) * p2p
    extra = plan.num_microbatches - (graph.num_microbatches or plan.num_microbatches)
    return _layout(st, bubble, plan.overlap_grad_reduce, plan.zero, extra)


def lowered_microbatches(plan) -> int:
    """Microbatches the closed form needs lowered: one, or one round of pp for vpp."""
    return plan.pp if plan.vpp > 1 else 1


def _repeat(st: _Stage, t: float, extra: int) -> tuple[list[Span], float]:
    """One span per category standing for ``extra`` more microbatches like microbatch 0."""
    totals: dict[tuple, list] = {}
    for op in st.chain:
        if op.microbatch == 0:
            entry = totals.setdefault((op.stream, op.category), [op, 0.0])
            entry[1] += op.duration_s * extra
    spans = []
    for op, seconds in totals.values():
        spans.append(replace(span_of(op, t, t + seconds), op=f"{op.category} x{extra} microbatches", microbatch=-1))
        t += seconds
    return spans, t


def _layout(st: _Stage, bubble: float, overlap: bool, zero: int, extra: int) -> list[Span]:
    busy = st.busy + extra * (st.fwd + st.bwd)
    ag_overlapped = overlap and zero != 3
    ag_window = st.fwd if zero != 3 else busy
    lowered = max(1, len({o.microbatch for o in st.chain}))
    repeat = (lowered + extra) / lowered if zero == 3 else 1.0  # ZeRO-3 gathers every microbatch
    gather_exposed = _hidden_exposure(st.gathers, ag_window, st.num_layers, ag_overlapped or zero == 3, repeat)
    shift = gather_exposed if st.gathers and (overlap or zero == 3) else 0.0
    spans, t = [], bubble + shift
    for op in st.chain:
        spans.append(span_of(op, t, t + op.duration_s))
        t += op.duration_s
    if extra > 0:
        more, t = _repeat(st, t, extra)
        spans += more
    grad_exposed = _hidden_exposure(st.grads, st.bwd, st.num_layers, overlap)
    spans += _comm_block(st.grads, t, grad_exposed)
    t += grad_exposed
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
