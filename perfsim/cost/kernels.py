"""Compute-op durations: roofline x calibrated efficiency from the GPU profile.

time = max(FLOPs / (peak * eff_compute(shape)), bytes / (HBM bw * eff_hbm(bytes))) + launch
Efficiencies come from the profile's tables; nothing here is a hardware constant.
"""

import math

import numpy as np

from perfsim.system.hardware import GpuSpec
from perfsim.lowering.ops import Gemm, Op, OpKind

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
GFLOP = 1e9
MBYTE = 1e6


def interp_log(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """Piecewise-linear in log10(x), clamped at both ends."""
    if len(xs) == 1:
        return ys[0]
    return float(np.interp(math.log10(max(x, 1e-30)), np.log10(xs), ys))


def wave_utilization(gemm: Gemm, gpu: GpuSpec) -> float:
    """Share of CU slots busy in the last wave of output tiles (1.0 below one wave:
    small GEMMs use stream-K/split-K, their falloff is in the size table)."""
    tiles = math.ceil(gemm.m / gpu.gemm.tile_m) * math.ceil(gemm.n / gpu.gemm.tile_n)
    if tiles <= gpu.num_compute_units:
        return 1.0
    waves = math.ceil(tiles / gpu.num_compute_units)
    return tiles / (waves * gpu.num_compute_units)


def gemm_efficiency(gemm: Gemm, gpu: GpuSpec) -> float:
    single = Gemm(m=gemm.m, n=gemm.n, k=gemm.k)
    size_eff = interp_log(single.flops / GFLOP, gpu.gemm.gflop, gpu.gemm.efficiency)
    return size_eff * wave_utilization(single, gpu)


def hbm_time(num_bytes: float, gpu: GpuSpec) -> float:
    if num_bytes <= 0:
        return 0.0
    eff = interp_log(num_bytes / MBYTE, gpu.hbm.mbytes, gpu.hbm.efficiency)
    return num_bytes / (gpu.hbm_Bps * eff)


def gemm_bytes(gemm: Gemm, dtype: str) -> float:
    return (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * DTYPE_BYTES[dtype] * gemm.batch


def gemm_time(gemm: Gemm, gpu: GpuSpec, dtype: str) -> float:
    compute = gemm.flops / (gpu.peak_flops(dtype) * gemm_efficiency(gemm, gpu))
    return max(compute, hbm_time(gemm_bytes(gemm, dtype), gpu)) + gpu.kernel_launch_s


def grouped_gemm_time(groups: tuple[int, ...], n: int, k: int, gpu: GpuSpec, dtype: str) -> float:
    """One grouped kernel over experts with ``groups[i]`` tokens each: its tiles run
    together, so the size efficiency is that of the summed work, times the share of
    tile rows that are real tokens (each group pads to a whole tile; empty groups cost
    only their weight reads)."""
    tokens = sum(groups)
    moved = (tokens * (k + n) + len(groups) * k * n) * DTYPE_BYTES[dtype]
    if tokens == 0:
        return hbm_time(moved, gpu) + gpu.kernel_launch_s
    tm = gpu.gemm.tile_m
    padded = sum(math.ceil(m / tm) * tm for m in groups)
    flops = 2.0 * tokens * n * k
    eff = interp_log(flops / GFLOP, gpu.gemm.gflop, gpu.gemm.efficiency) * tokens / padded
    compute = flops / (gpu.peak_flops(dtype) * eff)
    return max(compute, hbm_time(moved, gpu)) + gpu.kernel_launch_s


def attention_time(flops: float, num_bytes: float, gpu: GpuSpec, backward: bool) -> float:
    table = gpu.attention.backward_efficiency if backward else gpu.attention.forward_efficiency
    eff = interp_log(flops / GFLOP, gpu.attention.gflop, table)
    compute = flops / (gpu.peak_flops("bf16") * eff)
    return max(compute, hbm_time(num_bytes, gpu)) + gpu.kernel_launch_s


def elementwise_time(num_bytes: float, gpu: GpuSpec) -> float:
    return hbm_time(num_bytes, gpu) + gpu.kernel_launch_s


def compute_time(op: Op, gpu: GpuSpec, dtype: str) -> float:
    """Duration of a compute op on one GPU running at its nominal speed."""
    if op.kind is OpKind.GEMM:
        return gemm_time(op.gemm, gpu, dtype)
    if op.kind is OpKind.GROUPED_GEMM:
        return grouped_gemm_time(op.grouped, op.gemm.n, op.gemm.k, gpu, dtype) * op.gemm.batch
    if op.kind is OpKind.ATTENTION:
        return attention_time(op.flops, op.bytes, gpu, backward=op.meta.get("backward", False))
    if op.kind in (OpKind.ELEMENTWISE, OpKind.OPTIMIZER):
        return elementwise_time(op.bytes, gpu)
    raise ValueError(f"not a compute op: {op.kind}")
