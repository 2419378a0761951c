"""``simulate --trace``: write the Chrome/Perfetto trace compactly, gzip-compressed when
the path ends in ``.gz`` (ui.perfetto.dev opens ``.json.gz`` directly), optionally only some
pipeline stages (``--trace-stages 0,3``), and say on stderr what it is doing and how big the
result is (a 70B plan's full trace is tens of MB)."""

import gzip
import json
import sys
import time

from perfsim.errors import ConfigError
from perfsim.system.specio import write_atomic
from perfsim.report import Report, chrome_trace
from perfsim.units import format_bytes


def parse_stages(text: str | None, num_stages: int) -> set[int] | None:
    """'0,3' or 'first,last' -> stage indices; None keeps every stage."""
    if not text:
        return None
    out = set()
    for part in text.split(","):
        part = part.strip()
        index = {"first": 0, "last": num_stages - 1}.get(part)
        if index is None:
            try:
                index = int(part)
            except ValueError:
                raise ConfigError(f"--trace-stages: {part!r} is not a stage number, first or last") from None
        if not 0 <= index < num_stages:
            raise ConfigError(f"--trace-stages: stage {index} is outside 0..{num_stages - 1} (pp={num_stages})")
        out.add(index)
    return out


def trace_events(report: Report, stages: set[int] | None) -> dict:
    """The trace of ``report`` restricted to ``stages``; times rounded to nanoseconds."""
    trace = chrome_trace(report)
    events = []
    for e in trace["traceEvents"]:
        if stages is not None and e.get("pid") not in stages:
            continue
        if e.get("ph") == "X":
            e = {**e, "ts": round(e["ts"], 3), "dur": round(e["dur"], 3)}
        events.append(e)
    return {**trace, "traceEvents": events}


def write(report: Report, path: str, stages: set[int] | None = None, log=None) -> int:
    """Write the trace; returns the number of bytes written. Progress goes to ``log``
    (the current sys.stderr by default)."""
    log = log or sys.stderr
    t0 = time.perf_counter()
    trace = trace_events(report, stages)
    count = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X")
    which = "all stages" if stages is None else f"stage{'s' if len(stages) > 1 else ''} {','.join(map(str, sorted(stages)))}"
    print(f"perfsim: writing trace: {count:,} ops of {which} -> {path}", file=log, flush=True)
    try:
        text = json.dumps(trace, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise ConfigError("--trace: the trace holds a NaN or infinite time; an input is out of range") from None
    data = gzip.compress(text.encode(), compresslevel=6) if path.endswith(".gz") else text
    write_atomic(path, data, "--trace")  # a unique temporary per writer, renamed into place
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
    print(f"perfsim: trace written: {format_bytes(size)} in {time.perf_counter() - t0:.1f} s"
          + ("" if path.endswith(".gz") else " (end the path in .gz to compress it)"), file=log, flush=True)
    return size
