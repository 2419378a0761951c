"""Kernel and link fits for ``calibrate``: GPU efficiency tables and link bandwidths.

* ``predict_kernel``: perfsim's time for one measured kernel (``readers.KernelPoint``),
  through ``costs`` exactly as the simulator prices ops.
* ``fit_table``: refit the y values of one efficiency table (piecewise linear in
  log10 x, clamped) at its existing x points, or at new x points (``knots``), by
  ``least_squares`` on relative time error (soft-L1, f_scale 5%) with a weak pull
  (``PRIOR``) toward the old values so knots without nearby data stay put.
  GEMM also picks the output tile (wave quantization over the CUs) from ``TILES``.
* ``fit_links``: xGMI per-link bandwidth = median of GPU-GPU rates measured with all
  pairs busy (TransferBench a2a; isolated pairs only when no concurrent run is given),
  host link = median host<->GPU rate, NIC = median cross-node GPU-GPU rate.
"""

import dataclasses
import statistics
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from perfsim.cost import kernels as costs
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, GpuSpec
from perfsim.lowering.ops import Gemm
from perfsim.calibration.readers import KernelPoint, P2pPoint

PRIOR = 1e-3
EFF_BOUNDS = (0.005, 1.0)
TILES = ((128, 128), (128, 256), (256, 128), (256, 256))
ATTN_BYTES_PER_ELEMENT = 2  # bf16 q, k, v, o


@dataclass(frozen=True, kw_only=True)
class TableFit:
    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    mape_before: float
    mape_after: float
    num_points: int
    note: str = ""


def attention_bytes(p: KernelPoint) -> float:
    return p.batch * p.seq * (2 * p.heads + 2 * p.kv_heads) * p.head_dim * ATTN_BYTES_PER_ELEMENT


def predict_kernel(p: KernelPoint, gpu: GpuSpec) -> float:
    """Seconds perfsim predicts for one measured kernel call."""
    if p.kind == "gemm":
        return costs.gemm_time(Gemm(m=p.m, n=p.n, k=p.k, batch=p.batch), gpu, p.dtype)
    if p.kind == "grouped_gemm":
        return costs.grouped_gemm_time((p.m,) * p.batch, p.n, p.k, gpu, p.dtype)
    if p.kind == "memory":
        return costs.elementwise_time(p.bytes, gpu)
    fwd = dataclasses.replace(p, direction="fwd").flops
    moved = attention_bytes(p)
    t_fwd = costs.attention_time(fwd, moved, gpu, backward=False)
    t_bwd = costs.attention_time(2.5 * fwd, 2 * moved, gpu, backward=True)
    return {"fwd": t_fwd, "bwd": t_bwd, "fwd_bwd": t_fwd + t_bwd}[p.direction]


def usable(points: list[KernelPoint], gpu: GpuSpec) -> tuple[list[KernelPoint], list[str]]:
    """Points this GPU profile can price (same device, known dtype); reasons for the rest."""
    want = _norm(gpu.name)
    keep, dropped = [], []
    for p in points:
        if p.device and _norm(p.device) != want and want not in _norm(p.device):
            dropped.append(f"line {p.line}: device {p.device!r} is not {gpu.name}")
        elif p.kind != "memory" and p.dtype not in gpu.peak_tflops:
            dropped.append(f"line {p.line}: {gpu.name} has no {p.dtype} peak")
        else:
            keep.append(p)
    return keep, dropped


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def mape(points: list[KernelPoint], gpu: GpuSpec) -> float:
    return 100 * float(np.mean([abs(predict_kernel(p, gpu) / p.time_s - 1) for p in points]))


# ---- efficiency tables ---------------------------------------------------------------

TABLES = {  # table name -> (kinds it prices, GpuSpec field, x field, y fields)
    "gemm": (("gemm", "grouped_gemm"), "gemm", "gflop", ("efficiency",)),
    "hbm": (("memory",), "hbm", "mbytes", ("efficiency",)),
    "attention": (("attention",), "attention", "gflop", ("forward_efficiency", "backward_efficiency")),
}


def _with_table(gpu: GpuSpec, table: str, xs: tuple, ys: np.ndarray, digits: int | None = None, **extra) -> GpuSpec:
    _, attr, x_field, y_fields = TABLES[table]
    n = len(xs)
    ys = np.round(ys, digits) if digits is not None else ys
    values = {f: tuple(float(v) for v in ys[i * n:(i + 1) * n]) for i, f in enumerate(y_fields)}
    spec = dataclasses.replace(getattr(gpu, attr), **{x_field: tuple(xs)}, **values, **extra)
    return dataclasses.replace(gpu, **{attr: spec})


def _initial(gpu: GpuSpec, table: str, xs: tuple) -> np.ndarray:
    _, attr, x_field, y_fields = TABLES[table]
    spec = getattr(gpu, attr)
    return np.concatenate([[costs.interp_log(x, getattr(spec, x_field), getattr(spec, f)) for x in xs] for f in y_fields])


