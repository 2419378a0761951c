"""Software-stack profiles: what the training framework adds to the hardware's time.

A stack profile (``hardware_profiles/stacks/*.toml``) holds the few stack-dependent,
physically meaningful parameters -- host gaps between kernels, a per-layer framework
overhead, host syncs per MoE layer, the MoE dispatch path, which kernels are fused,
the overlap policy and the FP8 recipe's extra cast traffic. Every table carries its
``source`` (``assumed`` where no public number exists). ``ideal`` adds nothing: it is
perfsim's behaviour without a stack. Lowering (``lowering.layers``) turns a stack into
steps, so the engine and the closed form price the same thing.
"""

import dataclasses
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from perfsim.errors import ConfigError
import tomli_w

from perfsim.system.specio import check_int, from_dict, read_toml, resolve_profile, to_dict, write_atomic

STACK_DIR = Path(__file__).resolve().parents[1] / "hardware_profiles" / "stacks"
FUSIBLE = ("rmsnorm", "swiglu", "rope", "loss")  # kernels a stack may run fused (one HBM pass)
# how ZeRO-3 (FSDP) holds its weights through a step (``[overlap] zero3_gather``, the plan's
# ``zero3_gather``): "per-pass" gathers each layer's weights before every forward and every
# backward pass of every microbatch and frees them after (FSDP2's default, reshard_after_forward
# and reshard_after_backward True; MaxText); "once" gathers them once before the step's first
# forward and keeps weights and gradients unsharded until the last backward, which
# reduce-scatters the gradients (PyTorch pipelining's FSDP path: set_reshard_after_backward /
# set_requires_gradient_sync False until the last microbatch; MaxText pipeline_fsdp_ag_once);
# "pipeline" is "once" with pipeline parallelism and "per-pass" without (torchtitan's
# fsdp_reshard_after_forward "default" policy)
ZERO3_GATHERS = ("per-pass", "once", "pipeline")


class Dispatch(StrEnum):
    DROPLESS = "dropless"  # experts compute only the tokens routed to them (grouped GEMM)
    CAPACITY = "capacity"  # with a capacity factor, experts compute their full capacity, padded (dense
    # dispatch); without one (0), dropless
    ROUTING = "routing"  # whatever the RoutingSpec says (ideal: perfsim's default)


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """Host-side time the framework adds on the compute stream."""

    kernel_gap_us: float = 0.0  # per compute kernel, beyond the GPU profile's launch cost
    layer_overhead_us: float = 0.0  # per layer pass (forward, backward, recompute)
    source: str = "assumed"

    def __post_init__(self):
        _non_negative("launch", kernel_gap_us=self.kernel_gap_us, layer_overhead_us=self.layer_overhead_us)


@dataclass(frozen=True, kw_only=True)
class MoeCosts:
    dispatch: Dispatch = Dispatch.ROUTING
    host_syncs_per_layer: int = 0  # device->host syncs per MoE layer pass (token counts to the host)
    host_sync_us: float = 0.0  # one sync: drain the queue, copy, resume launching
    # speed of the routed-expert kernels (permute, expert GEMMs and activation) relative to
    # the tuned grouped GEMM the GPU's tables hold, on the padded (capacity) path and on
    # the dropless path: how the framework implements each path (einsum over dispatch
    # masks, ragged dot, megablox) is a stack property
    padded_speed: float = 1.0
    dropless_speed: float = 1.0
    # the capacity path's dispatch and combine as einsums over one-hot [token, expert,
    # capacity slot] masks (MaxText dense_matmul): dense GEMMs whose size grows with the
    # sequence times top-k times the capacity factor, in place of the permute kernels
    mask_einsum: bool = False
    source: str = "assumed"

    def __post_init__(self):
        object.__setattr__(self, "dispatch", _enum(Dispatch, self.dispatch, "moe.dispatch"))
        _boolean("moe", mask_einsum=self.mask_einsum)
        for key in ("padded_speed", "dropless_speed"):
            value = getattr(self, key)
            _non_negative("moe", **{key: value})
            if not value > 0:
                raise ConfigError(f"stack.moe.{key} must be > 0, got {value!r}")
        if isinstance(self.host_syncs_per_layer, bool) or not isinstance(self.host_syncs_per_layer, int) \
                or self.host_syncs_per_layer < 0:
            raise ConfigError(f"stack.moe.host_syncs_per_layer must be an integer >= 0, got {self.host_syncs_per_layer!r}")
        _non_negative("moe", host_sync_us=self.host_sync_us)


