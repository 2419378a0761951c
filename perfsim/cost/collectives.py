"""Collective cost: RCCL-like algorithms decomposed into phases of concurrent flows.

An algorithm turns (collective, buffer size, group placement) into phases; a phase says
how many bytes the representative rank pushes over xGMI and through its NIC, over how
many xGMI links, and how many latency steps it takes on each tier. ``network`` turns the
bytes into per-link demand (xGMI links, NIC, leaf uplinks). A call costs

    launch + protocol latency + steps x hop latency + sum over phases of
    max over links (bytes on the link / (link bandwidth x protocol efficiency))

and carries its per-link demand so the engine can share links among concurrent calls.
Buffer sizes follow rccl-tests: ``size`` is the full buffer (n chunks for RS/AG/A2A).
"""

from dataclasses import dataclass, field

from perfsim import units
from perfsim.system import network
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, FabricTopology, ProtocolSpec
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape

# rccl-tests busbw = algbw * factor(n) (rccl-tests doc/PERFORMANCE.md)
BUSBW_FACTOR = {
    Coll.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
    Coll.REDUCE_SCATTER: lambda n: (n - 1) / n,
    Coll.ALL_GATHER: lambda n: (n - 1) / n,
    Coll.ALL_TO_ALL: lambda n: (n - 1) / n,
    Coll.BROADCAST: lambda n: 1.0,
    Coll.REDUCE: lambda n: 1.0,
    Coll.SEND_RECV: lambda n: 1.0,
}
# bytes each rank sends in a ring, as a share of the buffer (Patarasuk & Yuan'09)
RING_SHARE = {
    Coll.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
    Coll.REDUCE_SCATTER: lambda n: (n - 1) / n,
    Coll.ALL_GATHER: lambda n: (n - 1) / n,
    Coll.BROADCAST: lambda n: 1.0,
    Coll.REDUCE: lambda n: 1.0,
}
# ring steps per call (NCCL tuning.cc: AR 2(n-1); RS/AG n-1; broadcast/reduce pipeline n-1)
RING_STEPS = {Coll.ALL_REDUCE: 2}


@dataclass(frozen=True, kw_only=True)
class Phase:
    intra_bytes: float = 0.0  # bytes the rank sends over xGMI
    inter_bytes: float = 0.0  # bytes the rank's NIC sends
    intra_links: int = 1  # xGMI links the intra bytes spread over
    intra_steps: int = 0
    inter_steps: int = 0
    cross_share: float | None = None  # share of inter bytes leaving the leaf; None: a
    # neighbour pattern (ring/tree) whose crossing edges carry all the rank's NIC bytes
    flows_per_gpu: int = 1  # NIC flows (for ECMP hashing)


@dataclass(frozen=True, kw_only=True)
class CollectiveCost:
    time_s: float
    latency_s: float
    protocol: str
    algorithm: str
    demand: dict[str, float] = field(default_factory=dict)  # link -> seconds busy alone
    bytes_sent: float = 0.0  # per rank, all phases


def _steps(coll: Coll, n: int) -> int:
    return RING_STEPS.get(coll, 1) * (n - 1)


