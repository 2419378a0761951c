"""Pure data shaping for the planner pages: spans -> Gantt bars and stream utilization,
breakdown grouping, Pareto fronts, scenario deltas, measured calibration points.

No Streamlit and no Plotly here; every function takes plain data and returns plain
data, so the pages stay free of arithmetic and this module is unit-tested.
"""

import csv
import math
from collections import defaultdict
from pathlib import Path

from perfsim.cost.collectives import bus_bandwidth
from perfsim.plan.parallel import dispatch_label

COMPUTE_STREAM = "compute"
BUBBLE = "pipeline_bubble"
IDLE = "idle"


def category_group(category: str, comm_categories) -> str:
    """'comm', 'bubble' or 'compute' for a breakdown category."""
    if category == BUBBLE or category == IDLE:
        return "bubble"
    return "comm" if category in comm_categories else "compute"


def span_groups(bars: list[dict]) -> dict[str, str]:
    """Group of each category in Gantt bars: on a communication stream 'comm', idle 'bubble'."""
    out = {}
    for b in bars:
        if b["category"] == IDLE:
            out[b["category"]] = "bubble"
        elif b["stream"] != COMPUTE_STREAM or out.get(b["category"]) == "comm":
            out[b["category"]] = "comm"
        else:
            out.setdefault(b["category"], "compute")
    return out


def breakdown_rows(breakdown: dict[str, float], overlapped: dict[str, float]) -> list[dict]:
    """Breakdown categories (seconds on the critical stage) with their group, largest first;
    categories present in ``overlapped`` are communication."""
    rows = [{"category": k, "seconds": v, "group": category_group(k, overlapped)} for k, v in breakdown.items()]
    return sorted(rows, key=lambda r: -r["seconds"])


def _merge_row(spans: list, gap_s: float) -> list[dict]:
    """Consecutive spans of one category on one (rank, stream) merged when the gap <= gap_s."""
    out: list[dict] = []
    for s in sorted(spans, key=lambda s: s.start_s):
        last = out[-1] if out else None
        if last and last["category"] == s.category and s.start_s - last["end_s"] <= gap_s:
            last["end_s"] = max(last["end_s"], s.end_s)
            last["count"] += 1
            last["bytes"] += s.bytes
            continue
        out.append({"rank": s.rank, "stream": s.stream, "category": s.category, "op": s.op,
                    "start_s": s.start_s, "end_s": s.end_s, "count": 1, "bytes": s.bytes})
    return out


def _by_row(spans) -> dict[tuple[int, str], list]:
    rows = defaultdict(list)
    for s in spans:
        rows[(s.rank, s.stream)].append(s)
    return rows


def _coarsen_row(bars: list[dict], window_s: float) -> list[dict]:
    """Neighbouring bars of any category folded into bars at most ``window_s`` long, each
    named after the category that covers most of it."""
    out: list[dict] = []
    for b in bars:
        last = out[-1] if out else None
        if last and b["end_s"] - last["start_s"] <= window_s:
            last["end_s"] = max(last["end_s"], b["end_s"])
            last["count"] += b["count"]
            last["bytes"] += b["bytes"]
            last["_time"][b["category"]] = last["_time"].get(b["category"], 0.0) + b["end_s"] - b["start_s"]
            continue
        out.append({**b, "_time": {b["category"]: b["end_s"] - b["start_s"]}})
    for bar in out:
        times = bar.pop("_time")
        bar["category"] = max(times, key=times.get)
        if len(times) > 1:
            bar["op"] = f"mixed: {', '.join(sorted(times))}"
    return out


def gantt_bars(spans, step_s: float, max_bars: int = 4000) -> list[dict]:
    """Bars for a Gantt chart: spans per (rank, stream), adjacent same-category spans
    merged; when more than ``max_bars`` remain, neighbours are folded into windows that
    double in length until at most ``max_bars`` remain (each bar keeps its op count)."""
    rows = {key: _merge_row(row, 0.0) for key, row in _by_row(spans).items()}
    window = step_s * len(rows) / max(max_bars, 1)
    while sum(len(r) for r in rows.values()) > max_bars and window <= 2 * step_s:
        rows = {key: _coarsen_row(row, window) for key, row in rows.items()}
        window *= 2
    return [b for key in sorted(rows) for b in rows[key]]


