"""Fabric topology as data, routing over equal paths, and max-min fair link sharing.

The full topology (``build_topology``) is a networkx graph: each MI300X node a full xGMI
mesh, one NIC per GPU over PCIe, and a scale-out of leaves and spines that is
``rails_only`` (one leaf/spine plane per rail), ``rail_optimized`` (rail leaves, spines
shared by all rails) or ``fat_tree`` (a node's NICs on one leaf). Costing never walks
that graph per GPU: by symmetry a collective's representative rank sees a handful of
link classes (its xGMI links, its NIC, its leaf's uplinks), whose capacities come from
``link_capacities``. Equal-cost path counts come from routing on a small slice of the
same graph, so a 16,384-GPU collective costs a few arithmetic operations.

Placement: a group over ``m`` nodes occupies ``ceil(m / nodes_per_leaf)`` leaves. An
all-to-all talks to every node, so its share of traffic that leaves the leaf is that of
a random peer (``cross_leaf_fraction``). A ring or tree follows rank order, and ranks
follow host order (hosts numbered by rack), so only one node edge per leaf boundary
leaves the leaf (``neighbour_cross_fraction``): the NVIDIA nccl-tests #322 ring over
1,024 H100 ranks on 128 nodes reaches 367 GB/s bus bandwidth, which a random order
through hashed spines would not (validation/data/multinode/).
"""

import math
from functools import lru_cache

import networkx as nx
import numpy as np

from perfsim import units
from perfsim.system.hardware import ClusterSpec, FabricTopology, Multipath, Routing

XGMI, NIC, UPLINK = "xgmi", "nic", "uplink"
ECMP_TRIALS = 256  # Monte Carlo draws for the expected max load of hashed flows


def _add_link(g: nx.DiGraph, a, b, capacity_Bps: float, latency_s: float, tier: str) -> None:
    for u, v in ((a, b), (b, a)):  # capacity is per direction
        g.add_edge(u, v, capacity_Bps=capacity_Bps, latency_s=latency_s, tier=tier)


def _add_nodes(g: nx.DiGraph, cluster: ClusterSpec, num_nodes: int) -> None:
    node, gpn = cluster.node, cluster.gpus_per_node
    pcie = units.GBps_to_Bps(node.pcie_bw_GBps)
    for n in range(num_nodes):
        for i in range(gpn):
            for j in range(i + 1, min(gpn, node.links_per_gpu + 1)):
                _add_link(g, ("gpu", n, i), ("gpu", n, j), node.link_Bps, node.link_latency_s, XGMI)
            _add_link(g, ("gpu", n, i), ("nic", n, i), pcie, 0.0, "pcie")


def _planes(cluster: ClusterSpec) -> list:
    fab = cluster.fabric
    return list(range(cluster.gpus_per_node)) if fab.topology is not FabricTopology.FAT_TREE else [0]


