"""The discrete-event estimator: SimPy runs each stage's streams as processes.

Each (stage, stream) is one process that walks its ops in program order, waiting for
their dependencies; the engine only records spans, ``report`` interprets them.
"""

from collections import defaultdict
from dataclasses import dataclass

import simpy

from perfsim.graph import OpGraph
from perfsim.ops import Op


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


def span_of(op: Op, start: float, end: float) -> Span:
    size = op.collective.size_bytes if op.collective else op.bytes
    return Span(
        rank=op.stage, stream=str(op.stream), op=op.name, category=op.category, kind=str(op.kind),
        start_s=start, end_s=end, bytes=size, flops=op.flops, microbatch=op.microbatch,
        layer=op.layer, phase=op.phase,
    )


def _stream(env: simpy.Environment, ops: list[Op], done: list, spans: list):
    for op in ops:
        waits = [done[d] for d in op.deps if not done[d].processed]
        if waits:
            yield env.all_of(waits)
        start = env.now
        if op.duration_s > 0:
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
    for ops in streams.values():
        env.process(_stream(env, ops, done, spans))
    env.run()
    if len(spans) != len(graph.ops):
        raise RuntimeError(f"engine deadlock: {len(graph.ops) - len(spans)} ops never ran")
    return sorted(spans, key=lambda s: (s.start_s, s.rank))