@dataclass(frozen=True, kw_only=True)
class Fusion:
    fused: tuple[str, ...] = FUSIBLE  # the kernels the stack runs fused; the rest cost extra HBM passes
    source: str = "assumed"

    def __post_init__(self):
        object.__setattr__(self, "fused", tuple(self.fused))
        for name in self.fused:
            if name not in FUSIBLE:
                raise ConfigError(f"stack.fusion.fused: {name!r} is not one of {', '.join(FUSIBLE)}")


@dataclass(frozen=True, kw_only=True)
class OverlapPolicy:
    """The stack's defaults for the plan's overlap knobs; unset leaves perfsim's default."""

    tp_comm: bool | None = None
    grad_reduce: bool | None = None
    param_gather: bool | None = None  # ZeRO/FSDP parameter gathers prefetched behind compute
    zero3_gather: str | None = None  # ZERO3_GATHERS; unset: per-pass
    # the share of an overlapped TP collective's bytes its implementation hides behind the
    # GEMM it feeds or drains (plan.tp_comm_overlap); the rest runs exposed on the chain.
    # 1: full concurrency (Megatron-Core's userbuffers as priced); a decomposed all-gather /
    # reduce-scatter (torchtitan's Async TP) hides less
    tp_comm_share: float = 1.0
    # whether the stack's TP overlap also pipelines the backward's reduce-scatter of an input
    # gradient summed over several matmuls: the gradient into Q/K/V when the model code runs
    # wq, wk, wv as separate matmuls, and into the gated MLP's w1 / w3. true: Megatron-Core's
    # userbuffers (one fused QKV / FC1 GEMM, its dgrad reduce-scatter overlapped); false:
    # PyTorch's micro-pipeline TP fuses a reduce-scatter only with the one matmul producing it,
    # so the reduce-scatter of that sum stays blocking
    tp_summed_dgrad: bool = True
    # the plan's ep_comm_overlap unless set (Megatron-Core's combined 1F1B: an MoE layer's
    # expert-parallel all-to-alls beside another microbatch's compute)
    ep_comm: bool | None = None
    # the share of an overlapped all-to-all's bytes hidden that way; the rest runs exposed
    ep_comm_share: float = 1.0
    source: str = "assumed"

    def __post_init__(self):
        _boolean("overlap", **{k: v for k in ("tp_comm", "grad_reduce", "param_gather", "tp_summed_dgrad", "ep_comm")
                               if (v := getattr(self, k)) is not None})
        for key in ("tp_comm_share", "ep_comm_share"):
            share = getattr(self, key)
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
                raise ConfigError(f"stack.overlap.{key} must be in [0, 1], got {share!r}")
        if self.zero3_gather is not None and self.zero3_gather not in ZERO3_GATHERS:
            raise ConfigError(f"stack.overlap.zero3_gather: {self.zero3_gather!r} is not one of {', '.join(ZERO3_GATHERS)}")


