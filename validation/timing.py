"""Kernel timing: warm-up, then the median of timed repeats (CUDA/HIP events on a GPU).

Each timed call starts behind a head start: a ``torch.cuda._sleep`` kernel longer than the
host takes to issue the call, so the call's kernels are queued before the start event
fires and the events time the GPU's work, not the host's. Without it a call on an idle
GPU is timed from the start event to its last kernel's end, host issue included: a 256^3
cuBLAS GEMM read ~21 us on an H200 that way (the Python/torch issue time; the queued gap
between dependent kernels there is ~1 us, validation/data/device/h200).

In the Triton interpreter there is nothing meaningful to time: ``time_fn`` still runs
the function (so the sweep exercises every kernel) but returns ``valid=False`` and the
writer never records such a number as a measurement.
"""

import statistics
import time
from dataclasses import dataclass

HEAD_START_MIN_S = 200e-6  # the head start is at least this, and 3x the host's issue time of one call
SLEEP_CYCLES_PER_S = 2.0e9  # torch.cuda._sleep spins clock cycles: ~2 GHz (an overestimate only lengthens it)


@dataclass(frozen=True, kw_only=True)
class Timing:
    median_s: float
    min_s: float
    repeats: int
    valid: bool  # False: not a measurement (interpreter / CPU)


def time_fn(fn, *, gpu: bool, warmup: int = 5, repeats: int = 20, max_s: float = 2.0) -> Timing:
    """Median wall time of ``fn()``; repeats shrink so one call never takes over ``max_s``."""
    if not gpu:
        fn()
        return Timing(median_s=float("nan"), min_s=float("nan"), repeats=1, valid=False)
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    head_start = _head_start(fn, torch)
    times = []
    budget_s = 0.0
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        head_start()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        budget_s += times[-1]
        if budget_s > max_s and len(times) >= 3:
            break
    return Timing(median_s=statistics.median(times), min_s=min(times), repeats=len(times), valid=True)


def _head_start(fn, torch):
    """A callable that queues a GPU sleep longer than the host's issue time of ``fn``."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return lambda: None
    sleep(int(SLEEP_CYCLES_PER_S * 1e-3))  # keep the GPU busy while the host issue is timed
    t0 = time.perf_counter()
    fn()
    issue_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    cycles = int(SLEEP_CYCLES_PER_S * max(HEAD_START_MIN_S, 3 * issue_s))
    return lambda: sleep(cycles)
