"""The discrete-event estimator: SimPy runs each stage's streams as processes.

Each (stage, stream) is one process that walks its ops in program order, waiting for
their dependencies; the engine only records spans, ``report`` interprets them.

Comm ops of a stage that overlap in time share the representative rank's links (xGMI
links, NIC, leaf uplinks): after its fixed latency an op moves data as a fluid flow,
and rates are re-divided max-min fairly whenever a flow starts or ends, gradient
buckets after everything else (``priority_rates``). An op alone
takes exactly its priced duration, so the engine equals ``analytic`` without overlap.

With ``plan.comm_compute_interference`` > 0 a compute op progresses at (1 - share) of
its speed while any comm op of its stage is in flight (overlap is not free); while a
dispatch or combine whose kernels hold compute units is in flight (``meta['cu_share']``,
DeepEP's SMs) it progresses at (1 - that share), the larger of the two applying.
"""

from collections import defaultdict
from dataclasses import dataclass

import simpy

from perfsim.lowering.graph import OpGraph
from perfsim.system.network import max_min_rates
from perfsim.lowering.ops import Op

DONE_S = 1e-15  # a flow with less work left than this (seconds at full rate) has ended
BACKGROUND = frozenset({"dp_grad_reduce"})  # comm categories served after everything else


@dataclass(frozen=True, slots=True)
class Span:
    rank: int  # pipeline stage of the representative rank
    stream: str
    op: str
    category: str
    kind: str
    start_s: float
    end_s: float
    bytes: float
    flops: float
    microbatch: int
    layer: int
    phase: str
    op_id: int = -1
    deps: tuple[int, ...] = ()
    coll: str = ""  # collective kind of a comm op ("all_to_all", ...)


def span_of(op: Op, start: float, end: float) -> Span:
    size = op.collective.size_bytes if op.collective else op.bytes
    return Span(
        rank=op.stage, stream=str(op.stream), op=op.name, category=op.category, kind=str(op.kind),
        start_s=start, end_s=end, bytes=size, flops=op.flops, microbatch=op.microbatch,
        layer=op.layer, phase=op.phase, op_id=op.op_id, deps=op.deps,
        coll=str(op.collective.coll) if op.collective else "",
    )


class _Links:
    """The links of one stage's representative rank, shared by its comm ops in flight."""

    def __init__(self, env: simpy.Environment, share: float = 0.0):
        self.env, self.flows, self.rates, self.last, self.generation = env, {}, {}, 0.0, 0
        self.share = share  # the plan's interference share while any comm op is in flight
        # comm ops in flight -> the compute-unit share each holds; fires when the share compute loses changes
        self.held, self.toggle = {}, env.event()

    def comm(self, op: Op):
        """Process body of a whole comm op: latency, then data; counts as in flight."""
        self._hold(op, True)
        yield from self.transfer(op)
        self._hold(op, False)

    def lost(self) -> float:
        """Share of its speed a compute op loses now: the plan's interference share while
        any comm op is in flight, or the compute units an in-flight dispatch holds."""
        if not self.held:
            return 0.0
        return max(self.share, *self.held.values())

    def _hold(self, op: Op, start: bool) -> None:
        before = self.lost()
        if start:
            self.held[op.op_id] = op.meta.get("cu_share", 0.0)
        else:
            del self.held[op.op_id]
        if self.lost() != before:
            fired, self.toggle = self.toggle, self.env.event()
            fired.succeed()

    def compute(self, op: Op):
        """Process body of a compute op that runs at (1 - ``lost()``) of its speed while
        comm kernels of this rank are in flight (CUs taken by RCCL, FiCCO; DeepEP's SMs)."""
        left = op.duration_s
        while left > DONE_S:
            rate = 1.0 - self.lost()
            start, timer = self.env.now, self.env.timeout(left / rate)
            fired = yield timer | self.toggle
            if timer in fired:
                return
            left -= (self.env.now - start) * rate

    def transfer(self, op: Op):
        """Process body: the data-moving part of ``op`` (after its latency)."""
        latency = op.meta.get("latency_s", 0.0)
        share = op.meta.get("link_share") or {}
        work = op.duration_s - latency
        if latency > 0:
            yield self.env.timeout(latency)
        if work <= 0:
            return
        if not share:
            yield self.env.timeout(work)
            return
        self._advance()
        finished = self.env.event()
        self.flows[op.op_id] = [work, share, finished, op.category in BACKGROUND]
        self._reschedule()
        yield finished

    def _advance(self) -> None:
        dt = self.env.now - self.last
        for fid, flow in self.flows.items():
            flow[0] -= dt * self.rates.get(fid, 0.0)
        self.last = self.env.now

    def _reschedule(self) -> None:
        self.rates = priority_rates(self.flows)
        self.generation += 1
        if self.flows:
            wait = min(flow[0] / max(self.rates[fid], 1e-300) for fid, flow in self.flows.items())
            self.env.process(self._timer(max(wait, 0.0), self.generation))

    def _timer(self, wait: float, generation: int):
        yield self.env.timeout(wait)
        if generation != self.generation:
            return
        self._advance()
        # a flow whose remaining time is below the clock's resolution at this time is done
        # (otherwise float absorption in now + wait would spin forever)
        tolerance = max(DONE_S, self.env.now * 1e-12)
        for fid in [f for f, flow in self.flows.items() if flow[0] <= tolerance * max(self.rates.get(f, 0.0), 1.0)]:
            self.flows.pop(fid)[2].succeed()
        self._reschedule()


