"""Spans + memory -> Report: step time, throughput, MFU, breakdown, trace export.

MFU = model FLOPs per step / (step time x GPUs x dense peak of the plan's dtype), with
model FLOPs from ``ModelSpec.model_flops_per_token`` (6N + causal attention); recompute
and other overheads are not counted as useful work.
"""

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field

from perfsim.calibration.accuracy import notes as accuracy_notes
from perfsim.estimators.engine import Span
from perfsim.system.hardware import ClusterSpec
from perfsim.lowering.memory import MemoryBreakdown
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan

COMPUTE_STREAM = "compute"
BUBBLE = "pipeline_bubble"


class _Coverage:
    """A union of disjoint intervals that reports how much each addition newly covers."""

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        i = bisect.bisect_left(self.ends, a)
        j = bisect.bisect_right(self.starts, b)
        overlap = sum(min(b, self.ends[k]) - max(a, self.starts[k]) for k in range(i, j))
        lo = min(a, self.starts[i]) if i < j else a
        hi = max(b, self.ends[j - 1]) if i < j else b
        self.starts[i:j], self.ends[i:j] = [lo], [hi]
        return (b - a) - max(0.0, overlap)


@dataclass(frozen=True, kw_only=True)
class Report:
    model: str
    cluster: str
    plan: dict
    estimator: str
    stack: str = "ideal"  # the software-stack profile the step was priced under (system.stacks)
    world_size: int
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    breakdown: dict[str, float]
    overlapped_comm_s: dict[str, float]
    critical_stage: int
    peak_memory_bytes: float
    memory_capacity_bytes: float
    memory: list[dict]
    warnings: list[str] = field(default_factory=list)
    bubble_s: float = 0.0  # idle time of the critical stage's compute stream
    bubble_fraction: float = 0.0
    exposed_comm_s: float = 0.0  # comm on the critical stage not hidden behind compute
    comm_by_collective: dict[str, dict] = field(default_factory=dict)  # "category/coll" -> total, exposed, overlapped
    per_layer_s: dict[str, dict] = field(default_factory=dict)  # critical stage, layer -> compute_s, comm_s
    per_stage: list[dict] = field(default_factory=list)  # stage -> compute_s, comm_s, idle_s
    per_stream_s: dict[str, float] = field(default_factory=dict)  # critical stage, busy seconds per stream
    critical_path_s: dict[str, float] = field(default_factory=dict)  # category -> seconds on the critical path
    critical_path_ops: int = 0
    moe_imbalance: float = 1.0  # max / mean routed tokens per EP rank
    moe_imbalance_cost_s: float = 0.0  # step time minus the same plan with uniform routing
    straggler_slowdown: float = 1.0  # slowest stage's compute factor from GPU variability
    straggler_cost_s: float = 0.0  # step time minus the same plan without variability
    simulated_microbatches: tuple[int, ...] = ()  # engine folded: the two short steps it extended linearly (pipeline.steady_window)
    links: dict[str, dict] = field(default_factory=dict)  # critical stage, link -> busy_s, utilization, exposed_s
    # kernel class -> the library the stack runs whose own GPU table priced it (attention, grouped)
    kernel_libraries: dict[str, str] = field(default_factory=dict)
    # how far perfsim's own held-out checks put a prediction like this (perfsim.calibration.accuracy): the
    # stack's published runs, the GPU's kernel tables, the cluster's collectives; "lines" to print
    accuracy: dict = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "spans"}
        out["fits"] = self.fits
        out["memory_headroom_bytes"] = self.memory_capacity_bytes - self.peak_memory_bytes
        return out


def _stage_breakdown(spans: list[Span], t0: float, t1: float) -> tuple[dict, dict, dict]:
    """(breakdown, overlapped comm, per collective) of one stage: compute by category,
    exposed comm by category, and idle time as pipeline bubble; the breakdown sums to
    t1 - t0. Comm spans are charged in start order: the first to stick out owns it."""
    cover, breakdown = _Coverage(), defaultdict(float)
    comm_total = defaultdict(float)
    per_coll = defaultdict(lambda: {"total_s": 0.0, "exposed_s": 0.0, "count": 0})
    for s in spans:
        if s.stream == COMPUTE_STREAM:
            breakdown[s.category] += s.end_s - s.start_s
            cover.add(s.start_s, s.end_s)
    for s in spans:
        if s.stream != COMPUTE_STREAM:
            exposed = cover.add(s.start_s, s.end_s)
            comm_total[s.category] += s.end_s - s.start_s
            breakdown[s.category] += exposed
            entry = per_coll[f"{s.category}/{s.coll or s.kind}"]
            entry["total_s"] += s.end_s - s.start_s
            entry["exposed_s"] += exposed
            entry["count"] += 1
    busy = sum(e - s for s, e in zip(cover.starts, cover.ends))
    breakdown[BUBBLE] = max(0.0, (t1 - t0) - busy)
    overlapped = {k: v - breakdown[k] for k, v in comm_total.items()}
    for entry in per_coll.values():
        entry["overlapped_s"] = entry["total_s"] - entry["exposed_s"]
    return dict(breakdown), overlapped, dict(per_coll)