@dataclass(frozen=True, kw_only=True)
class Fp8Recipe:
    cast_bytes_factor: float = 1.0  # HBM traffic of the recipe's casts relative to current scaling
    # the FP8 copy of each weight made once per step and reused by the step's microbatches
    # (Transformer Engine is_first_microbatch); false: every microbatch casts the weights again
    weights_cast_once: bool = False
    # the norm in front of a GEMM writes that GEMM's FP8 input itself (Transformer Engine
    # LayerNormLinear: norm + quantize in one kernel), so its input takes no cast pass
    norm_fused_cast: bool = False
    # the amax pass of a current-scaling cast of an activation or an output gradient runs
    # inside the kernel that produced the tensor (a compiler fusing the abs-max reduction into
    # its producer), so only weights take a separate amax pass
    amax_fused: bool = False
    # delayed scaling (Transformer Engine DelayedScaling, Megatron-LM's default --fp8-recipe):
    # the scale comes from the amax history of earlier steps and the cast kernel records the
    # tensor's amax as it casts, so no amax pass reads the tensor first; false: current
    # (per-tensor dynamic) scaling, an amax pass before every cast
    delayed_scaling: bool = False
    # dgrad and wgrad GEMMs with a split (full-precision) accumulator, the forward GEMM with
    # the fast one (Transformer Engine's _2X_ACC_DGRAD / _2X_ACC_WGRAD, torchao's and XLA's
    # FP8 backward): priced at the GPU's ``fp8_split_accumulator_speed``; false: every FP8
    # GEMM at the table's (fast-accumulation) speed
    backward_split_accumulator: bool = False
    # the tensors an FP8 GEMM keeps for its backward are its FP8 inputs (1 B a value; the
    # activation input of each linear layer, quantized for the forward GEMM, kept in the one
    # layout its wgrad reads: Transformer Engine Linear / LayerNormLinear / GroupedLinear
    # save the quantized input); false: the layer inputs are kept in BF16
    saves_fp8_inputs: bool = False
    # FP8 primary weights by default under dtype fp8 (the plan's ``fp8_params`` unless the user
    # sets it: NeMo's FP8 recipes set Megatron's fp8_param_gather); None: the plan's default (off)
    primary_weights: bool | None = None
    # the grouped expert GEMMs take per-expert token counts in multiples of this under FP8:
    # the routed tokens are copied into a padded buffer before the first GEMM and the output
    # copied back after the last, forward and backward (Megatron-Core TEGroupedMLP:
    # fp8_padding / fp8_unpadding, Transformer Engine Fp8Padding / Fp8Unpadding); a copy only
    # where a count is not a multiple already (dropless routing's counts are data-dependent;
    # a padded capacity may be aligned). 0: the kernels take any split, no copy
    grouped_pad_align: int = 0
    source: str = "assumed"

    def __post_init__(self):
        if self.primary_weights is not None:
            _boolean("fp8", primary_weights=self.primary_weights)
        check_int("fp8.grouped_pad_align", self.grouped_pad_align, lo=0)
        _non_negative("fp8", cast_bytes_factor=self.cast_bytes_factor)
        _boolean("fp8", weights_cast_once=self.weights_cast_once, norm_fused_cast=self.norm_fused_cast,
                 amax_fused=self.amax_fused,
                 delayed_scaling=self.delayed_scaling, backward_split_accumulator=self.backward_split_accumulator,
                 saves_fp8_inputs=self.saves_fp8_inputs)


VENDOR_SPEEDS = {"amd": "speed_amd", "nvidia": "speed_nvidia"}  # GpuSpec.vendor -> KernelQuality field
VENDOR_ATTENTION = {"amd": "attention_amd", "nvidia": "attention_nvidia"}  # ... and its attention library
VENDOR_GROUPED = {"amd": "grouped_amd", "nvidia": "grouped_nvidia"}  # ... and its grouped expert GEMM library


def speed_param(vendor: str) -> str:
    """The stack parameter a GPU vendor's kernels run at: its own speed where perfsim
    knows the vendor (``VENDOR_SPEEDS``), else the stack's ``kernels.speed``."""
    return f"kernels.{VENDOR_SPEEDS[vendor]}" if vendor in VENDOR_SPEEDS else "kernels.speed"


@dataclass(frozen=True, kw_only=True)
class KernelQuality:
    """Speed of the stack's compute kernels relative to the tuned libraries the GPU's
    kernel tables were fitted on (compiler-generated or untuned kernels run slower)."""

    speed: float = 1.0
    # the speed on one GPU vendor's kernel libraries (cuBLAS / cuDNN / Transformer Engine
    # CUDA against hipBLASLt / CK / AITER / Transformer Engine ROCm), where set: a stack
    # runs different kernels on each, so a speed measured on one says nothing of the other
    speed_amd: float | None = None
    speed_nvidia: float | None = None
    # the flash-attention kernel library the stack runs on each GPU vendor (a GPU profile's
    # ``attention_libraries`` key, e.g. aiter_v3); "" or a library the GPU has no table for:
    # the GPU's pooled attention table. ``attention``: the one in force (``StackSpec.on_vendor``)
    attention: str = ""
    attention_amd: str = ""
    attention_nvidia: str = ""
    # the grouped (MoE expert) GEMM library likewise (a GPU profile's ``grouped_libraries``
    # key, e.g. torch_grouped_mm); "" or one the GPU has no table for: its grouped_gemm tables
    grouped: str = ""
    grouped_amd: str = ""
    grouped_nvidia: str = ""
    source: str = "assumed"

    def __post_init__(self):
        for key in ("attention", *VENDOR_ATTENTION.values(), "grouped", *VENDOR_GROUPED.values()):
            value = getattr(self, key)
            if not isinstance(value, str) or (value and not re.fullmatch(r"[a-z0-9_]+", value)):
                raise ConfigError(f"stack.kernels.{key} must be a kernel library name such as aiter_v3, got {value!r}")
        for key in ("speed", *VENDOR_SPEEDS.values()):
            value = getattr(self, key)
            if value is None and key != "speed":
                continue
            _non_negative("kernels", **{key: value})
            if not value > 0:
                raise ConfigError(f"stack.kernels.{key} must be > 0, got {value!r}")

    def on(self, vendor: str) -> float:
        """The speed on ``vendor``'s GPUs: its own where the profile sets one, else ``speed``."""
        own = getattr(self, VENDOR_SPEEDS[vendor]) if vendor in VENDOR_SPEEDS else None
        return self.speed if own is None else own


