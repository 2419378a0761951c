"""All-to-all(v) and MoE dispatch/combine at scale.

A rank's all-to-all splits into an intra-node part (xGMI / NVLink, one link per local
peer) and an inter-node part whose NIC cost depends on its bytes (the fabric's
efficiency ramp, read at the NIC's total: every peer's send is in flight at once), the
NIC's message rate (one message per remote peer per call: many small per-peer messages)
and, in all_to_allv, the busiest receiver (incast: every sender's bytes for one rank
converge on that rank's NIC, priced on the receive side). Rails-only
fabrics have no path between rails, so traffic for another rail first crosses xGMI to
the GPU on that rail (PXN); rail-optimized fabrics send it up to the shared spines.

The implementation (``impl``) is a profile choice (``[dispatch.<name>]``): RCCL's
pairwise all-to-all, DeepEP-style GPU-initiated kernels (NVSHMEM/rocSHMEM), MORI-EP,
UCCL-EP, each with the NIC and intra-node efficiency and per-call latency measured for
it; ``dedup_per_node`` implementations send a token once per remote node and forward
it locally (the caller passes the share of copies that survive, ``remote_share``).
"""

from perfsim import units
from perfsim.cost.phases import CollectiveCost, Phase, price
from perfsim.errors import ConfigError
from perfsim.plan.parallel import GroupShape
from perfsim.system import network
from perfsim.system.hardware import ClusterSpec, DispatchSpec, FabricTopology, ProtocolSpec


def all_to_all_phase(intra: float, inter: float, shape: GroupShape, cluster: ClusterSpec,
                     remote_peers: int | None = None, spec: DispatchSpec | None = None) -> Phase:
    """One pairwise exchange: ``intra`` bytes to local peers, ``inter`` to remote ones."""
    p, m = shape.per_node, shape.num_nodes
    other_rail = (p - 1) / p
    topology = cluster.fabric.topology
    pxn = inter * other_rail if topology is FabricTopology.RAILS_ONLY else 0.0
    cross = network.cross_leaf_fraction(cluster, m)
    if topology is FabricTopology.RAIL_OPTIMIZED and m > 1:
        cross = other_rail + (1 - other_rail) * cross
    peers = shape.size - p if remote_peers is None else remote_peers
    return Phase(intra_bytes=intra + pxn, inter_bytes=inter, intra_links=max(p - 1, 1),
                 intra_steps=1 if p > 1 else 0, inter_steps=1 if m > 1 else 0,
                 cross_share=cross, flows_per_gpu=max(1, peers), inter_peers=max(1, peers) if inter > 0 else 0,
                 intra_efficiency=None if spec is None else spec.intra_efficiency,
                 inter_efficiency=None if spec is None else spec.rdma_efficiency, rings=False)


DEFAULT_IMPLS = ("rccl", "nccl")  # the collective library's own all-to-all


def dispatch_spec(cluster: ClusterSpec, impl: str | None) -> DispatchSpec | None:
    """The profile's implementation ``impl``; by default the library's own (``rccl`` /
    ``nccl``), or None (protocol pricing, NIC ramp only) when the profile has neither."""
    if impl is None:
        return next((cluster.dispatch[k] for k in DEFAULT_IMPLS if k in cluster.dispatch), None)
    if impl not in cluster.dispatch:
        known = ", ".join(cluster.dispatch) or "none in this profile"
        raise ConfigError(f"impl: {impl!r} is not a dispatch implementation of {cluster.name} (known: {known})")
    return cluster.dispatch[impl]


def cost_of(phase: Phase, shape: GroupShape, cluster: ClusterSpec, name: str, proto: ProtocolSpec,
            peers: tuple[int, ...], spec: DispatchSpec | None, base_latency_s: float, sent: float) -> CollectiveCost:
    steps, bw_time, demand, nic = price([phase], shape.num_nodes, cluster, proto, peers)
    extra = units.us_to_s(spec.latency_us) if spec is not None else 0.0
    latency = base_latency_s + steps + extra
    return CollectiveCost(time_s=latency + bw_time, latency_s=latency, protocol=name,
                          algorithm="direct", demand=demand, bytes_sent=sent, inter_s=nic)


def _tier_bytes(counts: list[list[float]], rank: int, per_node: int, sending: bool) -> tuple[float, float, int]:
    """(intra-node bytes, inter-node bytes, remote peers with bytes) ``rank`` sends (or receives)."""
    row = counts[rank] if sending else [r[rank] for r in counts]
    intra = sum(b for peer, b in enumerate(row) if peer != rank and peer // per_node == rank // per_node)
    remote = [b for peer, b in enumerate(row) if peer // per_node != rank // per_node]
    return intra, sum(remote), sum(1 for b in remote if b > 0)


def check_counts(counts: list[list[float]], n: int) -> None:
    if len(counts) != n or any(len(row) != n for row in counts):
        raise ConfigError(f"counts: need a {n}x{n} matrix of bytes")
    if any(b < 0 for row in counts for b in row):
        raise ConfigError("counts: byte counts must be >= 0")


def worst_rank(counts: list[list[float]], shape: GroupShape, cluster: ClusterSpec, pick, peers: tuple[int, ...],
               spec: DispatchSpec | None, base_latency) -> CollectiveCost:
    """The slowest rank, sending or receiving (links are full duplex: each direction is
    priced on its own and the larger counts). ``pick(bytes) -> (name, proto)``."""
    worst = None
    for rank in range(shape.size):
        for sending in (True, False):
            intra, inter, remote = _tier_bytes(counts, rank, shape.per_node, sending)
            name, proto = pick(intra + inter)
            phase = all_to_all_phase(intra, inter, shape, cluster, remote, spec)
            cost = cost_of(phase, shape, cluster, name, proto, peers, spec, base_latency(proto), intra + inter)
            if worst is None or cost.time_s > worst.time_s:
                worst = cost
    return worst
