"""Collective cost: RCCL/NCCL-like algorithms decomposed into phases of concurrent flows.

An algorithm turns (collective, buffer size, group placement) into phases
(``cost.phases``); a phase says how many bytes the representative rank pushes over its
node's fabric (xGMI mesh links, or one NVSwitch port: ``NodeSpec.gpu_bw_Bps``) and
through its NIC, and how many latency steps it takes on each tier. A call costs

    launch (by launch mode, less what graph capture removes) + protocol latency
    + intra steps x xGMI/NVLink hop + network steps x network hop
    + sum over phases of max over links (bytes on the link / its rate)

where an intra-node link's rate is its bandwidth x the protocol's efficiency and the
NIC's is the line rate x the fabric's per-message efficiency ramp (bytes per peer per
step; measured with the protocol RCCL picks at each size) x, for all-to-all, the
dispatch implementation's efficiency (``cost.alltoall``, ``cost.dispatch``). Algorithms:
ring, tree (double binary across nodes), direct (one-shot inside a node), hierarchical
(intra RS, rail ring, intra AG: what ZeRO at 1,000+ ranks wants, as ring latency grows
with N; a candidate only where the profile says the library may run it,
``collectives.hierarchical``), NVLS (NVSwitch reduction) and NVLSTree (NVLS inside the
node, a tree across nodes, NCCL's multi-node all-reduce on NVSwitch systems); the selector takes the
fastest that applies, as NCCL's and RCCL's tuners do. Each cost carries its per-link demand so the engine can
share links among concurrent calls. Buffer sizes follow rccl-tests: ``size`` is the full
buffer (n chunks for RS/AG/A2A).
"""

import functools
import math
from enum import StrEnum

from perfsim import units
from perfsim.cost import alltoall
from perfsim.cost.phases import CollectiveCost, Phase, price
from perfsim.errors import ConfigError
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape
from perfsim.system import network
from perfsim.system.hardware import ClusterSpec, IntraTopology, ProtocolSpec

__all__ = ["ALGORITHMS", "BUSBW_FACTOR", "CollectiveCost", "LaunchMode", "Phase", "all_to_allv_cost",
           "bus_bandwidth", "collective_cost", "local_peers", "pick_protocol"]


class LaunchMode(StrEnum):
    MPI = "mpi"  # one process per GPU (rccl-tests -np N -g 1)
    SINGLE_PROCESS = "single-process"  # one process drives all GPUs (rccl-tests -g N)


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


def _steps(coll: Coll, n: int) -> int:
    return RING_STEPS.get(coll, 1) * (n - 1)


