"""Attach a duration to every op of a graph: compute from ``costs``, communication from
``collectives`` on the communicator's placement. Identical ops are priced once.

Comm ops also get ``meta['latency_s']`` and ``meta['link_share']`` (the share of each
link of the stage's representative rank the op keeps busy while it moves data alone),
which the engine uses to share links among concurrent comm ops. The MoE dispatch and
combine (all-to-all on the ``ep`` communicator) are priced under the plan's ``dispatch``
implementation (``cost.dispatch.step_cost``; ``alltoall``: the library's all-to-all), and
carry ``meta['cu_share']``, the share of the GPU's compute units that implementation's
kernels hold while they run (``dispatch.held_share``): compute overlapped with them runs on
the rest (both estimators)."""

from perfsim.cost import dispatch
from perfsim.cost.collectives import collective_cost, local_peers
from perfsim.cost.kernels import PRICE_META, compute_time
from perfsim.lowering.graph import OpGraph
from perfsim.system.hardware import ClusterSpec
from perfsim.lowering.ops import Coll, Op
from perfsim.lowering.steps import ACT_BYTES
from perfsim.plan.parallel import group_shapes, group_strides


def _key(op: Op) -> tuple:
    return (op.kind, op.gemm, op.grouped, op.collective, op.flops, op.bytes,
            tuple(op.meta.get(k) for k in PRICE_META))


def placement_key(plan) -> tuple:
    """What an op's price depends on besides the op itself: the communicators' placement
    and the plan's GEMM dtype (a ``price`` cache may be shared by plans alike in it)."""
    return (plan.tp, plan.cp, plan.pp, plan.dp, plan.ep, plan.etp, plan.dtype, plan.dispatch)


def price(graph: OpGraph, cluster: ClusterSpec, slowdowns: list[float] | None = None,
          cache: dict | None = None) -> OpGraph:
    """Fill ``duration_s`` of every op in place; returns the graph.

    ``slowdowns`` (one factor per pipeline stage, see ``stragglers``) stretch compute
    ops to the pace of the stage's slowest GPU; an expert op that carries its EP rank's
    ``speed`` runs at that speed instead. ``cache`` (op key -> price) may be passed in to
    be shared by graphs of plans with the same ``placement_key`` on the same cluster."""
    slow = slowdowns or [1.0] * graph.plan.pp
    dispatch.check_impl(cluster, graph.plan.dispatch)
    shapes = group_shapes(graph.plan, cluster.gpus_per_node)
    strides = {k: stride for k, (_, stride) in group_strides(graph.plan).items()}
    cache = {} if cache is None else cache
    held = dispatch.held_share(cluster, graph.plan.dispatch, graph.plan.dispatch_compute_units)
    for op in graph.ops:
        key = _key(op)
        if key not in cache:
            cache[key] = _duration(op, cluster, shapes, strides, graph)
        op.duration_s, comm = cache[key]
        if comm is not None:
            op.meta["latency_s"], op.meta["link_share"] = comm
            if held and _is_dispatch(op):
                op.meta["cu_share"] = held
        elif "speed" in op.meta:
            op.duration_s /= op.meta["speed"]
        elif slow[op.stage] != 1.0:
            op.duration_s *= slow[op.stage]
    return graph


def _is_dispatch(op: Op) -> bool:
    """The MoE dispatch or combine: an all-to-all on the ``ep`` communicator."""
    return op.collective.coll is Coll.ALL_TO_ALL and op.collective.group == "ep"


def _comm_cost(op: Op, cluster: ClusterSpec, shapes: dict, strides: dict, graph: OpGraph):
    call, impl, model = op.collective, graph.plan.dispatch, graph.model
    shape = shapes[call.group]
    peers = local_peers(shape, strides.get(call.group, 1))
    if not _is_dispatch(op) or impl == dispatch.LIBRARY:
        return collective_cost(call.coll, call.size_bytes, shape, cluster, peers=peers)
    if impl in dispatch.LIBRARY_NAMES or shape.size <= 1 or call.size_bytes <= 0:
        return collective_cost(call.coll, call.size_bytes, shape, cluster, peers=peers, impl=impl)
    token_bytes = call.token_bytes or model.hidden_size * ACT_BYTES  # the lowered all-to-all's copy of one token
    return dispatch.step_cost(call.size_bytes, token_bytes, model.top_k, model.num_experts, shape, cluster, impl, peers,
                              topk_groups=model.topk_groups, expert_groups=model.expert_groups, blocked=call.blocked)


def _duration(op: Op, cluster: ClusterSpec, shapes: dict, strides: dict, graph: OpGraph) -> tuple:
    dtype = graph.plan.dtype
    if op.is_comm:
        cost = _comm_cost(op, cluster, shapes, strides, graph)
        bw_time = cost.time_s - cost.latency_s
        share = {k: v / bw_time for k, v in cost.demand.items()} if bw_time > 0 else {}
        return cost.time_s, (cost.latency_s, share)
    gemm_dtype = dtype if op.gemm is not None else "bf16"
    return compute_time(op, cluster.gpu, gemm_dtype), None
