"""Parallel plans: validation and rank placement (which groups stay inside a node).

Rank order follows Megatron-Core: tp innermost, then cp, then dp, then pp. Expert
layers regroup the tp*cp*dp ranks of a stage as etp (innermost), ep, then edp.
"""

import dataclasses
import re
from dataclasses import dataclass
from enum import StrEnum

from perfsim.errors import ConfigError
from perfsim.model.spec import AttentionKind, ModelSpec
from perfsim.plan import layout
from perfsim.system.kernel_tables import DTYPE_BYTES
from perfsim.system.stacks import IDEAL, ZERO3_GATHERS, StackSpec, load_stack


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    # torchtitan's per-op selective checkpointing (activation_checkpoint selective_ac_option
    # "op"): the outputs of every other matmul, the attention and the TP reduce-scatters kept,
    # everything else recomputed (perfsim.lowering.layers.recompute_steps); dense layers only
    OP = "op"
    FULL = "full"


# Megatron-Core's --recompute-modules (TransformerConfig.recompute_modules), what selective
# recompute re-runs: the attention core (its default), MLA's up projections with their rope
# (mla_up_proj: q / k / v rebuilt from the kept latents in front of the attention's backward),
# the norms not fused into the linear after them, the expert activation, the shared experts, a
# dense layer's whole MLP, an MoE layer's whole MoE part (router, dispatch, experts, combine);
# lowering.layers.recompute_steps and lowering.memory.layer_activation_bytes price each.
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "shared_experts", "mlp", "moe")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
MOE_RECOMPUTE_MODULES = ("moe_act", "shared_experts", "moe")
# the recompute settings a module list applies under: selective, or auto (which may settle on it)
RECOMPUTE_MODULE_LEVELS = ("selective", "auto")


def split_recompute_modules(text: str) -> tuple[str, ...]:
    """A written module list -> names: Megatron's space-separated form, or commas (the CLI's);
    an empty name where two separators or an end leave one (the plan refuses it)."""
    return tuple(re.split(r"[\s,;+]+", text.strip()))


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"  # zero bubble, backward split into input- and weight-gradient (Qi'23)
    # V-shape (vpp 2: stage s holds virtual stages s and 2pp-1-s), backward split as in ZB-H1,
    # at 1F1B's activation memory, half of it, a third of it (Qi'24 ZB-V; Qi'24 "Pipeline
    # Parallelism with Controllable Memory" V-Half, V-Min; Primus-pipeline zbv / v-half / v-min)
    ZBV = "zbv"
    V_HALF = "v-half"
    V_MIN = "v-min"


V_SHAPES = frozenset({Schedule.ZBV, Schedule.V_HALF, Schedule.V_MIN})
# schedules whose chunks may hold uneven layer counts (first_stage_layers / last_stage_layers
# with vpp > 1: the first and last virtual stages): interleaved 1F1B (Megatron's
# --decoder-first/last-pipeline-num-layers and account_for_embedding/loss_in_pipeline_split
# under a virtual pipeline) and the V shapes
UNEVEN_CHUNKED = V_SHAPES | {Schedule.INTERLEAVED, Schedule.ONE_F_ONE_B}
DTYPES = ("bf16", "fp16", "fp8")
# FP8 scaling recipes a plan may name (plan.fp8_recipe; "" = the stack's [fp8] delayed_scaling):
# "delayed" takes each tensor's scale from the amax history of earlier steps (Transformer
# Engine DelayedScaling, Megatron-LM --fp8-recipe delayed), "current" from the tensor itself,
# an amax pass before each cast (Float8CurrentScaling, --fp8-recipe tensorwise, NVIDIA's "FP8-CS")
FP8_RECIPES = ("delayed", "current")
# plan knobs that need dtype fp8 -> why (the error says it)
FP8_ONLY = {"dispatch_fp8": "FP8 dispatch feeds FP8 expert GEMMs, so it needs",
            "fp8_params": "FP8 primary weights feed FP8 GEMMs, so they need",
            "fp8_recipe": "an FP8 scaling recipe needs"}
# plan.dispatch names that run the collective library's all-to-all (RCCL / NCCL): tokens
# arrive grouped by source rank, so a rank holding several experts regroups them by expert
# (Megatron-Core MoEAlltoAllTokenDispatcher.sort_chunks_by_idxs); the dedicated dispatch
# kernels (deepep, mori) write the expert-major layout themselves
LIBRARY_DISPATCH = ("alltoall", "rccl", "nccl")



