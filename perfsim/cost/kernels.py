"""Compute-op durations: roofline x calibrated efficiency from the GPU profile.

time = max(FLOPs / (peak(dtype) * clock ratio * eff(shape)), bytes / (HBM bw * eff_hbm(bytes))) + launch
(GEMM: the two joined by the table's fitted ``roofline_exponent`` instead of max, ``roofline``,
and at least the output tiles' serial K loop, ``k_loop_time``)

* GEMM: the input dtype's own table (``gpu.gemm_table``); eff = tile quantization (real /
  tile-padded output area; the library's macro tile, or a narrower one when that wastes
  less) x wave quantization over the CUs/SMs (all GEMMs of a batched call) x size
  fall-off read at the padded work of the call; bytes with the output dtype written. Backward = dgrad [m,n]@[n,k] + wgrad [k,m]@[m,n].
* Grouped (MoE expert) GEMM: one launch over each expert's GEMM on the tokens routed to
  it, priced at the dense table as one call (tile-padded per expert, CU fill over all
  experts' tiles, size fall-off at the launch's work, K loop), its compute at the grouped
  kernel's own speed against that (the GPU's grouped table vs tokens per expert; forward,
  or the dgrad and wgrad launches).
* Attention: efficiency vs sequence length, head-dim factor, causal factor, fwd / bwd.
* Memory-bound kernels (norms, casts, permutes, optimizer): bytes at the HBM table.

Efficiencies come from the profile's tables; nothing here is a hardware constant.
"""

import bisect
import collections
import dataclasses
import functools
import math

import numpy as np

from perfsim.lowering.ops import Gemm, Op, OpKind
from perfsim.lowering.steps import fp8_cast_bytes, fp8_rowwise_cast_bytes
from perfsim.system.hardware import GpuSpec
from perfsim.system.kernel_tables import DTYPE_BYTES, GemmEfficiency

GFLOP = 1e9
MBYTE = 1e6
PRICE_META = ("dtype", "grad", "backward", "seq", "head_dim", "causal", "host_s", "kernel_speed", "batched", "split_acc",
              "attention_library", "grouped_library")  # op.meta keys compute_time reads
# the macro tile, its N side halved, its M side down to 1/8 (skinny-M kernels: 16- and
# 32-row MFMA/WGMMA tiles for small token counts); the library picks the least padded
_TILE_SPLITS = tuple((dm, dn) for dm in (1, 2, 4, 8) for dn in (1, 2))


@functools.lru_cache(maxsize=1 << 12)  # bounded: a long fit or search never grows it past that
def _log10s(xs: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.log10(xs))