def ring(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """Flat ring over all ranks; each channel crosses every node boundary once, channels
    spread over the NICs the library's rings use for p GPUs of a node (``NodeSpec.ring_nics``:
    one per GPU unless the node profile says otherwise) (NCCL ring: busbw = min(xGMI, those
    NICs' bandwidth))."""
    if coll not in RING_SHARE:
        return []
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    total = RING_SHARE[coll](n) * size
    inter = total / cluster.node.ring_nics(p) if m > 1 else 0.0
    steps, inter_steps = _steps(coll, n), _steps(coll, m)
    return [Phase(intra_bytes=total - inter, inter_bytes=inter, intra_links=max(p - 1, 1),
                  intra_steps=steps - inter_steps, inter_steps=inter_steps)]


def _btree(nranks: int, rank: int) -> tuple[int, tuple[int, ...]]:
    """(parent or -1, children) of ``rank`` in NCCL's binary tree over ``nranks`` (the
    bit-pattern tree of src/graph/trees.cc ncclGetBtree)."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ((bit >> 1,) if nranks > 1 else ())
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    if low == 0:
        return up, ()
    down1 = rank + low
    while down1 >= nranks and low:
        low >>= 1
        down1 = rank + low if low else -1
    return up, tuple(c for c in (rank - (bit >> 1), down1) if c >= 0)


def _tree_degree(nranks: int, rank: int) -> int:
    """Links ``rank`` has in NCCL's two trees (ncclGetDtree: the binary tree, and its mirror
    over an even count or its shift by one over an odd one): parent and children of each."""
    up, kids = _btree(nranks, rank)
    other = nranks - 1 - rank if nranks % 2 == 0 else (rank - 1 + nranks) % nranks
    up2, kids2 = _btree(nranks, other)
    return (up >= 0) + len(kids) + (up2 >= 0) + len(kids2)


@functools.cache
def tree_nic_share(num_nodes: int) -> float:
    """Bytes the busiest node's NIC carries in NCCL's double binary tree over ``num_nodes``,
    per byte it carries on two nodes. Each tree moves half the buffer and a node sends (and
    receives) that half once per tree link it has, so the load is its link count over both
    trees: 2 on two nodes; 3 on three (each tree a chain, a middle node in one); 4 from four
    nodes on, where a node with two children in one tree is a leaf of the other (NCCL's
    tuner halves its NVLSTree's network bandwidth beyond two nodes for this: tuning.cc,
    NVLS_TREE bw = nNodes <= 2 ? bwInter : bwInter / 2)."""
    if num_nodes < 2:
        return 1.0
    return max(_tree_degree(num_nodes, r) for r in range(num_nodes)) / 2.0


def tree(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """Double binary tree across nodes, chain inside a node (NCCL): reduce up, broadcast
    down; each node's NICs carry the buffer once each way on two nodes, and beyond as NCCL's
    two trees load the busiest node (``tree_nic_share``: 1.5x on three, 2x from four, where
    interior nodes have two children); a network step at the tree's
    own hop latency (``tree_inter_step_latency_us``: NCCL's tuner keeps one per algorithm,
    hwLat[NET][TREE] 5 us LL against the ring's 2.7). (Pricing up and down on the
    two directions of a full-duplex NIC, S / p each, was tried: it makes tree beat ring by
    ~10% at 2 nodes for large buffers, which the measured sweeps do not show: the RCCL
    default on 2 x MI355X + Pollara reaches 369 GB/s, the forced ring on MI325X 350.)"""
    if coll not in (Coll.ALL_REDUCE, Coll.BROADCAST, Coll.REDUCE) or shape.num_nodes < 2:
        return []
    p, m = shape.per_node, shape.num_nodes
    ways = 2 if coll is Coll.ALL_REDUCE else 1
    inter = ways * size * tree_nic_share(m) / cluster.node.ring_nics(p)
    return [Phase(intra_bytes=ways * size * (p - 1) / p, inter_bytes=inter,
                  intra_links=max(p - 1, 1), intra_steps=ways * (p - 1),
                  inter_steps=ways * network.log2_ceil(m), inter_step_us=cluster.collectives.tree_inter_step_us)]


def direct(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """One-shot / all-pairs: every rank talks to every peer at once (RS then AG for
    all-reduce: 2 steps, same bytes as a ring); all-to-all and send/recv everywhere."""
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    if coll is Coll.ALL_TO_ALL:
        return [alltoall.all_to_all_phase(size * (p - 1) / n, size * (n - p) / n, shape, cluster)]
    if coll is Coll.SEND_RECV:
        return [Phase(inter_bytes=size, inter_steps=1, rings=False)] if m > 1 else \
            [Phase(intra_bytes=size, intra_steps=1, rings=False)]
    if m > 1:
        return []
    if coll in (Coll.BROADCAST, Coll.REDUCE):  # the root's buffer to (or from) every peer
        return [Phase(intra_bytes=size * (n - 1), intra_links=n - 1, intra_steps=1, rings=False)]
    steps = 2 if coll is Coll.ALL_REDUCE else 1
    return [Phase(intra_bytes=RING_SHARE[coll](n) * size, intra_links=n - 1, intra_steps=steps, rings=False)]


def _has_nvls(cluster: ClusterSpec) -> bool:
    """An NVSwitch node whose profile prices NVLS (a fitted ``nvls_efficiency``)."""
    return cluster.collectives.nvls_efficiency > 0 and cluster.node.intra_topology is IntraTopology.SWITCH


def _nvls_phase(size: float, p: int, cluster: ClusterSpec, **inter) -> Phase:
    """The switch's part of an NVLS call over ``p`` GPUs: each GPU moves its buffer once each
    way plus its 1/p slice, S (p + 1) / p, at ``nvls_efficiency``; ``inter``: the NIC part."""
    return Phase(intra_bytes=size * (p + 1) / p, intra_links=p - 1,
                 intra_efficiency=cluster.collectives.nvls_efficiency, **inter)


def nvls(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """NVLink SHARP all-reduce inside an NVSwitch node (NCCL NVLS): the switch reduces
    (multimem.ld_reduce) and multicasts (multimem.st), so each GPU moves its buffer once
    each way plus its 1/n slice, S (n + 1) / n per direction, at ``nvls_efficiency``."""
    if coll is not Coll.ALL_REDUCE or shape.num_nodes > 1 or not _has_nvls(cluster):
        return []
    return [_nvls_phase(size, shape.size, cluster)]


def nvls_tree(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec) -> list[Phase]:
    """NCCL's NVLSTree all-reduce across NVSwitch nodes: NVLS inside each node (the switch
    reduces and multicasts, as ``nvls``), each GPU the head of 1/p of the buffer on its own NIC,
    and a double binary tree across nodes per head, its reduce going up one direction of the
    NIC while the broadcast comes down the other. NCCL's tuner prices it at the smaller of
    the NVLS bandwidth and the network's, the network's halved beyond two nodes, where a
    tree's interior nodes carry two children (tuning.cc: NVLS_TREE bw = min(bwIntra,
    nNodes <= 2 ? bwInter : bwInter / 2)); each NIC sends S / p at two nodes and, beyond,
    the trees' own load (``tree_nic_share``: 2 S / p from four nodes, as the tuner; 1.5 S / p
    on three, where both trees are chains). What NCCL's default runs on H100 / H200 clusters
    (NVIDIA/nccl-tests #309: its maintainer on 2-node runs above the ring's NIC bound)."""
    tune, p, m = cluster.collectives, shape.per_node, shape.num_nodes
    if coll is not Coll.ALL_REDUCE or m < 2 or p < 2 or not _has_nvls(cluster):
        return []
    return [_nvls_phase(size, p, cluster, inter_bytes=tree_nic_share(m) * size / p,
                        inter_steps=2 * network.log2_ceil(m), inter_step_us=tune.tree_inter_step_us)]


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


ALGORITHMS = {"ring": ring, "tree": tree, "direct": direct, "hierarchical": hierarchical, "nvls": nvls,
              "nvls_tree": nvls_tree}


# collectives whose buffer is the ranks' chunks side by side: RCCL's windows hold one rank's share
PER_RANK_WINDOWS = (Coll.ALL_GATHER, Coll.REDUCE_SCATTER)


def pick_protocol(cluster: ClusterSpec, size_bytes: float, protocol: str | None = None,
                  coll: Coll | None = None, ranks: int = 1) -> tuple[str, ProtocolSpec]:
    """The protocol a call of ``size_bytes`` runs: the one forced, else the first whose window
    holds it: the collective's own windows where the profile gives them
    (``protocol_windows``, compared with one rank's share for all_gather / reduce_scatter),
    else the protocols' max_bytes (the all-reduce's windows)."""
    tune = cluster.collectives
    protocols = tune.protocols
    if protocol is not None:
        if protocol not in protocols:
            raise ConfigError(f"protocol: {protocol!r} is not one of {', '.join(protocols)}")
        return protocol, protocols[protocol]
    ordered = sorted(protocols.items(), key=lambda kv: kv[1].max_bytes)
    own = tune.protocol_windows.get(coll.value) if coll is not None else None
    if own:
        share = size_bytes / max(1, ranks) if coll in PER_RANK_WINDOWS else size_bytes
        for name, top in sorted(own.items(), key=lambda kv: kv[1]):
            if share <= top:
                return name, protocols[name]
        return ordered[-1]
    for name, spec in ordered:
        if size_bytes <= spec.max_bytes:
            return name, spec
    return ordered[-1]


def base_latency_s(cluster: ClusterSpec, proto: ProtocolSpec, launch: str = LaunchMode.MPI,
                   graph: bool = False) -> float:
    """Per-call latency before any step: library launch (+ single-process launch cost,
    - what graph capture removes) + the protocol's own."""
    tune = cluster.collectives
    try:
        mode = LaunchMode(launch)
    except ValueError:
        raise ConfigError(f"launch: {launch!r} is not one of {', '.join(m.value for m in LaunchMode)}") from None
    launch_us = tune.launch_latency_us + (tune.single_process_latency_us if mode is LaunchMode.SINGLE_PROCESS else 0.0)
    if graph:
        launch_us = max(0.0, launch_us - tune.graph_saving_us)
    return units.us_to_s(launch_us + proto.latency_us)


def _candidates(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec, algorithm: str | None,
                graph: bool = False) -> list[str]:
    if algorithm is not None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algo: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        return [algorithm]
    if coll in (Coll.ALL_TO_ALL, Coll.SEND_RECV):
        return ["direct"]
    tune = cluster.collectives
    names = ["ring", "tree", *(["hierarchical"] if tune.hierarchical else [])]
    lo = tune.graph_direct_min_bytes if graph and tune.graph_direct_min_bytes is not None else tune.direct_min_bytes
    own = tune.direct_windows.get(coll.value)  # a collective's own direct kernel, from the smallest size
    if shape.num_nodes == 1 and (size <= own if own is not None else lo <= size <= tune.direct_max_bytes):
        names.append("direct")  # RCCL's one-shot/MSCCL kernels serve only this window (wider when captured)
    if size >= tune.nvls_min_bytes:
        names += ["nvls", "nvls_tree"]  # empty unless the node has NVLS (nvls(), nvls_tree() check)
    return names


def local_peers(shape: GroupShape, stride: int = 1) -> tuple[int, ...]:
    """Local GPU indices the representative rank (GPU 0) talks to over xGMI."""
    return tuple(i * stride for i in range(1, shape.per_node)) or (1,)


def _nvls_latency(algo: str, cluster: ClusterSpec) -> float:
    return units.us_to_s(cluster.collectives.nvls_latency_us) if algo in ("nvls", "nvls_tree") else 0.0


def step_floor_us(cluster: ClusterSpec, proto: ProtocolSpec | None, size_bytes: float) -> float:
    """The ring step floor of a call: the protocol's own (full from ``ring_floor_full_bytes``,
    in proportion below), never under the profile-wide ``ring_step_floor_us``."""
    tune = cluster.collectives
    own = proto.ring_step_floor_us if proto is not None else None
    if own is None:
        return tune.ring_step_floor_us
    full = tune.ring_floor_full_bytes
    return max(tune.ring_step_floor_us, own * (min(1.0, size_bytes / full) if full > 0 else 1.0))


def paced_s(algo: str, coll: Coll, shape: GroupShape, cluster: ClusterSpec, proto: ProtocolSpec | None = None,
            size_bytes: float = float("inf")) -> float:
    """The least time a ring crossing nodes takes: its steps (every rank's, for a flat
    ring; the rail ring's, for hierarchical) at the protocol's ring step floor (else the
    profile's ``ring_step_floor_us``). Each step of a lock-step ring waits for the slowest
    of its hops, so at 1,000+ ranks the 2(n-1) steps set the time until the per-step slice
    is large enough to hide them (the 1,024-rank H100 ring: 1 GB and 2 GB take the same
    ~20 ms; NCCL's own tuner multiplies its ring latency by 1.9 across nodes for the same
    plateau); and a protocol whose steps each wait on the network proxy sets a plateau of
    its own at mid sizes (RCCL's LL128 and Simple rings on 2 and 3 MI355X nodes: the same
    time per step from 1 MB to 32 MB)."""
    floor_us = step_floor_us(cluster, proto, size_bytes)
    if floor_us <= 0 or shape.num_nodes < 2 or coll not in RING_SHARE:
        return 0.0
    if algo == "ring":
        return units.us_to_s(floor_us * _steps(coll, shape.size))
    if algo == "hierarchical" and coll not in (Coll.BROADCAST, Coll.REDUCE):
        return units.us_to_s(floor_us * _steps(coll, shape.num_nodes))
    return 0.0


def _lockstep_loops_s(steps: int, per_step: float, proto: ProtocolSpec) -> float:
    """``steps`` of a lock-step ring, each rank sending ``per_step`` bytes a step, in loops of
    at most ``ring_loop_bytes`` a step: every step of every loop pays the protocol's cost. A
    call that fills less than one loop runs one with a smaller chunk, so a step's cost holds
    whole below a loop."""
    loops = max(1, math.ceil(per_step / proto.ring_loop_bytes - 1e-9))
    return units.us_to_s(steps * loops * proto.ring_step_cost_us)


def step_cost_s(algo: str, coll: Coll, shape: GroupShape, cluster: ClusterSpec, proto: ProtocolSpec | None,
                size_bytes: float) -> float:
    """What a protocol's per-step cost (``ProtocolSpec.ring_step_cost_us``: NCCL's Simple
    protocol over the network, its proxy's handshake per chunk) adds on top of the bytes'
    time of a call spanning nodes. A ring (and the rail ring of ``hierarchical``) moves in
    lock step: each of its steps, in each loop of at most ``ring_loop_bytes`` a rank (the
    channels x the chunk per channel), pays the cost, so a 4-node ring's steps cost as much
    at 256 MB as at 1 GB and from there grow with the loops. A tree pipelines its chunks:
    the cost is paid once per chunk the busiest node's NICs move, ``ring_loop_bytes`` of
    them a round over the channels (``tree_nic_share`` of the buffer, both ways for an
    all-reduce's classic tree).

    Only a call over every GPU of each node pays it: on one 10-node H100 cluster, the same
    day, rings over 1, 2 and 4 GPUs of each node reach 0.98 of their NICs' line rate with no
    per-step cost to see (a 4-GPU-a-node all_gather's 39 steps take 128 us beside its bytes
    at 128 MB-16 GB), where the whole nodes reach 0.80, as on the three other IB clusters
    measured (the mechanism, whether the node's eight proxies or its PCIe, is not
    identified)."""
    m = shape.num_nodes
    if (proto is None or proto.ring_step_cost_us <= 0 or m < 2 or coll not in RING_SHARE
            or shape.per_node < cluster.node.gpus_per_node):
        return 0.0
    if algo == "ring":
        steps = _steps(coll, shape.size)
        return _lockstep_loops_s(steps, RING_SHARE[coll](shape.size) * size_bytes / steps, proto)
    if algo == "hierarchical" and coll not in (Coll.BROADCAST, Coll.REDUCE):
        steps = _steps(coll, m)
        return _lockstep_loops_s(steps, RING_SHARE[coll](m) * size_bytes / shape.per_node / steps, proto)
    if algo in ("tree", "nvls_tree") and coll is Coll.ALL_REDUCE:
        ways = 2 if algo == "tree" else 1
        return units.us_to_s(proto.ring_step_cost_us * ways * tree_nic_share(m) * size_bytes / proto.ring_loop_bytes)
    return 0.0


def collective_cost(
    coll: Coll, size_bytes: float, shape: GroupShape, cluster: ClusterSpec, protocol: str | None = None,
    algorithm: str | None = None, peers: tuple[int, ...] | None = None, launch: str = LaunchMode.MPI,
    graph: bool = False, impl: str | None = None,
) -> CollectiveCost:
    """Time of one collective call on a buffer of ``size_bytes`` per rank; the selector
    takes the fastest applicable algorithm (RCCL's tuner), or the one forced. ``launch``
    and ``graph`` set the per-call launch cost; ``impl`` names an all-to-all
    implementation of the profile's ``[dispatch]`` (default: its ``rccl`` entry)."""
    if size_bytes < 0:
        raise ConfigError(f"size_bytes must be >= 0, got {size_bytes!r}")
    if shape.size <= 1 or size_bytes == 0:
        return CollectiveCost(time_s=0.0, latency_s=0.0, protocol="none", algorithm="none")
    name, proto = pick_protocol(cluster, size_bytes, protocol, coll, shape.size)
    peers = peers or local_peers(shape)
    base = base_latency_s(cluster, proto, launch, graph)
    if coll is Coll.ALL_TO_ALL and algorithm in (None, "direct"):
        n, p = shape.size, shape.per_node
        spec = alltoall.dispatch_spec(cluster, impl)
        phase = alltoall.all_to_all_phase(size_bytes * (p - 1) / n, size_bytes * (n - p) / n, shape, cluster, spec=spec)
        return alltoall.cost_of(phase, shape, cluster, name, proto, peers, spec, base, phase.intra_bytes + phase.inter_bytes)
    best = None
    for algo in _candidates(coll, size_bytes, shape, cluster, algorithm, graph):
        phases = ALGORITHMS[algo](coll, size_bytes, shape, cluster)
        if not phases:
            continue
        steps, bw_time, demand, nic = price(phases, shape.num_nodes, cluster, proto, peers)
        extra = step_cost_s(algo, coll, shape, cluster, proto, size_bytes)
        if extra > 0:  # a per-step cost paid on top of the bytes takes the place of the step floor
            steps += extra
        else:
            steps = max(steps, paced_s(algo, coll, shape, cluster, proto, size_bytes) - bw_time)  # pacing hides under the bytes
        latency = base + steps + _nvls_latency(algo, cluster)
        sent = sum(ph.intra_bytes + ph.inter_bytes for ph in phases)
        cost = CollectiveCost(time_s=latency + bw_time, latency_s=latency, protocol=name, algorithm=algo,
                              demand=demand, bytes_sent=sent, inter_s=nic)
        if best is None or cost.time_s < best.time_s:
            best = cost
    if best is None:
        raise ConfigError(f"algo: {algorithm!r} cannot run {coll.value} on {shape.size} ranks over {shape.num_nodes} nodes")
    return best


def all_to_allv_cost(counts: list[list[float]], shape: GroupShape, cluster: ClusterSpec,
                     protocol: str | None = None, impl: str | None = None, launch: str = LaunchMode.MPI,
                     graph: bool = False) -> CollectiveCost:
    """All-to-all with per-pair byte counts ``counts[src][dst]``; the slowest rank sets
    the time, whether it is slow sending or receiving (incast at a hot receiver)."""
    alltoall.check_counts(counts, shape.size)
    spec = alltoall.dispatch_spec(cluster, impl)
    return alltoall.worst_rank(counts, shape, cluster, lambda b: pick_protocol(cluster, b, protocol),
                               local_peers(shape), spec, lambda proto: base_latency_s(cluster, proto, launch, graph))


def bus_bandwidth(coll: Coll, size_bytes: float, ranks: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in B/s, rccl-tests conventions."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * BUSBW_FACTOR[coll](ranks)
