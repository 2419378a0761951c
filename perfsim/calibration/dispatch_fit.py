"""Fit MoE dispatch/combine implementation efficiencies to the tables libraries print.

Each library prints bandwidths with its own accounting, so a measured GB/s becomes a
time through the bytes that library counts (``counted_bytes``), and the time gives the
efficiency of the leg the metric names: an RDMA figure the NIC leg, an XGMI/NVLink
figure the intra-node leg (perfsim.cost.dispatch prices both and takes the busier).

* DeepEP (tests/test_internode.py): RDMA = tokens x distinct nodes reached (own node
  included) x bytes per token (FP8 dispatch hidden x (1 + 4/128), BF16 combine 2 x
  hidden); NVL = token copies received x the same bytes. Routing: 256 experts, top-k
  within min(nodes, 4) nodes.
* MORI-EP (tests/python/ops/test_dispatch_combine_internode.py): RDMA = tokens x nodes
  x hidden x input element size (1 B for FP8); XGMI = copies received x hidden x 1 B;
  routing uniform, no node limit; combine counted with the input's element size (the
  benchmark of ROCm/mori@05bb5f4; the later cross-type benchmark counts the combine in its
  own dtype, BF16, which moves twice the bytes in about twice the time: with no per-call
  latency in the model either accounting gives the same GB/s).
"""

import dataclasses
import statistics
from dataclasses import dataclass

from perfsim.calibration.readers_multinode import DispatchPoint
from perfsim.cost.dispatch import DispatchLoad, dispatch_cost, expected_hits
from perfsim.plan.parallel import GroupShape
from perfsim.system.hardware import ClusterSpec

NUM_EXPERTS = 256  # DeepSeek-V3, the configuration every table row names
LIBRARIES = ("deepep", "mori")  # series prefixes; "deepep-ll" is DeepEP's low-latency mode


@dataclass(frozen=True, kw_only=True)
class DispatchFit:
    impl: str
    intra_efficiency: float | None  # None: no intra-node row
    rdma_efficiency: float | None
    num_points: int


def library(p: DispatchPoint) -> str | None:
    """The implementation a row measures: ``deepep``, ``mori``, ``deepep-ll`` (DeepEP's
    low-latency kernels, 128 tokens); None for kernels perfsim does not model (MORI V0,
    MORI low-latency: its EP16 -> EP32 latency doubles, no per-message law fits two rows)."""
    lib = next((lib for lib in LIBRARIES if p.series.lower().startswith(lib)), None)
    low_latency = p.tokens < 1024 or "LL" in p.series
    if lib == "deepep" and low_latency and p.tokens < 1024:
        return "deepep-ll"
    if lib is None or low_latency or "V0" in p.series:
        return None
    return lib


def token_bytes(p: DispatchPoint, impl: str) -> float:
    return p.hidden if impl == "mori" else p.bytes_per_token


def load(p: DispatchPoint, impl: str) -> DispatchLoad:
    groups = min(p.num_nodes, 4) if impl == "deepep" else 0  # the low-latency test routes over all experts
    return DispatchLoad(tokens=p.tokens, token_bytes=token_bytes(p, impl), topk=p.topk, num_experts=NUM_EXPERTS,
                        topk_groups=groups)


def shape(p: DispatchPoint) -> GroupShape:
    return GroupShape(size=p.num_ranks, per_node=min(8, p.num_ranks), num_nodes=p.num_nodes)


def counted_bytes(p: DispatchPoint, impl: str) -> float:
    """The bytes the library divides by its time for the metric ``p`` reports."""
    s, tb = shape(p), token_bytes(p, impl)
    groups = min(load(p, impl).topk_groups or s.num_nodes, s.num_nodes)
    per_rank = NUM_EXPERTS // s.size
    if impl == "deepep-ll":  # tests/test_low_latency.py: every (token, expert) copy, either metric
        return p.tokens * p.topk * tb
    if p.metric == "rdma":
        nodes = s.num_nodes if impl == "mori" else expected_hits(groups, per_rank * s.per_node, p.topk)
        return p.tokens * nodes * tb
    return p.tokens * expected_hits(groups * s.per_node, per_rank, p.topk) * tb


def predict_GBps(p: DispatchPoint, impl: str, cluster: ClusterSpec) -> float:
    cost = dispatch_cost(load(p, impl), shape(p), cluster, impl)
    return counted_bytes(p, impl) / cost.time_s / 1e9


def leg_efficiency(p: DispatchPoint, impl: str, cluster: ClusterSpec) -> float:
    """Efficiency of the leg ``p``'s metric names that reproduces its bandwidth (<= 1)."""
    unit = dataclasses.replace(cluster.dispatch[impl], latency_us=0.0, intra_efficiency=1.0, rdma_efficiency=1.0)
    cost = dispatch_cost(load(p, impl), shape(p), dataclasses.replace(cluster, dispatch={impl: unit}), impl)
    measured_s = counted_bytes(p, impl) / (p.bw_GBps * 1e9)
    leg_s = cost.nic_s if p.metric == "rdma" else cost.intra_s
    return min(1.0, leg_s / measured_s)


def fit_dispatch(points: list[DispatchPoint], cluster: ClusterSpec) -> list[DispatchFit]:
    """Median leg efficiency per implementation the profile has, over the usable rows."""
    out = []
    for impl in LIBRARIES:  # bandwidth kernels; the low-latency law is fitted by fit_low_latency
        rows = [p for p in points if library(p) == impl and (p.metric == "rdma" or p.num_nodes == 1)]
        if not rows or impl not in cluster.dispatch:
            continue
        intra = [leg_efficiency(p, impl, cluster) for p in rows if p.metric != "rdma"]
        rdma = [leg_efficiency(p, impl, cluster) for p in rows if p.metric == "rdma"]
        out.append(DispatchFit(impl=impl, intra_efficiency=round(statistics.median(intra), 4) if intra else None,
                               rdma_efficiency=round(statistics.median(rdma), 4) if rdma else None,
                               num_points=len(rows)))
    return out


def fit_low_latency(rows: tuple[DispatchPoint, ...], cluster: ClusterSpec, impl: str = "deepep-ll") -> float:
    """Per-call latency (us) of a low-latency kernel: the median over ``rows`` of measured
    time (the latency column) minus the modelled transfer time with no latency. (Its
    message rate is not identified by DeepEP's table: 7.4 KB copies at the NIC efficiency of
    the normal kernels take as long as a ~6.3 M messages/s limit would, so it stays 0.)"""
    gaps = []
    for p in rows:
        spec = dataclasses.replace(cluster.dispatch[impl], latency_us=0.0)
        cost = dispatch_cost(load(p, impl), shape(p), dataclasses.replace(cluster, dispatch={impl: spec}), impl)
        measured = counted_bytes(p, impl) / (p.bw_GBps * 1e9) if p.latency_us is None else p.latency_us * 1e-6
        gaps.append((measured - cost.time_s) * 1e6)
    return round(statistics.median(gaps), 3)
