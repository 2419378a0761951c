"""Kernel efficiency tables of a GPU profile (``[gemm]``, ``[gemm_dtypes.*]``,
``[grouped_gemm.*]``, ``[attention]``, ``[hbm]``): what fraction of the roofline a
kernel reaches as a function of its shape. Each table carries its ``source`` (a
measurement it was fitted to, or the word ``assumed``); ``cost.kernels`` reads them.

Tables are piecewise linear in log10(x), clamped at both ends.
"""

from dataclasses import dataclass
from typing import ClassVar

from perfsim.errors import ConfigError
from perfsim.system.specio import check_fraction, check_positive

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def check_table(owner: str, xs: tuple, ys: tuple, x_name: str, y_name: str, fraction: bool = True) -> None:
    if len(xs) != len(ys) or len(xs) < 1:
        raise ConfigError(f"{owner}: {x_name}/{y_name} lengths differ ({len(xs)} vs {len(ys)}) or are empty")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ConfigError(f"{owner}.{x_name}: x values must increase, got {list(xs)}")
    for y in ys:
        if fraction:
            check_fraction(owner, **{y_name: y})
        else:
            check_positive(owner, **{y_name: y})


def is_assumed(source: str) -> bool:
    """A table whose source starts with 'assumed' or 'derived' is not fitted to its own GPU."""
    return source.strip().lower().startswith(("assumed", "derived"))


@dataclass(frozen=True, kw_only=True)
class GemmEfficiency:
    """Achieved fraction of the clock-scaled dense peak vs GEMM size (GFLOP), for one input
    dtype; tile and wave quantization are applied on top (``tile_m`` x ``tile_n`` is the
    library's largest macro tile; it may halve either side for a better fit). Bytes are
    counted with ``output_dtype`` for the written result ("" = the input dtype).
    ``roofline_exponent`` p joins compute time c and HBM time m as (c^p + m^p)^(1/p): 1 =
    operand streaming and MFMA work do not overlap, large = they overlap fully; 0 = the
    plain roofline max(c, m). ``k_step_ns``: serial time per element of K along one output
    tile's K loop; a call takes at least (waves of tiles) x K x k_step (a skinny GEMM whose
    few tiles each stream a long K is bound by that loop, not by HBM or MFMA throughput;
    0 = no such bound). Fitted with the table (same ``source``)."""

    source: str
    tile_m: int
    tile_n: int
    gflop: tuple[float, ...]
    efficiency: tuple[float, ...]
    output_dtype: str = ""
    roofline_exponent: float = 0.0
    k_step_ns: float = 0.0

    def __post_init__(self):
        check_positive("gemm", tile_m=self.tile_m, tile_n=self.tile_n)
        if not self.roofline_exponent == 0.0 and not self.roofline_exponent >= 1.0:
            raise ConfigError(f"gemm.roofline_exponent: must be 0 (max) or >= 1, got {self.roofline_exponent}")
        if not self.k_step_ns >= 0.0:
            raise ConfigError(f"gemm.k_step_ns: must be >= 0, got {self.k_step_ns}")
        check_table("gemm", self.gflop, self.efficiency, "gflop", "efficiency")
        if self.output_dtype and self.output_dtype not in DTYPE_BYTES:
            raise ConfigError(f"gemm.output_dtype: unknown dtype {self.output_dtype!r} (known: {', '.join(DTYPE_BYTES)})")


@dataclass(frozen=True, kw_only=True)
class GroupedGemmEfficiency:
    """A grouped (MoE expert) GEMM kernel's compute speed against perfsim's dense GEMM
    table's price of the same launch (``costs.launch_time``: every expert's tile-padded
    GEMM in one launch, the size fall-off at the launch's work, the K loop, HBM), vs the
    mean tokens routed to one active expert, forward and backward (dgrad and wgrad
    launches): 1 = as fast as the dense table prices it, below 1 slower."""

    # keys of the grouped tables perfsim wrote before they were speeds against the dense price
    RETIRED_KEYS: ClassVar[dict[str, str]] = dict.fromkeys(
        ("forward_efficiency", "backward_efficiency"),
        ": grouped tables no longer hold a fraction of peak but the grouped kernel's speed against the dense "
        "GEMM table's price of the same launch (forward_speed / backward_speed); refit it with perfsim calibrate "
        "--gemm-csv, or drop the table to price the experts at the dense table")

    source: str
    tokens: tuple[float, ...]
    forward_speed: tuple[float, ...]
    backward_speed: tuple[float, ...]

    def __post_init__(self):
        check_table("grouped_gemm", self.tokens, self.forward_speed, "tokens", "forward_speed", fraction=False)
        check_table("grouped_gemm", self.tokens, self.backward_speed, "tokens", "backward_speed", fraction=False)