@dataclass(frozen=True, kw_only=True)
class InputPipeline:
    """Host time a run on real data spends in the input pipeline (read, tokenize, pack,
    shard the batch) that the step does not hide: seconds per million tokens of the step's
    global batch per GPU (a host feeding g GPUs loads g times that share). A run on
    synthetic data (``plan.real_data`` false) pays none."""

    host_s_per_mtoken: float = 0.0
    source: str = "assumed"

    def __post_init__(self):
        _non_negative("data", host_s_per_mtoken=self.host_s_per_mtoken)


# the activation-recompute settings a framework can offer (perfsim.plan.parallel.Recompute,
# and "block": full recompute of the first N layers of each pipeline chunk, plan.recompute_layers)
RECOMPUTE_LEVELS = ("none", "selective", "op", "block", "full")


@dataclass(frozen=True, kw_only=True)
class RecomputeLadder:
    """The activation-recompute settings the stack's framework offers, lightest first: what
    ``recompute='auto'`` walks (the first that fits; full when none does) and ``perfsim
    search`` tries. Megatron-LM offers selective recompute and full recompute of N layers
    per chunk (block); torchtitan per-op selective checkpointing; MaxText one remat policy
    for every layer."""

    auto: tuple[str, ...] = ("none", "selective", "block", "full")
    source: str = "assumed"

    def __post_init__(self):
        if isinstance(self.auto, str) or not isinstance(self.auto, list | tuple) or not self.auto:
            raise ConfigError(f"stack.recompute.auto must be a list of {', '.join(RECOMPUTE_LEVELS)}, got {self.auto!r}")
        object.__setattr__(self, "auto", tuple(self.auto))
        for level in self.auto:
            if level not in RECOMPUTE_LEVELS:
                raise ConfigError(f"stack.recompute.auto: {level!r} is not one of {', '.join(RECOMPUTE_LEVELS)}")
        if len(set(self.auto)) != len(self.auto) or self.auto[-1] != "full":
            raise ConfigError(f"stack.recompute.auto must list each setting once, lightest first, ending with full, "
                              f"got {list(self.auto)!r}")

    def levels(self) -> tuple[str, ...]:
        """The plan recompute values among them (block is full recompute of fewer layers)."""
        return tuple(level for level in self.auto if level != "block")


# the stack parameters ``perfsim calibrate --runs`` can fit (perfsim.design.runs_fit.BOUNDS holds
# their ranges; a test keeps the two lists equal)
FREE_PARAMETERS = ("kernels.speed", "kernels.speed_amd", "kernels.speed_nvidia", "launch.layer_overhead_us",
                   "launch.kernel_gap_us", "moe.host_sync_us", "moe.padded_speed", "moe.dropless_speed",
                   "data.host_s_per_mtoken", "overlap.tp_comm_share", "overlap.ep_comm_share")


