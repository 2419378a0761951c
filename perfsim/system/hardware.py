"""Hardware specs (GPU, node, fabric, collective tuning, cluster) and strict profile loading.

Specs mirror the profile files key for key (units in key names, e.g. ``hbm_bw_GBps``);
SI values come from properties (``hbm_Bps``) that convert through ``units``.
"""

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import tomli_w

from perfsim import units
from perfsim.errors import ConfigError
from perfsim.system.kernel_tables import (AttentionEfficiency, GemmEfficiency, GroupedGemmEfficiency,  # noqa: F401
                                          HbmEfficiency, MemboundEfficiency)
from perfsim.system.specio import (check_finite_output, check_fraction, check_positive, from_dict, read_toml,
                                    resolve_profile, to_dict, write_atomic)

MAX_NODES = 1 << 20  # input bound: a million nodes, far past any cluster built
MAX_GPUS_PER_NODE = 576  # input bound: the largest scale-up domain announced (NVL576)
PROFILE_DIR = Path(__file__).resolve().parents[1] / "hardware_profiles"  # inside the package: wheels carry it
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


class IntraTopology(StrEnum):
    FULL_MESH = "full_mesh"  # MI300X: 7 xGMI links per GPU, one per peer
    SWITCH = "switch"  # NVSwitch: every GPU reaches every peer at full injection bandwidth


class FabricTopology(StrEnum):
    RAILS_ONLY = "rails_only"
    RAIL_OPTIMIZED = "rail_optimized"
    FAT_TREE = "fat_tree"


class Routing(StrEnum):
    SPRAY = "spray"  # packet spraying (UEC / Pollara): load spread evenly over equal paths
    ECMP_HASH = "ecmp_hash"  # one path per flow by hash: flows can collide


class Multipath(StrEnum):
    """What the NIC does with one flow: keep it on one path (in-order RoCE), or split it
    over ``multipath_paths`` entropy values and accept out-of-order delivery (UEC /
    Pollara multipath), which hashes as that many independent sub-flows."""

    SINGLE = "single"
    OUT_OF_ORDER = "out_of_order"