def ep_overlap_conflict(plan) -> str:
    """Why the expert-parallel all-to-all overlap cannot run on ``plan`` (its tp, cp, pp,
    vpp, ep, tp_comm_overlap and recompute), '' where it can: Megatron-Core pairs one
    microbatch's forward with another's backward only under virtual pipeline stages (or no
    pipeline) and refuses full recompute beside it, and perfsim overlaps one kind of
    communication per pass, so not beside TP-comm overlap or ring attention. The one rule
    plan validation, the search and the estimators' sample apply."""
    if plan.pp > 1 and plan.vpp == 1:
        return (f"needs virtual pipeline stages (vpp > 1) with pp {plan.pp}: Megatron-Core pairs one microbatch's "
                "forward with another's backward only under the interleaved (or V-shape) schedules")
    if plan.ep > 1 and ((plan.tp_comm_overlap and plan.tp > 1) or plan.cp > 1):
        return (f"with {'tp_comm_overlap' if plan.cp == 1 else 'cp'} (tp {plan.tp}, cp {plan.cp}): perfsim overlaps "
                "one kind of communication per pass; set tp_comm_overlap false (--no-tp-comm-overlap), or cp 1 "
                "(Megatron-Core warns against tensor or context parallelism with this overlap before Blackwell)")
    if plan.ep > 1 and getattr(plan, "recompute", None) == Recompute.FULL:  # a search shape has none yet
        return ("with full recompute: Megatron-Core refuses the two together (\"disable full recomputation when "
                "enabling overlap_moe_expert_parallel_comm\", megatron/training/arguments.py); use recompute none or "
                "selective (recompute auto stops at selective beside the overlap)")
    return ""