@dataclass(frozen=True, kw_only=True)
class CalibrationProtocol:
    """The free parameters ``perfsim calibrate --runs`` fits to this stack's runs when no
    ``--fit`` is given (of them, those the runs identify: ``runs_fit.protocol_params``), and
    which its leave-one-source-out folds refit: the protocol the shipped values were fitted
    by, so that refitting the shipped runs gives the shipped profile back. Empty: every
    parameter the runs identify (``runs_fit.params_for``)."""

    fit: tuple[str, ...] = ()
    source: str = "assumed: every free parameter the runs identify"

    def __post_init__(self):
        if isinstance(self.fit, str) or not isinstance(self.fit, list | tuple):
            raise ConfigError(f"stack.calibration.fit must be a list of parameter names, got {self.fit!r}")
        object.__setattr__(self, "fit", tuple(self.fit))
        for name in self.fit:
            if name not in FREE_PARAMETERS:
                raise ConfigError(f"stack.calibration.fit: {name!r} is not a free stack parameter "
                                  f"(one of {', '.join(FREE_PARAMETERS)})")
        if len(set(self.fit)) != len(self.fit):
            raise ConfigError(f"stack.calibration.fit names a parameter twice: {list(self.fit)!r}")


@dataclass(frozen=True, kw_only=True)
class MemoryPolicy:
    """What the framework keeps per parameter and per logit, and how its allocator packs
    transient buffers; unset leaves perfsim's default (``lowering.memory``: BF16 weights,
    FP32 main gradients, FP32 master + Adam moments, FP32 logits and their gradient, a
    caching allocator's fragmentation)."""

    weight_bytes: float | None = None  # per parameter, the weights the step computes from (sharded as the plan says)
    grad_bytes: float | None = None  # per parameter, the gradients accumulated
    optimizer_bytes: float | None = None  # per parameter: master copy (if any) + optimizer moments
    logit_bytes: float | None = None  # per logit held at the loss (logits kept + their gradient)
    fragmentation: float | None = None  # share of transient bytes lost to allocator fragmentation
    # a recomputed layer's backward holds the tensors its rerun saves, beside what the layer
    # stored (PyTorch's activation checkpointing); False where the framework's compiler
    # schedules that rerun to fit the device (XLA's rematerialization pass)
    recompute_working_set: bool = True
    # ZeRO-3 whose sharded parameters are the optimizer's FP32 master (PyTorch FSDP2 under a
    # MixedPrecisionPolicy): no compute-precision shard is kept beside them, the compute copy
    # exists only gathered (the ZeRO working buffers, or the whole step where the weights stay
    # gathered); False: a compute-precision shard beside the master (Megatron-style)
    sharded_master: bool = False
    # the step's gradients take memory of their own through the step (Megatron-Core's DDP grad
    # buffer, allocated with the model; FSDP2's sharded gradients, written by its reduce-scatter
    # stream, whose allocations PyTorch's caching allocator keeps apart from the blocks the
    # compute stream frees); False where they are temporaries of one compiled step (XLA's buffer assignment:
    # the backward writes each layer's gradient as it frees the activations that layer kept,
    # so a step of one microbatch, with no accumulation buffer, peaks at the larger of the two)
    gradient_buffer: bool = True
    # weighting the routed tokens by the router's probabilities keeps a hidden-width copy of
    # each routed token for the probabilities' gradient (the experts' output where the combine
    # weighs them, MaxText's unpermute; their input where the dispatch does); False where the
    # activation weighs them (Megatron-Core's weighted SwiGLU), which keeps only what the
    # activation's backward reads anyway (the up projection's output)
    routed_probs_copy: bool = True
    # under tensor parallelism the column-parallel linears keep the input their all-gather wrote
    # (the whole sequence, in the dtype the gather carries) for the weight gradient: PyTorch
    # DTensor's ColwiseParallel behind torchtitan's PrepareModuleInput; False where they keep the
    # sequence-parallel shard and gather it again in the backward (Megatron-Core / Transformer Engine)
    tp_gathered_inputs: bool = False
    source: str = "assumed"

    def __post_init__(self):
        for key in ("weight_bytes", "grad_bytes", "optimizer_bytes", "logit_bytes", "fragmentation"):
            value = getattr(self, key)
            if value is not None:
                _non_negative("memory", **{key: value})
        for key in ("recompute_working_set", "sharded_master", "gradient_buffer", "routed_probs_copy",
                    "tp_gathered_inputs"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"stack.memory.{key} must be true or false, got {getattr(self, key)!r}")
        if self.fragmentation is not None and self.fragmentation >= 1:
            raise ConfigError(f"stack.memory.fragmentation must be below 1, got {self.fragmentation!r}")


