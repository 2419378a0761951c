"""A self-contained HTML run report of one simulated step (``simulate --html``, the
planner's "Download HTML report"): headline figures, the plan, the breakdown, memory per
stage, a communication table with message sizes per collective and per layer, and a
timeline of the critical stage. Plain HTML + inline SVG: no plotly, no network, opens anywhere.
Needs the report's spans (simulate with ``trace=True``) for the comm tables and timeline."""

import html
import zlib
from collections import defaultdict

from perfsim.report import Report
from perfsim.units import format_bytes

COMPUTE = "compute"
MAX_TIMELINE_RECTS = 6000
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 20px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}td.l,th.l{text-align:left}
h2{margin-top:28px}.muted{color:#666;font-size:90%}svg text{font-size:11px}"""


def _e(value) -> str:
    return html.escape(str(value))


def colour(category: str) -> str:
    """A fixed colour per category name (the same in every report)."""
    hue = zlib.crc32(category.encode()) % 360
    return "#9e9e9e" if category in ("pipeline_bubble", "idle", "wait") else f"hsl({hue},55%,55%)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


def _table(head: list[str], rows: list[list], left: int = 1) -> str:
    th = "".join(f"<th class='l'>{_e(h)}</th>" if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td class='l'>{_e(c)}</td>" if i < left else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def comm_rows(spans) -> list[dict]:
    """Collectives and p2p ops of the step by (category, op): calls, message size per call
    (rccl-tests 'size': the payload), total bytes and time busy, per representative rank."""
    groups: dict[tuple, list] = defaultdict(list)
    for s in spans:
        if s.stream != COMPUTE and s.bytes > 0:
            groups[(s.category, s.op)].append(s)
    out = []
    for (category, op), mine in sorted(groups.items()):
        sizes = sorted({s.bytes for s in mine})
        out.append({"category": category, "op": op, "coll": mine[0].coll, "calls": len(mine),
                    "min_bytes": sizes[0], "max_bytes": sizes[-1], "total_bytes": sum(s.bytes for s in mine),
                    "busy_s": sum(s.end_s - s.start_s for s in mine), "ranks": len({s.rank for s in mine})})
    return out


def layer_comm_rows(spans, stage: int) -> list[dict]:
    """Per layer of ``stage``, microbatch 0: each communication op and its message size."""
    per_layer: dict[int, dict[str, float]] = defaultdict(dict)
    for s in spans:
        if s.rank == stage and s.stream != COMPUTE and s.bytes > 0 and s.microbatch == 0 and s.layer >= 0:
            per_layer[s.layer].setdefault(s.op, s.bytes)
    return [{"layer": layer, "ops": ops} for layer, ops in sorted(per_layer.items())]


def _bar_svg(parts: list[tuple[str, float]], total: float, width: int = 900) -> str:
    x, rects = 0.0, []
    for name, seconds in parts:
        w = width * seconds / total if total else 0
        rects.append(f"<rect x='{x:.2f}' y='0' width='{w:.2f}' height='28' fill='{colour(name)}'>"
                     f"<title>{_e(name)}: {_ms(seconds)} ms</title></rect>")
        x += w
    return f"<svg width='{width}' height='30' role='img' aria-label='breakdown'>{''.join(rects)}</svg>"


def _timeline_svg(spans, stage: int, step_s: float, width: int = 1100) -> str:
    mine = [s for s in spans if s.rank == stage]
    streams = sorted({s.stream for s in mine}, key=lambda n: (n != COMPUTE, n))
    if not mine or step_s <= 0:
        return "<p class='muted'>no spans: simulate with a trace to see the timeline</p>"
    shown = sorted(mine, key=lambda s: s.end_s - s.start_s, reverse=True)[:MAX_TIMELINE_RECTS]
    lane, rects = 22, []
    for s in shown:
        y = 4 + lane * streams.index(s.stream)
        x0, w = 120 + (width - 130) * s.start_s / step_s, max(0.3, (width - 130) * (s.end_s - s.start_s) / step_s)
        rects.append(f"<rect x='{x0:.1f}' y='{y}' width='{w:.1f}' height='{lane - 6}' fill='{colour(s.category)}'>"
                     f"<title>{_e(s.op)} ({_e(s.category)}) {_ms(s.end_s - s.start_s)} ms</title></rect>")
    labels = "".join(f"<text x='2' y='{4 + lane * i + 12}'>{_e(n)}</text>" for i, n in enumerate(streams))
    note = (f"<p class='muted'>the {len(shown):,} longest of {len(mine):,} ops</p>" if len(shown) < len(mine)
            else "")
    return (f"<svg width='{width}' height='{8 + lane * len(streams)}' role='img' aria-label='timeline'>{labels}"
            f"{''.join(rects)}</svg>{note}")


def _headline(r: Report) -> str:
    rows = [["step time", f"{_ms(r.step_time_s)} ms"], ["tokens/s", f"{r.tokens_per_s:,.0f}"],
            ["tokens/s/GPU", f"{r.tokens_per_s_per_gpu:,.0f}"], ["TFLOPS/GPU", f"{r.tflops_per_gpu:,.1f}"],
            ["MFU", f"{r.mfu:.1%}"], ["peak memory/GPU", f"{format_bytes(r.peak_memory_bytes)} of "
                                                      f"{format_bytes(r.memory_capacity_bytes)}"],
            ["pipeline bubble", f"{_ms(r.bubble_s)} ms"], ["exposed comm", f"{_ms(r.exposed_comm_s)} ms"],
            ["GPUs", f"{r.world_size:,}"], ["estimator", r.estimator]]
    return _table(["figure", "value"], rows)


def _breakdown(r: Report) -> str:
    parts = sorted(((k, v) for k, v in r.breakdown.items() if v > 0), key=lambda kv: -kv[1])
    rows = [[k, _ms(v), f"{v / r.step_time_s:.1%}", _ms(r.overlapped_comm_s.get(k, 0.0))] for k, v in parts]
    return (f"<p>Where critical stage {r.critical_stage}'s step goes (sums to the step; its idle time is "
            "pipeline_bubble). Hidden: communication overlapped with compute.</p>"
            + _bar_svg(parts, r.step_time_s) + _table(["category", "ms", "share", "hidden ms"], rows))


def _memory(r: Report) -> str:
    keys = [k for k in r.memory[0] if k.endswith("_bytes")] if r.memory else []
    rows = [[m["stage"], *(format_bytes(m.get(k, 0.0)) for k in keys)] for m in r.memory]
    return _table(["stage", *(k.removesuffix("_bytes") for k in keys)], rows)


def _comm(r: Report) -> str:
    rows = [[c["category"], c["op"], c["coll"], c["calls"], format_bytes(c["min_bytes"]) if c["min_bytes"] == c["max_bytes"]
             else f"{format_bytes(c['min_bytes'])}-{format_bytes(c['max_bytes'])}", format_bytes(c["total_bytes"]),
             _ms(c["busy_s"]), c["ranks"]] for c in comm_rows(r.spans)]
    layers = layer_comm_rows(r.spans, r.critical_stage)
    per_layer = [[l["layer"], "; ".join(f"{op} {format_bytes(b)}" for op, b in l["ops"].items())] for l in layers]
    return ("<p>Per representative rank of each stage; message size = the collective's payload (rccl-tests "
            "'size').</p>" + _table(["category", "op", "collective", "calls", "message size", "total", "busy ms",
                                     "stages"], rows, left=3)
            + f"<h3>Per layer (stage {r.critical_stage}, microbatch 0)</h3>"
            + (_table(["layer", "communication ops and message sizes"], per_layer, left=2) if per_layer
               else "<p class='muted'>no per-layer communication</p>"))


def render(r: Report, title: str | None = None) -> str:
    """The report as one HTML document."""
    title = title or f"perfsim: {r.model} on {r.cluster}"
    plan = _table(["knob", "value"], [[k, v] for k, v in r.plan.items()])
    warnings = "".join(f"<li>{_e(w)}</li>" for w in r.warnings)
    trust = "".join(f"<li>{_e(line)}</li>" for line in r.accuracy.get("lines", ()))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
            f"</head><body><h1>{_e(title)}</h1><p class='muted'>{r.world_size:,} GPUs, estimator {_e(r.estimator)}; "
            "one representative rank per pipeline stage.</p>" + _headline(r)
            + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "")
            + (f"<h2>How far to trust this</h2><p class='muted'>perfsim's own held-out checks "
               f"(docs/accuracy.md)</p><ul>{trust}</ul>" if trust else "")
            + "<h2>Plan</h2>" + plan + "<h2>Breakdown</h2>" + _breakdown(r) + "<h2>Memory per rank</h2>" + _memory(r)
            + "<h2>Communication</h2>" + _comm(r) + f"<h2>Timeline (stage {r.critical_stage})</h2>"
            + _timeline_svg(r.spans, r.critical_stage, r.step_time_s) + "</body></html>")
