"""Fit mi300x-pollara's [collectives] protocol latencies and bandwidth efficiencies to the
measured 8-GPU all_reduce sweep (least squares on relative error, scipy).

Model (perfsim.cost.collectives): time = launch + protocol latency + steps x xGMI hop
+ bytes / (links x link bandwidth x efficiency). Fixed, not fitted: hop latency 0.8 us
(RCCL gfx942 hwLat), xGMI 46.8 GB/s (TransferBench), protocol windows (RCCL gfx942
llProtoRanges AllReduce: LL <= 524288 B, LL128 <= 4415057 B) and the direct (one-shot)
window [1 KiB, 524288 B]. Fitted: one latency and one efficiency per protocol (6 numbers
for 32 points). Usage: python validation/fit_collectives.py  (prints the TOML values)
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

# The repo root, never validation/ itself: validation/kernels would shadow the `kernels`
# package (transformers imports it) for every later import in the process.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from validation.collective_data import FIT_SERIES, load_series  # noqa: E402
from perfsim import api  # noqa: E402
from perfsim.system.hardware import load_cluster  # noqa: E402

PROTOCOLS = ("ll", "ll128", "simple")


def with_params(cluster, params):
    lat, eff = params[:3], params[3:]
    base = min(lat)
    protos = {name: dataclasses.replace(cluster.collectives.protocols[name], latency_us=float(lat[i] - base),
                                        bw_efficiency=float(eff[i])) for i, name in enumerate(PROTOCOLS)}
    tune = dataclasses.replace(cluster.collectives, launch_latency_us=float(base), protocols=protos)
    return dataclasses.replace(cluster, collectives=tune)


def residuals(params, cluster, points):
    trial = with_params(cluster, params)
    return np.array([api.collective("all_reduce", s, 8, trial)["time_us"] / t - 1 for s, t in points])


def main() -> int:
    cluster = load_cluster("mi300x-pollara")
    points = load_series(FIT_SERIES)
    fit = least_squares(residuals, [10, 10, 10, 0.5, 0.7, 0.95], args=(cluster, points),
                        bounds=([0, 0, 0, 0.05, 0.05, 0.05], [100, 100, 100, 1, 1, 1]))
    best = with_params(cluster, fit.x)
    print(f"launch_latency_us = {best.collectives.launch_latency_us:.2f}")
    for name in PROTOCOLS:
        p = best.collectives.protocols[name]
        print(f"[{name}] latency_us = {p.latency_us:.2f}  bw_efficiency = {p.bw_efficiency:.4f}")
    print(f"MAPE {100 * np.mean(np.abs(fit.fun)):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