def _per_layer(spans: list[Span]) -> dict[str, dict]:
    out = defaultdict(lambda: {"compute_s": 0.0, "comm_s": 0.0})
    for s in spans:
        key = str(s.layer) if s.layer >= 0 else "other"
        out[key]["compute_s" if s.stream == COMPUTE_STREAM else "comm_s"] += s.end_s - s.start_s
    return dict(out)


def _per_stage(by_stage: dict, step: float) -> list[dict]:
    rows = []
    for rank in sorted(by_stage):
        compute = sum(s.end_s - s.start_s for s in by_stage[rank] if s.stream == COMPUTE_STREAM)
        comm = sum(s.end_s - s.start_s for s in by_stage[rank] if s.stream != COMPUTE_STREAM)
        rows.append({"stage": rank, "compute_s": compute, "comm_s": comm, "idle_s": max(0.0, step - compute)})
    return rows


def _per_stream(spans: list[Span]) -> dict[str, float]:
    out = defaultdict(float)
    for s in spans:
        out[s.stream] += s.end_s - s.start_s
    return dict(out)


def critical_path(spans: list[Span]) -> list[Span]:
    """Walk back from the last span to the start: at each span, step to whichever of its
    dependencies and its stream predecessor ended last (the one that released it)."""
    if not spans:
        return []
    by_id = {s.op_id: s for s in spans if s.op_id >= 0}
    lanes = defaultdict(list)
    for s in sorted(spans, key=lambda s: (s.start_s, s.end_s)):
        lanes[(s.rank, s.stream)].append(s)
    before = {}
    for lane in lanes.values():
        for prev, nxt in zip(lane, lane[1:]):
            before[id(nxt)] = prev
    path, seen = [], set()
    node = max(spans, key=lambda s: (s.end_s, s.start_s))
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        path.append(node)
        preds = [by_id[d] for d in node.deps if d in by_id] + ([before[id(node)]] if id(node) in before else [])
        preds = [p for p in preds if p.end_s <= node.start_s + 1e-12]
        node = max(preds, key=lambda p: p.end_s) if preds else None
    return path[::-1]


def _path_summary(path: list[Span]) -> dict[str, float]:
    out = defaultdict(float)
    for a, b in zip(path, path[1:]):
        if b.start_s > a.end_s:
            out["wait"] += b.start_s - a.end_s
    for s in path:
        out[s.category] += s.end_s - s.start_s
    if path and path[0].start_s > 0:
        out["wait"] += path[0].start_s
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def build_report(
    *, spans: list[Span], memory: list[MemoryBreakdown], model: ModelSpec, plan: ParallelPlan,
    cluster: ClusterSpec, estimator: str, warnings: list[str] | None = None, **moe_and_stragglers,
) -> Report:
    """A report from the engine's spans. ``moe_and_stragglers``: moe_imbalance,
    moe_imbalance_cost_s, straggler_slowdown, straggler_cost_s (computed by ``api``,
    which knows the baselines)."""
    return assemble_report(figures=span_figures(spans), spans=spans, memory=memory, model=model, plan=plan,
                           cluster=cluster, estimator=estimator, warnings=warnings, **moe_and_stragglers)


def span_figures(spans: list[Span]) -> dict:
    """What a report shows of a step, from the engine's spans."""
    t0 = 0.0  # a step starts at t = 0; idle time before the first span (pipeline warm-up) is bubble
    t1 = max(s.end_s for s in spans)
    step = t1 - t0
    by_stage = defaultdict(list)
    for s in spans:
        by_stage[s.rank].append(s)
    crit = max(by_stage, key=lambda r: (sum(s.end_s - s.start_s for s in by_stage[r] if s.stream == COMPUTE_STREAM), -r))
    breakdown, overlapped, per_coll = _stage_breakdown(by_stage[crit], t0, t1)
    path = critical_path(spans)
    return dict(
        step_time_s=step, breakdown=dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
        overlapped_comm_s=overlapped, critical_stage=crit, bubble_s=breakdown[BUBBLE],
        exposed_comm_s=sum(e["exposed_s"] for e in per_coll.values()), comm_by_collective=per_coll,
        per_layer_s=_per_layer(by_stage[crit]), per_stage=_per_stage(by_stage, step),
        per_stream_s=_per_stream(by_stage[crit]), critical_path_s=_path_summary(path), critical_path_ops=len(path),
    )