@dataclass(frozen=True, kw_only=True)
class AttentionEfficiency:
    """Flash-attention achieved fraction of the clock-scaled BF16 peak vs sequence length,
    forward and backward; times a head-dim factor (vs ``head_dim``) and a causal factor
    (causal kernels skip masked tiles but lose some efficiency at the diagonal)."""

    source: str
    seq: tuple[float, ...]
    forward_efficiency: tuple[float, ...]
    backward_efficiency: tuple[float, ...]
    head_dim: tuple[float, ...] = (128.0,)
    head_dim_factor: tuple[float, ...] = (1.0,)
    causal_forward_factor: float = 1.0
    causal_backward_factor: float = 1.0

    def __post_init__(self):
        check_table("attention", self.seq, self.forward_efficiency, "seq", "forward_efficiency")
        check_table("attention", self.seq, self.backward_efficiency, "seq", "backward_efficiency")
        check_table("attention", self.head_dim, self.head_dim_factor, "head_dim", "head_dim_factor", fraction=False)
        check_positive("attention", causal_forward_factor=self.causal_forward_factor,
                       causal_backward_factor=self.causal_backward_factor)


@dataclass(frozen=True, kw_only=True)
class HbmEfficiency:
    """Achieved fraction of peak HBM bandwidth vs bytes moved by one kernel."""

    label: ClassVar[str] = "hbm"  # the profile table errors name
    source: str
    mbytes: tuple[float, ...]
    efficiency: tuple[float, ...]

    def __post_init__(self):
        check_table(self.label, self.mbytes, self.efficiency, "mbytes", "efficiency")


@dataclass(frozen=True, kw_only=True)
class MemboundEfficiency(HbmEfficiency):
    """The same curve for memory-bound compute kernels (norms, casts, activations):
    ``[membound]``, beside the streaming copy's ``[hbm]``."""

    label: ClassVar[str] = "membound"


def table_provenance(gpu) -> list[tuple[str, str, str]]:
    """(table, 'measured' | 'derived' | 'assumed', source) for every kernel table of a ``GpuSpec``."""
    tables = [("gemm.bf16", gpu.gemm), *((f"gemm.{d}", t) for d, t in sorted(gpu.gemm_dtypes.items())),
              *((f"grouped_gemm.{d}", t) for d, t in sorted(gpu.grouped_gemm.items())),
              ("attention", gpu.attention),
              *((f"attention.{lib}", t) for lib, t in sorted(gpu.attention_libraries.items())),
              *((f"grouped_gemm.{lib}", t) for lib, t in sorted(gpu.grouped_libraries.items())),
              ("hbm", gpu.hbm)]
    rows = [(name, _status(t.source), t.source) for name, t in tables]
    if gpu.membound is not None:
        rows.append(("membound", _status(gpu.membound.source), gpu.membound.source))
    else:  # cost.kernels.membound_time's fallback
        rows.append(("membound", "assumed", "no memory-bound kernel table fitted for this GPU: norms, casts and other "
                     "elementwise kernels run at the hbm (streaming copy) table's bandwidth"))
    if not gpu.grouped_gemm:  # cost.kernels.grouped_gemm_time's fallback, said rather than left out
        rows.append(("grouped_gemm", "assumed", "no grouped-kernel table fitted for this GPU: the experts' GEMMs "
                     "are priced as one launch at the dense gemm table (grouped kernel speed 1)"))
    return rows + [("clock_under_load", _status(gpu.clock_source), f"{gpu.clock_under_load_MHz} MHz: {gpu.clock_source}"),
                   ("kernel_launch", _status(gpu.kernel_launch_source), f"{gpu.kernel_launch_us} us: {gpu.kernel_launch_source}"),
                   ("fp8_split_accumulator", _status(gpu.fp8_split_accumulator_source),
                    f"speed {gpu.fp8_split_accumulator_speed}: {gpu.fp8_split_accumulator_source}"),
                   ("hbm_capacity", _status(gpu.hbm_capacity_source),
                    f"{gpu.hbm_bytes / 1e9:.2f} GB usable ({gpu.hbm_capacity_GB:g} GiB less {gpu.hbm_reserved_MiB:g} MiB): "
                    f"{gpu.hbm_capacity_source}")]


def _status(source: str) -> str:
    word = source.strip().lower()
    return "derived" if word.startswith("derived") else "assumed" if word.startswith("assumed") else "measured"
