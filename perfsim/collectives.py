"""Collective cost: RCCL-like hierarchical algorithms in a latency-bandwidth model.

A collective over a group with ``per_node`` GPUs on each of ``num_nodes`` nodes runs as
intra-node phases over xGMI/NVLink and an inter-node phase over the NIC rails. The
protocol (LL / LL128 / Simple) is chosen by message size from the profile's windows.
"""

from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.hardware import ClusterSpec, ProtocolSpec
from perfsim.ops import Coll
from perfsim.parallel import GroupShape
from perfsim import units

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


@dataclass(frozen=True, kw_only=True)
class CollectiveCost:
    time_s: float
    latency_s: float
    protocol: str
    algorithm: str


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


def _tier_bw(cluster: ClusterSpec, shape: GroupShape) -> tuple[float, float]:
    """(intra-node B/s per GPU to its group peers, inter-node B/s per GPU)."""
    intra = cluster.node.gpu_bw_Bps(shape.per_node - 1) if shape.per_node > 1 else float("inf")
    nic = cluster.fabric.node_Bps / cluster.gpus_per_node
    if shape.num_nodes > cluster.fabric.nodes_per_leaf:
        nic /= cluster.fabric.oversubscription
    return intra, nic


def _ring_phase_bytes(coll: Coll, size: float, n: int) -> float:
    """Bytes each rank sends in a ring collective over n ranks on a buffer of ``size``."""
    if n <= 1:
        return 0.0
    if coll is Coll.ALL_REDUCE:
        return 2 * (n - 1) / n * size
    if coll in (Coll.REDUCE_SCATTER, Coll.ALL_GATHER, Coll.ALL_TO_ALL):
        return (n - 1) / n * size
    return size  # broadcast / reduce pipelined along the ring


def _steps(coll: Coll, n: int) -> int:
    if n <= 1:
        return 0
    return 2 * (n - 1) if coll is Coll.ALL_REDUCE else n - 1


def hierarchical_time(coll: Coll, size: float, shape: GroupShape, cluster: ClusterSpec, proto: ProtocolSpec) -> tuple[float, float]:
    """(bandwidth time, step latency) of a collective in the hierarchical decomposition."""
    intra_bw, nic_bw = _tier_bw(cluster, shape)
    p, n = shape.per_node, shape.num_nodes
    tune = cluster.collectives
    if coll is Coll.ALL_TO_ALL:
        intra = size * (p - 1) / shape.size / (intra_bw / max(p - 1, 1)) if p > 1 else 0.0
        inter = size * (shape.size - p) / shape.size / nic_bw
        bw_time = max(intra, inter) / proto.bw_efficiency
        lat = (tune.intra_step_latency_us if p > 1 else 0) + (tune.inter_step_latency_us if n > 1 else 0)
        return bw_time, units.us_to_s(lat)
    if coll is Coll.SEND_RECV:
        bw = cluster.node.link_Bps if n == 1 else nic_bw
        lat = tune.intra_step_latency_us if n == 1 else tune.inter_step_latency_us
        return size / (bw * proto.bw_efficiency), units.us_to_s(lat)
    intra_bytes = _ring_phase_bytes(coll, size, p)
    inter_bytes = _ring_phase_bytes(coll, size / p if coll is not Coll.BROADCAST else size, n)
    bw_time = (intra_bytes / intra_bw if p > 1 else 0.0) + (inter_bytes / nic_bw if n > 1 else 0.0)
    lat = _steps(coll, p) * tune.intra_step_latency_us + _steps(coll, n) * tune.inter_step_latency_us
    return bw_time / proto.bw_efficiency, units.us_to_s(lat)


def collective_cost(
    coll: Coll, size_bytes: float, shape: GroupShape, cluster: ClusterSpec, protocol: str | None = None
) -> CollectiveCost:
    """Time of one collective call on a buffer of ``size_bytes`` per rank."""
    if size_bytes < 0:
        raise ConfigError(f"size_bytes must be >= 0, got {size_bytes!r}")
    if shape.size <= 1 or size_bytes == 0:
        return CollectiveCost(time_s=0.0, latency_s=0.0, protocol="none", algorithm="none")
    name, proto = pick_protocol(cluster, size_bytes, protocol)
    bw_time, step_lat = hierarchical_time(coll, size_bytes, shape, cluster, proto)
    latency = units.us_to_s(cluster.collectives.launch_latency_us + proto.latency_us) + step_lat
    algorithm = "ring" if shape.num_nodes == 1 else "hierarchical"
    return CollectiveCost(time_s=latency + bw_time, latency_s=latency, protocol=name, algorithm=algorithm)


def bus_bandwidth(coll: Coll, size_bytes: float, ranks: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in B/s, rccl-tests conventions."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * BUSBW_FACTOR[coll](ranks)