def ring(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """Flat ring over all ranks; each channel crosses every node boundary once, channels
    spread over the node's p NICs (NCCL ring: busbw = min(xGMI, node NIC bandwidth))."""
    if coll not in RING_SHARE:
        return []
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    total = RING_SHARE[coll](n) * size
    inter = total / p if m > 1 else 0.0
    steps, inter_steps = _steps(coll, n), _steps(coll, m)
    return [Phase(intra_bytes=total - inter, inter_bytes=inter, intra_links=max(p - 1, 1),
                  intra_steps=steps - inter_steps, inter_steps=inter_steps)]


def tree(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """Double binary tree across nodes, chain inside a node (NCCL): reduce up, broadcast
    down; each node's NICs carry the buffer once each way."""
    if coll not in (Coll.ALL_REDUCE, Coll.BROADCAST, Coll.REDUCE) or shape.num_nodes < 2:
        return []
    p, m = shape.per_node, shape.num_nodes
    ways = 2 if coll is Coll.ALL_REDUCE else 1
    return [Phase(intra_bytes=ways * size * (p - 1) / p, inter_bytes=ways * size / p,
                  intra_links=max(p - 1, 1), intra_steps=ways * (p - 1),
                  inter_steps=ways * network.log2_ceil(m))]


def direct(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """One-shot / all-pairs: every rank talks to every peer at once (RS then AG for
    all-reduce: 2 steps, same bytes as a ring); all-to-all and send/recv everywhere."""
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    if coll is Coll.ALL_TO_ALL:
        return [_all_to_all_phase(size * (p - 1) / n, size * (n - p) / n, shape, cluster)]
    if coll is Coll.SEND_RECV:
        return [Phase(inter_bytes=size, inter_steps=1)] if m > 1 else [Phase(intra_bytes=size, intra_steps=1)]
    if m > 1:
        return []
    if coll in (Coll.BROADCAST, Coll.REDUCE):  # the root's buffer to (or from) every peer
        return [Phase(intra_bytes=size * (n - 1), intra_links=n - 1, intra_steps=1)]
    steps = 2 if coll is Coll.ALL_REDUCE else 1
    return [Phase(intra_bytes=RING_SHARE[coll](n) * size, intra_links=n - 1, intra_steps=steps)]


def _all_to_all_phase(intra: float, inter: float, shape: GroupShape, cluster: ClusterSpec) -> Phase:
    """Pairwise exchange. Rails-only fabrics have no path between rails, so traffic for
    another rail first crosses xGMI to the GPU on that rail (PXN); rail-optimized
    fabrics send it up to the shared spines instead."""
    p, m = shape.per_node, shape.num_nodes
    other_rail = (p - 1) / p
    topology = cluster.fabric.topology
    pxn = inter * other_rail if topology is FabricTopology.RAILS_ONLY else 0.0
    cross = network.cross_leaf_fraction(cluster, m)
    if topology is FabricTopology.RAIL_OPTIMIZED and m > 1:
        cross = other_rail + (1 - other_rail) * cross
    return Phase(intra_bytes=intra + pxn, inter_bytes=inter, intra_links=max(p - 1, 1),
                 intra_steps=1 if p > 1 else 0, inter_steps=1 if m > 1 else 0,
                 cross_share=cross, flows_per_gpu=max(1, shape.size - p))


def hierarchical(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """Intra-node over xGMI, then inter-node ring on each rail with 1/p of the buffer,
    then intra-node again (all-reduce: RS, AR, AG; RS: RS, RS; AG: AG, AG)."""
    p, m = shape.per_node, shape.num_nodes
    if coll not in RING_SHARE or m < 2 or p < 2:
        return []
    if coll in (Coll.BROADCAST, Coll.REDUCE):
        inter = Phase(inter_bytes=size, inter_steps=m - 1)
        intra = Phase(intra_bytes=size, intra_links=p - 1, intra_steps=p - 1)
        return [inter, intra]
    local = Phase(intra_bytes=size * (p - 1) / p, intra_links=p - 1, intra_steps=p - 1)
    rail = Phase(inter_bytes=RING_SHARE[coll](m) * size / p, inter_steps=_steps(coll, m))
    if coll is Coll.ALL_REDUCE:
        return [local, rail, local]
    return [local, rail] if coll is Coll.REDUCE_SCATTER else [rail, local]


ALGORITHMS = {"ring": ring, "tree": tree, "direct": direct, "hierarchical": hierarchical}


def pick_protocol(cluster: ClusterSpec, size_bytes: float, protocol: str | None = None) -> tuple[str, ProtocolSpec]:
    protocols = cluster.collectives.protocols
    if protocol is not None:
        if protocol not in protocols:
            raise ConfigError(f"protocol: {protocol!r} is not one of {', '.join(protocols)}")
        return protocol, protocols[protocol]
    ordered = sorted(protocols.items(), key=lambda kv: kv[1].max_bytes)
    for name, spec in ordered:
        if size_bytes <= spec.max_bytes:
            return name, spec
    return ordered[-1]


def _link_demand(phase: Phase, shape: GroupShape, cluster: ClusterSpec, peers: tuple[int, ...]) -> dict[str, float]:
    """Seconds each link of the representative rank is busy for this phase at full speed."""
    demand = {}
    if phase.intra_bytes > 0:
        links = peers[: max(1, min(phase.intra_links, len(peers)))]
        for peer in links:
            demand[f"{network.XGMI}:{peer}"] = phase.intra_bytes / len(links) / cluster.node.link_Bps
    if phase.inter_bytes > 0:
        demand[network.NIC] = phase.inter_bytes / network.nic_Bps(cluster)
        xleaf = network.cross_leaf_fraction(cluster, shape.num_nodes)
        gpus_share = xleaf if phase.cross_share is None else phase.cross_share
        bytes_share = (1.0 if xleaf > 0 else 0.0) if phase.cross_share is None else phase.cross_share
        if bytes_share > 0:
            up = network.uplink_Bps(cluster, shape.num_nodes, gpus_share, phase.flows_per_gpu)
            demand[network.UPLINK] = phase.inter_bytes * bytes_share / up
    return demand


def _price(phases: list[Phase], shape: GroupShape, cluster: ClusterSpec, proto: ProtocolSpec,
           peers: tuple[int, ...]) -> tuple[float, float, dict[str, float]]:
    """(latency, bandwidth time, summed link demand) of a phase list under ``proto``."""
    tune = cluster.collectives
    steps_us = sum(ph.intra_steps * tune.intra_step_latency_us + ph.inter_steps * tune.inter_step_latency_us
                   for ph in phases)
    latency = units.us_to_s(tune.launch_latency_us + proto.latency_us + steps_us)
    bw_time, total = 0.0, {}
    for ph in phases:
        demand = {k: v / proto.bw_efficiency for k, v in _link_demand(ph, shape, cluster, peers).items()}
        bw_time += max(demand.values(), default=0.0)
        for k, v in demand.items():
            total[k] = total.get(k, 0.0) + v
    return latency, bw_time, total


def _candidates(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec, algorithm: str | None) -> list[str]:
    if algorithm is not None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algo: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        return [algorithm]
    if coll in (Coll.ALL_TO_ALL, Coll.SEND_RECV):
        return ["direct"]
    tune = cluster.collectives
    names = ["ring", "tree", "hierarchical"]
    if shape.num_nodes == 1 and tune.direct_min_bytes <= size <= tune.direct_max_bytes:
        names.append("direct")  # RCCL's one-shot/MSCCL kernels serve only this window
    return names


def local_peers(shape: GroupShape, stride: int = 1) -> tuple[int, ...]:
    """Local GPU indices the representative rank (GPU 0) talks to over xGMI."""
    return tuple(i * stride for i in range(1, shape.per_node)) or (1,)


def collective_cost(
    coll: Coll, size_bytes: float, shape: GroupShape, cluster: ClusterSpec, protocol: str | None = None,
    algorithm: str | None = None, peers: tuple[int, ...] | None = None,
) -> CollectiveCost:
    """Time of one collective call on a buffer of ``size_bytes`` per rank; the selector
    takes the fastest applicable algorithm (RCCL's tuner), or the one forced."""
    if size_bytes < 0:
        raise ConfigError(f"size_bytes must be >= 0, got {size_bytes!r}")
    if shape.size <= 1 or size_bytes == 0:
        return CollectiveCost(time_s=0.0, latency_s=0.0, protocol="none", algorithm="none")
    name, proto = pick_protocol(cluster, size_bytes, protocol)
    peers = peers or local_peers(shape)
    best = None
    for algo in _candidates(coll, size_bytes, shape, cluster, algorithm):
        phases = ALGORITHMS[algo](coll, size_bytes, shape, cluster)
        if not phases:
            continue
        latency, bw_time, demand = _price(phases, shape, cluster, proto, peers)
        sent = sum(ph.intra_bytes + ph.inter_bytes for ph in phases)
        cost = CollectiveCost(time_s=latency + bw_time, latency_s=latency, protocol=name, algorithm=algo,
                              demand=demand, bytes_sent=sent)
        if best is None or cost.time_s < best.time_s:
            best = cost
    if best is None:
        raise ConfigError(f"algo: {algorithm!r} cannot run {coll.value} on {shape.size} ranks over {shape.num_nodes} nodes")
    return best


def _tier_bytes(counts: list[list[float]], rank: int, per_node: int, sending: bool) -> tuple[float, float]:
    """(intra-node, inter-node) bytes ``rank`` sends (or receives) in an all_to_allv."""
    row = counts[rank] if sending else [r[rank] for r in counts]
    intra = sum(b for peer, b in enumerate(row) if peer != rank and peer // per_node == rank // per_node)
    inter = sum(b for peer, b in enumerate(row) if peer // per_node != rank // per_node)
    return intra, inter


def all_to_allv_cost(counts: list[list[float]], shape: GroupShape, cluster: ClusterSpec,
                     protocol: str | None = None) -> CollectiveCost:
    """All-to-all with per-pair byte counts ``counts[src][dst]``; the slowest rank sets
    the time, whether it is slow sending or receiving (links are full duplex, so each
    direction is priced on its own and the larger counts)."""
    n, p = shape.size, shape.per_node
    if len(counts) != n or any(len(row) != n for row in counts):
        raise ConfigError(f"counts: need a {n}x{n} matrix of bytes")
    if any(b < 0 for row in counts for b in row):
        raise ConfigError("counts: byte counts must be >= 0")
    worst = None
    for rank in range(n):
        for sending in (True, False):
            intra, inter = _tier_bytes(counts, rank, p, sending)
            name, proto = pick_protocol(cluster, intra + inter, protocol)
            phase = _all_to_all_phase(intra, inter, shape, cluster)
            latency, bw_time, demand = _price([phase], shape, cluster, proto, local_peers(shape))
            cost = CollectiveCost(time_s=latency + bw_time, latency_s=latency, protocol=name, algorithm="direct",
                                  demand=demand, bytes_sent=intra + inter)
            if worst is None or cost.time_s > worst.time_s:
                worst = cost
    return worst


def bus_bandwidth(coll: Coll, size_bytes: float, ranks: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in B/s, rccl-tests conventions."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * BUSBW_FACTOR[coll](ranks)
