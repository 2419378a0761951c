"""Which GPU-profile table a kernel measurement informs, and how its free values are
read from and written back into a ``GpuSpec`` (used by ``kernel_fit.fit_table``).

One ``TableRef`` per table: ``gemm/<dtype>`` (``gpu.gemm`` for BF16, ``gemm_dtypes``
otherwise), ``grouped_gemm/<dtype>``, ``attention`` (efficiency vs sequence length
forward and backward, a head-dim factor per measured head dim, two causal factors),
``membound`` (memory-bound kernel rows: the GPU's measured norm / rotary / reduction
kernels; the streaming-copy ``hbm`` table stays as the profile gives it).

GEMM, attention and memory-bound curves are fitted in a two-parameter family and written
out as tables on a fixed wide grid (``GRID``), so they extrapolate the way kernels
behave instead of clamping at the edge of the data: eff(x) = plateau * x / (x + x_half),
the shape of a fixed per-call cost (prologue, epilogue, tail wave) beside work that
grows with x. Parameters per curve: plateau and log10(x_half). A grouped-GEMM table is a
speed against the dense GEMM table's price of the same launch (``costs.grouped_speed``),
whose size fall-off is already in that price: one speed per direction, written at the
median measured tokens per expert (flat beyond it), fitted from 1 (the dense price).
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfsim.calibration.readers import KernelPoint
from perfsim.cost import kernels as costs
from perfsim.system.hardware import GpuSpec
from perfsim.system.kernel_tables import AttentionEfficiency, GemmEfficiency, GroupedGemmEfficiency, MemboundEfficiency

EFF_BOUNDS = (0.005, 1.0)
FACTOR_BOUNDS = (0.3, 1.5)  # head-dim and causal factors
FRESH_EFFICIENCY = 0.5  # where a fitted plateau starts (the fit moves it; a fit prior, not a measurement)
FP8_OUTPUT = "bf16"  # FP8 training GEMMs write BF16 (Transformer Engine, Primus-Turbo, aiter a8w8)
# written-out grid of each parametric curve: (log10 lo, log10 hi, knots per decade)
GRID = {"gemm": (-4.0, 6.0, 2), "attention": (2.0, 5.5, 2), "memory": (-2.0, 5.0, 2)}
# a grouped kernel's speed against the dense table's price of the same launch: where a fit
# starts (the dense price itself) and the range it may take (fit bounds, not measurements)
SPEED_START = 1.0
SPEED_BOUNDS = (0.05, 2.0)
PLATEAU_BOUNDS = (0.02, 1.0)
# memory-bound rows below this size time the launch path, not the kernel (AITER's Triton
# rms_norm on MI355X takes 22 us flat from 1.8 to 29 MB: its host launch), and perfsim prices
# the per-kernel launch on its own (kernel_launch_us, the stack's kernel gap); the
# ``membound`` table is fitted to the rows at or above it
MEMORY_FIT_MIN_MBYTES = 64.0
HALF_BOUNDS = {"gemm": (-5.0, 5.0), "attention": (0.0, 6.0), "memory": (-3.0, 4.0)}
# where log10(x_half) starts (and, through the weak prior, stays where no point constrains
# it): 1 GFLOP, 1024 keys, 1 MB -- fit priors, not measurements; a refit does not depend on
# the table it replaces
HALF_START = {"gemm": 0.0, "attention": 3.01, "memory": 0.0}


def in_fit_range(p: KernelPoint) -> bool:
    """Whether a row can inform its table: memory-bound rows of at least
    MEMORY_FIT_MIN_MBYTES; never an inference fused-MoE stage (``kernel = moe_stage``: it
    gathers its tokens by index and scatters them weighted, work a training grouped GEMM
    on permuted tokens does not do; on MI300X such stages run at 0.35-0.65 of the dense
    price at 128+ tokens per expert where Primus-Turbo's grouped GEMM runs at about 0.9);
    never a MoE MLP forward timed whole (``kernel = moe_mlp``): its time holds the
    framework's routing-side work besides the expert GEMMs (VeOmni's torch._grouped_mm
    path: an expert histogram, a stable argsort, an index gather padded per expert, gate
    and up as two grouped GEMMs, a scatter into zeros and a top-k sum), which perfsim prices
    in other ops of its MoE layer or not at all; fitted, the grouped table would carry it
    (the H100 table fitted to those rows priced torch._grouped_mm itself 2.5x slow)."""
    if p.kernel in ("moe_stage", "moe_mlp"):
        return False
    return p.kind != "memory" or p.bytes / costs.MBYTE >= MEMORY_FIT_MIN_MBYTES


def ratio_filled(factors: dict[float, float], reference: AttentionEfficiency) -> dict[float, float]:
    """Head dim -> factor: ``factors`` (the head dims a fit's rows measure), and each head dim only
    ``reference`` has at ``reference``'s ratio to the nearest (in log) of them."""
    out = dict(factors)
    for d in (float(x) for x in reference.head_dim if float(x) not in factors):
        near = min(factors, key=lambda m: abs(np.log(m / d)))
        ratio = (costs.interp_log(d, reference.head_dim, reference.head_dim_factor)
                 / costs.interp_log(near, reference.head_dim, reference.head_dim_factor))
        out[d] = round(float(np.clip(factors[near] * ratio, *FACTOR_BOUNDS)), 5)
    return out


def with_head_dims_of(table: AttentionEfficiency, reference: AttentionEfficiency) -> AttentionEfficiency:
    """``table`` with each head dim only ``reference`` has, at ``reference``'s ratio to the nearest
    head dim ``table`` has (``ratio_filled``); its own head dims and curves as they are."""
    factors = ratio_filled({float(d): float(f) for d, f in zip(table.head_dim, table.head_dim_factor)}, reference)
    dims = tuple(sorted(factors))
    return dataclasses.replace(table, head_dim=dims, head_dim_factor=tuple(factors[d] for d in dims))


def saturating(xs, plateau: float, log_half: float) -> np.ndarray:
    """plateau * x / (x + x_half): a fixed per-call cost beside work growing with x."""
    xs = np.asarray(xs, dtype=float)
    return plateau * xs / (xs + 10.0 ** log_half)


def curve_params(xs, ys) -> tuple[float, float]:
    """(plateau, log10 x_half) of the ``saturating`` curve through an attention table's first
    and last points (a fitted table is that curve written out on a grid; clamped into the
    attention fit's bounds)."""
    (x1, e1), (x2, e2) = (xs[0], ys[0]), (xs[-1], ys[-1])
    slope = e1 / x1 - e2 / x2
    if slope <= 0 or e2 <= e1:  # one point, or flat: no fall-off to read
        return float(np.clip(e2, *PLATEAU_BOUNDS)), HALF_START["attention"]
    half = (e2 - e1) / slope
    plateau = e2 * (x2 + half) / x2
    return (float(np.clip(plateau, *PLATEAU_BOUNDS)),
            float(np.clip(np.log10(half), *HALF_BOUNDS["attention"])))


@dataclass(frozen=True)
class TableRef:
    kind: str  # gemm | grouped_gemm | attention | memory
    dtype: str | None = None
    head_dims: tuple[float, ...] = ()  # attention: the head dims the points measure
    # attention: a sibling GPU's table whose shape (forward and backward curves, head-dim and
    # causal factors) is the fit's start and weak prior instead of the fixed starts, so an
    # axis the points do not measure (no backward rows, no non-causal rows, a head dim) keeps
    # that table's value rather than a generic one (``accuracy_kernels.ATTENTION_FROM``); a head
    # dim only the prior measures is written at the prior's ratio to the nearest measured one
    prior: AttentionEfficiency | None = None
    # attention: (forward, backward) whether the points measure the causal factor of that pass,
    # i.e. hold both causal and non-causal rows of it; with a prior, a factor they do not measure
    # is the prior's (rows of one mode alone confound it with the curve's plateau, which a weak
    # prior would split between the two rather than keep)
    causal_measured: tuple[bool, bool] = (True, True)

    @property
    def name(self) -> str:
        return {"memory": "membound", "attention": "attention"}.get(self.kind, f"{self.kind}/{self.dtype}")

    def selects(self, p: KernelPoint) -> bool:
        return p.kind == self.kind and (self.dtype is None or p.dtype == self.dtype) and in_fit_range(p)

    def get(self, gpu: GpuSpec):
        if self.kind == "gemm":
            return gpu.gemm_table(self.dtype)
        if self.kind == "grouped_gemm":
            return gpu.grouped_gemm.get(self.dtype)
        return gpu.attention if self.kind == "attention" else gpu.membound

    def new_table(self, gpu: GpuSpec) -> bool:
        """The GPU has no table of its own for this (a fresh one gets knots over the data)."""
        if self.kind == "gemm":
            return self.dtype != "bf16" and self.dtype not in gpu.gemm_dtypes
        if self.kind == "attention":
            return tuple(gpu.attention.head_dim) != self.head_dims or len(gpu.attention.seq) < 2
        if self.kind == "memory":
            return gpu.membound is None
        return self.kind == "grouped_gemm" and self.dtype not in gpu.grouped_gemm

    def _fields(self) -> tuple[str, tuple[str, ...]]:
        return {"gemm": ("gflop", ("efficiency",)), "memory": ("mbytes", ("efficiency",)),
                "grouped_gemm": ("tokens", ("forward_speed", "backward_speed")),
                "attention": ("seq", ("forward_efficiency", "backward_efficiency"))}[self.kind]

    def xs(self, gpu: GpuSpec) -> tuple[float, ...]:
        table = self.get(gpu)
        return tuple(getattr(table, self._fields()[0])) if table is not None else (1.0,)

    def ys(self, gpu: GpuSpec) -> tuple[float, ...]:
        return tuple(getattr(self.get(gpu), self._fields()[1][0]))

    @property
    def parametric(self) -> bool:
        return self.kind in GRID

    def knots(self, points: list[KernelPoint]) -> tuple[float, ...]:
        from perfsim.calibration.kernel_fit import log_knots

        if self.parametric:
            lo, hi, per = GRID[self.kind]
            return tuple(float(f"{x:.4g}") for x in np.logspace(lo, hi, int(round((hi - lo) * per)) + 1))
        if self.kind == "grouped_gemm":  # one speed per direction (the dense price carries the size fall-off)
            return (float(f"{np.median([p.m for p in points]):.4g}"),)
        x = {"gemm": lambda p: p.flops / costs.GFLOP, "attention": lambda p: p.seq,
             "memory": lambda p: p.bytes / costs.MBYTE}[self.kind]
        return log_knots([x(p) for p in points], per_decade=3 if self.kind != "gemm" else 2)

    def initial(self, gpu: GpuSpec, xs: tuple) -> np.ndarray:
        table = self.get(gpu)
        x_field, y_fields = self._fields()
        if self.parametric:
            return self._initial_params(table, x_field, y_fields)
        if self.kind == "grouped_gemm":
            # from the fixed start, never the table it replaces: the fit's weak prior pulls toward
            # the start, and where the rows leave a choice open (step-timed rows alone cannot split
            # forward from backward) a start taken from a table fitted to every family would carry
            # the held-out family into its own fold
            return np.full(len(xs) * len(y_fields), SPEED_START)
        if table is None:
            return np.full(len(xs) * len(y_fields), FRESH_EFFICIENCY)
        ys = [[costs.interp_log(x, getattr(table, x_field), getattr(table, f)) for x in xs] for f in y_fields]
        if self.kind == "attention":
            ys.append([costs.interp_log(h, table.head_dim, table.head_dim_factor) for h in self.head_dims])
            ys.append([table.causal_forward_factor, table.causal_backward_factor])
        return np.concatenate(ys)

    def _initial_params(self, table, x_field: str, y_fields: tuple[str, ...]) -> np.ndarray:
        """(plateau, log10 x_half) per curve from fixed starts (``FRESH_EFFICIENCY``,
        ``HALF_START``; attention factors 1): a refit does not depend on the table it
        replaces, so refitting a fitted profile gives it back. An attention ref with a
        ``prior`` starts from (and is weakly held to) that table instead, named by the caller."""
        if self.kind == "attention" and self.prior is not None:
            return self._prior_params()
        params = [v for _ in y_fields for v in (FRESH_EFFICIENCY, HALF_START[self.kind])]
        if self.kind == "attention":
            params += [1.0] * (len(self.head_dims) + 2)
        return np.array(params)

    def _prior_params(self) -> np.ndarray:
        """The prior table's (plateau, log10 x_half) per curve, read back from its written-out
        grid, then its factors at ``head_dims`` and its two causal factors."""
        t = self.prior
        params = []
        for ys in (t.forward_efficiency, t.backward_efficiency):
            params += list(curve_params(t.seq, ys))
        params += [costs.interp_log(h, t.head_dim, t.head_dim_factor) for h in self.head_dims]
        return np.array(params + [t.causal_forward_factor, t.causal_backward_factor])

    def _head_factors(self, fitted: list[float]) -> dict[float, float]:
        """Head dim -> factor: the fitted ones, and each head dim only the prior measures at the
        prior's ratio to the nearest (in log) measured head dim."""
        factors = {float(d): f for d, f in zip(self.head_dims, fitted)}
        return factors if self.prior is None else ratio_filled(factors, self.prior)

    def bounds(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        _, y_fields = self._fields()
        if self.parametric:
            half = HALF_BOUNDS[self.kind]
            lo, hi = [PLATEAU_BOUNDS[0], half[0]] * len(y_fields), [PLATEAU_BOUNDS[1], half[1]] * len(y_fields)
        else:
            y_lo, y_hi = SPEED_BOUNDS if self.kind == "grouped_gemm" else EFF_BOUNDS
            lo, hi = [y_lo] * (n * len(y_fields)), [y_hi] * (n * len(y_fields))
        if self.kind == "attention":
            extra = len(self.head_dims) + 2
            lo, hi = lo + [FACTOR_BOUNDS[0]] * extra, hi + [FACTOR_BOUNDS[1]] * extra
        return np.array(lo), np.array(hi)

    def apply(self, gpu: GpuSpec, xs: tuple, params: np.ndarray, **extra) -> GpuSpec:
        x_field, y_fields = self._fields()
        n = len(xs)
        if self.parametric:
            curves = {f: saturating(xs, *params[2 * i:2 * i + 2]) for i, f in enumerate(y_fields)}
            fmt = (lambda v: float(f"{v:.5g}")) if extra.pop("round_values", False) else float
            values = {f: tuple(fmt(max(v, EFF_BOUNDS[0])) for v in ys) for f, ys in curves.items()}
            used = 2 * len(y_fields)
        else:
            values = {f: tuple(float(v) for v in params[i * n:(i + 1) * n]) for i, f in enumerate(y_fields)}
            used = n * len(y_fields)
        values[x_field] = tuple(float(x) for x in xs)
        if self.kind == "attention":
            rest = params[used:]
            h = len(self.head_dims)
            factors = self._head_factors([float(v) for v in rest[:h]])
            causal = [float(rest[h]), float(rest[h + 1])]
            if self.prior is not None:
                kept = (self.prior.causal_forward_factor, self.prior.causal_backward_factor)
                causal = [c if measured else float(k) for c, measured, k in zip(causal, self.causal_measured, kept)]
            values.update(head_dim=tuple(sorted(factors)), head_dim_factor=tuple(factors[d] for d in sorted(factors)),
                          causal_forward_factor=causal[0], causal_backward_factor=causal[1])
            return dataclasses.replace(gpu, attention=dataclasses.replace(gpu.attention, **values))
        if self.kind == "memory":
            old = gpu.membound
            table = (dataclasses.replace(old, **values) if old is not None else
                     MemboundEfficiency(source="fitted memory-bound kernel table", **values))
            return dataclasses.replace(gpu, membound=table)
        if self.kind == "grouped_gemm":
            old = gpu.grouped_gemm.get(self.dtype)
            table = (dataclasses.replace(old, **values) if old is not None else
                     GroupedGemmEfficiency(source=f"fitted grouped {self.dtype} kernel", **values))
            return dataclasses.replace(gpu, grouped_gemm={**gpu.grouped_gemm, self.dtype: table})
        return self._apply_gemm(gpu, values, extra)

    def _apply_gemm(self, gpu: GpuSpec, values: dict, extra: dict) -> GpuSpec:
        base: GemmEfficiency = gpu.gemm_table(self.dtype)
        out = base.output_dtype or (FP8_OUTPUT if self.dtype == "fp8" else "")
        table = dataclasses.replace(base, output_dtype=out, **values, **extra)
        if self.dtype == "bf16":
            return dataclasses.replace(gpu, gemm=table)
        if self.dtype not in gpu.gemm_dtypes:
            table = dataclasses.replace(table, source=f"fitted {self.dtype} GEMM table (started from the bf16 one)")
        return dataclasses.replace(gpu, gemm_dtypes={**gpu.gemm_dtypes, self.dtype: table})


ORDER = {"memory": 0, "gemm": 1, "grouped_gemm": 2, "attention": 3}  # memory-bound first: FP8 cast rows lean on it


def table_refs(points: list[KernelPoint], attention_prior: AttentionEfficiency | None = None) -> list[TableRef]:
    """The tables ``points`` inform, in ``ORDER`` (a table's points may lean on earlier ones);
    ``attention_prior``: the table the attention fit starts from (its head dims kept too)."""
    refs = set()
    for p in points:
        if p.kind == "attention" or not in_fit_range(p):
            continue
        refs.add(TableRef(p.kind, p.dtype if p.kind in ("gemm", "grouped_gemm") else None))
    heads = tuple(sorted({float(p.head_dim) for p in points if p.kind == "attention"}))
    if heads:
        modes = {(p.direction, bool(p.causal)) for p in points if p.kind == "attention"}
        measured = tuple(all((d, c) in modes for c in (False, True)) for d in ("fwd", "bwd"))
        refs.add(TableRef("attention", None, heads, attention_prior, measured))
    return sorted(refs, key=lambda r: (ORDER[r.kind], r.dtype or ""))


__all__ = ["AttentionEfficiency", "TableRef", "table_refs"]