@dataclass(frozen=True, kw_only=True)
class StackSpec:
    name: str = "ideal"
    description: str = "no framework cost: perfsim's hardware-only step"
    source: str = "assumed"
    launch: HostCosts = field(default_factory=HostCosts)
    moe: MoeCosts = field(default_factory=MoeCosts)
    fusion: Fusion = field(default_factory=Fusion)
    overlap: OverlapPolicy = field(default_factory=OverlapPolicy)
    fp8: Fp8Recipe = field(default_factory=Fp8Recipe)
    kernels: KernelQuality = field(default_factory=KernelQuality)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    data: InputPipeline = field(default_factory=InputPipeline)
    recompute: RecomputeLadder = field(default_factory=RecomputeLadder)
    calibration: CalibrationProtocol = field(default_factory=CalibrationProtocol)

    def fused(self, kernel: str) -> bool:
        return kernel in self.fusion.fused

    def plan_defaults(self, dtype: str = "bf16") -> dict:
        """Plan knobs the stack sets unless the user sets them (for a plan of ``dtype``: the FP8
        primary weights only under fp8)."""
        pairs = (("tp_comm_overlap", self.overlap.tp_comm), ("ep_comm_overlap", self.overlap.ep_comm),
                 ("overlap_grad_reduce", self.overlap.grad_reduce),
                 ("overlap_param_gather", self.overlap.param_gather),
                 ("fp8_params", self.fp8.primary_weights if dtype == "fp8" else None))
        return {k: v for k, v in pairs if v is not None}

    def on_vendor(self, vendor: str) -> "StackSpec":
        """The profile as it runs on ``vendor``'s GPUs: ``kernels.speed`` set to that
        vendor's speed (``KernelQuality.on``) and ``kernels.attention`` to its attention
        library, where the profile sets them; where the plan meets the cluster."""
        speed = self.kernels.on(vendor)
        library = getattr(self.kernels, VENDOR_ATTENTION[vendor]) if vendor in VENDOR_ATTENTION else ""
        library = library or self.kernels.attention
        grouped = getattr(self.kernels, VENDOR_GROUPED[vendor]) if vendor in VENDOR_GROUPED else ""
        grouped = grouped or self.kernels.grouped
        if speed == self.kernels.speed and library == self.kernels.attention and grouped == self.kernels.grouped:
            return self
        return self.with_values(**{"kernels.speed": speed, "kernels.attention": library, "kernels.grouped": grouped})

    def with_values(self, **values: float) -> "StackSpec":
        """A copy with ``table.key`` values replaced (calibration), e.g. ``{"launch.layer_overhead_us": 40}``."""
        tables: dict[str, dict] = {}
        for dotted, value in values.items():
            table, _, key = dotted.partition(".")
            tables.setdefault(table, {})[key] = value
        try:
            parts = {t: dataclasses.replace(getattr(self, t), **kv) for t, kv in tables.items()}
        except (AttributeError, TypeError) as exc:
            raise ConfigError(f"stack: cannot set {sorted(values)} ({exc})") from None
        return dataclasses.replace(self, **parts)



def _non_negative(table: str, **values: float) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ConfigError(f"stack.{table}.{key} must be a number >= 0, got {value!r}")


def _boolean(table: str, **values) -> None:
    for key, value in values.items():
        if not isinstance(value, bool):
            raise ConfigError(f"stack.{table}.{key} must be true or false, got {value!r}")


def _enum(cls: type, value, key: str):
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(f"stack.{key}: {value!r} is not one of {', '.join(m.value for m in cls)}") from None


IDEAL = StackSpec()  # the default: adds nothing (hardware_profiles/stacks/ideal.toml holds the same values)


STACK_TABLES = ("launch", "moe", "fusion", "overlap", "fp8", "kernels", "memory", "data", "recompute")