def idle_bars(spans, step_s: float, min_fraction: float = 0.002) -> list[dict]:
    """Idle gaps (pipeline bubble) on each rank's compute stream longer than
    ``min_fraction`` of the step, including the warm-up before the first op."""
    out = []
    for (rank, stream), row in sorted(_by_row(spans).items()):
        if stream != COMPUTE_STREAM:
            continue
        t = 0.0
        for s in sorted(row, key=lambda s: s.start_s) + [None]:
            start = step_s if s is None else s.start_s
            if start - t > min_fraction * step_s:
                out.append({"rank": rank, "stream": stream, "category": IDLE, "op": IDLE,
                            "start_s": t, "end_s": start, "count": 1, "bytes": 0.0})
            if s is not None:
                t = max(t, s.end_s)
    return out


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def stream_utilization(spans, step_s: float) -> list[dict]:
    """Busy fraction of the step per (rank, stream): union of its span intervals / step,
    with the bytes it moved and its effective rate while busy (bytes / busy seconds)."""
    out = []
    for (rank, stream), row in sorted(_by_row(spans).items()):
        busy = busy_seconds([(s.start_s, s.end_s) for s in row])
        moved = sum(s.bytes for s in row) if stream != COMPUTE_STREAM else 0.0
        out.append({"rank": rank, "stream": stream, "busy_s": busy, "busy_fraction": busy / step_s if step_s else 0.0,
                    "bytes": moved, "busy_GBps": moved / busy / 1e9 if busy and moved else 0.0})
    return out


def idle_link_notes(utilization: list[dict], below: float = 0.05) -> list[str]:
    """A note for each communication stream busy less than ``below`` of the step."""
    return [f"stage {u['rank']} {u['stream']} is busy only {u['busy_fraction']:.1%} of the step"
            for u in utilization if u["stream"] != COMPUTE_STREAM and u["busy_fraction"] < below]


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """rccl-tests -b/-e/-f sizes: min, min*f, ... up to max."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"size sweep: need 1 <= min <= max and factor >= 2, got {min_bytes}, {max_bytes}, {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def read_measured_busbw(path: str | Path) -> list[dict]:
    """Rows of ``allreduce_busbw_vs_size.csv`` (series, gpu, n_ranks, size_bytes,
    busbw_GBps out-of-place); [] when the file is absent."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = []
        for r in csv.DictReader(handle):
            try:
                busbw = float(r["busbw_GBps_oop"] or r["busbw_GBps_ip"])
            except (KeyError, ValueError):
                continue
            if math.isfinite(busbw):
                rows.append({"series": r["series"], "gpu": r.get("gpu", ""), "ranks": int(r["n_ranks"]),
                             "size_bytes": int(float(r["size_bytes"])), "busbw_GBps": busbw})
    return rows


def pareto_front(points: list[dict], x: str, y: str) -> list[dict]:
    """Points not dominated when x is minimized and y maximized, sorted by x."""
    front, best = [], -math.inf
    for p in sorted(points, key=lambda p: (p[x], -p[y])):
        if p[y] > best:
            front.append(p)
            best = p[y]
    return front


METRICS = (  # (key in Report.to_dict(), label, higher is better)
    ("step_time_s", "step time", False),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", True),
    ("tokens_per_s", "tokens/s", True),
    ("mfu", "MFU", True),
    ("tflops_per_gpu", "TFLOPS/GPU", True),
    ("peak_memory_bytes", "peak memory", False),
    ("world_size", "GPUs", None),
)


def compare_rows(results: dict[str, dict]) -> list[dict]:
    """One row per metric, one column per scenario, and a 'vs <first>' relative delta
    column for each later scenario."""
    names = list(results)
    rows = []
    for key, label, _ in METRICS:
        row = {"metric": label}
        base = results[names[0]].get(key)
        for name in names:
            row[name] = results[name].get(key)
        for name in names[1:]:
            value = results[name].get(key)
            row[f"{name} vs {names[0]}"] = (value - base) / base if base and value is not None else None
        rows.append(row)
    return rows


def plan_differences(plans: dict[str, dict]) -> list[dict]:
    """Knobs whose values differ between the scenarios' plans, one row per knob."""
    keys = sorted({k for plan in plans.values() for k in plan})
    out = []
    for key in keys:
        values = {name: plan.get(key) for name, plan in plans.items()}
        if len({str(v) for v in values.values()}) > 1:
            out.append({"knob": key, **{name: str(v) for name, v in values.items()}})
    return out


SEARCH_COLUMNS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "tflops_per_gpu",
                  "peak_memory_bytes", "memory_headroom_bytes", "exposed_comm_s", "usd_per_mtoken", "world_size",
                  "estimator", "pareto")