def priority_rates(flows: dict) -> dict[int, float]:
    """Max-min fair rates in two classes: foreground traffic (everything a pass waits
    for: TP/EP/CP/PP comm, parameter prefetch) shares the links first; background
    gradient buckets take what is left, so overlapping them never slows the pass
    (``flows[id] = [work, link shares, event, background]``)."""
    front = {fid: f[1] for fid, f in flows.items() if not f[3]}
    rates = max_min_rates(front) if front else {}
    back = {fid: f[1] for fid, f in flows.items() if f[3]}
    if not back:
        return rates
    used: dict[str, float] = {}
    for fid, share in front.items():
        for link, d in share.items():
            used[link] = used.get(link, 0.0) + d * rates[fid]
    scaled, stalled = {}, []
    for fid, share in back.items():
        left = {link: 1.0 - used.get(link, 0.0) for link in share}
        if any(v <= 1e-12 for v in left.values()):
            stalled.append(fid)
        else:
            scaled[fid] = {link: d / left[link] for link, d in share.items()}
    rates.update(max_min_rates(scaled) if scaled else {})
    rates.update({fid: 0.0 for fid in stalled})
    return rates


def _stream(env: simpy.Environment, ops: list[Op], done: list, spans: list, links: _Links, slows: bool):
    for op in ops:
        waits = [done[d] for d in op.deps if not done[d].processed]
        if waits:
            yield env.all_of(waits)
        start = env.now
        if op.is_comm:
            yield from (links.comm(op) if slows else links.transfer(op))
        elif slows and op.duration_s > 0:
            yield from links.compute(op)
        elif op.duration_s > 0:
            yield env.timeout(op.duration_s)
        spans.append(span_of(op, start, env.now))
        done[op.op_id].succeed()


def run(graph: OpGraph) -> list[Span]:
    """Simulate one step of a priced graph; spans sorted by start time."""
    env = simpy.Environment()
    done = [env.event() for _ in graph.ops]
    streams: dict[tuple, list[Op]] = defaultdict(list)
    for op in graph.ops:
        streams[(op.stage, op.stream)].append(op)
    spans: list[Span] = []
    share = graph.plan.interference
    links = {stage: _Links(env, share) for stage, _ in streams}
    slows = bool(share) or any(op.meta.get("cu_share") for op in graph.ops)  # comm slows compute
    for (stage, _), ops in streams.items():
        env.process(_stream(env, ops, done, spans, links[stage], slows))
    env.run()
    if len(spans) != len(graph.ops):
        raise RuntimeError(f"engine deadlock: {len(graph.ops) - len(spans)} ops never ran")
    return sorted(spans, key=lambda s: (s.start_s, s.rank))
