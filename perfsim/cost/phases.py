"""Phases of concurrent flows and what they cost on the representative rank's links.

A phase says how many bytes the representative rank pushes over its node's fabric
(xGMI mesh links, or one NVSwitch port) and through its NIC, and how many latency steps
it takes on each tier. ``network`` turns the bytes into per-link demand (xGMI links or
the switch port, NIC, leaf uplinks). NIC bytes are priced at the line rate times the
fabric's per-message efficiency (``message_efficiency``: a measured ramp with the NIC's
bytes in the phase) and, for many small messages, no faster than the NIC's message rate
allows (one message per remote peer).
"""

import bisect
import math
from dataclasses import dataclass, field

from perfsim import units
from perfsim.system import network
from perfsim.system.hardware import ClusterSpec, FabricSpec, IntraTopology, ProtocolSpec

SWITCH_PORT = f"{network.XGMI}:switch"


@dataclass(frozen=True, kw_only=True)
class Phase:
    intra_bytes: float = 0.0  # bytes the rank sends over xGMI / NVLink
    inter_bytes: float = 0.0  # bytes the rank's NIC sends
    intra_links: int = 1  # xGMI links the intra bytes spread over (full mesh)
    intra_steps: int = 0
    inter_steps: int = 0
    cross_share: float | None = None  # share of inter bytes leaving the leaf; None: a
    # neighbour pattern (ring/tree) whose crossing edges carry all the rank's NIC bytes
    flows_per_gpu: int = 1  # NIC flows (for ECMP hashing)
    inter_peers: int = 0  # distinct remote peers (all-to-all); 0: a neighbour pattern
    intra_efficiency: float | None = None  # overrides the protocol's (NVLS, dispatch kernels)
    inter_efficiency: float | None = None
    inter_step_us: float | None = None  # a network step's latency; None: the profile's ring step
    # the phase runs over the rings / trees the library builds for the group, so a group of part of
    # a node reaches its share of each link (NodeSpec.group_link_Bps); False: every pair at once
    # (one-shot, all-to-all), measured at the link's full usable rate
    rings: bool = True

    @property
    def message_bytes(self) -> float:
        """The size the NIC ramp is read at: the NIC's bytes in this phase. (Keyed per
        ring step instead, a ramp fitted on 2 nodes prices the 1,024-rank ring 60-90% slow;
        keyed by the call's bytes it carries over within ~30%: RCCL/NCCL choose channels
        and protocol by buffer size. An all-to-all keeps every peer's send in flight, so
        it too is read at its total; many small per-peer messages are the message rate's.)"""
        return self.inter_bytes

    @property
    def num_messages(self) -> int:
        """Messages the NIC posts: one per remote peer, or one per network step."""
        return self.inter_peers if self.inter_peers else max(1, self.inter_steps)


@dataclass(frozen=True, kw_only=True)
class CollectiveCost:
    time_s: float
    latency_s: float
    protocol: str
    algorithm: str
    demand: dict[str, float] = field(default_factory=dict)  # link -> seconds busy alone
    bytes_sent: float = 0.0  # per rank, all phases
    inter_s: float = 0.0  # of time_s: seconds the NIC is the busiest link (for reports)


def message_efficiency(fabric: FabricSpec, message_bytes: float) -> float:
    """Share of line rate at ``message_bytes`` (Phase.message_bytes; log interpolation,
    clamped at the table's ends)."""
    xs, ys = fabric.message_kbytes, fabric.message_efficiency
    if not xs:
        return 1.0
    kb = max(message_bytes / units.KB, 1e-6)
    i = bisect.bisect_left(xs, kb)
    if i == 0:
        return ys[0]
    if i == len(xs):
        return ys[-1]
    t = math.log(kb / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def _intra_demand(phase: Phase, cluster: ClusterSpec, peers: tuple[int, ...], eff: float) -> dict[str, float]:
    node = cluster.node
    if node.intra_topology is IntraTopology.SWITCH:
        return {SWITCH_PORT: phase.intra_bytes / (node.gpu_bw_Bps(len(peers)) * eff)}
    links = peers[: max(1, min(phase.intra_links, len(peers)))]
    # rings over part of the node reach less of each link; all pairs at once do not (measured both ways)
    link = node.group_link_Bps(len(peers) + 1) if phase.rings else node.link_Bps
    return {f"{network.XGMI}:{peer}": phase.intra_bytes / len(links) / (link * eff) for peer in links}


def _inter_demand(phase: Phase, num_nodes: int, cluster: ClusterSpec, eff: float) -> dict[str, float]:
    fab = cluster.fabric
    ramp = eff * message_efficiency(fab, phase.message_bytes)
    nic = phase.inter_bytes / (network.nic_Bps(cluster) * ramp)
    if fab.message_rate_Mps > 0:
        nic = max(nic, phase.num_messages / (fab.message_rate_Mps * 1e6))
    demand = {network.NIC: nic}
    xleaf = network.neighbour_cross_fraction(cluster, num_nodes)
    gpus_share = xleaf if phase.cross_share is None else phase.cross_share
    bytes_share = (1.0 if xleaf > 0 else 0.0) if phase.cross_share is None else phase.cross_share
    if bytes_share > 0:
        up = network.uplink_Bps(cluster, num_nodes, gpus_share, phase.flows_per_gpu)
        demand[network.UPLINK] = phase.inter_bytes * bytes_share / (up * ramp)
    return demand


def link_demand(phase: Phase, num_nodes: int, cluster: ClusterSpec, proto: ProtocolSpec,
                peers: tuple[int, ...]) -> dict[str, float]:
    """Seconds each link of the representative rank is busy for this phase alone."""
    demand = {}
    if phase.intra_bytes > 0:
        eff = phase.intra_efficiency if phase.intra_efficiency is not None else proto.bw_efficiency
        demand.update(_intra_demand(phase, cluster, peers, eff))
    if phase.inter_bytes > 0:  # the NIC ramp is measured with the protocol RCCL picks at each size
        eff = phase.inter_efficiency if phase.inter_efficiency is not None else 1.0
        demand.update(_inter_demand(phase, num_nodes, cluster, eff))
    return demand


def step_latency_us(phases: list[Phase], cluster: ClusterSpec) -> tuple[float, float]:
    """(intra-node, network) step latency of a phase list, microseconds."""
    tune = cluster.collectives
    hop = tune.inter_step_latency_us
    return (sum(ph.intra_steps for ph in phases) * tune.intra_step_latency_us,
            sum(ph.inter_steps * (hop if ph.inter_step_us is None else ph.inter_step_us) for ph in phases))


def price(phases: list[Phase], num_nodes: int, cluster: ClusterSpec, proto: ProtocolSpec,
          peers: tuple[int, ...]) -> tuple[float, float, dict[str, float], float]:
    """(step latency s, bandwidth time s, summed link demand, NIC-bound seconds) of a
    phase list; latency and bandwidth add (a max(latency, bytes) overlap of the network
    hops was tried and fits the 2-node Pollara sweep worse: 10.9% vs 3.5% MAPE)."""
    bw_time, nic_time, total = 0.0, 0.0, {}
    for ph in phases:
        demand = link_demand(ph, num_nodes, cluster, proto, peers)
        busiest = max(demand.values(), default=0.0)
        bw_time += busiest
        if demand.get(network.NIC, 0.0) >= busiest > 0:
            nic_time += busiest
        for k, v in demand.items():
            total[k] = total.get(k, 0.0) + v
    intra_us, inter_us = step_latency_us(phases, cluster)
    latency = units.us_to_s(intra_us + inter_us)
    return latency, bw_time, total, nic_time