PLAN_AXES = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "recompute", "schedule")


def _as_dict(item) -> dict:
    if isinstance(item, dict):
        return item
    for name in ("to_dict", "as_dict", "_asdict"):
        if callable(getattr(item, name, None)):
            return getattr(item, name)()
    return dict(vars(item))


def search_candidates(result) -> list:
    """The ranked candidates of a search result: the result itself when it is a list, else
    its first list-valued attribute among rows / ranked / results / plans / candidates."""
    if isinstance(result, list | tuple):
        return list(result)
    for name in ("rows", "ranked", "results", "plans", "candidates", "top"):
        value = getattr(result, name, None) if not isinstance(result, dict) else result.get(name)
        if isinstance(value, list | tuple):
            return list(value)
    raise ValueError(f"search: cannot read candidates from a {type(result).__name__}")


def search_rows(result) -> list[dict]:
    """Flat rows (rank, the metric columns, the plan axes, a label, the plan dict) of a
    ranked search result, whatever container the search returns."""
    rows = []
    for i, item in enumerate(search_candidates(result), 1):
        d = _as_dict(item)
        plan = d.get("plan") if isinstance(d.get("plan"), dict) else {}
        if not plan and isinstance(d.get("report"), dict):
            plan = d["report"].get("plan", {})
        flat = {**(d.get("report") if isinstance(d.get("report"), dict) else {}), **d}
        row = {"rank": flat.get("rank", i)}
        row.update({k: flat.get(k) for k in SEARCH_COLUMNS if flat.get(k) is not None})
        row.update({k: str(plan[k]) if k in ("recompute", "schedule") else plan[k] for k in PLAN_AXES if k in plan})
        if plan.get("recompute_layers"):  # block recompute: full on the first N layers of each chunk
            row["recompute"] = f"{plan['recompute']}/{plan['recompute_layers']}"
        if plan:
            row["dispatch"] = dispatch_label(plan)
        if "world_size" not in row and plan:
            row["world_size"] = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("cp", 1) * plan.get("dp", 1)
        for key in ("reason", "why", "loses_because", "note"):
            if flat.get(key):
                row["why"] = str(flat[key])
                break
        row["label"] = " ".join(f"{k}={row[k] if k == 'recompute' else plan[k]}" for k in PLAN_AXES
                                if k in plan and plan[k] not in (1, "none"))
        if plan and row["dispatch"] not in ("-", "alltoall"):
            row["label"] += f" dispatch={row['dispatch']}"
        row["plan"] = plan
        rows.append(row)
    return rows


def rccl_points(log, series: str) -> list[dict]:
    """Measured out-of-place points of a parsed rccl-tests log (perfsim.calibration.readers.RcclLog)
    that carry a time, one dict per message size: every point `perfsim validate` and `calibrate`
    score, including the small sizes whose printed busbw rounds to 0.00."""
    return [{"series": series, "op": log.op, "ranks": log.num_ranks, "size_bytes": r.size_bytes,
             "time_us": r.time_us_oop, "measured": r.busbw_GBps_oop or 0.0}
            for r in log.rows if r.time_us_oop is not None and r.time_us_oop > 0]


def series_points(series) -> list[dict]:
    """Measured points of one multi-node table series (perfsim.calibration.readers_multinode.
    CollectiveSeries), as rccl_points: its busbw from the time (rccl-tests' factors)."""
    return [{"series": series.series, "op": series.coll.value, "ranks": series.num_ranks, "size_bytes": size,
             "time_us": t, "measured": bus_bandwidth(series.coll, size, series.num_ranks, t * 1e-6)[1] / 1e9}
            for size, t in series.rows if t > 0]


def series_rows(series) -> list[dict]:
    """Table rows of the chosen multi-node series: what ran, where, and on which path."""
    return [{"series": x.series, "gpu": x.gpu, "op": x.coll.value, "ranks": x.num_ranks, "nodes": x.num_nodes,
             "launch": x.launch, "forced": " / ".join(v for v in (x.algorithm, x.protocol) if v) or "-",
             "rows": len(x.rows)} for x in series]


def error_stats(rows: list[dict]) -> dict:
    """Mean absolute percentage error and the worst signed error of predicted vs measured."""
    errors = [(r["predicted"] - r["measured"]) / r["measured"] for r in rows if r.get("measured")]
    if not errors:
        return {"points": 0, "mape": None, "worst": None}
    worst = max(errors, key=abs)
    return {"points": len(errors), "mape": sum(abs(e) for e in errors) / len(errors), "worst": worst}