def stack_provenance(spec: StackSpec) -> list[tuple[str, str, str]]:
    """(table, 'assumed' | 'fitted' | 'sourced', source) per table of a stack profile: assumed
    where its source says so first, fitted where it says perfsim calibrate --runs fitted a value
    of it, else sourced (read from a framework's code, docs or a measurement its source names);
    last, the calibration protocol (what calibrate --runs frees by default)."""
    rows = []
    for table in STACK_TABLES:
        source = getattr(spec, table).source
        low = source.strip().lower()
        status = ("assumed" if low.startswith("assumed") else
                  "fitted" if "fitted" in low and "perfsim calibrate --runs" in low else "sourced")
        rows.append((table, status, source))
    protocol = spec.calibration  # what calibrate --runs frees: a choice, not a value
    freed = ", ".join(protocol.fit) or "every parameter the runs identify"
    status = "assumed" if protocol.source.strip().lower().startswith("assumed") else "sourced"
    rows.append(("calibration", status, f"fit: {freed}; {protocol.source}"))
    return rows


def list_stacks() -> list[str]:
    return sorted(p.stem for p in STACK_DIR.glob("*.toml"))


def load_stack(name_or_path: "str | Path | StackSpec") -> StackSpec:
    """A stack profile by name (``maxtext``) or path; strict about keys and values."""
    if isinstance(name_or_path, StackSpec):
        return name_or_path
    if not isinstance(name_or_path, str | Path):
        raise ConfigError(f"stack: expected a profile name or path, got {name_or_path!r}")
    path = resolve_profile("stack", name_or_path, STACK_DIR)
    key = str(path.resolve())
    cached = _LOADED.get(key)
    if cached is not None and cached[0] == _stamps(cached[1]):  # neither the file nor a base rewritten
        return cached[2]
    try:
        path.stat()
    except OSError as exc:
        raise ConfigError(f"stack: cannot read {str(path)!r} ({exc.strerror})") from None
    files: list[Path] = []
    spec = from_dict(StackSpec, _merged_toml(path, files=files), key)
    if len(_LOADED) >= MAX_LOADED:
        _LOADED.clear()
    _LOADED[key] = (_stamps(files), tuple(files), spec)
    return spec


def stack_base(name_or_path: str | Path) -> str | None:
    """The profile a stack profile names as its ``base`` (None where it stands alone)."""
    base = read_toml(resolve_profile("stack", name_or_path, STACK_DIR)).get("base")
    return base if isinstance(base, str) else None


MAX_LOADED = 64  # stack profiles kept loaded
_LOADED: dict[str, tuple] = {}  # resolved path -> (its and its bases' mtimes, those files, the spec)


def _stamps(files) -> tuple:
    try:
        return tuple(f.stat().st_mtime_ns for f in files)
    except OSError:
        return ()


MAX_BASES = 4  # a chain of based-on profiles deeper than this is a loop or a mistake


def _merged_toml(path: Path, seen: tuple[str, ...] = (), files: list | None = None) -> dict:
    """A stack profile's TOML with its ``base`` (another profile: a shipped name, or a path
    relative to this file) filled in underneath: each of this file's tables overrides the
    base's key by key (its ``source`` then describes this file's values), top-level keys
    replace the base's. One version family of a stack differs from another in a few values
    (``nemo-25.11`` from ``nemo``), which the derived file alone holds."""
    data = read_toml(path)
    if files is not None:  # the files read, for the loaded-profile cache to check
        files.append(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base must be a stack profile name or path, got {base!r}")
    if len(seen) >= MAX_BASES or str(path.resolve()) in seen:
        raise ConfigError(f"{path}: base profiles loop or nest deeper than {MAX_BASES}: {' -> '.join((*seen, base))}")
    relative = path.parent / base
    try:
        base_path = resolve_profile("stack", relative if relative.suffix == ".toml" and relative.is_file() else base,
                                    STACK_DIR)
    except ConfigError as exc:
        raise ConfigError(f"{path}: base {base!r}: {exc}") from None
    merged = _merged_toml(base_path, (*seen, str(path.resolve())), files)
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def dump_stack(spec: StackSpec) -> str:
    """TOML text of ``spec`` (unset overlap keys left out); loads back equal."""
    data = to_dict(spec)
    for table in ("overlap", "memory", "kernels"):
        data[table] = {k: v for k, v in data[table].items() if v is not None and v != ""}
    return tomli_w.dumps(data)


def write_stack(spec: StackSpec, path: str | Path, overwrite: bool = False) -> Path:
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"--out: {str(path)!r} exists (pass --force to replace it)")
    return write_atomic(path, dump_stack(spec), "--out")
