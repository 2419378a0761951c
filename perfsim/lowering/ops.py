"""The op vocabulary of a per-rank program: compute, collective and point-to-point ops."""

from dataclasses import dataclass, field
from enum import StrEnum


class OpKind(StrEnum):
    GEMM = "gemm"
    GROUPED_GEMM = "grouped_gemm"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    OPTIMIZER = "optimizer"
    COLLECTIVE = "collective"
    P2P = "p2p"


class Stream(StrEnum):
    COMPUTE = "compute"
    TP_COMM = "tp_comm"
    EP_COMM = "ep_comm"
    CP_COMM = "cp_comm"
    DP_COMM = "dp_comm"  # gradient reduction (all-reduce / reduce-scatter)
    DP_GATHER = "dp_gather"  # ZeRO parameter all-gathers: their own queue (FSDP2, Megatron-Core)
    PP_COMM = "pp_comm"


class Coll(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


COMM_KINDS = (OpKind.COLLECTIVE, OpKind.P2P)


@dataclass(frozen=True, kw_only=True)
class Gemm:
    """[m, k] @ [k, n] repeated ``batch`` times (a grouped GEMM lists its groups' m)."""

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True, kw_only=True)
class CollectiveCall:
    coll: Coll
    group: str  # communicator kind: tp, cp, dp, dp_cp, pp, ep, etp, edp
    size_bytes: float  # rccl-tests convention: the per-rank buffer size
    # MoE dispatch/combine: bytes of one token copy (0: a BF16 hidden vector); FP8 dispatch
    # sends hidden x (1 + 4/128) bytes (FP8 values, one FP32 scale per 128)
    token_bytes: float = 0.0
    # MoE dispatch/combine under a blocked routing (RoutingSpec.topk_block): a dispatch
    # implementation's token reaches the ranks of one block of experts (cost.dispatch)
    blocked: bool = False


@dataclass(kw_only=True)
class Op:
    """One node of the op graph. ``duration_s`` is filled by the cost model."""

    op_id: int
    stage: int
    name: str
    kind: OpKind
    stream: Stream
    category: str
    deps: tuple[int, ...] = ()
    flops: float = 0.0
    bytes: float = 0.0
    gemm: Gemm | None = None
    grouped: tuple[int, ...] = ()
    collective: CollectiveCall | None = None
    microbatch: int = -1
    layer: int = -1
    phase: str = ""
    duration_s: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS
