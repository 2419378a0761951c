"""MoE dispatch/combine as expert-parallel libraries run it, from the routing up.

A rank holds ``tokens`` tokens; each picks ``topk`` of ``num_experts`` experts spread
evenly over the EP ranks in order. Under group-limited routing (DeepSeek-V2/V3: the
model's ``expert_groups`` / ``topk_groups``) it first picks ``topk_groups`` of the
``expert_groups`` contiguous expert groups, which bounds the nodes it can reach (V3: 8
groups on 8 nodes, at most 4 nodes per token). Under uniform routing the expected
number of distinct nodes and ranks a token reaches follows from drawing ``topk``
distinct experts from the chosen groups (hypergeometric); under a blocked routing (a
benchmark's balanced gate: each token's top-k experts one block of consecutive ids) it
reaches the ranks holding that block (``blocked_reach``), so:

* a ``dedup_per_node`` implementation (DeepEP normal kernels, MORI-EP V1) sends each
  token once to every remote node it reaches, over the NIC to the same-rail GPU, which
  forwards it over NVLink/xGMI to the ranks that need it;
* otherwise (RCCL all-to-all, low-latency kernels) every token copy travels to its rank:
  remote copies over the NIC, local ones over xGMI; a low-latency kernel posts one RDMA
  message per remote copy, so its NIC leg is also bounded by its ``message_rate_Mps``.

Time = the implementation's latency + the busier of the NIC (wire bytes at line rate x
its ``rdma_efficiency`` x the fabric's per-message ramp) and the intra-node fabric
(delivered copies at the node's per-GPU bandwidth x ``intra_efficiency``). ``phase``
"combine" is the reverse path with the combine's bytes per token (BF16 in DeepSeek-V3).
The bandwidths libraries print are reproduced with their own accounting: DeepEP's
"RDMA GB/s" counts a token once per node it reaches, the local node included
(tests/test_internode.py ``num_rdma_token_sent``), its "NVL GB/s" the copies received.

A training step's dispatch and combine (the plan's ``dispatch``: ``IMPLS``) are priced
by ``step_cost``: ``alltoall`` (the default) is the collective library's own all-to-all
(RCCL / NCCL, ``cost.alltoall``), any other name an implementation of the cluster
profile's ``[dispatch.<name>]``: ``rccl`` / ``nccl`` name the library's own table (priced
as ``alltoall``), ``deepep``, ``deepep-ll``, ``mori`` are priced here.
"""

from dataclasses import dataclass
from math import ceil, comb

from perfsim import units
from perfsim.cost import alltoall
from perfsim.cost.phases import SWITCH_PORT, CollectiveCost, message_efficiency
from perfsim.errors import ConfigError
from perfsim.plan.parallel import LIBRARY_DISPATCH, GroupShape
from perfsim.system import network
from perfsim.system.hardware import ClusterSpec, DispatchSpec, IntraTopology

LIBRARY = "alltoall"  # the plan's default: the collective library's all-to-all (cost.alltoall)
# names priced as the library's all-to-all, one copy per (token, expert) (``cost.alltoall``)
LIBRARY_NAMES = LIBRARY_DISPATCH


@dataclass(frozen=True, kw_only=True)
class DispatchLoad:
    tokens: float  # per rank (a step's busiest rank may hold a fractional expected count)
    token_bytes: float  # one token copy (FP8 dispatch of hidden 7168: 7168 x (1 + 4/128))
    topk: int
    num_experts: int
    topk_groups: int = 0  # group-limited routing: experts from this many groups (0 = any expert)
    expert_groups: int = 0  # ... of this many contiguous groups (0 = one group per EP node)
    # each token's top-k experts one aligned block of expert ids (``blocked_reach``): no draw
    blocked: bool = False

    def __post_init__(self):
        if self.tokens < 0 or self.token_bytes < 0 or self.topk < 1 or self.num_experts < self.topk:
            raise ConfigError(f"dispatch: need tokens >= 0, token_bytes >= 0, 1 <= topk <= num_experts; got {self}")
        if self.expert_groups < 0 or self.topk_groups < 0 or self.expert_groups and self.num_experts % self.expert_groups:
            raise ConfigError(f"dispatch: expert_groups must divide num_experts, topk_groups >= 0; got {self}")


@dataclass(frozen=True, kw_only=True)
class DispatchCost:
    time_s: float
    wire_bytes: float  # the rank's NIC bytes
    intra_bytes: float  # copies the rank receives over NVLink / xGMI
    node_copies: float  # token copies counted once per node reached (DeepEP "RDMA" accounting)
    nic_s: float
    intra_s: float

    @property
    def rdma_GBps(self) -> float:
        return self.node_copies / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def intra_GBps(self) -> float:
        return self.intra_bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0


def expected_hits(bins: int, per_bin: int, picks: int) -> float:
    """Distinct bins reached when ``picks`` distinct items are drawn from ``bins x per_bin``."""
    total = bins * per_bin
    if picks > total:
        raise ConfigError(f"dispatch: topk {picks} exceeds the {total} experts it may choose from")
    return bins * (1 - comb(total - per_bin, picks) / comb(total, picks))


def blocked_reach(num_experts: int, topk: int, per_rank: int, per_node: int) -> tuple[float, float]:
    """(distinct nodes, distinct ranks) a token reaches when its top-k experts are one block
    of consecutive expert ids starting at a multiple of k, as NeMo AutoModel's
    FakeBalancedGate routes (token t -> experts t*k ... t*k + k - 1, mod E): averaged over
    the blocks' starting points; ``per_rank`` experts on each rank, ``per_node`` ranks a node."""
    starts = sorted({j * topk % num_experts for j in range(num_experts)})
    nodes = ranks = 0
    for start in starts:
        experts = [(start + i) % num_experts for i in range(topk)]
        ranks += len({e // per_rank for e in experts})
        nodes += len({e // (per_rank * per_node) for e in experts})
    return nodes / len(starts), ranks / len(starts)


def _reach(load: DispatchLoad, shape: GroupShape) -> tuple[float, float]:
    """(distinct nodes, distinct ranks) one token reaches."""
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    if load.num_experts % n:
        raise ConfigError(f"dispatch: {load.num_experts} experts do not split over {n} EP ranks")
    per_rank = load.num_experts // n
    if load.blocked:
        return blocked_reach(load.num_experts, load.topk, per_rank, p)
    nodes = _group_nodes(load, m)
    if nodes >= m:
        return expected_hits(m, per_rank * p, load.topk), expected_hits(n, per_rank, load.topk)
    # the chosen groups' experts lie on ``nodes`` nodes (fractional: an expectation);
    # the token's top-k are drawn among them: interpolate between whole node counts
    lo = max(int(nodes), 1)
    hi = min(lo + 1, m)
    w = nodes - lo if hi > lo else 0.0

    def at(a: int) -> tuple[float, float]:
        a = max(a, ceil(load.topk / (per_rank * p)))  # enough experts to pick from
        return expected_hits(a, per_rank * p, load.topk), expected_hits(a * p, per_rank, load.topk)

    (n_lo, r_lo), (n_hi, r_hi) = at(lo), at(hi)
    return (1 - w) * n_lo + w * n_hi, (1 - w) * r_lo + w * r_hi


def _group_nodes(load: DispatchLoad, m: int) -> float:
    """Expected number of EP nodes holding a token's chosen expert groups (``m``: no limit)."""
    k = load.topk_groups
    g = load.expert_groups or m  # no group count given: one group per node (DeepEP's test)
    if not k or k >= g:
        return float(m)
    if g % m == 0:  # each node holds g / m whole groups: nodes reached by k distinct groups
        return expected_hits(m, g // m, k)
    return min(float(m), k * m / g)  # a group spans m / g nodes (or straddles them)


def _spec(cluster: ClusterSpec, impl: str) -> DispatchSpec:
    if impl not in cluster.dispatch:
        known = ", ".join(cluster.dispatch) or "none in this profile"
        raise ConfigError(f"impl: {impl!r} is not a dispatch implementation of {cluster.name} (known: {known})")
    return cluster.dispatch[impl]


def dispatch_cost(load: DispatchLoad, shape: GroupShape, cluster: ClusterSpec, impl: str) -> DispatchCost:
    """Time of one dispatch (or combine: the same bytes reversed) for ``load`` on ``shape``."""
    spec = _spec(cluster, impl)
    n, p, m = shape.size, shape.per_node, shape.num_nodes
    nodes, ranks = _reach(load, shape)
    ranks = float(load.topk) if spec.copy_per_expert else ranks
    copies = load.tokens * load.token_bytes
    intra = copies * ranks
    if spec.dedup_per_node:
        wire, peers = copies * nodes * (m - 1) / m, m - 1
    else:
        wire, peers = copies * ranks * (n - p) / n, n - p
        intra = copies * ranks * (p - 1) / n
    # the fabric's per-message ramp (measured on RCCL collectives) applies to RCCL only
    ramp = message_efficiency(cluster.fabric, wire) if peers and not spec.gpu_initiated else 1.0
    nic_s = wire / (network.nic_Bps(cluster) * spec.rdma_efficiency * ramp) if wire else 0.0
    if spec.message_rate_Mps > 0 and load.token_bytes > 0:  # one message per remote token copy
        nic_s = max(nic_s, wire / load.token_bytes / (spec.message_rate_Mps * 1e6))
    intra_s = intra / (cluster.node.gpu_bw_Bps(p - 1) * spec.intra_efficiency) if p > 1 else 0.0
    time = units.us_to_s(spec.latency_us) + max(nic_s, intra_s)
    return DispatchCost(time_s=time, wire_bytes=wire, intra_bytes=intra, node_copies=copies * nodes,
                        nic_s=nic_s, intra_s=intra_s)


def implementations(cluster: ClusterSpec) -> tuple[str, ...]:
    """The values a plan's ``dispatch`` may take on ``cluster``."""
    return (LIBRARY, *cluster.dispatch)


def check_impl(cluster: ClusterSpec, impl: str) -> None:
    if impl not in implementations(cluster):
        raise ConfigError(f"plan.dispatch: {impl!r} is not a dispatch implementation of {cluster.name} "
                          f"(known: {', '.join(implementations(cluster))})")


def held_share(cluster: ClusterSpec, impl: str, units: int | None = None) -> float:
    """Share of the GPU's compute units the dispatch and combine kernels of ``impl`` hold
    while they run: ``units`` (the plan's ``dispatch_compute_units``) or the profile's
    ``DispatchSpec.compute_units`` (the library's all-to-all: the ``rccl`` / ``nccl`` entry,
    0 without one). Compute overlapped with them runs on the rest."""
    total = cluster.gpu.num_compute_units
    if units is None:
        spec = alltoall.dispatch_spec(cluster, None) if impl == LIBRARY else cluster.dispatch.get(impl)
        units = 0 if spec is None else spec.compute_units
    elif units >= total:
        raise ConfigError(f"plan.dispatch_compute_units must be below the {cluster.gpu.name} GPU's {total} compute "
                          f"units, got {units}")
    return units / total


def step_cost(size_bytes: float, token_bytes: float, topk: int, num_experts: int, shape: GroupShape,
              cluster: ClusterSpec, impl: str, peers: tuple[int, ...], topk_groups: int = 0,
              expert_groups: int = 0, blocked: bool = False) -> CollectiveCost:
    """One dispatch (or combine) of a training step under ``impl`` (not of ``LIBRARY_NAMES``):
    ``size_bytes`` is what the lowered all-to-all carries for the busiest rank, one
    ``token_bytes`` copy per (token, expert) pair, so the rank holds
    ``size_bytes / (topk x token_bytes)`` tokens. The demand names the links the engine
    shares: the NIC and the intra-node links to ``peers`` (or the NVSwitch port).
    ``topk_groups`` of ``expert_groups``: the model's group-limited routing (0: none);
    ``blocked``: each token's experts one block of ids (``blocked_reach``)."""
    tokens = size_bytes / (topk * token_bytes) if token_bytes > 0 else 0.0
    load = DispatchLoad(tokens=tokens, token_bytes=token_bytes, topk=topk, num_experts=num_experts,
                        topk_groups=topk_groups, expert_groups=expert_groups, blocked=blocked)
    cost = dispatch_cost(load, shape, cluster, impl)
    demand = {network.NIC: cost.nic_s} if cost.nic_s > 0 else {}
    if cost.intra_s > 0:
        switch = cluster.node.intra_topology is IntraTopology.SWITCH
        demand.update({SWITCH_PORT: cost.intra_s} if switch else {f"{network.XGMI}:{p}": cost.intra_s for p in peers})
    latency = units.us_to_s(_spec(cluster, impl).latency_us)
    return CollectiveCost(time_s=cost.time_s, latency_s=latency, protocol=impl, algorithm="dispatch",
                          demand=demand, bytes_sent=cost.wire_bytes + cost.intra_bytes,
                          inter_s=cost.nic_s if cost.nic_s >= cost.intra_s else 0.0)