def interp_log(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """Piecewise-linear in log10(x), clamped at both ends (``np.interp``'s arithmetic on
    one point, without its per-call array set-up: the fits call this millions of times)."""
    if len(xs) == 1:
        return float(ys[0])
    lx = _log10s(tuple(xs))
    v = math.log10(max(x, 1e-30))
    if math.isnan(v):
        return math.nan
    if v <= lx[0]:
        return float(ys[0])
    if v >= lx[-1]:
        return float(ys[-1])
    j = bisect.bisect_right(lx, v) - 1
    if v == lx[j]:
        return float(ys[j])
    slope = (ys[j + 1] - ys[j]) / (lx[j + 1] - lx[j])
    return float(slope * (v - lx[j]) + ys[j])


def _tiles(m: int, n: int, tm: int, tn: int) -> int:
    return math.ceil(m / tm) * math.ceil(n / tn)


def _waves(tiles: int, cus: int) -> float:
    """Share of the ``cus`` CU slots busy over the waves of ``tiles`` output tiles (1.0 below
    one wave: small GEMMs use stream-K/split-K, their falloff is in the size table)."""
    if tiles <= cus:
        return 1.0
    waves = math.ceil(tiles / cus)
    return tiles / (waves * cus)


# one launch's GEMMs as (m, n, k, count): ``count`` GEMMs [m, k] @ [k, n] (a batched call is
# one entry, a grouped kernel one entry per distinct token count)
Launch = tuple[tuple[int, int, int, int], ...]


def _launch_tiles(shapes: Launch, tm: int, tn: int) -> tuple[int, float]:
    """(output tiles, tile-padded multiply-adds) of one launch."""
    tiles = [c * _tiles(m, n, tm, tn) for m, n, _, c in shapes]
    return sum(tiles), sum(t * tm * tn * k for t, (_, _, k, _) in zip(tiles, shapes))


def _macs(shapes: Launch) -> float:
    return float(sum(m * n * k * c for m, n, k, c in shapes))


def _launch_choice(shapes: Launch, table: GemmEfficiency, gpu: GpuSpec) -> tuple[int, int, float]:
    """(tile_m, tile_n, utilization) the library would pick among ``_TILE_SPLITS`` of the
    macro tile for one launch over ``shapes``: whichever keeps most of the CU time on real
    multiply-adds. A launch of several GEMMs (a batched call, a grouped kernel) runs one
    workgroup per output tile of every GEMM (``_fill``): fewer tiles than CUs leave CUs
    idle; a single GEMM below one wave splits K instead (its fall-off is in the size table)."""
    return _choice(shapes, table.tile_m, table.tile_n, gpu.num_compute_units)


@functools.lru_cache(maxsize=1 << 16)
def _choice(shapes: Launch, tile_m: int, tile_n: int, cus: int) -> tuple[int, int, float]:
    """``_launch_choice`` on what it reads (the fits price the same shapes at every step)."""
    best = None
    occupancy = _fill if sum(c for *_, c in shapes) > 1 else _waves
    real = _macs(shapes)
    for dm, dn in _TILE_SPLITS:
        tm, tn = max(tile_m // dm, 1), max(tile_n // dn, 1)
        tiles, padded = _launch_tiles(shapes, tm, tn)
        util = real / padded * occupancy(tiles, cus)
        if best is None or util > best[2] + 1e-12:
            best = (tm, tn, util)
    return best


def _shapes(gemm: Gemm) -> Launch:
    return ((gemm.m, gemm.n, gemm.k, gemm.batch),)


def tile_choice(m: int, n: int, table: GemmEfficiency, gpu: GpuSpec, batch: int = 1) -> tuple[int, int, float]:
    """(tile_m, tile_n, utilization) of a (batched) call of ``batch`` [m, n] outputs
    (``_launch_choice``: the tiles of all GEMMs of one call share the CUs)."""
    return _launch_choice(((m, n, 1, batch),), table, gpu)


def wave_utilization(gemm: Gemm, gpu: GpuSpec, dtype: str = "bf16") -> float:
    """Tile x wave quantization of one GEMM on ``gpu`` (1.0 = no padded work)."""
    return tile_choice(gemm.m, gemm.n, gpu.gemm_table(dtype), gpu, gemm.batch)[2]


def _launch_efficiency(shapes: Launch, gpu: GpuSpec, dtype: str, choice: tuple | None = None) -> float:
    table = gpu.gemm_table(dtype)
    util = (choice or _launch_choice(shapes, table, gpu))[2]
    return interp_log(2.0 * _macs(shapes) / util / GFLOP, table.gflop, table.efficiency) * util


def gemm_efficiency(gemm: Gemm, gpu: GpuSpec, dtype: str = "bf16") -> float:
    """Real FLOPs / (clock-scaled peak x time). The size table is read at the work the CUs
    actually do -- the tile- and wave-padded FLOPs of the whole call -- so its fall-off (a
    fixed per-call cost beside work that grows) is paid once per call, not scaled up by
    the padding."""
    return _launch_efficiency(_shapes(gemm), gpu, dtype)


def peak(gpu: GpuSpec, dtype: str) -> float:
    """Dense peak FLOP/s of ``dtype`` at the clock the GPU holds under load."""
    return gpu.peak_flops(dtype) * gpu.clock_ratio


def _bandwidth_time(num_bytes: float, table, gpu: GpuSpec) -> float:
    """``num_bytes`` at the fraction of peak HBM bandwidth ``table`` gives for that size."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / (gpu.hbm_Bps * interp_log(num_bytes / MBYTE, table.mbytes, table.efficiency))


def hbm_time(num_bytes: float, gpu: GpuSpec) -> float:
    return _bandwidth_time(num_bytes, gpu.hbm, gpu)


def output_bytes(dtype: str, gpu: GpuSpec) -> int:
    out = gpu.gemm_table(dtype).output_dtype
    return DTYPE_BYTES[out or dtype]


def _launch_bytes(shapes: Launch, dtype: str, out: int) -> float:
    return sum(((m * k + k * n) * DTYPE_BYTES[dtype] + m * n * out) * c for m, n, k, c in shapes)


def gemm_bytes(gemm: Gemm, dtype: str, gpu: GpuSpec | None = None) -> float:
    out = output_bytes(dtype, gpu) if gpu is not None else DTYPE_BYTES[dtype]
    return _launch_bytes(_shapes(gemm), dtype, out)


def roofline(compute_s: float, memory_s: float, exponent: float) -> float:
    """Compute and HBM time joined as (c^p + m^p)^(1/p); p = 0: max(c, m)."""
    if exponent == 0.0 or compute_s <= 0.0 or memory_s <= 0.0:
        return max(compute_s, memory_s)
    hi = max(compute_s, memory_s)
    return hi * ((compute_s / hi) ** exponent + (memory_s / hi) ** exponent) ** (1.0 / exponent)


def _launch_k_loop(shapes: Launch, gpu: GpuSpec, dtype: str, choice: tuple | None = None) -> float:
    """Lower bound from the serial K loop of each output tile: every wave of tiles (the
    chosen tile, all GEMMs of the launch) walks K at the table's ``k_step_ns`` -- the
    tiles' mean K where the GEMMs of a grouped wgrad differ in it, and never less than
    the longest K (the tile that walks it ends the launch)."""
    table = gpu.gemm_table(dtype)
    if table.k_step_ns <= 0.0:
        return 0.0
    tm, tn, _ = choice or _launch_choice(shapes, table, gpu)
    return _k_steps(shapes, tm, tn, gpu.num_compute_units) * table.k_step_ns * 1e-9


@functools.lru_cache(maxsize=1 << 16)
def _k_steps(shapes: Launch, tm: int, tn: int, cus: int) -> float:
    """K-loop steps the launch's last wave of ``tm`` x ``tn`` tiles ends on (``_launch_k_loop``)."""
    tiles = [c * _tiles(m, n, tm, tn) for m, n, _, c in shapes]
    waves = math.ceil(sum(tiles) / cus)
    mean_k = sum(t * k for t, (_, _, k, _) in zip(tiles, shapes)) / sum(tiles)
    return max(waves * mean_k, max(k for _, _, k, _ in shapes))


def k_loop_time(gemm: Gemm, gpu: GpuSpec, dtype: str) -> float:
    """``_launch_k_loop`` of one (batched) GEMM call."""
    return _launch_k_loop(_shapes(gemm), gpu, dtype)


def launch_time(shapes: Launch, gpu: GpuSpec, dtype: str, speed: float = 1.0) -> float:
    """One kernel launch over ``shapes`` (a GEMM, a batched call, a grouped kernel's
    experts: ``Launch``), launch gap included, at the input dtype's dense GEMM table: tile
    padding and CU fill over all the launch's tiles (``_launch_choice``), the size
    fall-off read at the launch's padded work, compute and HBM time joined by the table's
    roofline exponent, at least the tiles' serial K loop (``_launch_k_loop``). ``speed``
    scales the compute term (a grouped kernel's own speed against the dense table's)."""
    table = gpu.gemm_table(dtype)
    choice = _launch_choice(shapes, table, gpu)  # once: the efficiency and the K loop read the same tile
    compute = 2.0 * _macs(shapes) / (peak(gpu, dtype) * _launch_efficiency(shapes, gpu, dtype, choice))
    memory = hbm_time(_launch_bytes(shapes, dtype, output_bytes(dtype, gpu)), gpu)
    body = roofline(compute / speed, memory, table.roofline_exponent)
    return max(body, _launch_k_loop(shapes, gpu, dtype, choice)) + gpu.kernel_launch_s


def gemm_time(gemm: Gemm, gpu: GpuSpec, dtype: str) -> float:
    """One (batched) GEMM call (``launch_time``)."""
    return launch_time(_shapes(gemm), gpu, dtype)


def gemm_backward_time(gemm: Gemm, gpu: GpuSpec, dtype: str, part: str = "both") -> float:
    """dgrad ([m,n] @ [n,k] -> [m,k]) and/or wgrad ([k,m] @ [m,n] -> [k,n]) of a forward GEMM."""
    dgrad = gemm_time(Gemm(m=gemm.m, n=gemm.k, k=gemm.n), gpu, dtype)
    wgrad = gemm_time(Gemm(m=gemm.k, n=gemm.n, k=gemm.m), gpu, dtype)
    return {"dgrad": dgrad, "wgrad": wgrad, "both": dgrad + wgrad}[part]


def grouped_speed(groups: tuple[int, ...], gpu: GpuSpec, dtype: str, backward: bool = False,
                  library: str | None = None) -> float:
    """The grouped kernel's compute speed against the dense GEMM table's price of the same
    launch, at the launch's mean tokens per active expert (the GPU's grouped table, kernel
    ``library``'s own where it has one; 1 where it has none)."""
    table = gpu.grouped_table(dtype, library)
    if table is None or not any(groups):
        return 1.0
    speeds = table.backward_speed if backward else table.forward_speed
    if len(speeds) == 1:  # one speed per direction (what calibrate writes): no token mean to take
        return speeds[0]
    active = [m for m in groups if m]
    return interp_log(sum(active) / len(active), table.tokens, speeds)


def grouped_gemm_time(groups: tuple[int, ...], n: int, k: int, gpu: GpuSpec, dtype: str,
                      backward: bool = False, batched: bool = False, library: str | None = None) -> float:
    """One grouped kernel over experts with ``groups[i]`` tokens each, priced as the
    library runs it: one launch over every active expert's output tiles
    (``launch_time``: expert i's [groups[i], k] @ [k, n] tile-padded, all experts' tiles
    sharing the CUs, the size fall-off read at the whole launch's work, the K loop, HBM
    for every active expert's weights), its compute at the grouped kernel's own speed
    against that dense price (``grouped_speed``). ``backward``: the dgrad launch
    ([groups[i], n] @ [n, k]) and the wgrad launch ([k, groups[i]] @ [groups[i], n]).
    ``batched``: the experts run as one batched dense GEMM (equal padded groups, e.g. an
    XLA einsum over the capacity): the dense price itself. Empty experts cost only their
    weight reads when no expert has tokens."""
    active = [m for m in groups if m]
    if not active:
        passes = 2 if backward else 1
        return hbm_time(passes * len(groups) * k * n * DTYPE_BYTES[dtype], gpu) + gpu.kernel_launch_s
    speed = 1.0 if batched else grouped_speed(groups, gpu, dtype, backward, library)
    counts = sorted(collections.Counter(active).items())
    if not backward:
        return launch_time(tuple((m, n, k, c) for m, c in counts), gpu, dtype, speed)
    return (launch_time(tuple((m, k, n, c) for m, c in counts), gpu, dtype, speed)
            + launch_time(tuple((k, n, m, c) for m, c in counts), gpu, dtype, speed))


def _fill(tiles: int, cus: int) -> float:
    """Share of the ``cus`` CU slots a grouped kernel keeps busy: one workgroup per output
    tile, so fewer tiles than CUs leave CUs idle (no stream-K split across experts)."""
    return tiles / cus if tiles < cus else _waves(tiles, cus)


def attention_efficiency(gpu: GpuSpec, backward: bool, seq: float | None = None, head_dim: float | None = None,
                         causal: bool = False, library: str | None = None) -> float:
    """Achieved fraction of the clock-scaled BF16 peak; an unknown ``seq`` takes the
    table's longest sequence (the plateau), an unknown head dim the factor 1; ``library``:
    the kernel library's own table where the GPU has one (``GpuSpec.attention_table``)."""
    a = gpu.attention_table(library)
    table = a.backward_efficiency if backward else a.forward_efficiency
    eff = interp_log(seq if seq else a.seq[-1], a.seq, table)
    if head_dim:
        eff *= interp_log(head_dim, a.head_dim, a.head_dim_factor)
    if causal:
        eff *= a.causal_backward_factor if backward else a.causal_forward_factor
    return min(eff, 1.0)


def attention_time(flops: float, num_bytes: float, gpu: GpuSpec, backward: bool, seq: float | None = None,
                   head_dim: float | None = None, causal: bool = False, library: str | None = None) -> float:
    """Flash attention (kept in BF16 under FP8 recipes); ``flops`` already halved when causal."""
    compute = flops / (peak(gpu, "bf16") * attention_efficiency(gpu, backward, seq, head_dim, causal, library))
    return max(compute, hbm_time(num_bytes, gpu)) + gpu.kernel_launch_s


def membound_time(num_bytes: float, gpu: GpuSpec) -> float:
    """HBM time of a memory-bound LLM kernel: the GPU's measured ``membound`` table (norm,
    rotary, reduction kernels as the libraries ship them), never faster than a streaming
    copy of the same bytes (``hbm``, which alone prices them where no table is fitted)."""
    copy = hbm_time(num_bytes, gpu)
    return copy if gpu.membound is None else max(copy, _bandwidth_time(num_bytes, gpu.membound, gpu))


def elementwise_time(num_bytes: float, gpu: GpuSpec) -> float:
    return membound_time(num_bytes, gpu) + gpu.kernel_launch_s


def optimizer_time(num_bytes: float, gpu: GpuSpec) -> float:
    """The optimizer step's multi-tensor kernels: long streaming passes over the states."""
    return hbm_time(num_bytes, gpu) + gpu.kernel_launch_s


def fp8_cast_time(elements: float, gpu: GpuSpec) -> float:
    """The two HBM-bound kernels (amax, cast-transpose) of one FP8 cast of a BF16 tensor
    (bytes from ``layers.fp8_cast_bytes``, the steps FP8 plans contain)."""
    return sum(elementwise_time(b, gpu) for b in fp8_cast_bytes(elements))


def fp8_rowwise_cast_time(elements: float, gpu: GpuSpec) -> float:
    """One dynamic per-token FP8 cast kernel of a BF16 activation (``steps.fp8_rowwise_cast_bytes``)."""
    return elementwise_time(fp8_rowwise_cast_bytes(elements), gpu)


def _accumulator_speed(op: Op, gpu: GpuSpec, dtype: str) -> float:
    """A backward FP8 GEMM the stack runs with a split accumulator (``meta['split_acc']``)
    at the GPU's speed for it; every other GEMM at the table's."""
    return gpu.fp8_split_accumulator_speed if dtype == "fp8" and op.meta.get("split_acc") else 1.0


def _gemm_op_time(op: Op, gpu: GpuSpec, dtype: str) -> float:
    part = op.meta.get("grad")
    if part is None:
        return gemm_time(op.gemm, gpu, dtype)
    single = Gemm(m=op.gemm.m, n=op.gemm.n, k=op.gemm.k)
    return gemm_backward_time(single, gpu, dtype, part) * (op.gemm.batch if part == "both" else 1) / (
        2 if part == "both" else 1) / _accumulator_speed(op, gpu, dtype)


def _grouped_op_time(op: Op, gpu: GpuSpec, dtype: str) -> float:
    part, batched, library = op.meta.get("grad"), bool(op.meta.get("batched")), op.meta.get("grouped_library")
    if part is None:
        return grouped_gemm_time(op.grouped, op.gemm.n, op.gemm.k, gpu, dtype, batched=batched, library=library) * op.gemm.batch
    both = grouped_gemm_time(op.grouped, op.gemm.n, op.gemm.k, gpu, dtype, backward=True, batched=batched, library=library)
    return (both if part == "both" else both / 2) / _accumulator_speed(op, gpu, dtype)


def compute_time(op: Op, gpu: GpuSpec, dtype: str) -> float:
    """Duration of a compute op on one GPU running at its nominal speed. An op's
    ``meta['dtype']`` overrides the plan dtype (the LM head stays BF16 under FP8);
    ``meta['grad']`` (dgrad | wgrad | both) marks backward GEMMs."""
    dtype = op.meta.get("dtype", dtype)
    if "host_s" in op.meta:  # host time a software stack adds (system.stacks): no GPU work
        return op.meta["host_s"]
    if "kernel_speed" in op.meta:  # the stack's kernels against the tuned ones the tables hold
        bare = dataclasses.replace(op, meta={k: v for k, v in op.meta.items() if k != "kernel_speed"})
        return compute_time(bare, gpu, dtype) / op.meta["kernel_speed"]
    if op.kind is OpKind.GEMM:
        return _gemm_op_time(op, gpu, dtype)
    if op.kind is OpKind.GROUPED_GEMM:
        return _grouped_op_time(op, gpu, dtype)
    if op.kind is OpKind.ATTENTION:
        return attention_time(op.flops, op.bytes, gpu, backward=op.meta.get("backward", False),
                              seq=op.meta.get("seq"), head_dim=op.meta.get("head_dim"), causal=op.meta.get("causal", False),
                              library=op.meta.get("attention_library"))
    if op.kind is OpKind.ELEMENTWISE:
        return elementwise_time(op.bytes, gpu)
    if op.kind is OpKind.OPTIMIZER:
        return optimizer_time(op.bytes, gpu)
    raise ValueError(f"not a compute op: {op.kind}")
