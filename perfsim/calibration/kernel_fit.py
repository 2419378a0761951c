"""Kernel and link fits for ``calibrate``: GPU efficiency tables and link bandwidths.

* ``predict_kernel``: perfsim's time for one measured kernel (``readers.KernelPoint``),
  through ``costs`` exactly as the simulator prices ops (a row whose ``kernel`` is
  ``cast`` / ``cast_a`` was timed with the FP8 casts of its BF16 inputs / activation,
  and is priced with them).
* ``fit_kernels``: refit each table that has points -- one GEMM table per input dtype,
  one grouped-GEMM table per dtype, attention, HBM -- piecewise linear in log10 x at
  knots spread over the measured range, by ``least_squares`` on relative time error
  (soft-L1, f_scale 5%) with a weak pull (``PRIOR``) toward the old values so knots
  without nearby data stay put. GEMM also picks its macro tile from ``TILES`` and
  how compute and HBM time overlap from ``ROOFLINE_EXPONENTS`` (or the plain max).
* ``fit_links``: xGMI per-link bandwidth = median of GPU-GPU rates measured with all
  pairs busy (TransferBench a2a; isolated pairs only when no concurrent run is given),
  host link = median host<->GPU rate, NIC = median cross-node GPU-GPU rate.
"""

import dataclasses
import statistics
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from perfsim.calibration.kernel_tables_fit import TableRef, table_refs
from perfsim.calibration.readers import KernelPoint, P2pPoint
from perfsim.cost import kernels as costs
from perfsim.errors import ConfigError
from perfsim.lowering.ops import Gemm
from perfsim.lowering.steps import ACT_BYTES
from perfsim.system.hardware import ClusterSpec, GpuSpec
from perfsim.system.kernel_tables import AttentionEfficiency

PRIOR = 1e-3
TILES = ((128, 128), (128, 256), (256, 128), (256, 256))
ROOFLINE_EXPONENTS = (1.0, 2.0, 4.0)  # compute / HBM overlap choices tried beside max (0); the fit picks
K_STEPS_NS = (0.5, 1.0, 2.0)  # serial K-loop time per K element tried beside none (0); the fit picks
ATTN_BYTES_PER_ELEMENT = 2  # bf16 q, k, v, o
# where a host-timed harness's host time per call starts in the fit, as a share of its
# fastest call (the bound): a fit start, not a measurement (below the bound so the fit
# can move it both ways)
HOST_FLOOR_START = 0.9
# a host-timed harness shows a host time per call when at least this many of its calls,
# spanning this much work, read within this share of its fastest call (fit rules, assumed)
HOST_PLATEAU_ROWS = 3
HOST_PLATEAU_SPREAD = 0.10
HOST_PLATEAU_WORK = 2.0


@dataclass(frozen=True, kw_only=True)
class TableFit:
    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    mape_before: float
    mape_after: float
    num_points: int
    note: str = ""
    host_floors: dict = dataclasses.field(default_factory=dict)  # host-timed harness -> host time per call (s)
    # attention: head dims its rows do not measure, written from a reference table alone (the prior,
    # ``TableRef.prior``; or the pooled table a library table is filled from, validation/accuracy_kernels.py)
    prior_only: tuple[float, ...] = ()


def attention_bytes(p: KernelPoint) -> float:
    return p.batch * p.seq * (2 * p.heads + 2 * p.kv_heads) * p.head_dim * ATTN_BYTES_PER_ELEMENT


def _cast_time(p: KernelPoint, gpu: GpuSpec) -> float:
    """FP8 casts a measured FP8 GEMM included (``kernel`` column): ``cast`` = both BF16
    inputs forward, the output gradient backward, each a current-scaling cast (amax, then
    cast-transpose); ``cast_a`` = the activation only, pre-quantized weights, as vLLM's
    "incl. act quant": its dynamic per-token quantization, one kernel per call
    (``costs.fp8_rowwise_cast_time``)."""
    if p.kernel not in ("cast", "cast_a"):
        return 0.0
    groups = p.batch if p.kind == "grouped_gemm" else 1
    if p.kernel == "cast_a":
        return costs.fp8_rowwise_cast_time(groups * p.m * p.k, gpu)
    return sum(costs.fp8_cast_time(groups * p.m * p.n, gpu) if backward
               else costs.fp8_cast_time(groups * p.m * p.k, gpu) + costs.fp8_cast_time(groups * p.k * p.n, gpu)
               for backward in p.gemm_passes)


def _moe_mlp_time(p: KernelPoint, gpu: GpuSpec) -> float:
    """A MoE MLP forward timed whole (``kernel = moe_mlp``: ``batch`` experts with ``m``
    tokens each, hidden ``k``, expert width ``n``, gated), priced as the steps perfsim's
    MoE layer lowers it to (``lowering.layers.moe_forward`` without the dispatch): the
    permute of the routed tokens, the gate_up grouped GEMM, the SwiGLU (unfused, as eager
    PyTorch runs it: silu written and read back), the down grouped GEMM, the unpermute."""
    routed, hidden, width = p.m * p.batch, p.k, p.n
    groups = (p.m,) * p.batch
    permutes = 2 * costs.elementwise_time(2 * routed * hidden * ACT_BYTES, gpu)
    act = costs.elementwise_time(routed * 3 * width * ACT_BYTES, gpu) + costs.elementwise_time(2 * routed * width * ACT_BYTES, gpu)
    gemms = (costs.grouped_gemm_time(groups, 2 * width, hidden, gpu, p.dtype)
             + costs.grouped_gemm_time(groups, hidden, width, gpu, p.dtype))
    return permutes + gemms + act


def _sum_loss_time(p: KernelPoint, gpu: GpuSpec) -> float:
    """``kernel = sum_loss``: the op timed as a training step on its own with
    ``output.sum()`` as the loss: one pass reading the output (the sum) and one writing its
    gradient (the expanded ones made contiguous before the backward GEMMs)."""
    if p.kernel != "sum_loss":
        return 0.0
    out = p.batch * p.m * p.n * ACT_BYTES
    return 2 * costs.elementwise_time(out, gpu)


def _gemm_time(p: KernelPoint, gpu: GpuSpec, backward: bool) -> float:
    if p.kind == "gemm":
        if backward:
            return costs.gemm_backward_time(Gemm(m=p.m, n=p.n, k=p.k), gpu, p.dtype) * p.batch
        return costs.gemm_time(Gemm(m=p.m, n=p.n, k=p.k, batch=p.batch), gpu, p.dtype)
    return costs.grouped_gemm_time((p.m,) * p.batch, p.n, p.k, gpu, p.dtype, backward=backward)


def predict_kernel(p: KernelPoint, gpu: GpuSpec) -> float:
    """Seconds perfsim predicts for one measured kernel call (a GEMM row's ``direction``:
    fwd, bwd = dgrad + wgrad, fwd_bwd = both timed together)."""
    if p.kind == "grouped_gemm" and p.kernel == "moe_mlp":
        return _moe_mlp_time(p, gpu)
    if p.kind in ("gemm", "grouped_gemm"):
        return sum(_gemm_time(p, gpu, backward) for backward in p.gemm_passes) + _cast_time(p, gpu) + _sum_loss_time(p, gpu)
    if p.kind == "memory":
        return costs.elementwise_time(p.bytes, gpu)
    fwd = dataclasses.replace(p, direction="fwd").flops
    moved = attention_bytes(p)
    shape = {"seq": p.seq, "head_dim": p.head_dim, "causal": p.causal}
    t_fwd = costs.attention_time(fwd, moved, gpu, backward=False, **shape)
    t_bwd = costs.attention_time(2.5 * fwd, 2 * moved, gpu, backward=True, **shape)
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


def harness(p: KernelPoint) -> tuple:
    """One host-timed harness: a series timing one op (kind, dtype, direction, what it
    includes); its host time per call is one number."""
    return p.series or p.source, p.kind, p.dtype, p.direction, p.kernel


