"""Attach a duration to every op of a graph: compute from ``costs``, communication from
``collectives`` on the communicator's placement. Identical ops are priced once."""

from perfsim.collectives import collective_cost
from perfsim.costs import compute_time
from perfsim.graph import OpGraph
from perfsim.hardware import ClusterSpec
from perfsim.ops import Op
from perfsim.parallel import group_shapes


def _key(op: Op) -> tuple:
    return (op.kind, op.gemm, op.grouped, op.collective, op.flops, op.bytes, op.meta.get("backward", False))


def price(graph: OpGraph, cluster: ClusterSpec) -> OpGraph:
    """Fill ``duration_s`` of every op in place; returns the graph."""
    shapes = group_shapes(graph.plan, cluster.gpus_per_node)
    cache: dict[tuple, float] = {}
    for op in graph.ops:
        key = _key(op)
        if key not in cache:
            cache[key] = _duration(op, cluster, shapes, graph.plan.dtype)
        op.duration_s = cache[key]
    return graph


def _duration(op: Op, cluster: ClusterSpec, shapes: dict, dtype: str) -> float:
    if op.is_comm:
        call = op.collective
        return collective_cost(call.coll, call.size_bytes, shapes[call.group], cluster).time_s
    gemm_dtype = dtype if op.gemm is not None else "bf16"
    return compute_time(op, cluster.gpu, gemm_dtype)
