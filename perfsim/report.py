"""Spans + memory -> Report: step time, throughput, MFU, breakdown, trace export.

MFU = model FLOPs per step / (step time x GPUs x dense peak of the plan's dtype), with
model FLOPs from ``ModelSpec.model_flops_per_token`` (6N + causal attention); recompute
and other overheads are not counted as useful work.
"""

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field

from perfsim.engine import Span
from perfsim.hardware import ClusterSpec
from perfsim.memory import MemoryBreakdown
from perfsim.model import ModelSpec
from perfsim.parallel import ParallelPlan

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
    spans: list[Span] = field(default_factory=list, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "spans"}
        out["fits"] = self.fits
        out["memory_headroom_bytes"] = self.memory_capacity_bytes - self.peak_memory_bytes
        return out


def _stage_breakdown(spans: list[Span], t0: float, t1: float) -> tuple[dict, dict]:
    """(breakdown, overlapped comm) of one stage: compute by category, exposed comm by
    category, and idle time as pipeline bubble; the breakdown sums to t1 - t0."""
    cover, breakdown = _Coverage(), defaultdict(float)
    comm_total = defaultdict(float)
    for s in spans:
        if s.stream == COMPUTE_STREAM:
            breakdown[s.category] += s.end_s - s.start_s
            cover.add(s.start_s, s.end_s)
    for s in spans:
        if s.stream != COMPUTE_STREAM:
            comm_total[s.category] += s.end_s - s.start_s
            breakdown[s.category] += cover.add(s.start_s, s.end_s)
    busy = sum(e - s for s, e in zip(cover.starts, cover.ends))
    breakdown[BUBBLE] = max(0.0, (t1 - t0) - busy)
    overlapped = {k: v - breakdown[k] for k, v in comm_total.items()}
    return dict(breakdown), overlapped


def build_report(
    *, spans: list[Span], memory: list[MemoryBreakdown], model: ModelSpec, plan: ParallelPlan,
    cluster: ClusterSpec, estimator: str, warnings: list[str] | None = None,
) -> Report:
    t0 = 0.0  # a step starts at t = 0; idle time before the first span (pipeline warm-up) is bubble
    t1 = max(s.end_s for s in spans)
    step = t1 - t0
    by_stage = defaultdict(list)
    for s in spans:
        by_stage[s.rank].append(s)
    crit = max(by_stage, key=lambda r: (sum(s.end_s - s.start_s for s in by_stage[r] if s.stream == COMPUTE_STREAM), -r))
    breakdown, overlapped = _stage_breakdown(by_stage[crit], t0, t1)
    tokens = plan.tokens_per_step
    world = plan.world_size
    flops = model.model_flops_per_token(plan.seq) * tokens
    tflops = flops / step / world / 1e12
    peak = max(memory, key=lambda m: m.total_bytes)
    return Report(
        model=model.name, cluster=cluster.name, plan=plan.to_dict(), estimator=estimator, world_size=world,
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / world,
        tflops_per_gpu=tflops, mfu=tflops * 1e12 / cluster.gpu.peak_flops(plan.dtype),
        breakdown=dict(sorted(breakdown.items(), key=lambda kv: -kv[1])), overlapped_comm_s=overlapped,
        critical_stage=crit, peak_memory_bytes=peak.total_bytes, memory_capacity_bytes=cluster.gpu.hbm_bytes,
        memory=[m.as_dict() for m in memory], warnings=list(warnings or []), spans=spans,
    )


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
