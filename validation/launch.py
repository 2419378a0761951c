"""The gap between dependent kernels on a GPU, measured from a profiler trace (GPU only).

    python -m validation.launch [--kernels 2000] --out launch.csv

perfsim's ``kernel_launch_us`` (hardware_profiles/gpus/*.toml) is the idle time between one
kernel's end and the next one's start on the same stream. This measures it three ways,
on tiny dependent kernels (``y = y + 1`` on 256 floats, each kernel a few microseconds
or less), from the kernels' own start and end stamps in a torch.profiler (CUPTI) trace:

* ``queued``: the host issued every kernel while a long ``torch.cuda._sleep`` kernel held
  the GPU, so the gaps are the GPU front end's alone (the floor of a step whose host
  runs ahead);
* ``eager``: kernels issued as a Python loop runs them, no head start: the gap is the
  longer of the front end's and the host's time to issue one torch op;
* ``graph``: the same kernels replayed from a CUDA graph.

Each row: the mode, the median / p10 / p90 gap (us), the median kernel duration (us), the
kernels counted, the device and software. Exits 2 with one line without a GPU.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from validation.env import EnvironmentProblem, setup

COLUMNS = ("mode", "gap_us_median", "gap_us_p10", "gap_us_p90", "kernel_us_median", "kernels", "device", "software", "source")
SOURCE = "validation/launch.py (torch.profiler CUPTI kernel stamps, tiny dependent kernels)"


def kernel_spans(trace: dict) -> list[tuple[float, float]]:
    """(start, end) in us of every GPU kernel in a chrome trace, in start order."""
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
             for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(spans)


def gaps(spans: list[tuple[float, float]]) -> list[float]:
    """Idle time between each kernel's end and the next one's start (never negative)."""
    return [max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:])]


def summarize(mode: str, spans: list[tuple[float, float]], drop: int = 0) -> dict:
    """The row of one mode; ``drop`` leading kernels (the head-start kernel) are left out."""
    spans = spans[drop:]
    g = sorted(gaps(spans))
    if len(g) < 10:
        raise EnvironmentProblem(f"{mode}: the trace holds {len(spans)} kernels, too few to measure gaps")
    q = statistics.quantiles(g, n=10)
    return {"mode": mode, "gap_us_median": round(statistics.median(g), 3), "gap_us_p10": round(q[0], 3),
            "gap_us_p90": round(q[-1], 3), "kernel_us_median": round(statistics.median(e - s for s, e in spans), 3),
            "kernels": len(spans)}


def _trace(fn) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # no CPU tracing: it would slow the host's issue
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def measure(n: int) -> list[dict]:
    import torch

    y = torch.zeros(256, device="cuda")

    def chain():
        for _ in range(n):
            y.add_(1.0)
    chain()  # warm-up: module load, allocator
    torch.cuda.synchronize()
    rows = []
    # queued: a sleep kernel long enough for the host to issue all n kernels behind it
    cycles = int(1e7 * max(1, n // 200))  # ~5 ms per 200 kernels at ~2 GHz: 25 us of host time per kernel
    queued = _trace(lambda: (torch.cuda._sleep(cycles), chain()))
    rows.append(summarize("queued", kernel_spans(queued), drop=1))
    rows.append(summarize("eager", kernel_spans(_trace(chain))))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        chain()
    graph.replay()
    rows.append(summarize("graph", kernel_spans(_trace(graph.replay))))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.launch", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.kernels < 20:
        print(f"error: --kernels must be at least 20, got {args.kernels}", file=sys.stderr)
        return 2
    try:
        runtime = setup(require_gpu=True)
        rows = measure(args.kernels)
    except EnvironmentProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from validation.csvout import software

    for row in rows:
        row.update(device=runtime.device_name, software=software(runtime.metadata), source=SOURCE)
        print(f"{row['mode']:7s} gap median {row['gap_us_median']:7.3f} us (p10 {row['gap_us_p10']:.3f}, "
              f"p90 {row['gap_us_p90']:.3f}); kernel {row['kernel_us_median']:.3f} us; {row['kernels']} kernels")
    import csv

    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