def extrapolate_figures(a: dict, b: dict, m_a: int, m_b: int, m: int) -> dict:
    """Figures of an m-microbatch step from two steps of m_a < m_b microbatches in the
    steady state, where each more microbatch adds the same work: linear in m."""
    k = (m - m_a) / (m_b - m_a)

    def lerp(x, y):
        if isinstance(x, dict) or isinstance(y, dict):
            x, y = x or {}, y or {}
            return {key: lerp(x.get(key, 0.0), y.get(key, 0.0)) for key in {**x, **y}}
        if isinstance(x, list):
            return [lerp(u, v) for u, v in zip(x, y)]
        if isinstance(x, bool) or not isinstance(x, int | float):
            return y
        value = x + (y - x) * k
        return round(value) if isinstance(x, int) and isinstance(y, int) else max(0.0, value)
    out = {key: lerp(a[key], b[key]) for key in a}
    out["critical_stage"] = b["critical_stage"]
    rest = sum(v for c, v in out["breakdown"].items() if c != BUBBLE)
    out["breakdown"][BUBBLE] = out["bubble_s"] = max(0.0, out["step_time_s"] - rest)
    out["breakdown"] = dict(sorted(out["breakdown"].items(), key=lambda kv: -kv[1]))
    for link in (out.get("links") or {}).values():  # a share of the step is not linear in m: from its parts
        link["utilization"] = link["busy_s"] / out["step_time_s"] if out["step_time_s"] > 0 else 0.0
    return out



# what the intra-node link family (perfsim.system.network.XGMI inside) is called on a vendor's
# nodes: Infinity Fabric (xGMI) on AMD, NVLink (through NVSwitch) on NVIDIA
INTRA_NODE_LINK = {"amd": "xgmi", "nvidia": "nvlink"}


def _named_links(figures: dict, name: str) -> dict:
    """``figures`` with the intra-node link family under the node's own name (reports say
    nvlink on NVIDIA nodes; the estimators key it xgmi everywhere)."""
    if name == "xgmi":
        return figures

    def rename(links: dict) -> dict:
        return {name if k == "xgmi" else k: v for k, v in links.items()}
    out = dict(figures)
    out["links"] = rename(figures.get("links") or {})
    out["comm_by_collective"] = {key: {**e, "links": rename(e["links"])} if "links" in e else e
                                 for key, e in (figures.get("comm_by_collective") or {}).items()}
    return out


def assemble_report(
    *, figures: dict, spans: list[Span], memory: list[MemoryBreakdown], model: ModelSpec, plan: ParallelPlan,
    cluster: ClusterSpec, estimator: str, warnings: list[str] | None = None, **moe_and_stragglers,
) -> Report:
    """A report from an estimator's figures (step_time_s, breakdown, overlapped_comm_s,
    critical_stage, bubble_s, exposed_comm_s, comm_by_collective, per_layer_s, per_stage,
    per_stream_s, critical_path_s, critical_path_ops): adds throughput, MFU and memory."""
    step = figures["step_time_s"]
    tokens, world = plan.tokens_per_step, plan.world_size
    tflops = model.model_flops_per_token(plan.seq, plan.mtp_layers) * tokens / step / world / 1e12
    peak = max(memory, key=lambda m: m.total_bytes)
    figures = _named_links(figures, INTRA_NODE_LINK.get(cluster.gpu.vendor, "xgmi"))
    libraries = kernel_libraries(plan.stack, cluster.gpu)
    return Report(
        model=model.name, cluster=cluster.name, plan=plan.priced_dict(), estimator=estimator, world_size=world,
        stack=plan.stack.name, kernel_libraries=libraries,
        accuracy=accuracy_notes(plan.stack, cluster, plan.dtype, model.is_moe, libraries),
        tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / world, tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / cluster.gpu.peak_flops(plan.dtype), peak_memory_bytes=peak.total_bytes,
        memory_capacity_bytes=cluster.gpu.hbm_bytes, memory=[m.as_dict() for m in memory],
        warnings=list(warnings or []), spans=spans, bubble_fraction=figures["bubble_s"] / step,
        **figures, **moe_and_stragglers,
    )


def kernel_libraries(stack, gpu) -> dict[str, str]:
    """The kernel libraries ``stack`` names (as priced on ``gpu``'s vendor) that ``gpu`` has its
    own table for (what priced those kernels instead of the GPU's pooled tables)."""
    kernels = stack.kernels
    out = {}
    if kernels.attention and kernels.attention in gpu.attention_libraries:
        out["attention"] = kernels.attention
    if kernels.grouped and kernels.grouped in gpu.grouped_libraries:
        out["grouped_gemm"] = kernels.grouped
    return out


def chrome_trace(report: Report) -> dict:
    """Chrome / Perfetto trace (JSON object format): one process per pipeline stage,
    one thread per stream, one complete ('X') event per span, times in microseconds."""
    events, tids = [], {}
    for s in report.spans:
        tid = tids.setdefault((s.rank, s.stream), len(tids) + 1)
        events.append({
            "name": s.op, "cat": s.category, "ph": "X", "pid": s.rank, "tid": tid,
            "ts": s.start_s * 1e6, "dur": (s.end_s - s.start_s) * 1e6,
            "args": {"bytes": s.bytes, "flops": s.flops, "microbatch": s.microbatch, "layer": s.layer},
        })
    for (rank, stream), tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": stream}})
    for rank in {r for r, _ in tids}:
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"pp stage {rank}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"plan": report.plan, "model": report.model}}


def write_trace(report: Report, path: str) -> None:
    with open(path, "w") as handle:
        json.dump(chrome_trace(report), handle)