def host_floors(points: list[KernelPoint]) -> dict[tuple, float]:
    """The host-timed harnesses among ``points`` that show a host time, with its bound (the
    host time per call is at most the fastest call the harness timed). A harness shows one
    when its fastest calls read about the same time whatever their work: at least
    ``HOST_PLATEAU_ROWS`` calls within ``HOST_PLATEAU_SPREAD`` of the fastest, spanning
    ``HOST_PLATEAU_WORK`` x in work. A harness without that plateau is priced at its GPU
    time (a host time free to sit under any lone fast row would absorb the table's misfit)."""
    series: dict[tuple, list[KernelPoint]] = {}
    for p in points:
        if p.timing == "host":
            series.setdefault(harness(p), []).append(p)
    floors = {}
    for key, rows in series.items():
        fastest = min(p.time_s for p in rows)
        flat = [p.work for p in rows if p.time_s <= fastest * (1 + HOST_PLATEAU_SPREAD)]
        if len(flat) >= HOST_PLATEAU_ROWS and max(flat) >= HOST_PLATEAU_WORK * min(flat):
            floors[key] = fastest
    return floors


# the GpuSpec fields that hold fitted kernel tables: what GPUs of one die share (their peak,
# clock under load and HBM stay their own)
TABLE_FIELDS = ("gemm", "gemm_dtypes", "grouped_gemm", "attention", "membound", "attention_libraries",
                "grouped_libraries")


def with_tables(spec: GpuSpec, tables_of: GpuSpec) -> GpuSpec:
    """GPU ``spec`` carrying ``tables_of``'s kernel tables."""
    return dataclasses.replace(spec, **{f: getattr(tables_of, f) for f in TABLE_FIELDS})


def _specs(gpu: GpuSpec, siblings: dict[str, GpuSpec] | None) -> dict[str, GpuSpec]:
    """device name -> the spec a row measured on it is priced on: a same-die GPU (``siblings``,
    keyed by the rows' device) with ``gpu``'s tables."""
    return {name: with_tables(spec, gpu) for name, spec in (siblings or {}).items()}


def timed(p: KernelPoint, gpu: GpuSpec, floors: dict[tuple, float] | None = None,
          specs: dict[str, GpuSpec] | None = None) -> float:
    """The time ``p``'s harness reads for perfsim's kernel time: a host-timed call takes the
    longer of its GPU time and its harness's host time per call (``floors``, fitted beside
    the table; none known: the GPU time). A row of a same-die GPU in ``specs`` is priced on
    that GPU's spec."""
    device = predict_kernel(p, (specs or {}).get(p.device, gpu))
    return max(device, (floors or {}).get(harness(p), 0.0)) if p.timing == "host" else device


def mape(points: list[KernelPoint], gpu: GpuSpec, floors: dict[tuple, float] | None = None,
         siblings: dict[str, GpuSpec] | None = None) -> float:
    specs = _specs(gpu, siblings)
    return 100 * float(np.mean([abs(timed(p, gpu, floors, specs) / p.time_s - 1) for p in points]))


# ---- efficiency tables ---------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    gpu: GpuSpec
    mape: float
    floors: dict  # host-timed harness -> fitted host time per call (s)


def fit_table(points: list[KernelPoint], gpu: GpuSpec, ref: TableRef, knots: tuple[float, ...] | None = None,
              siblings: dict[str, GpuSpec] | None = None, **extra) -> Trial:
    """``gpu`` with table ``ref`` refit to ``points`` (and ``extra`` fields such as tiles), the
    MAPE after, and the host time per call of each host-timed harness, fitted with the
    table (bounded by the harness's fastest call) so that the table prices the kernel and
    not the harness: a host-timed row is priced as ``timed``."""
    xs = knots or (ref.knots(points) if ref.parametric else ref.xs(gpu))
    lo, hi = ref.bounds(len(xs))
    y0 = np.clip(ref.initial(gpu, xs), lo, hi)
    bound = host_floors(points)
    keys = sorted(bound)
    top = np.array([bound[h] for h in keys]) * 1e6  # microseconds: the fit's scale
    f0 = HOST_FLOOR_START * top
    measured = np.array([p.time_s for p in points])

    def split(x):
        return x[:len(y0)], dict(zip(keys, x[len(y0):] * 1e-6))

    def residuals(x):
        ys, floors = split(x)
        trial = ref.apply(gpu, xs, ys, **extra)
        specs = _specs(trial, siblings)
        rel = np.array([timed(p, trial, floors, specs) for p in points]) / measured - 1
        return np.concatenate([rel, PRIOR * (ys - y0) / np.where(np.abs(y0) > 1e-6, np.abs(y0), 1.0)])

    fit = least_squares(residuals, np.concatenate([y0, f0]), bounds=(np.concatenate([lo, 0 * top]), np.concatenate([hi, top])),
                        loss="soft_l1", f_scale=0.05)
    ys, floors = split(fit.x)
    best = ref.apply(gpu, xs, np.round(ys, 5), **extra, **({"round_values": True} if ref.parametric else {}))
    return Trial(best, mape(points, best, floors, siblings), floors)


