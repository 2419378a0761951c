"""Kernel timing: warm-up, then the median of timed repeats (CUDA/HIP events on a GPU).

In the Triton interpreter there is nothing meaningful to time: ``time_fn`` still runs
the function (so the sweep exercises every kernel) but returns ``valid=False`` and the
writer never records such a number as a measurement.
"""

import statistics
from dataclasses import dataclass


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
    times = []
    budget_s = 0.0
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        budget_s += times[-1]
        if budget_s > max_s and len(times) >= 3:
            break
    return Timing(median_s=statistics.median(times), min_s=min(times), repeats=len(times), valid=True)