def _check_table(owner: str, xs: tuple, ys: tuple, x_name: str, y_name: str) -> None:
    if len(xs) != len(ys) or len(xs) < 1:
        raise ConfigError(f"{owner}: {x_name}/{y_name} lengths differ ({len(xs)} vs {len(ys)}) or are empty")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ConfigError(f"{owner}.{x_name}: x values must increase, got {list(xs)}")
    for y in ys:
        check_fraction(owner, **{y_name: y})


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    vendor: str
    source: str
    num_compute_units: int
    peak_tflops: dict[str, float]
    # the vendor's HBM figure ("80 GB", "192 GB"): DRAM is sized in powers of two, so the figure is
    # binary, GiB (an H100 80GB's five 16 GiB stacks; AMD's GPU specification table, ROCm docs
    # reference/gpu-specs, prints MI300X 192, MI325X 256, MI355X 288 as "VRAM (GiB)")
    hbm_capacity_GB: float
    hbm_bw_GBps: float
    clock_peak_MHz: float
    clock_under_load_MHz: float
    kernel_launch_us: float
    gemm: GemmEfficiency  # the BF16 table (and any dtype without its own)
    attention: AttentionEfficiency
    hbm: HbmEfficiency  # a streaming copy (BabelStream): GEMM / attention rooflines, the optimizer step
    gemm_dtypes: dict[str, GemmEfficiency] = field(default_factory=dict)  # per input dtype: fp8, fp16, ...
    grouped_gemm: dict[str, GroupedGemmEfficiency] = field(default_factory=dict)  # per input dtype
    clock_source: str = "assumed"  # where clock_under_load_MHz comes from
    kernel_launch_source: str = "assumed"  # where kernel_launch_us comes from
    # speed of an FP8 GEMM run with a split (periodically promoted, full-precision)
    # accumulator against the fast-accumulation kernels the FP8 table was fitted on; the
    # FP8 training recipes run dgrad and wgrad that way (``stack.fp8.backward_split_accumulator``).
    # 1: the GPU's FP8 matrix instructions accumulate at full precision already (no fast mode)
    fp8_split_accumulator_speed: float = 1.0
    fp8_split_accumulator_source: str = "assumed"
    # what the driver keeps of the HBM: the capacity a program sees (NVML's / rocm-smi's total)
    # is the binary capacity less this; 0 where no device's total is on record (assumed)
    hbm_reserved_MiB: float = 0.0
    hbm_capacity_source: str = "assumed: the vendor's figure as GiB, nothing reserved by the driver"
    # memory-bound LLM kernels (norms, rotary, activations, casts, router, permutes, loss):
    # achieved fraction of peak HBM bandwidth vs bytes, fitted to measured kernels; None =
    # priced as the streaming copy (``hbm``)
    membound: MemboundEfficiency | None = None
    # flash attention as one kernel library ships it (e.g. ``aiter_v3``: AITER's asm fmha v3
    # kernels, which Transformer Engine ROCm's CK backend runs with NVTE_CK_USES_FWD/BWD_V3),
    # fitted to that library's rows alone; a stack names the library it runs
    # (``[kernels] attention_amd`` / ``attention_nvidia``); any other: the pooled ``attention``
    attention_libraries: dict[str, AttentionEfficiency] = field(default_factory=dict)
    # a 16-bit (BF16 / FP16 input) grouped expert GEMM as one kernel library runs it (e.g.
    # ``torch_grouped_mm``: torch._grouped_mm, CUTLASS grouped GEMM on Hopper, which
    # torchtitan's MoE calls), fitted to that library's rows alone; a stack names the library
    # it runs (``[kernels] grouped_amd`` / ``grouped_nvidia``); any other, and FP8 inputs: the
    # GPU's ``grouped_gemm`` tables
    grouped_libraries: dict[str, GroupedGemmEfficiency] = field(default_factory=dict)

    def __post_init__(self):
        check_positive(
            "gpu",
            num_compute_units=self.num_compute_units,
            hbm_capacity_GB=self.hbm_capacity_GB,
            hbm_bw_GBps=self.hbm_bw_GBps,
            clock_peak_MHz=self.clock_peak_MHz,
            clock_under_load_MHz=self.clock_under_load_MHz,
        )
        if self.kernel_launch_us < 0:
            raise ConfigError(f"gpu.kernel_launch_us must be >= 0, got {self.kernel_launch_us!r}")
        if not 0 <= self.hbm_reserved_MiB < self.hbm_capacity_GB * 1024:
            raise ConfigError("gpu.hbm_reserved_MiB must be >= 0 and below the capacity "
                              f"({self.hbm_capacity_GB * 1024:g} MiB), got {self.hbm_reserved_MiB!r}")
        if not 0 < self.fp8_split_accumulator_speed <= 1:
            raise ConfigError("gpu.fp8_split_accumulator_speed must be in (0, 1] (a split accumulator is never "
                              f"faster than the fast one), got {self.fp8_split_accumulator_speed!r}")
        for dtype, tflops in self.peak_tflops.items():
            if dtype not in DTYPES:
                raise ConfigError(f"gpu.peak_tflops: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
            check_positive("gpu.peak_tflops", **{dtype: tflops})
        if "bf16" not in self.peak_tflops:
            raise ConfigError("gpu.peak_tflops.bf16: missing required key")
        for table, tables in (("gemm_dtypes", self.gemm_dtypes), ("grouped_gemm", self.grouped_gemm)):
            for dtype in tables:
                if dtype not in self.peak_tflops:
                    raise ConfigError(f"gpu.{table}.{dtype}: no peak_tflops.{dtype} to scale it")

    def gemm_table(self, dtype: str) -> GemmEfficiency:
        """The GEMM table for input ``dtype`` (``gemm`` where the profile has none)."""
        return self.gemm_dtypes.get(dtype, self.gemm)

    def attention_table(self, library: str | None = None) -> AttentionEfficiency:
        """The flash-attention table of kernel ``library`` where the profile has one, else
        the pooled table (every library's rows)."""
        return self.attention_libraries.get(library or "", self.attention)

    def grouped_table(self, dtype: str, library: str | None = None) -> GroupedGemmEfficiency | None:
        """The grouped-kernel table for input ``dtype``: kernel ``library``'s own where the
        profile has one and the inputs are 16-bit, else the GPU's (BF16's where ``dtype`` has
        none; None: no grouped table, the experts run at the dense price)."""
        if library and dtype in ("bf16", "fp16") and library in self.grouped_libraries:
            return self.grouped_libraries[library]
        return self.grouped_gemm.get(dtype) or self.grouped_gemm.get("bf16")

    @property
    def clock_ratio(self) -> float:
        """Clock under sustained load / peak clock: what the dense peak is scaled by."""
        return self.clock_under_load_MHz / self.clock_peak_MHz

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise ConfigError(f"dtype: {self.name} has no {dtype!r} peak (has {', '.join(self.peak_tflops)})")
        return units.tflops_to_flops(self.peak_tflops[dtype])

    @property
    def hbm_bytes(self) -> float:
        """Bytes a program can allocate: the vendor's figure as GiB (``hbm_capacity_GB``) less
        what the driver reserves (``hbm_reserved_MiB``)."""
        return self.hbm_capacity_GB * units.GiB - self.hbm_reserved_MiB * units.MiB

    @property
    def hbm_Bps(self) -> float:
        return units.GBps_to_Bps(self.hbm_bw_GBps)

    @property
    def kernel_launch_s(self) -> float:
        return units.us_to_s(self.kernel_launch_us)


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    name: str
    source: str
    gpus_per_node: int
    intra_topology: IntraTopology
    links_per_gpu: int
    link_bw_raw_GBps: float
    link_bw_GBps: float
    link_latency_us: float
    pcie_bw_GBps: float
    # the share of link_bw_GBps a collective reaches on each link when only group_gpus[i] GPUs of
    # the node take part (the collective library runs fewer channels for a smaller group), linear
    # in the GPU count between the points, clamped at both ends; empty: every group at link_bw_GBps
    group_gpus: tuple[int, ...] = ()
    group_link_efficiency: tuple[float, ...] = ()
    group_source: str = ""
    # the NICs of the node a ring (or tree) over group_gpus[i] of its GPUs leaves and enters the
    # node on, as the collective library's debug logs show them (RCCL's rings over two GPUs of an
    # MI355X node all cross on one NIC); a group size not listed, or empty: one NIC per GPU of the
    # group (the rails)
    group_nics: tuple[int, ...] = ()
    group_nics_source: str = ""

    def __post_init__(self):
        if len(self.group_gpus) != len(self.group_link_efficiency):
            raise ConfigError(f"node.group_gpus ({len(self.group_gpus)} values) and node.group_link_efficiency "
                              f"({len(self.group_link_efficiency)}) must have the same length")
        if any(g < 2 for g in self.group_gpus) or list(self.group_gpus) != sorted(set(self.group_gpus)):
            raise ConfigError(f"node.group_gpus must be increasing GPU counts >= 2, got {list(self.group_gpus)!r}")
        for efficiency in self.group_link_efficiency:
            check_fraction("node", group_link_efficiency=efficiency)
        if self.group_nics and len(self.group_nics) != len(self.group_gpus):
            raise ConfigError(f"node.group_nics ({len(self.group_nics)} values) must have one value per group_gpus "
                              f"entry ({len(self.group_gpus)})")
        for gpus, nics in zip(self.group_gpus, self.group_nics):
            if not 1 <= nics <= gpus:
                raise ConfigError(f"node.group_nics must be between 1 and the group's GPU count, got {nics!r} "
                                  f"for {gpus} GPUs")
        check_positive(
            "node",
            gpus_per_node=self.gpus_per_node,
            links_per_gpu=self.links_per_gpu,
            link_bw_GBps=self.link_bw_GBps,
            pcie_bw_GBps=self.pcie_bw_GBps,
        )
        if self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise ConfigError(f"node.gpus_per_node must be <= {MAX_GPUS_PER_NODE}, got {self.gpus_per_node!r}")
        if self.link_bw_GBps > self.link_bw_raw_GBps:
            raise ConfigError(
                f"node.link_bw_GBps ({self.link_bw_GBps}) exceeds link_bw_raw_GBps ({self.link_bw_raw_GBps})"
            )
        if self.link_latency_us < 0:
            raise ConfigError(f"node.link_latency_us must be >= 0, got {self.link_latency_us!r}")

    @property
    def link_Bps(self) -> float:
        return units.GBps_to_Bps(self.link_bw_GBps)

    @property
    def link_latency_s(self) -> float:
        return units.us_to_s(self.link_latency_us)

    def group_link_Bps(self, gpus: int) -> float:
        """Per-link bandwidth a collective over ``gpus`` GPUs of this node reaches (``group_gpus``)."""
        xs, ys = self.group_gpus, self.group_link_efficiency
        if not xs:
            return self.link_Bps
        if gpus <= xs[0]:
            return self.link_Bps * ys[0]
        if gpus >= xs[-1]:
            return self.link_Bps * ys[-1]
        i = next(i for i, x in enumerate(xs) if x >= gpus)
        t = (gpus - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.link_Bps * (ys[i - 1] + t * (ys[i] - ys[i - 1]))

    def ring_nics(self, gpus: int) -> int:
        """NICs a ring over ``gpus`` GPUs of this node crosses the node boundary on (``group_nics``;
        else one per GPU)."""
        return dict(zip(self.group_gpus, self.group_nics)).get(gpus, gpus)

    def gpu_bw_Bps(self, num_peers: int) -> float:
        """Per-direction bandwidth one GPU has to ``num_peers`` peers of its node."""
        if self.intra_topology is IntraTopology.FULL_MESH:
            return min(num_peers, self.links_per_gpu) * self.link_Bps
        return self.links_per_gpu * self.link_Bps


@dataclass(frozen=True, kw_only=True)
class FabricSpec:
    source: str
    topology: FabricTopology
    nics_per_node: int
    nic_bw_Gbps: float
    nic_latency_us: float
    switch_latency_us: float
    nodes_per_leaf: int
    oversubscription: float
    routing: Routing
    # share of NIC line rate a rank's NIC reaches vs its bytes in one phase of a call
    # (log-size interpolation, clamped); empty = 1.0
    message_kbytes: tuple[float, ...] = ()
    message_efficiency: tuple[float, ...] = ()
    message_source: str = ""
    message_rate_Mps: float = 0.0  # NIC messages per second (millions); 0 = no limit
    multipath: Multipath = Multipath.SINGLE
    multipath_paths: int = 1  # entropy values one flow is split over (out_of_order)
    reorder_efficiency: float = 1.0  # share of bandwidth kept when reordering out-of-order packets

    def __post_init__(self):
        check_positive(
            "fabric",
            nics_per_node=self.nics_per_node,
            nic_bw_Gbps=self.nic_bw_Gbps,
            nodes_per_leaf=self.nodes_per_leaf,
            multipath_paths=self.multipath_paths,
        )
        if self.oversubscription < 1:
            raise ConfigError(f"fabric.oversubscription must be >= 1, got {self.oversubscription!r}")
        if self.nic_latency_us < 0 or self.switch_latency_us < 0 or self.message_rate_Mps < 0:
            raise ConfigError("fabric latencies and message_rate_Mps must be >= 0")
        check_fraction("fabric", reorder_efficiency=self.reorder_efficiency)
        if self.message_kbytes or self.message_efficiency:
            _check_table("fabric", self.message_kbytes, self.message_efficiency, "message_kbytes", "message_efficiency")
            if not self.message_source:
                raise ConfigError("fabric.message_source: a message-efficiency table needs its source")

    @property
    def nic_Bps(self) -> float:
        return units.gbps_to_Bps(self.nic_bw_Gbps)

    @property
    def node_Bps(self) -> float:
        return self.nics_per_node * self.nic_Bps


@dataclass(frozen=True, kw_only=True)
class ProtocolSpec:
    """One RCCL-like protocol: used up to ``max_bytes``; achieves a share of link bandwidth."""

    max_bytes: float
    latency_us: float
    bw_efficiency: float
    # the shortest one step of a ring spanning nodes takes under this protocol; None: the
    # collectives table's ring_step_floor_us (one value for every protocol)
    ring_step_floor_us: float | None = None
    # a ring spanning nodes moves its buffer in loops: each rank sends at most
    # ``ring_loop_bytes`` a step (the library's channels x its chunk per channel), and every
    # step of every loop adds ``ring_step_cost_us`` on top of the bytes' time (NCCL's Simple
    # ring on InfiniBand: the network proxy's per-step round trip, paid per chunk; a tree pays
    # it per chunk its busiest NICs move; only calls over every GPU of each node:
    # ``collectives.step_cost_s``); where it is paid it takes the place of the step floor
    # (``ring_step_floor_us``), which still bounds the calls it does not reach; 0: none
    ring_step_cost_us: float = 0.0
    ring_loop_bytes: float = 0.0

    def __post_init__(self):
        check_positive("protocol", max_bytes=self.max_bytes)
        check_fraction("protocol", bw_efficiency=self.bw_efficiency)
        if self.latency_us < 0:
            raise ConfigError(f"protocol.latency_us must be >= 0, got {self.latency_us!r}")
        if self.ring_step_floor_us is not None and not self.ring_step_floor_us >= 0:
            raise ConfigError(f"protocol.ring_step_floor_us must be >= 0, got {self.ring_step_floor_us!r}")
        for key in ("ring_step_cost_us", "ring_loop_bytes"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"protocol.{key} must be >= 0, got {getattr(self, key)!r}")
        if self.ring_step_cost_us > 0 and not self.ring_loop_bytes > 0:
            raise ConfigError(f"protocol.ring_loop_bytes must be > 0 where ring_step_cost_us is set "
                              f"({self.ring_step_cost_us!r}), got {self.ring_loop_bytes!r}")


# collectives a profile may give protocol windows of its own (``CollectiveTuning.protocol_windows``)
WINDOW_COLLECTIVES = ("all_gather", "reduce_scatter", "broadcast", "reduce")


@dataclass(frozen=True, kw_only=True)
class CollectiveTuning:
    """Per-call and per-step latencies of the collective library, and its protocols."""

    source: str
    launch_latency_us: float
    intra_step_latency_us: float
    inter_step_latency_us: float
    direct_min_bytes: float  # one-shot/all-pairs intra-node kernels serve sizes in
    direct_max_bytes: float  # [direct_min_bytes, direct_max_bytes]; 0/0 disables them
    protocols: dict[str, ProtocolSpec]
    # launch mode and graph capture: extra per-call cost of a single-process (-g N)
    # launch, and the per-call cost graph capture removes (0: no measurement, no change)
    single_process_latency_us: float = 0.0
    graph_saving_us: float = 0.0
    # the one-shot window's lower edge under graph capture (RCCL takes the one-shot kernel
    # for smaller calls when captured); None: direct_min_bytes, as without capture
    graph_direct_min_bytes: float | None = None
    # NVLS (NVSwitch multicast/reduce) all-reduce; efficiency 0 = the node has none
    nvls_efficiency: float = 0.0
    nvls_latency_us: float = 0.0
    nvls_min_bytes: float = 0.0  # NCCL picks NVLS from this size up
    # the shortest one step of a ring that spans nodes takes (lock-step pacing: every step
    # waits for its slowest hop); 0 = not identified, steps priced by latency only
    ring_step_floor_us: float = 0.0
    # a protocol's own ring step floor (``ProtocolSpec.ring_step_floor_us``) holds from this
    # call size up, where the library runs its full channel count; below, it shrinks in
    # proportion to the size (fewer channels, each step waits on fewer network posts)
    ring_floor_full_bytes: float = 0.0
    # a network step of the tree algorithm (NCCL's double binary tree: hwLat[NET][TREE]
    # beside the ring's hwLat[NET][RING]); None: ``inter_step_latency_us``, as the ring's
    tree_inter_step_latency_us: float | None = None
    # whether the selector may pick the hierarchical algorithm (intra-node RS, a ring per
    # rail, intra-node AG) for a call it is not told the algorithm of: false where the
    # library's tuner has no such kernel and runs its ring / tree (RCCL); forcing it
    # (``algorithm="hierarchical"``) prices it either way
    hierarchical: bool = True
    # the library's protocol windows per collective where they differ from the all-reduce's
    # (``protocols``' max_bytes): {collective: {protocol: largest size it runs}}, sizes per
    # rank for all_gather / reduce_scatter (the buffer's n chunks: RCCL's llProtoRanges, which
    # a public tuner log shows applied to one rank's share, the profile's source says where);
    # a size above every window runs the protocol with the largest max_bytes
    protocol_windows: dict[str, dict[str, float]] = field(default_factory=dict)
    # a collective's own direct (all-pairs) kernel inside one node where the library has one
    # apart from the all-reduce's one-shot window: {collective: largest size it runs}, from
    # the smallest size up (RCCL's Direct all_gather path inside one MI355X node)
    direct_windows: dict[str, float] = field(default_factory=dict)

    @property
    def tree_inter_step_us(self) -> float:
        """A tree network step's latency (``tree_inter_step_latency_us``, else the ring's)."""
        own = self.tree_inter_step_latency_us
        return self.inter_step_latency_us if own is None else own

    def __post_init__(self):
        if self.tree_inter_step_latency_us is not None and not self.tree_inter_step_latency_us >= 0:
            raise ConfigError(f"collectives.tree_inter_step_latency_us must be >= 0, got {self.tree_inter_step_latency_us!r}")
        for key in ("launch_latency_us", "intra_step_latency_us", "inter_step_latency_us",
                    "direct_min_bytes", "direct_max_bytes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"collectives.{key} must be >= 0, got {getattr(self, key)!r}")
        if self.direct_max_bytes < self.direct_min_bytes:
            raise ConfigError(
                f"collectives.direct_max_bytes ({self.direct_max_bytes}) is below direct_min_bytes ({self.direct_min_bytes})"
            )
        if not self.protocols:
            raise ConfigError("collectives.protocols: at least one protocol is required")
        if self.graph_direct_min_bytes is not None and not 0 <= self.graph_direct_min_bytes <= self.direct_max_bytes:
            raise ConfigError(f"collectives.graph_direct_min_bytes must be in [0, direct_max_bytes="
                              f"{self.direct_max_bytes:g}], got {self.graph_direct_min_bytes!r}")
        for key in ("single_process_latency_us", "graph_saving_us", "nvls_latency_us", "nvls_min_bytes",
                    "ring_step_floor_us", "ring_floor_full_bytes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"collectives.{key} must be >= 0, got {getattr(self, key)!r}")
        if self.nvls_efficiency:
            check_fraction("collectives", nvls_efficiency=self.nvls_efficiency)
        for coll, windows in self.protocol_windows.items():
            if coll not in WINDOW_COLLECTIVES:
                raise ConfigError(f"collectives.protocol_windows: {coll!r} is not one of {', '.join(WINDOW_COLLECTIVES)}")
            for name, top in windows.items():
                if name not in self.protocols:
                    raise ConfigError(f"collectives.protocol_windows.{coll}: {name!r} is not one of the "
                                      f"profile's protocols ({', '.join(self.protocols)})")
                if not top > 0:
                    raise ConfigError(f"collectives.protocol_windows.{coll}.{name} must be > 0, got {top!r}")
        for coll, top in self.direct_windows.items():
            if coll not in WINDOW_COLLECTIVES:
                raise ConfigError(f"collectives.direct_windows: {coll!r} is not one of {', '.join(WINDOW_COLLECTIVES)}")
            if not top > 0:
                raise ConfigError(f"collectives.direct_windows.{coll} must be > 0, got {top!r}")


@dataclass(frozen=True, kw_only=True)
class DispatchSpec:
    """One MoE dispatch/combine implementation (RCCL all-to-all, DeepEP-style, MORI, UCCL-EP):
    the share of NIC and xGMI/NVLink bandwidth it reaches and its per-call latency."""

    source: str
    rdma_efficiency: float
    intra_efficiency: float
    latency_us: float
    dedup_per_node: bool = False  # a token crosses to a remote node once, then is forwarded locally
    # low-latency kernels post one RDMA message per remote token copy, at most this many
    # per second per GPU (millions); 0 = bandwidth-bound kernels (no per-message limit)
    message_rate_Mps: float = 0.0
    copy_per_expert: bool = False  # a token goes once per chosen expert (no merge per rank): low-latency kernels
    # CUs / SMs the dispatch and combine kernels hold while they run (DeepEP's num_sms): compute
    # overlapped with them runs on the rest (0: the kernels hold none, or none identified)
    compute_units: int = 0

    @property
    def gpu_initiated(self) -> bool:
        """Kernels that write from the GPU in fixed-size chunks (a per-node dedup kernel, or a
        low-latency one writing each expert copy): the fabric's per-message ramp, measured on
        library collectives, does not slow them."""
        return self.dedup_per_node or self.copy_per_expert

    def __post_init__(self):
        check_fraction("dispatch", rdma_efficiency=self.rdma_efficiency, intra_efficiency=self.intra_efficiency)
        if self.latency_us < 0 or self.message_rate_Mps < 0:
            raise ConfigError(f"dispatch.latency_us and message_rate_Mps must be >= 0, got {self.latency_us!r}, "
                              f"{self.message_rate_Mps!r}")
        units = self.compute_units
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ConfigError(f"dispatch.compute_units must be a whole number >= 0, got {units!r}")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    description: str
    source: str
    num_nodes: int
    gpu: GpuSpec
    node: NodeSpec
    fabric: FabricSpec
    collectives: CollectiveTuning
    dispatch: dict[str, DispatchSpec] = field(default_factory=dict)  # MoE dispatch/combine implementations
    provenance: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        check_positive("cluster", num_nodes=self.num_nodes)
        if self.num_nodes > MAX_NODES:
            raise ConfigError(f"cluster.num_nodes must be <= {MAX_NODES}, got {self.num_nodes!r}")
        for name, spec in self.dispatch.items():
            if spec.compute_units >= self.gpu.num_compute_units:
                raise ConfigError(f"dispatch.{name}.compute_units must be below the GPU's {self.gpu.num_compute_units} "
                                  f"compute units, got {spec.compute_units!r}")

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    def with_protocol(self, name: str, **fields) -> "ClusterSpec":
        """The cluster with fields of its collective library's protocol ``name`` replaced."""
        tune = self.collectives
        spec = dataclasses.replace(tune.protocols[name], **fields)
        return dataclasses.replace(self, collectives=dataclasses.replace(tune, protocols={**tune.protocols, name: spec}))

    def with_nodes(self, num_nodes: int) -> "ClusterSpec":
        if not isinstance(num_nodes, int) or num_nodes < 1:
            raise ConfigError(f"nodes must be a positive integer, got {num_nodes!r}")
        return dataclasses.replace(self, num_nodes=num_nodes)

    def with_gpus(self, num_gpus: int) -> "ClusterSpec":
        """Smallest cluster of whole nodes holding ``num_gpus`` GPUs (a partial node is allowed)."""
        if not isinstance(num_gpus, int) or num_gpus < 1:
            raise ConfigError(f"gpus must be a positive integer, got {num_gpus!r}")
        return self.with_nodes(-(-num_gpus // self.gpus_per_node))


# ---- loading --------------------------------------------------------------------------


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    return resolve_profile(kind, name_or_path, PROFILE_DIR / f"{kind}s")


def list_profiles(kind: str) -> list[str]:
    """Names of the shipped profiles of ``kind`` ('gpu', 'node', 'cluster')."""
    return sorted(p.stem for p in (PROFILE_DIR / f"{kind}s").glob("*.toml"))


MAX_BASE_DEPTH = 8  # profiles naming a base that names a base ...: a loop or a chain this long is an error


def _merged(base: dict, over: dict) -> dict:
    """``over`` laid on ``base``: a table given in both is merged key by key, any other value replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _near(ref: str, folder: Path | None) -> str:
    """A relative ``.toml`` path inside a profile file is read beside that file (when the file
    is there; else as given, from the working directory)."""
    if folder is not None and ref.endswith(".toml") and not Path(ref).is_absolute() and (folder / ref).is_file():
        return str(folder / ref)
    return ref


def _with_base(kind: str, data: dict, where: str, folder: Path | None, depth: int = 0) -> dict:
    """A profile's table with its ``base`` (a shipped profile's name or a file of the same
    kind) laid under it: a variant names what it changes and inherits the rest, e.g. a
    power-capped GPU (``base = "h100"``, its own clock and HBM) or a cluster with other NICs."""
    if "base" not in data:
        return data
    ref = data["base"]
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{where}: base: expected a {kind} profile name or file, got {ref!r}")
    if depth >= MAX_BASE_DEPTH:
        raise ConfigError(f"{where}: base: more than {MAX_BASE_DEPTH} profiles deep (a loop?)")
    path = _resolve(kind, _near(ref, folder))
    base = _with_base(kind, read_toml(path), str(path), path.parent, depth + 1)
    return _merged(base, {k: v for k, v in data.items() if k != "base"})


def _load_part(kind: str, ref: str | dict, cls: type, where: str, folder: Path | None = None):
    if isinstance(ref, dict):
        return from_dict(cls, _with_base(kind, ref, f"{where}: {kind}", folder), f"{where}: {kind}")
    if not isinstance(ref, str):
        raise ConfigError(f"{where}: {kind} must be a profile name or a table, got {ref!r}")
    path = _resolve(kind, _near(ref, folder))
    return from_dict(cls, _with_base(kind, read_toml(path), str(path), path.parent), str(path))


def load_gpu(name_or_path: str | Path) -> GpuSpec:
    return _load_part("gpu", str(name_or_path), GpuSpec, "gpu")


def _signature(path: Path) -> tuple:
    """What says a profile (and the GPU / node profiles it may name, shipped or beside it:
    a ``base`` or a ``gpu = "file.toml"``) is unchanged."""
    parts = [path]  # first: the key names the file itself
    if path.parent != PROFILE_DIR / "clusters":
        parts += sorted(p for p in path.parent.glob("*.toml") if p != path)
    for kind in ("gpus", "nodes"):
        folder = PROFILE_DIR / kind
        parts += sorted(folder.glob("*.toml")) if folder.is_dir() else []
    out = []
    for p in parts:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


_LOADED: dict[tuple, ClusterSpec] = {}


def load_cluster(name_or_path: str | Path, num_nodes: int | None = None) -> ClusterSpec:
    """Load a cluster profile by name (``mi300x-pollara``) or path; optionally resize it.
    Specs are immutable, so an unchanged file is parsed once and the same object returned
    (the closed form's memo is keyed by it)."""
    if isinstance(name_or_path, ClusterSpec):
        cluster = name_or_path
    else:
        path = _resolve("cluster", name_or_path)
        key = (_signature(path), num_nodes)
        if key not in _LOADED:
            if len(_LOADED) > 64:
                _LOADED.clear()
            _LOADED[key] = _load_cluster_file(path, num_nodes)
        return _LOADED[key]
    return cluster if num_nodes is None else cluster.with_nodes(num_nodes)


def _load_cluster_file(path: Path, num_nodes: int | None) -> ClusterSpec:
    where = str(path)
    data = dict(_with_base("cluster", read_toml(path), where, path.parent))
    for kind, cls in (("gpu", GpuSpec), ("node", NodeSpec)):
        if kind not in data:
            raise ConfigError(f"{where}: {kind}: missing required key")
        data[kind] = to_dict(_load_part(kind, data[kind], cls, where, path.parent))
    cluster = from_dict(ClusterSpec, data, where)
    return cluster if num_nodes is None else cluster.with_nodes(num_nodes)


def dump_cluster(cluster: ClusterSpec) -> str:
    """Self-contained TOML text of ``cluster`` (GPU and node inlined); loads back equal."""
    return tomli_w.dumps(to_dict(cluster))


def write_cluster(cluster: ClusterSpec, path: str | Path, overwrite: bool = False) -> Path:
    """Write atomically; refuse to overwrite an existing file unless told to."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"out: {str(path)!r} exists; pass overwrite (--force) to replace it")
    if path.is_dir():
        raise ConfigError(f"out: {str(path)!r} is a directory; give a file name")
    data = to_dict(cluster)
    check_finite_output(data, "out")  # a NaN or inf profile would not load back
    return write_atomic(path, tomli_w.dumps(data), "out")


def cluster_provenance(cluster: ClusterSpec) -> list[tuple[str, str, str]]:
    """(table, 'measured' | 'fitted' | 'derived' | 'assumed' | 'sourced', source) for every
    table of a cluster profile: the cluster, its node's links, the fabric and its NIC
    ramp, the collective library's tuning, each MoE dispatch implementation."""
    node = cluster.node
    rows = [("cluster", cluster.source), ("node", node.source),
            *((t, s) for t, s in (("node.group", node.group_source), ("node.group_nics", node.group_nics_source)) if s),
            ("fabric", cluster.fabric.source)]
    if cluster.fabric.message_source:
        rows.append(("fabric.message", cluster.fabric.message_source))
    rows.append(("collectives", cluster.collectives.source))
    rows += [(f"dispatch.{name}", spec.source) for name, spec in sorted(cluster.dispatch.items())]
    return [(table, _cluster_status(source), source) for table, source in rows]


def _cluster_status(source: str) -> str:
    """The source's own first word where it names one, else 'fitted' where it says a
    validation script fitted a value, else 'sourced' (read from a named document)."""
    low = source.strip().lower()
    for word in ("assumed", "derived", "measured", "fitted"):
        if low.startswith(word):
            return word
    return "fitted" if "fitted by" in low else "sourced"