def host_note(floors: dict[tuple, float], points: list[KernelPoint], gpu: GpuSpec) -> str:
    """What the fit read as host time: per host-timed harness, its host time per call and
    how many of its rows that time, not the GPU's, sets."""
    parts = []
    for key, floor in sorted(floors.items()):
        rows = [p for p in points if p.timing == "host" and harness(p) == key]
        host = sum(predict_kernel(p, gpu) < floor for p in rows)
        parts.append(f"{key[0]} {key[3] or key[1]}: {floor * 1e6:.0f} us, sets {host} of {len(rows)} rows" if host
                     else f"{key[0]} {key[3] or key[1]}: GPU-bound, no row at its host time")
    return "host-timed series priced as the longer of the GPU time and a host time per call fitted per series (" + "; ".join(parts) + ")"


def log_knots(values: list[float], per_decade: float = 2.0, max_knots: int = 12) -> tuple[float, ...]:
    """Log-spaced knots spanning ``values`` (about ``per_decade`` per decade)."""
    lo, hi = np.log10(min(values)), np.log10(max(values))
    if hi <= lo:
        return (float(f"{min(values):.4g}"),)
    n = min(max_knots, max(2, int(np.ceil((hi - lo) * per_decade)) + 1))
    return tuple(float(f"{x:.4g}") for x in np.logspace(lo, hi, n))


def gemm_knots(points: list[KernelPoint], per_decade: int = 1) -> tuple[float, ...]:
    """Regenerated x points: ``per_decade`` log-spaced knots spanning the measured GFLOPs."""
    return log_knots([p.flops / costs.GFLOP for p in points if p.kind in ("gemm", "grouped_gemm")], per_decade)