def kernel_rows(points) -> list[dict]:
    """Table rows of parsed kernel measurements (perfsim.calibration.readers.KernelPoint) with the
    achieved TFLOPS (FLOPs / time) or TB/s (bytes / time)."""
    out = []
    for p in points:
        row = {"kind": p.kind, "dtype": p.dtype, "device": p.device, "m": p.m, "n": p.n, "k": p.k,
               "batch": p.batch, "seq": p.seq, "time_us": p.time_s * 1e6, "timing": p.timing}
        row["achieved"] = (f"{p.flops / p.time_s / 1e12:.1f} TFLOPS" if p.flops
                           else f"{p.bytes / p.time_s / 1e12:.2f} TB/s" if p.bytes else "")
        out.append(row)
    return out


def search_summary(result) -> str:
    """One line on how much the search looked at, when the result says (perfsim.search's
    SearchResult: enumerated, costed, rejected, total_s, executor, workers)."""
    if not hasattr(result, "enumerated"):
        return ""
    rejected = ", ".join(f"{n:,} {why}" for why, n in sorted(getattr(result, "rejected", {}).items(), key=lambda kv: -kv[1]))
    return (f"{result.enumerated:,} plans enumerated, {result.costed:,} costed"
            + (f" (rejected: {rejected})" if rejected else "")
            + f" in {getattr(result, 'total_s', 0.0):.1f} s on {getattr(result, 'executor', '?')}"
            + f" x {getattr(result, 'workers', 1)}")


NVIDIA = ("nvidia", "h100", "h200", "h800", "a100", "b200", "gb200", "b100", "l40", "tesla", "nccl version")
AMD = ("amd", "instinct", "mi300", "mi325", "mi350", "mi355", "mi250", "rccl version", "gfx9")


def _vendor(text: str) -> str | None:
    text = text.lower()
    if any(k in text for k in AMD):
        return "AMD"
    if any(k in text for k in NVIDIA):
        return "NVIDIA"
    return None


def log_devices(text: str) -> list[str]:
    """Device names of an rccl-tests / nccl-tests log ('#  Rank  0 ... device  0 [bus] NAME')."""
    out = []
    for line in text.splitlines():
        if line.lstrip("# ").startswith("Rank") and "device" in line and "]" in line:
            out.append(line.rsplit("]", 1)[1].strip())
    return out


def vendor_mismatch(log_text: str, profile_gpu: str) -> str:
    """A warning when a log's devices (or its NCCL/RCCL banner) are another vendor's than the
    profile's GPU (an H100 NCCL log fitted into an MI300X profile); '' when they agree or
    either is unknown."""
    devices = log_devices(log_text)
    banner = "\n".join(line for line in log_text.splitlines()[:40] if "version" in line.lower())
    measured = _vendor(" ".join(devices)) or _vendor(banner)
    expected = _vendor(profile_gpu)
    if not measured or not expected or measured == expected:
        return ""
    seen = devices[0] if devices else f"a {measured} library"
    return (f"measured on {seen} ({measured}) but the profile's GPU is {profile_gpu} ({expected}): "
            "its fit would describe the other machine")


def critical_path_rows(report) -> list[tuple[str, float]]:
    """(category, seconds on the critical path), largest first, then the breakdown-only ones at 0."""
    path = dict(report.critical_path_s)
    rows = sorted(path.items(), key=lambda kv: -kv[1])
    return rows + [(k, 0.0) for k in report.breakdown if k not in path]


def critical_path_note(report) -> str:
    """What the critical path is, in one paragraph with its total."""
    total = sum(report.critical_path_s.values())
    if report.estimator == "analytic":
        return (f"The closed form traces no op chain: its critical path ({total * 1e3:,.1f} ms) is the breakdown of "
                f"critical stage {report.critical_stage}, pipeline bubble included. The des engine finds the "
                "longest chain of dependent ops through all stages.")
    return (f"The critical path is the longest chain of dependent ops through all pipeline stages: "
            f"{report.critical_path_ops:,} ops, {total * 1e3:,.1f} ms (the step is {report.step_time_s * 1e3:,.1f} ms). "
            f"Where stage {report.critical_stage} waits (its pipeline bubble), the chain runs through the ops of the "
            "stage it waits for, so per-category times on the path differ from the breakdown and the path holds no "
            "bubble.")