def fit_table(points: list[KernelPoint], gpu: GpuSpec, table: str, knots: tuple[float, ...] | None = None,
              **extra) -> tuple[GpuSpec, float]:
    """``gpu`` with ``table`` refit to ``points`` (and ``extra`` fields such as tiles); MAPE after."""
    _, attr, x_field, _ = TABLES[table]
    xs = knots or getattr(getattr(gpu, attr), x_field)
    y0 = np.clip(_initial(gpu, table, xs), *EFF_BOUNDS)
    measured = np.array([p.time_s for p in points])

    def residuals(ys):
        trial = _with_table(gpu, table, xs, ys, **extra)
        rel = np.array([predict_kernel(p, trial) for p in points]) / measured - 1
        return np.concatenate([rel, PRIOR * (ys - y0) / y0])

    fit = least_squares(residuals, y0, bounds=EFF_BOUNDS, loss="soft_l1", f_scale=0.05)
    best = _with_table(gpu, table, xs, fit.x, digits=5, **extra)
    return best, mape(points, best)


def gemm_knots(points: list[KernelPoint], per_decade: int = 1) -> tuple[float, ...]:
    """Regenerated x points: ``per_decade`` log-spaced knots spanning the measured GFLOPs."""
    g = [p.flops / costs.GFLOP for p in points if p.kind in ("gemm", "grouped_gemm")]
    lo, hi = np.log10(min(g)), np.log10(max(g))
    n = max(2, int(np.ceil((hi - lo) * per_decade)) + 1)
    return tuple(float(f"{x:.4g}") for x in np.logspace(lo, hi, n)) if hi > lo else (float(min(g)),)


def fit_kernels(points: list[KernelPoint], gpu: GpuSpec, regenerate_gemm: bool = False) -> tuple[GpuSpec, list[TableFit]]:
    """Refit every table that has points; GEMM also chooses its tile among ``TILES``."""
    fits = []
    for table, (kinds, attr, x_field, y_fields) in TABLES.items():
        mine = [p for p in points if p.kind in kinds]
        if not mine:
            continue
        before = mape(mine, gpu)
        if table == "gemm":
            knots = gemm_knots(mine) if regenerate_gemm else None
            trials = [fit_table(mine, gpu, table, knots, tile_m=tm, tile_n=tn) for tm, tn in TILES]
            gpu, after = min(trials, key=lambda t: t[1])
            note = f"tile {gpu.gemm.tile_m}x{gpu.gemm.tile_n} chosen among {len(TILES)}"
        else:
            gpu, after, note = *fit_table(mine, gpu, table), ""
        spec = getattr(gpu, attr)
        fits.append(TableFit(name=table, xs=getattr(spec, x_field), ys=getattr(spec, y_fields[0]), mape_before=before,
                             mape_after=after, num_points=len(mine), note=note))
    return gpu, fits


# ---- links ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    name: str  # node.link_bw_GBps, node.pcie_bw_GBps, fabric.nic_bw_Gbps
    before: float
    after: float
    num_points: int
    note: str


def _median(points: list[P2pPoint], link: str) -> tuple[float | None, int, str]:
    mine = [p for p in points if p.link == link]
    busy = [p for p in mine if p.concurrent]
    use = busy or mine
    if not use:
        return None, 0, ""
    return statistics.median(p.GBps for p in use), len(use), "all pairs busy" if busy else "isolated pairs"


def fit_links(points: list[P2pPoint], cluster: ClusterSpec) -> tuple[ClusterSpec, list[LinkFit]]:
    node, fabric, fits = cluster.node, cluster.fabric, []
    xgmi, n, how = _median(points, "xgmi")
    if xgmi is not None:
        if xgmi > node.link_bw_raw_GBps:
            raise ConfigError(f"p2p: measured xGMI {xgmi:.1f} GB/s exceeds the link's raw {node.link_bw_raw_GBps} GB/s")
        fits.append(LinkFit(name="node.link_bw_GBps", before=node.link_bw_GBps, after=round(xgmi, 3), num_points=n, note=how))
        node = dataclasses.replace(node, link_bw_GBps=round(xgmi, 3))
    pcie, n, how = _median(points, "pcie")
    if pcie is not None:
        fits.append(LinkFit(name="node.pcie_bw_GBps", before=node.pcie_bw_GBps, after=round(pcie, 3), num_points=n, note=how))
        node = dataclasses.replace(node, pcie_bw_GBps=round(pcie, 3))
    nic, n, how = _median(points, "nic")
    if nic is not None:
        gbps = round(nic * 8, 2)  # GB/s -> Gb/s
        fits.append(LinkFit(name="fabric.nic_bw_Gbps", before=fabric.nic_bw_Gbps, after=gbps, num_points=n, note=how))
        fabric = dataclasses.replace(fabric, nic_bw_Gbps=gbps)
    return dataclasses.replace(cluster, node=node, fabric=fabric), fits