def fit_kernels(points: list[KernelPoint], gpu: GpuSpec, regenerate_gemm: bool = False,
                siblings: dict[str, GpuSpec] | None = None,
                attention_prior: AttentionEfficiency | None = None) -> tuple[GpuSpec, list[TableFit]]:
    """Refit every table that has points; GEMM also chooses its tile among ``TILES``.
    ``siblings``: GPUs of the same die (keyed by the rows' device) whose rows are among
    ``points``: each such row is priced on its own GPU's spec with the tables being fitted.
    ``attention_prior``: a table whose shape the attention fit starts from and is weakly held
    to (``TableRef.prior``), else the fixed starts."""
    fits = []
    for ref in table_refs(points, attention_prior):
        mine = [p for p in points if ref.selects(p)]
        before = mape(mine, gpu, siblings=siblings)
        knots = ref.knots(mine) if (regenerate_gemm or ref.new_table(gpu)) else None
        if ref.kind == "gemm":  # the tile (at the plain roofline), then the roofline exponent
            # every trial sets each choice it does not make to a fixed start (no K-loop bound until
            # its step is chosen): none inherits the table it replaces, so a refit, and a held-out
            # fold started from a profile fitted to every family, depends on its rows alone
            trials = [fit_table(mine, gpu, ref, knots, siblings, tile_m=tm, tile_n=tn, roofline_exponent=0.0,
                                k_step_ns=0.0) for tm, tn in TILES]
            table = ref.get(min(trials, key=lambda t: t.mape).gpu)
            tile = {"tile_m": table.tile_m, "tile_n": table.tile_n}
            trials += [fit_table(mine, gpu, ref, knots, siblings, **tile, roofline_exponent=p, k_step_ns=0.0)
                       for p in ROOFLINE_EXPONENTS]
            table = ref.get(min(trials, key=lambda t: t.mape).gpu)
            shape = {**tile, "roofline_exponent": table.roofline_exponent}
            trials += [fit_table(mine, gpu, ref, knots, siblings, **shape, k_step_ns=s) for s in K_STEPS_NS]
            best = min(trials, key=lambda t: t.mape)
            table = ref.get(best.gpu)
            note = (f"tile {table.tile_m}x{table.tile_n} chosen among {len(TILES)}, roofline exponent "
                    f"{table.roofline_exponent:g} among 0 (max), {', '.join(f'{p:g}' for p in ROOFLINE_EXPONENTS)}, "
                    f"K-loop step {table.k_step_ns:g} ns among 0, {', '.join(f'{s:g}' for s in K_STEPS_NS)}")
        else:
            best, note = fit_table(mine, gpu, ref, knots, siblings), ""
        gpu, after = best.gpu, best.mape
        if best.floors:
            note = "; ".join(x for x in (note, host_note(best.floors, mine, gpu)) if x)
        if ref.kind == "grouped_gemm" and not any(True in p.gemm_passes for p in mine):
            gpu, derived = derive_backward(gpu, ref.dtype)
            note = "; ".join(x for x in (note, derived) if x)
        prior_only = tuple(d for d in gpu.attention.head_dim if d not in ref.head_dims) if ref.kind == "attention" else ()
        fits.append(TableFit(name=ref.name, xs=ref.xs(gpu), ys=ref.ys(gpu), mape_before=before, mape_after=after,
                             num_points=len(mine), note=note, host_floors=best.floors, prior_only=prior_only))
    if any(f.name == "attention" for f in fits) and gpu.attention_libraries:
        # the profile's per-library attention tables were fitted to other measurements than
        # these: dropped, so a stack naming a library prices attention at the table just fitted
        gpu = dataclasses.replace(gpu, attention_libraries={})
    if any(f.name.startswith("grouped_gemm") for f in fits) and gpu.grouped_libraries:
        # likewise the per-library grouped tables: a stack naming one prices at the user's fit
        gpu = dataclasses.replace(gpu, grouped_libraries={})
    return gpu, fits


def derive_backward(gpu: GpuSpec, dtype: str) -> tuple[GpuSpec, str]:
    """A grouped table fitted to forward rows only: its backward (dgrad + wgrad) speed is
    its forward speed times the BF16 grouped table's backward / forward ratio at the same
    tokens per expert (the same kernel family's measured backward penalty, which the fit
    could not see); with no BF16 grouped table to read it from, the forward itself."""
    table, ref = gpu.grouped_gemm[dtype], gpu.grouped_gemm.get("bf16")
    if ref is None or dtype == "bf16":
        back, how = table.forward_speed, "backward = forward (no backward rows, no bf16 grouped table: assumed)"
    else:
        back = tuple(float(f"{f * costs.interp_log(t, ref.tokens, ref.backward_speed) / costs.interp_log(t, ref.tokens, ref.forward_speed):.5g}")
                     for t, f in zip(table.tokens, table.forward_speed))
        how = "backward derived: no backward rows; forward x the bf16 grouped table's backward/forward ratio"
    tables = {**gpu.grouped_gemm, dtype: dataclasses.replace(table, backward_speed=back)}
    return dataclasses.replace(gpu, grouped_gemm=tables), how


def restamp(gpu: GpuSpec, name: str, stamp) -> GpuSpec:
    """``gpu`` with the ``source`` of table ``name`` (a ``TableFit.name``) passed through ``stamp``."""
    kind, _, dtype = name.partition("/")
    if kind in ("hbm", "membound", "attention"):
        spec = getattr(gpu, kind)
        return dataclasses.replace(gpu, **{kind: dataclasses.replace(spec, source=stamp(spec.source))})
    if kind == "gemm" and dtype == "bf16":
        return dataclasses.replace(gpu, gemm=dataclasses.replace(gpu.gemm, source=stamp(gpu.gemm.source)))
    field = "gemm_dtypes" if kind == "gemm" else "grouped_gemm"
    tables = dict(getattr(gpu, field))
    tables[dtype] = dataclasses.replace(tables[dtype], source=stamp(tables[dtype].source))
    return dataclasses.replace(gpu, **{field: tables})


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