@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    zero: int = 1
    mbs: int = 1
    gbs: int
    seq: int
    dtype: str = "bf16"
    recompute: Recompute = Recompute.NONE
    schedule: Schedule = Schedule.ONE_F_ONE_B
    sequence_parallel: bool = True
    overlap_grad_reduce: bool = True
    # ZeRO parameter all-gathers prefetched behind compute (Megatron-Core overlap_param_gather,
    # FSDP2's forward/backward prefetch); False: each layer's gather runs when the layer before
    # it ends and the layer waits for it (ZeRO-3), or after the optimizer step (ZeRO-1/2)
    overlap_param_gather: bool = True
    # Megatron-Core DDP bucket: 40M params of bf16 gradients (ddp bucket_size default)
    grad_bucket_bytes: int = 80_000_000
    # share of compute throughput lost while a comm kernel runs beside it on the same GPU
    # (RCCL kernels occupy CUs; FiCCO); 0 until a GPU profile carries a measured value
    comm_compute_interference: float = 0.0
    dma_offload: bool = False  # comm on SDMA engines: no CU stolen, so no interference
    # Megatron-Core --tp-comm-overlap (userbuffers): a TP all-gather runs beside the GEMM
    # that consumes it and a TP reduce-scatter beside the GEMM that produces it
    tp_comm_overlap: bool = False
    # Megatron-Core --overlap-moe-expert-parallel-comm (Megatron-Bridge moe_a2a_overlap): the
    # combined 1F1B schedule runs one microbatch's forward beside another's backward, so an
    # MoE layer's expert-parallel all-to-alls run beside the other pass's compute
    ep_comm_overlap: bool = False
    # Megatron-Core --moe-shared-expert-overlap: an MoE layer's shared experts run on their own
    # stream beside its dispatch and combine all-to-alls (lowering.layers.overlap_shared_experts)
    shared_expert_overlap: bool = False
    # uneven pipeline stages (Megatron --decoder-first/last-pipeline-num-layers): layers on the
    # first / last stage, the other stages splitting the rest evenly; 0 = an even split
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
    # the embedding (the loss) takes one layer slot of the first (last) virtual stage, the layers
    # and those slots split evenly over pp x vpp, so that stage holds one layer fewer (none where
    # each holds one). Not beside first_stage_layers / last_stage_layers.
    account_for_embedding: bool = False
    account_for_loss: bool = False
    # multi-token prediction (DeepSeek-V3 sec. 2.2; Megatron-Core --mtp-num-layers): each MTP
    # layer embeds the tokens one further ahead, joins them to the hidden state before it
    # (two RMSNorms, a 2h -> h projection), runs one more transformer layer like the model's
    # last and its own final norm, and the loss stage computes one more LM head and
    # cross-entropy on its output. Layer indices num_layers.. on the last virtual stage, or
    # where ``pipeline_layout`` puts them.
    mtp_layers: int = 0
    # gradient accumulation as separate pipeline schedules: the step's microbatches run as this
    # many schedules one after another, each filling and draining the pipeline, as
    # torch.distributed.pipelining runs one schedule step per accumulation step (torchtitan,
    # NeMo AutoModel: global batch = local batch x accumulation steps x dp); 1 = every
    # microbatch in one schedule, as Megatron-Core runs them. Needs pp > 1.
    pipeline_flushes: int = 1
    # Megatron-Core's --pipeline-model-parallel-layout (perfsim.plan.layout): which layers each
    # virtual stage holds, e.g. "Et|(tt|)*30mL"; "" = the split the other fields set. Not
    # beside first_stage_layers / last_stage_layers / account_for_*.
    pipeline_layout: str = ""
    # recompute only the first N layers of each pipeline stage (each virtual chunk): Megatron's
    # --recompute-method block --recompute-num-layers N; 0 = every layer
    recompute_layers: int = 0
    # what selective recompute re-runs (RECOMPUTE_MODULES: Megatron's --recompute-modules)
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    # the software stack the step runs under (framework costs, fused kernels, dispatch path;
    # system.stacks); a profile name is loaded
    stack: StackSpec = IDEAL
    # MoE dispatch/combine implementation: "alltoall" (the collective library's all-to-all,
    # RCCL/NCCL) or a name of the cluster profile's [dispatch.<name>] tables ("deepep",
    # "deepep-ll", "mori"; cost.dispatch), checked against the cluster when priced
    dispatch: str = "alltoall"
    # FP8 dispatch (DeepSeek-V3 sec. 3.3, DeepEP's FP8 dispatch): tokens leave for their
    # experts as FP8 with one FP32 scale per 128 values (and so do the gradients that flow
    # back into the experts); the combine direction stays BF16. Needs dtype fp8.
    dispatch_fp8: bool = False
    # compute units (SMs / CUs) the dispatch and combine kernels hold while they run (DeepEP's
    # num_sms, Megatron-Core's --moe-deepep-num-sms); None = the cluster profile's
    # ([dispatch.<name>] compute_units). Compute overlapped with them runs on the rest.
    dispatch_compute_units: int | None = None
    # gradient clipping by global norm (Megatron --clip-grad, default 1.0; MaxText / optax
    # clip_by_global_norm): the norm reads the local fp32 main-gradient shard, a scalar
    # all-reduce sums it over the data-parallel ranks (ZeRO shards), and the gradients are
    # scaled in place
    clip_grad: bool = True
    # the step reads real data through the stack's input pipeline ([data] host_s_per_mtoken:
    # host time the step does not hide); false: synthetic / mock data, no input cost
    real_data: bool = False
    # the FP8 scaling recipe (FP8_RECIPES); "" = the stack's ([fp8] delayed_scaling). Needs dtype fp8.
    fp8_recipe: str = ""
    # FP8 primary weights (Transformer Engine fp8_model_init, Megatron --fp8-param-gather,
    # torchao's FP8 all-gather under FSDP): the working weights are FP8 (1 B a parameter,
    # written by the optimizer step from the FP32 master copy), so the step casts no weight
    # (it transposes the FP8 copy once for the dgrad GEMMs) and ZeRO gathers them in FP8.
    # Needs dtype fp8.
    fp8_params: bool = False
    # how ZeRO-3 holds its weights through the step (stacks.ZERO3_GATHERS: per-pass, once,
    # pipeline); "" = the stack's ([overlap] zero3_gather; per-pass where it sets none)
    zero3_gather: str = ""

    def __post_init__(self):
        if not isinstance(self.stack, StackSpec):
            object.__setattr__(self, "stack", load_stack(self.stack))
        for key in ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "mbs", "gbs", "seq", "pipeline_flushes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"plan.{key} must be a positive integer, got {value!r}")
        for key in ("first_stage_layers", "last_stage_layers", "recompute_layers", "mtp_layers"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"plan.{key} must be an integer >= 0, got {value!r}")
            if key in ("recompute_layers", "mtp_layers"):
                continue
            if value and (self.pp < 2 or (self.vpp > 1 and self.schedule not in UNEVEN_CHUNKED)):
                raise ConfigError(f"plan.{key} ({value}) needs pp > 1, and with vpp > 1 the interleaved or a V-shape "
                                  f"schedule (got {self.schedule})")
        for key in ("account_for_embedding", "account_for_loss"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"plan.{key} must be true or false, got {getattr(self, key)!r}")
        if any(self.accounted):
            if self.first_stage_layers or self.last_stage_layers:
                raise ConfigError("plan.account_for_embedding/account_for_loss and first_stage_layers/last_stage_layers "
                                  "both set the pipeline split: use one")
            if self.pp < 2 or (self.vpp > 1 and self.schedule not in UNEVEN_CHUNKED):
                raise ConfigError(f"plan.account_for_embedding/account_for_loss need pp > 1, and with vpp > 1 the "
                                  f"interleaved or a V-shape schedule (got pp {self.pp}, {self.schedule})")
        if not isinstance(self.pipeline_layout, str):
            raise ConfigError(f"plan.pipeline_layout must be a layout string such as 'Et|(tt|)*30mL', "
                              f"got {self.pipeline_layout!r}")
        if self.pipeline_layout:
            if self.first_stage_layers or self.last_stage_layers or any(self.accounted):
                raise ConfigError("plan.pipeline_layout and first_stage_layers/last_stage_layers/account_for_* all set "
                                  "the pipeline split: use one")
            if self.vpp > 1 and self.schedule not in UNEVEN_CHUNKED:
                raise ConfigError(f"plan.pipeline_layout with vpp > 1 needs the interleaved or a V-shape schedule "
                                  f"(got {self.schedule})")
            layout.check(self.pipeline_layout, self.pp, self.vpp, self.mtp_layers)
        if isinstance(self.grad_bucket_bytes, bool) or not isinstance(self.grad_bucket_bytes, int) or self.grad_bucket_bytes < 1:
            raise ConfigError(f"plan.grad_bucket_bytes must be a positive integer, got {self.grad_bucket_bytes!r}")
        share = self.comm_compute_interference
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise ConfigError(f"plan.comm_compute_interference must be in [0, 1), got {share!r}")
        units = self.dispatch_compute_units
        if units is not None and (isinstance(units, bool) or not isinstance(units, int) or units < 0):
            raise ConfigError(f"plan.dispatch_compute_units must be a whole number >= 0 (or unset: the cluster "
                              f"profile's), got {units!r}")
        if not isinstance(self.dispatch, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.dispatch):
            raise ConfigError(f"plan.dispatch must be an implementation name such as alltoall, deepep or mori, "
                              f"got {self.dispatch!r}")
        for key in ("sequence_parallel", "overlap_grad_reduce", "overlap_param_gather", "dma_offload", "tp_comm_overlap",
                    "ep_comm_overlap", "shared_expert_overlap", "dispatch_fp8", "clip_grad", "real_data", "fp8_params"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"plan.{key} must be true or false, got {getattr(self, key)!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"plan.zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"plan.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.zero3_gather not in ("", *ZERO3_GATHERS):
            raise ConfigError(f"plan.zero3_gather must be one of {', '.join(ZERO3_GATHERS)}, got {self.zero3_gather!r}")
        if self.fp8_recipe not in ("", *FP8_RECIPES):
            raise ConfigError(f"plan.fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        for key, why in FP8_ONLY.items():
            if getattr(self, key) and self.dtype != "fp8":
                raise ConfigError(f"plan.{key}: {why} dtype fp8 (got dtype {self.dtype})")
        object.__setattr__(self, "recompute", _enum(Recompute, self.recompute, "recompute"))
        object.__setattr__(self, "schedule", _enum(Schedule, self.schedule, "schedule"))
        if self.recompute_layers and self.recompute == Recompute.NONE:
            raise ConfigError(f"plan.recompute_layers ({self.recompute_layers}) needs recompute selective, op or full")
        self._check_recompute_modules()
        self._check_divisibility()

    def _check_recompute_modules(self) -> None:
        modules = self.recompute_modules
        if isinstance(modules, str) or not isinstance(modules, (tuple, list)) or not modules:
            raise ConfigError(f"plan.recompute_modules must be a non-empty list of {', '.join(RECOMPUTE_MODULES)}, "
                              f"got {modules!r}")
        for name in modules:
            if name not in RECOMPUTE_MODULES:
                raise ConfigError(f"plan.recompute_modules: {name!r} is not one of {', '.join(RECOMPUTE_MODULES)} "
                                  "(Megatron's hyper-connection and gated-delta-net modules are not modelled)")
        if len(set(modules)) != len(modules):
            raise ConfigError(f"plan.recompute_modules names a module twice: {modules!r}")
        # one order, so that plans alike in what they re-run are equal (and share memoized answers)
        object.__setattr__(self, "recompute_modules", tuple(m for m in RECOMPUTE_MODULES if m in modules))
        if self.recompute_modules != DEFAULT_RECOMPUTE_MODULES and self.recompute != Recompute.SELECTIVE:
            raise ConfigError(f"plan.recompute_modules ({', '.join(self.recompute_modules)}) needs recompute selective "
                              f"or auto (Megatron's --recompute-granularity selective), got recompute "
                              f"{self.recompute.value}")
        refused = [m for m in ("layernorm", "moe_act") if m in self.recompute_modules]
        if refused and self.dtype == "fp8" and self.fp8_delayed_scaling:
            raise ConfigError(f"plan.recompute_modules: {refused[0]} under FP8 delayed scaling: Megatron-Core refuses "
                              f"it (\"Delayed scaling does not support moe_act and layernorm recompute for fp8\"); "
                              f"use fp8_recipe current (--fp8-recipe current) or drop the module")

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """What this plan's recompute re-runs by module: its ``recompute_modules`` under
        selective recompute, none otherwise (a plan at another level holds the default list:
        ``_check_recompute_modules``)."""
        return self.recompute_modules if self.recompute == Recompute.SELECTIVE else ()

    def at_recompute(self, level: Recompute | str, layers: int = 0) -> "ParallelPlan":
        """This plan at recompute ``level`` (``layers``: its recompute_layers), its module list
        kept where the level is selective and the default one elsewhere, the only list a plan
        at another level may hold (``_check_recompute_modules``)."""
        level = _enum(Recompute, level, "recompute")
        modules = self.recompute_modules if level == Recompute.SELECTIVE else DEFAULT_RECOMPUTE_MODULES
        return dataclasses.replace(self, recompute=level, recompute_layers=layers, recompute_modules=modules)

    def _check_divisibility(self) -> None:
        if self.gbs % (self.mbs * self.dp):
            raise ConfigError(f"plan.gbs ({self.gbs}) must be divisible by mbs*dp ({self.mbs}*{self.dp})")
        if (self.tp * self.cp * self.dp) % (self.ep * self.etp):
            raise ConfigError(
                f"plan.ep*etp ({self.ep}*{self.etp}) must divide tp*cp*dp ({self.tp}*{self.cp}*{self.dp})"
            )
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError(f"plan.vpp ({self.vpp}) needs pp > 1")
        if self.pipeline_flushes > 1 and self.pp == 1:
            raise ConfigError(f"plan.pipeline_flushes ({self.pipeline_flushes}) needs pp > 1: without a pipeline "
                              f"the microbatches run back to back")
        if self.num_microbatches % self.pipeline_flushes:
            raise ConfigError(f"plan.pipeline_flushes ({self.pipeline_flushes}) must divide the step's microbatches "
                              f"(gbs / mbs*dp = {self.num_microbatches})")
        why = ep_overlap_conflict(self) if self.ep_comm_overlap else ""
        if why:
            raise ConfigError(f"plan.ep_comm_overlap {why}")
        if self.seq % self.cp or (self.cp > 1 and (self.seq // self.cp) % 2):
            raise ConfigError(f"plan.seq ({self.seq}) must be divisible by 2*cp ({2 * self.cp})")

    @property
    def accounted(self) -> tuple[bool, bool]:
        """(embedding, loss): the ends that take a layer slot of the pipeline split."""
        return self.account_for_embedding, self.account_for_loss

    @property
    def overlaps_ep_comm(self) -> bool:
        """The expert-parallel all-to-all overlap in effect: asked for, with experts to exchange."""
        return self.ep_comm_overlap and self.ep > 1

    @property
    def overlaps_shared_experts(self) -> bool:
        """The shared-expert overlap in effect: asked for, with all-to-alls to run beside."""
        return self.shared_expert_overlap and self.ep > 1

    @property
    def keeps_fp8_inputs(self) -> bool:
        """FP8 linear layers keep their cast input for the backward, not the BF16 one (the
        stack's ``fp8.saves_fp8_inputs``, under dtype fp8)."""
        return self.dtype == "fp8" and self.stack.fp8.saves_fp8_inputs

    @property
    def keeps_weights_gathered(self) -> bool:
        """ZeRO-3 whose weights stay gathered through the step (``zero3_gather`` once, or
        pipeline with pp > 1; the plan's, else the stack's): one gather per step before the
        first forward, gradients accumulated unsharded and reduce-scattered after the last
        backward."""
        if self.zero != 3:
            return False
        mode = self.zero3_gather or self.stack.overlap.zero3_gather or "per-pass"
        return mode == "once" or (mode == "pipeline" and self.pp > 1)

    @property
    def step_zero(self) -> int:
        """The ZeRO stage the step's communication and memory follow: the plan's, except
        ZeRO-3 that keeps its weights gathered (``keeps_weights_gathered``), which runs the
        step as ZeRO-1 does -- the weights gathered once, full gradients reduce-scattered once
        after the last backward, only the optimizer states (and the weights between steps)
        sharded."""
        return 1 if self.keeps_weights_gathered else self.zero

    @property
    def grad_syncs(self) -> int:
        """Gradient reductions per step: one after the last microbatch (ZeRO-0/1, which
        accumulate full gradients; ZeRO-3 keeping its weights gathered; any pipeline: PyTorch
        pipelining and MaxText accumulate first), or one per microbatch where ZeRO-2/3 holds
        the gradients sharded without a pipeline: every backward reduce-scatters its own
        gradients and the next microbatch waits for them (FSDP2's default,
        FSDPParamGroup.finalize_backward; DeepSpeed ZeRO-2/3 every micro-step)."""
        return self.num_microbatches if self.pp == 1 and self.step_zero in (2, 3) else 1

    @property
    def weights_gathered_ahead(self) -> bool:
        """ZeRO-1/2 gathers the updated weights behind the next step's first forward
        (gradient reduction and parameter gathers both overlapped); otherwise it gathers
        them after the optimizer step, exposed."""
        return self.step_zero in (1, 2) and self.overlap_grad_reduce and self.overlap_param_gather

    @property
    def fp8_delayed_scaling(self) -> bool:
        """Whether FP8 casts take their scales from earlier steps (no amax pass): the plan's
        recipe where it names one, else the stack's ``[fp8] delayed_scaling``."""
        return self.fp8_recipe == "delayed" if self.fp8_recipe else self.stack.fp8.delayed_scaling

    def fp8_copies_kept(self, reused: bool) -> bool:
        """Whether an FP8 copy of a weight (a cast, or FP8 primary weights' transpose) made
        where ``reused`` (the stack casts once a step, or the weights are FP8) is kept through
        the step: not under per-pass ZeRO-3, whose weights are gathered (and copied) pass by
        pass (Megatron-FSDP keeps no FP8 transpose cache)."""
        return reused and self.step_zero != 3

    def fp8_copies_per_step(self, reused: bool) -> int:
        """Microbatches that share one FP8 copy of a weight (``fp8_copies_kept``): all of
        them where it is kept, else 1."""
        return self.num_microbatches if self.fp8_copies_kept(reused) else 1

    @property
    def param_bytes(self) -> int:
        """Bytes of one working-copy parameter: FP8 primary weights, else BF16."""
        return DTYPE_BYTES["fp8" if self.fp8_params else "bf16"]

    @property
    def interference(self) -> float:
        """Compute slowdown share while comm runs (none with DMA offload)."""
        return 0.0 if self.dma_offload else float(self.comm_compute_interference)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: replicas of each expert within a stage."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def flush_microbatches(self) -> int:
        """Microbatches of one pipeline schedule (``pipeline_flushes`` of them a step)."""
        return self.num_microbatches // self.pipeline_flushes

    def with_microbatches(self, m: int) -> "ParallelPlan":
        """This plan with a step of ``m`` microbatches (the engine's short steps): its schedules
        kept whole, ``m`` / ``flush_microbatches`` of them, or one where ``m`` is not a number of them."""
        per = self.flush_microbatches
        return dataclasses.replace(self, gbs=self.mbs * self.dp * m, pipeline_flushes=m // per if m % per == 0 else 1)

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"vpp{self.vpp}"] if self.vpp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"dp{self.dp}"]
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"etp{self.etp}"] if self.etp > 1 else []
        parts += [f"zero{self.zero}", f"mbs{self.mbs}", f"gbs{self.gbs}", f"seq{self.seq}", self.dtype]
        parts += [f"recompute-{self.recompute}"] if self.recompute != Recompute.NONE else []
        parts += ["+".join(self.selective_modules)] if self.selective_modules not in ((), DEFAULT_RECOMPUTE_MODULES) else []
        parts += [f"of{self.recompute_layers}"] if self.recompute_layers else []
        parts += ["tp-comm-overlap"] if self.tp_comm_overlap else []
        parts += ["ep-comm-overlap"] if self.overlaps_ep_comm else []
        parts += ["shared-expert-overlap"] if self.overlaps_shared_experts else []
        parts += ["no-param-prefetch"] if not self.overlap_param_gather and self.zero else []
        parts += ["zero3-gather-once"] if self.keeps_weights_gathered else []
        parts += [f"first{self.first_stage_layers}"] if self.first_stage_layers else []
        parts += [f"last{self.last_stage_layers}"] if self.last_stage_layers else []
        parts += [f"account-{'+'.join(n for n, on in zip(('embedding', 'loss'), self.accounted) if on)}"] \
            if any(self.accounted) else []
        parts += [f"mtp{self.mtp_layers}"] if self.mtp_layers else []
        parts += [f"flushes{self.pipeline_flushes}"] if self.pipeline_flushes > 1 else []
        parts += [f"layout-{self.pipeline_layout.replace(' ', '')}"] if self.pipeline_layout else []
        parts += [f"stack-{self.stack.name}"] if self.stack.name != "ideal" else []
        parts += [f"dispatch-{self.dispatch}"] if self.dispatch != "alltoall" else []
        parts += ["dispatch-fp8"] if self.dispatch_fp8 else []
        parts += [f"dispatch-cus{self.dispatch_compute_units}"] if self.dispatch_compute_units is not None else []
        parts += ["no-clip"] if not self.clip_grad else []
        parts += ["real-data"] if self.real_data else []
        parts += [f"fp8-{self.fp8_recipe}"] if self.fp8_recipe else []
        parts += ["fp8-params"] if self.fp8_params else []
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def priced_dict(self) -> dict:
        """``to_dict`` as the step was priced: a ZeRO-3 gather policy left to the stack ("")
        or set to pipeline reads as the one the step ran ("once" or "per-pass"), so reports
        and search rows say which it was (and build the same plan again)."""
        out = self.to_dict()
        if self.zero == 3:
            out["zero3_gather"] = "once" if self.keeps_weights_gathered else "per-pass"
        return out


def _plain(value):
    if isinstance(value, StackSpec):
        return value.name
    if isinstance(value, tuple):  # recompute_modules: a JSON list, as a report writes it
        return list(value)
    return str(value) if isinstance(value, StrEnum) else value


# plan switches a search applies to every plan it sweeps (perfsim.search's plan_knobs)
PLAN_SWITCHES = ("overlap_grad_reduce", "overlap_param_gather", "clip_grad", "dispatch_fp8", "real_data", "fp8_params",
                 "shared_expert_overlap")


def dispatch_label(plan: dict) -> str:
    """A plan dict's MoE dispatch implementation as tables show it, or '-' where there is
    no expert parallelism (ep 1: no dispatch all-to-all, nothing for it to price)."""
    return str(plan.get("dispatch") or "alltoall") if int(plan.get("ep") or 1) > 1 else "-"


def _enum(cls: type, value, key: str):
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise ConfigError(f"plan.{key} must be one of {choices}, got {value!r}") from None


def _check_uneven(plan: ParallelPlan, model: ModelSpec) -> None:
    first, last = plan.first_stage_layers, plan.last_stage_layers
    units = plan.pp * plan.vpp  # V-shape: the first and last virtual stages (both on stage 0)
    middle = units - bool(first) - bool(last)
    rest = model.num_layers - first - last
    what = "stages" if plan.vpp == 1 else "virtual stages"
    if rest < 0 or (middle and (rest < middle or rest % middle)) or (not middle and rest):
        raise ConfigError(
            f"plan.first_stage_layers/last_stage_layers ({first}/{last}): the other {middle} {what} must split the "
            f"remaining {rest} of the model's {model.num_layers} layers evenly, at least one each")


def _check_accounted(plan: ParallelPlan, model: ModelSpec) -> None:
    slots, units = sum(plan.accounted), plan.pp * plan.vpp
    if (model.num_layers + slots) % units:
        what = " and ".join(n for n, on in zip(("embedding", "loss"), plan.accounted) if on)
        raise ConfigError(f"plan.account_for_embedding/account_for_loss: the model's {model.num_layers} layers + the "
                          f"{what} ({slots}) must split evenly over pp*vpp = {plan.pp}*{plan.vpp} = {units} "
                          f"{'stages' if plan.vpp == 1 else 'virtual stages'}")


def op_recompute_applies(model: ModelSpec) -> bool:
    """Per-op checkpointing (Recompute.OP) is modelled for dense layers with multi-head /
    grouped-query attention."""
    return not model.is_moe and model.attention is AttentionKind.GQA


def recompute_ladder(levels: tuple[str, ...], model: ModelSpec) -> tuple[str, ...]:
    """A stack's recompute settings (``stack.recompute.auto`` or ``.levels()``) that can be
    priced on ``model``: per-op checkpointing only where it is modelled
    (``op_recompute_applies``). What ``recompute='auto'`` walks and ``perfsim search`` tries."""
    return tuple(level for level in levels if level != Recompute.OP.value or op_recompute_applies(model))


def check_plan(plan: ParallelPlan, model: ModelSpec, num_gpus: int) -> None:
    """Raise ConfigError naming the first knob that does not fit this model and cluster."""
    if plan.world_size != num_gpus:
        raise ConfigError(
            f"plan: tp*pp*cp*dp = {plan.tp}*{plan.pp}*{plan.cp}*{plan.dp} = {plan.world_size} "
            f"must equal the GPU count {num_gpus}"
        )
    if plan.schedule in V_SHAPES and (plan.pp < 2 or plan.vpp != 2):
        raise ConfigError(f"plan.schedule {plan.schedule.value!r} is V-shaped: it needs pp > 1 and vpp 2 "
                          f"(two chunks per stage), got pp {plan.pp}, vpp {plan.vpp}")
    if model.num_heads % plan.tp:
        raise ConfigError(f"plan.tp ({plan.tp}) must divide the model's heads ({model.num_heads})")
    if model.num_kv_heads % plan.tp and plan.tp % model.num_kv_heads:
        raise ConfigError(f"plan.tp ({plan.tp}) and the model's kv heads ({model.num_kv_heads}) must divide one another")
    if plan.mtp_layers > model.num_layers:  # DeepSeek-V3 runs one; more than the model's layers is a typo
        raise ConfigError(f"plan.mtp_layers ({plan.mtp_layers:,}) must be at most the model's layers "
                          f"({model.num_layers})")
    if plan.pipeline_layout:
        layout.check_model(plan.pipeline_layout, model.num_layers)
    elif plan.first_stage_layers or plan.last_stage_layers:
        _check_uneven(plan, model)
    elif any(plan.accounted):
        _check_accounted(plan, model)
    elif model.num_layers % (plan.pp * plan.vpp):
        raise ConfigError(
            f"plan.pp*vpp ({plan.pp}*{plan.vpp}) must divide the model's layers ({model.num_layers}); "
            f"first_stage_layers / last_stage_layers (--first-stage-layers, --last-stage-layers) split them unevenly"
        )
    _check_moe(plan, model)
    if "mla_up_proj" in plan.recompute_modules and model.attention is not AttentionKind.MLA:
        raise ConfigError(f"plan.recompute_modules: mla_up_proj needs multi-latent attention; {model.name} has "
                          f"{model.attention.value} attention")
    if plan.recompute == Recompute.OP and not op_recompute_applies(model):
        raise ConfigError(f"plan.recompute 'op' (torchtitan's per-op checkpointing) is modelled for dense layers with "
                          f"multi-head / grouped-query attention; {model.name} has "
                          f"{'MoE layers' if model.is_moe else f'{model.attention.value} attention'}: use selective or full")
    if plan.schedule == Schedule.INTERLEAVED and plan.vpp == 1:
        raise ConfigError("plan.schedule 'interleaved' needs vpp > 1")
    if plan.vpp > 1 and plan.schedule not in V_SHAPES and plan.num_microbatches % plan.pp:
        raise ConfigError(
            f"plan: interleaving needs microbatches ({plan.num_microbatches}) divisible by pp ({plan.pp})"
        )


def _check_moe(plan: ParallelPlan, model: ModelSpec) -> None:
    if not model.is_moe:
        if plan.ep > 1 or plan.etp > 1:
            raise ConfigError(f"plan.ep/etp ({plan.ep}/{plan.etp}) need an MoE model; {model.name} is dense")
        moe_only = [m for m in plan.recompute_modules if m in MOE_RECOMPUTE_MODULES]
        if moe_only:
            raise ConfigError(f"plan.recompute_modules: {moe_only[0]} needs an MoE model; {model.name} is dense")
        if plan.shared_expert_overlap:
            raise ConfigError(f"plan.shared_expert_overlap needs an MoE model with shared experts; "
                              f"{model.name} is dense")
        return
    if "shared_experts" in plan.recompute_modules and not model.has_shared_experts:
        raise ConfigError(f"plan.recompute_modules: shared_experts needs a model with shared experts; "
                          f"{model.name} has none")
    if plan.shared_expert_overlap:
        _check_shared_overlap(plan, model)
    if model.num_experts % plan.ep:
        raise ConfigError(f"plan.ep ({plan.ep}) must divide the model's experts ({model.num_experts})")
    if model.expert_ffn_hidden_size % plan.etp:
        raise ConfigError(f"plan.etp ({plan.etp}) must divide expert_ffn_hidden_size ({model.expert_ffn_hidden_size})")


def _check_shared_overlap(plan: ParallelPlan, model: ModelSpec) -> None:
    """Where Megatron-Core's --moe-shared-expert-overlap can run (its TransformerConfig checks)
    and perfsim prices it."""
    if not model.has_shared_experts:
        raise ConfigError(f"plan.shared_expert_overlap needs a model with shared experts; {model.name} has none")
    if "shared_experts" in plan.recompute_modules:
        raise ConfigError("plan.shared_expert_overlap: Megatron-Core refuses it beside the shared_experts recompute "
                          "module (\"shared_experts recompute cannot work with --moe-shared-expert-overlap\"); drop "
                          "one of them")
    if plan.overlaps_ep_comm:
        raise ConfigError("plan.shared_expert_overlap beside ep_comm_overlap: the expert-parallel overlap's merged "
                          "step already runs the all-to-alls beside the other pass's compute, shared experts "
                          "included; set one of them")


# ---- placement ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GroupShape:
    """Where a communicator's ranks sit: ``per_node`` GPUs on each of ``num_nodes`` nodes."""

    size: int
    per_node: int
    num_nodes: int

    @property
    def intra_only(self) -> bool:
        return self.num_nodes == 1


def group_shape(size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """Geometry of ranks ``r0 + i*stride, i < size`` on nodes of ``gpus_per_node`` GPUs."""
    if size == 1:
        return GroupShape(size=1, per_node=1, num_nodes=1)
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return GroupShape(size=size, per_node=per_node, num_nodes=-(-size // per_node))


def group_strides(plan: ParallelPlan) -> dict[str, tuple[int, int]]:
    """(size, stride) of every communicator kind in Megatron-Core order."""
    dp_cp = plan.dp * plan.cp
    return {
        "tp": (plan.tp, 1),
        "cp": (plan.cp, plan.tp),
        "dp": (plan.dp, plan.tp * plan.cp),
        "dp_cp": (dp_cp, plan.tp),  # dense-gradient reduction group (Megatron shards over dp x cp)
        "pp": (plan.pp, plan.tp * plan.cp * plan.dp),
        # Megatron-Core's embedding group: a first-stage rank and its last-stage peer (the
        # word-embedding copy's gradients, sharding.embedding_sync_params)
        "embd": (2, (plan.pp - 1) * plan.tp * plan.cp * plan.dp) if plan.pp > 1 else (1, 1),
        "etp": (plan.etp, 1),
        "ep": (plan.ep, plan.etp),
        "edp": (plan.edp, plan.etp * plan.ep),
    }


def group_shapes(plan: ParallelPlan, gpus_per_node: int) -> dict[str, GroupShape]:
    return {k: group_shape(size, stride, gpus_per_node) for k, (size, stride) in group_strides(plan).items()}


def derive_dp(num_gpus: int, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """dp from the GPU count; ConfigError when tp*pp*cp does not divide it."""
    inner = tp * pp * cp
    if num_gpus % inner:
        raise ConfigError(f"plan: tp*pp*cp = {inner} does not divide the GPU count {num_gpus}")
    return num_gpus // inner