def num_uplinks(cluster: ClusterSpec) -> int:
    """Uplinks of one leaf (= spines of its plane): its downlinks over the oversubscription."""
    fab = cluster.fabric
    down = fab.nodes_per_leaf * (1 if fab.topology is not FabricTopology.FAT_TREE else cluster.gpus_per_node)
    return max(1, int(down // fab.oversubscription))


def build_topology(cluster: ClusterSpec, num_nodes: int | None = None) -> nx.DiGraph:
    """The whole fabric as a directed graph (one edge per link direction)."""
    fab, num_nodes = cluster.fabric, num_nodes or cluster.num_nodes
    g = nx.DiGraph()
    _add_nodes(g, cluster, num_nodes)
    num_leaves = -(-num_nodes // fab.nodes_per_leaf)
    lat = units.us_to_s(fab.switch_latency_us)
    shared = fab.topology is FabricTopology.RAIL_OPTIMIZED
    for plane in _planes(cluster):
        for s in range(num_uplinks(cluster)):
            spine = ("spine", 0 if shared else plane, s)
            for leaf in range(num_leaves):
                _add_link(g, ("leaf", plane, leaf), spine, fab.nic_Bps, lat, UPLINK)
    for n in range(num_nodes):
        for i in range(cluster.gpus_per_node):
            plane = 0 if fab.topology is FabricTopology.FAT_TREE else i
            _add_link(g, ("nic", n, i), ("leaf", plane, n // fab.nodes_per_leaf), fab.nic_Bps, lat, NIC)
    return g


@lru_cache(maxsize=64)
def _slice_paths(uplinks: int) -> int:
    """Equal-cost NIC-to-NIC paths across two leaves of one plane (a routed slice)."""
    g = nx.DiGraph()
    for s in range(uplinks):
        for leaf in (0, 1):
            _add_link(g, ("leaf", leaf), ("spine", s), 1.0, 0.0, UPLINK)
    for leaf in (0, 1):
        _add_link(g, ("nic", leaf), ("leaf", leaf), 1.0, 0.0, NIC)
    return sum(1 for _ in nx.all_shortest_paths(g, ("nic", 0), ("nic", 1)))


def equal_paths(cluster: ClusterSpec) -> int:
    """Paths ECMP can choose between for cross-leaf traffic (one per spine)."""
    return _slice_paths(num_uplinks(cluster))


@lru_cache(maxsize=4096)
def expected_max_flows(num_flows: int, num_paths: int, seed: int = 0) -> float:
    """E[flows on the busiest path] when ``num_flows`` flows hash onto ``num_paths`` paths
    (seeded Monte Carlo, so deterministic)."""
    if num_flows <= 0:
        return 0.0
    if num_paths <= 1:
        return float(num_flows)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, num_paths, size=(ECMP_TRIALS, num_flows))
    return float(np.array([np.bincount(row, minlength=num_paths).max() for row in draws]).mean())


@lru_cache(maxsize=4096)
def ecmp_collision_factor(num_flows: int, num_paths: int, seed: int = 0) -> float:
    """E[max load] / mean load when ``num_flows`` equal flows hash onto ``num_paths``
    paths (seeded Monte Carlo, so deterministic); 1.0 means no collision penalty."""
    if num_flows <= 0 or num_paths <= 1:
        return 1.0
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, num_paths, size=(ECMP_TRIALS, num_flows))
    max_load = np.array([np.bincount(row, minlength=num_paths).max() for row in draws]).mean()
    mean_load = num_flows / num_paths
    return float(max(1.0, max_load / max(mean_load, 1.0)))


def cross_leaf_fraction(cluster: ClusterSpec, num_nodes: int) -> float:
    """Share of a group's node-to-node traffic that leaves its leaf (see module doc)."""
    per_leaf = cluster.fabric.nodes_per_leaf
    if num_nodes <= per_leaf:
        return 0.0
    leaves = -(-num_nodes // per_leaf)
    return 1.0 - (num_nodes / leaves - 1) / (num_nodes - 1)


def neighbour_cross_fraction(cluster: ClusterSpec, num_nodes: int) -> float:
    """Share of a rank-ordered ring's node-to-node edges that leave a leaf (one per leaf, wrap included)."""
    per_leaf = cluster.fabric.nodes_per_leaf
    if num_nodes <= per_leaf:
        return 0.0
    return -(-num_nodes // per_leaf) / num_nodes


def uplink_Bps(cluster: ClusterSpec, num_nodes: int, crossing_share: float, flows_per_gpu: int = 1) -> float:
    """Rate one GPU's cross-leaf traffic gets through its leaf's uplinks.

    The ``G * crossing_share`` GPUs of a leaf (one plane) whose traffic leaves it share ``k``
    uplinks of NIC speed. Spraying gives each ``nic * min(1, k / crossing)``. ECMP hashes
    their ``crossing * flows_per_gpu`` flows, each ``1 / flows_per_gpu`` of a NIC, onto the
    ``k`` paths: the busiest path carries E[max flows] of them, so each GPU gets
    ``nic * min(1, flows_per_gpu / E[max flows])`` (= the spray rate divided by the
    collision factor once the paths are full). Out-of-order multipath (UEC) splits every
    flow into ``multipath_paths`` sub-flows, which hash independently (fewer collisions),
    at the cost of ``reorder_efficiency``."""
    fab = cluster.fabric
    per_leaf = min(num_nodes, fab.nodes_per_leaf)
    gpus = per_leaf * (cluster.gpus_per_node if fab.topology is FabricTopology.FAT_TREE else 1)
    crossing = max(1.0, gpus * crossing_share)
    paths = equal_paths(cluster)
    reorder = 1.0
    if fab.multipath is Multipath.OUT_OF_ORDER:
        flows_per_gpu *= fab.multipath_paths
        reorder = fab.reorder_efficiency
    if fab.routing is Routing.ECMP_HASH:
        busiest = expected_max_flows(max(1, round(crossing * flows_per_gpu)), paths)
        return fab.nic_Bps * min(1.0, flows_per_gpu / busiest) * reorder
    return fab.nic_Bps * min(1.0, paths / crossing) * reorder


def nic_Bps(cluster: ClusterSpec) -> float:
    """Injection bandwidth of one GPU into the fabric: its NIC, or its PCIe link if slower."""
    return min(cluster.fabric.nic_Bps, units.GBps_to_Bps(cluster.node.pcie_bw_GBps))


def max_min_rates(demands: dict[int, dict[str, float]]) -> dict[int, float]:
    """Max-min fair progress rates by progressive filling.

    ``demands[f][link]`` is the share of ``link`` that flow ``f`` uses when running at
    its full rate (1.0, its speed alone). Unfrozen flows rise together; a link that fills
    freezes the flows on it; no flow exceeds 1.0."""
    rates, active, level = {f: 0.0 for f in demands}, set(demands), 0.0
    while active:
        links = {link for f in active for link in demands[f]}
        headroom = {}
        for link in links:
            want = sum(demands[f].get(link, 0.0) for f in active)
            if want > 0:
                used = sum(demands[f].get(link, 0.0) * rates[f] for f in demands)
                headroom[link] = max(0.0, 1.0 - used) / want
        step = min([1.0 - level, *headroom.values()])
        level += step
        for f in active:
            rates[f] = level
        tight = {link for link, h in headroom.items() if h <= step * (1 + 1e-9)}
        frozen = {f for f in active if level >= 1.0 - 1e-12 or tight & demands[f].keys()}
        active -= frozen or set(active)
    return rates


def log2_ceil(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0
