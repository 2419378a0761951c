"""Megatron-LM / Primus training flags -> perfsim plan knobs.

``from_args("--tensor-model-parallel-size 8 --micro-batch-size 1 ...")`` and
``from_primus_yaml(text)`` (a Primus experiment YAML: ``modules.pre_trainer.overrides``, or a
flat mapping of Megatron arguments) return a :class:`MegatronPlan`: the knobs
``api.simulate`` takes, model overrides (capacity factor), and every flag that was not
used, sorted into three lists so none is dropped silently: ``ignored`` (known, no effect on
step time in perfsim: logging, data, checkpointing), ``not_modelled`` (known, would change
step time, perfsim cannot represent it) and ``unknown``. Flag names follow Megatron's
``arguments.py`` (dashes on the command line, underscores in YAML).
"""

import os
import re
import shlex
from dataclasses import dataclass, field

from perfsim.errors import ConfigError
from perfsim.plan.parallel import RECOMPUTE_MODULES, split_recompute_modules
from perfsim.plan import layout

# Megatron argument (underscored) -> perfsim knob; values are integers.
INT_KNOBS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "context_parallel_size": "cp",
    "micro_batch_size": "mbs",
    "global_batch_size": "gbs",
    "seq_length": "seq",
    "decoder_first_pipeline_num_layers": "first_stage_layers",
    "decoder_last_pipeline_num_layers": "last_stage_layers",
}
BOOL_KNOBS = {  # Megatron switch -> (knob, value when set)
    "sequence_parallel": ("sequence_parallel", True),
    "overlap_grad_reduce": ("overlap_grad_reduce", True),
    "tp_comm_overlap": ("tp_comm_overlap", True),
    "overlap_moe_expert_parallel_comm": ("ep_comm_overlap", True),
    "moe_shared_expert_overlap": ("shared_expert_overlap", True),
    "overlap_param_gather": ("overlap_param_gather", True),  # off unless set, as in Megatron-Core
}
DTYPES = {"bf16": "bf16", "fp16": "fp16"}
# Primus' zero-bubble switches (primus/configs/modules/megatron/zero_bubble.yaml and its PP
# strategy table): --patch-zero-bubble (or --enable-zero-bubble) is zero-bubble 1P (zb-h1),
# with --zero-bubble-v-schedule the V-shape schedule named by --zero-bubble-v-schedule-mem-setup
# (zb: zbv, half: v-half, min: v-min; Primus' default half), at two chunks per stage
ZERO_BUBBLE = ("patch_zero_bubble", "enable_zero_bubble")
V_MEM_SETUP = {"zb": "zbv", "half": "v-half", "min": "v-min"}
# Known flags that do not change a step's time in perfsim (or only through the model, which
# comes from --model): reported as ignored, not as unknown.
IGNORED = frozenset("""
lr min_lr lr_decay_style lr_warmup_iters lr_warmup_fraction lr_decay_iters weight_decay adam_beta1
adam_beta2 adam_eps init_method_std seed train_iters train_samples eval_iters eval_interval log_interval
save load save_interval data_path split tokenizer_type tokenizer_model vocab_file merge_file
distributed_backend use_flash_attn use_mcore_models transformer_impl attention_softmax_in_fp32
no_masked_softmax_fusion no_bias_gelu_fusion no_bias_dropout_fusion no_gradient_accumulation_fusion
accumulate_allreduce_grads_in_fp32 bf16_main_grads wandb_project wandb_exp_name tensorboard_dir
log_throughput log_timers_to_tensorboard disable_bias_linear swiglu normalization untie_embeddings_and_output_weights
position_embedding_type rotary_base max_position_embeddings make_vocab_size_divisible_by num_layers hidden_size
ffn_hidden_size num_attention_heads num_query_groups group_query_attention kv_channels num_experts
moe_ffn_hidden_size moe_router_topk moe_shared_expert_intermediate_size moe_grouped_gemm
moe_router_load_balancing_type moe_aux_loss_coeff moe_router_dtype moe_router_force_load_balancing
moe_layer_freq moe_permute_fusion moe_router_pre_softmax q_lora_rank kv_lora_rank qk_head_dim qk_pos_emb_head_dim
v_head_dim multi_latent_attention hidden_dropout attention_dropout exit_interval exit_duration_in_mins
manual_gc manual_gc_interval ckpt_format dataloader_type num_workers mock_data mtp_loss_scaling_factor
""".split())
# Megatron-LM's switches that count the embedding / the loss as a pipeline layer
ACCOUNT_FLAGS = {"account_for_embedding_in_pipeline_split": "account_for_embedding",
                 "account_for_loss_in_pipeline_split": "account_for_loss"}
# Megatron-LM's MoE token dispatchers (--moe-token-dispatcher-type): alltoall is the collective
# library's all-to-all, flex runs the --moe-flex-dispatcher-backend (default deepep; the deprecated
# --moe-enable-deepep names it too) with --moe-deepep-num-sms SMs, or hybridep (DeepEP's hybrid
# NVLink + RDMA kernels, which Megatron-Bridge's H100 Qwen3-30B-A3B preset runs from 26.04: no
# public bandwidth table of its own, so priced by the cluster's DeepEP table); allgather is not modelled
DISPATCHERS = ("allgather", "alltoall", "flex")
# --recompute-modules names Megatron-Core versions accept beside perfsim's RECOMPUTE_MODULES
# (TransformerConfig's allowed_modules across releases and forks: the hyper-connection and
# gated-delta-net modules, the finer MLP / expert splits, the EP-overlap chunks); reported as
# not modelled, where any other name is refused as Megatron-Core refuses it
MEGATRON_ONLY_MODULES = ("mhc", "gdn", "gdn_norm_out", "mlp_act", "pre_mlp", "routed_experts", "a2a_overlap_attn",
                         "a2a_overlap_post_attn", "a2a_overlap_mlp")
FLEX_BACKENDS = ("deepep", "hybridep")
DISPATCH_FLAGS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_enable_deepep", "moe_deepep_num_sms")
# Megatron-LM --fp8-recipe -> plan.fp8_recipe (the others are in NOT_MODELLED)
MEGATRON_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}
# Known flags with a step-time effect perfsim cannot represent: reported (with why), not used.
NOT_MODELLED = {
    "account_for_embedding_in_pipeline_split": "uneven pipeline stages are set by --decoder-first/last-pipeline-"
                                               "num-layers here; with those, the embedding's accounting is not applied",
    "account_for_loss_in_pipeline_split": "uneven pipeline stages are set by --decoder-first/last-pipeline-"
                                          "num-layers here; with those, the loss's accounting is not applied",
    "recompute_num_layers": "with --recompute-method uniform every layer recomputes (the checkpoint grouping "
                            "is not modelled)",
    "use_torch_fsdp2": "Megatron's PyTorch FSDP2 path (weights gathered before every pass, gradients accumulated "
                       "unsharded under no_sync and reduce-scattered once) is not one of perfsim's ZeRO stages; "
                       "--zero 3 prices its per-pass gathers, --zero 3 --zero3-gather once its memory's upper end",
    "cpu_offloading": "CPU offload is not modelled",
    "fp8_recipe": "perfsim prices the delayed and tensorwise (current) recipes; blockwise and mxfp8 scale "
                  "per block, which is not modelled (the stack's recipe is used)",
}


@dataclass(frozen=True, kw_only=True)
class MegatronPlan:
    knobs: dict = field(default_factory=dict)
    model_overrides: dict = field(default_factory=dict)
    layers_per_virtual_stage: int | None = None  # --num-layers-per-virtual-pipeline-stage
    ignored: tuple[str, ...] = ()
    not_modelled: tuple[tuple[str, str], ...] = ()
    unknown: tuple[str, ...] = ()

    def knobs_for(self, num_layers: int) -> dict:
        """The knobs, with vpp derived from --num-layers-per-virtual-pipeline-stage for a
        model of ``num_layers`` layers."""
        knobs = dict(self.knobs)
        if self.layers_per_virtual_stage:
            per_stage, pp = self.layers_per_virtual_stage, knobs.get("pp", 1)
            if num_layers % (pp * per_stage):
                raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {per_stage}: {num_layers} layers do not "
                                  f"split into pp={pp} stages of chunks of {per_stage}")
            knobs["vpp"] = num_layers // (pp * per_stage)
        return knobs

    def notes(self) -> list[str]:
        """Lines that say what was used and what was not."""
        used = " ".join(f"{k}={v}" for k, v in sorted({**self.knobs, **self.model_overrides}.items()))
        if self.layers_per_virtual_stage:
            used += f" vpp=layers/(pp*{self.layers_per_virtual_stage})"
        out = [f"mapped: {used or 'nothing'}"]
        out += [f"not modelled: --{_dash(k)} ({why})" for k, why in self.not_modelled]
        if self.unknown:
            out.append("unknown (not used): " + ", ".join(f"--{_dash(k)}" for k in self.unknown))
        if self.ignored:
            out.append("ignored (no effect on step time here): " + ", ".join(f"--{_dash(k)}" for k in self.ignored))
        return out


def _dash(name: str) -> str:
    return name.replace("_", "-")


def _finite(name: str, value) -> float:
    """A finite number >= 0 (a NaN capacity factor would drop NaN tokens)."""
    try:
        number = float(str(value))
    except ValueError:
        number = float("nan")
    if not 0 <= number < float("inf"):
        raise ConfigError(f"--{_dash(name)}: expected a finite number >= 0, got {value!r}")
    return number


def _int(name: str, value) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"--{_dash(name)}: expected an integer, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"--{_dash(name)}: must be >= 1, got {number}")
    return number


def _truthy(value) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def from_mapping(args: dict) -> MegatronPlan:
    """Megatron arguments as {underscored name: value} (a switch: True) -> MegatronPlan."""
    knobs, overrides, ignored, not_modelled, unknown = {}, {}, [], [], []
    vpp_layers, method, recompute_num = None, None, None
    zero_bubble, v_schedule, mem_setup = False, False, "half"
    fp8_only = {}  # Megatron flag -> (plan knob, value): knobs that apply only to an FP8 run
    account, dispatching = [], {}
    for raw, value in args.items():
        name = raw.replace("-", "_")
        if value is None or value is False:
            continue
        if name in INT_KNOBS:
            knobs[INT_KNOBS[name]] = _int(name, value)
        elif name in BOOL_KNOBS:
            if _truthy(value):
                knob, on = BOOL_KNOBS[name]
                knobs[knob] = on
        elif name in DTYPES and _truthy(value):
            knobs.setdefault("dtype", DTYPES[name])
        elif name in ("fp8", "fp8_format"):
            knobs["dtype"] = "fp8"
        elif name == "fp8_recipe" and str(value) in MEGATRON_FP8_RECIPES:
            fp8_only[name] = ("fp8_recipe", MEGATRON_FP8_RECIPES[str(value)])
        elif name == "fp8_param_gather":  # FP8 primary weights, gathered in FP8 (plan.fp8_params)
            if _truthy(value):
                fp8_only[name] = ("fp8_params", True)
        elif name in ACCOUNT_FLAGS:
            if _truthy(value):
                account.append(ACCOUNT_FLAGS[name])
        elif name == "use_distributed_optimizer":
            knobs["zero"] = 1 if _truthy(value) else 0
        elif name == "recompute_granularity":
            if str(value) not in ("full", "selective"):
                raise ConfigError(f"--recompute-granularity: expected full or selective, got {value!r}")
            knobs["recompute"] = str(value)
        elif name == "recompute_modules":  # what selective recompute re-runs (a list, or names separated by spaces)
            names = [str(v) for v in value] if isinstance(value, list | tuple) else split_recompute_modules(str(value))
            modelled = tuple(m for m in names if m in RECOMPUTE_MODULES)
            if modelled:
                knobs["recompute_modules"] = modelled
            for m in names:
                if m not in RECOMPUTE_MODULES + MEGATRON_ONLY_MODULES:
                    raise ConfigError(f"--recompute-modules: {m!r} is not a Megatron-Core recompute module (one of "
                                      f"{', '.join(RECOMPUTE_MODULES + MEGATRON_ONLY_MODULES)})")
                if m not in RECOMPUTE_MODULES:
                    not_modelled.append(("recompute_modules", f"module {m} is not modelled (perfsim re-runs "
                                                              f"{', '.join(RECOMPUTE_MODULES)})"))
        elif name == "recompute_method":
            if str(value) not in ("uniform", "block"):
                raise ConfigError(f"--recompute-method: expected uniform or block, got {value!r}")
            method = str(value)
        elif name == "recompute_num_layers":
            recompute_num = _int(name, value)
        elif name == "num_layers_per_virtual_pipeline_stage":
            vpp_layers = _int(name, value)
        elif name == "num_virtual_stages_per_pipeline_rank":  # Primus' name for the vpp
            knobs["vpp"] = _int(name, value)
        elif name == "mtp_num_layers":  # multi-token prediction (plan.mtp_layers); 0 = none
            if str(value).strip() != "0":
                knobs["mtp_layers"] = _int(name, value)
        elif name == "pipeline_model_parallel_layout":  # plan.pipeline_layout; vpp = its stages / pp
            knobs["pipeline_layout"] = str(value)
        elif name in ZERO_BUBBLE:
            zero_bubble = zero_bubble or _truthy(value)
        elif name == "zero_bubble_v_schedule":
            v_schedule = _truthy(value)
        elif name == "zero_bubble_v_schedule_mem_setup":
            if str(value) not in V_MEM_SETUP:
                raise ConfigError(f"--zero-bubble-v-schedule-mem-setup: expected zb, half or min, got {value!r}")
            mem_setup = str(value)
        elif name == "ddp_bucket_size":
            knobs["grad_bucket_bytes"] = 2 * _int(name, value)  # elements of bf16 gradients
        elif name == "clip_grad":  # Megatron clips at 1.0 by default; 0 turns clipping off
            knobs["clip_grad"] = _finite(name, value) > 0
        elif name in DISPATCH_FLAGS:
            dispatching[name] = value
        elif name == "moe_expert_capacity_factor":
            overrides["capacity_factor"] = _finite(name, value)
        elif name in NOT_MODELLED:
            not_modelled.append((name, NOT_MODELLED[name]))
        elif name in IGNORED:
            ignored.append(name)
        else:
            unknown.append(name)
    _dispatcher(dispatching, knobs, ignored, not_modelled)
    if v_schedule:  # the V-shape schedules: two chunks per stage (Primus sets vpp 2 itself)
        knobs["schedule"], knobs["vpp"] = V_MEM_SETUP[mem_setup], 2
    elif zero_bubble:
        knobs["schedule"] = "zb-h1"
    if "pipeline_layout" in knobs and "vpp" not in knobs and not vpp_layers:
        stages, pp = len(layout.parse(knobs["pipeline_layout"])), knobs.get("pp", 1)
        if stages % pp:
            raise ConfigError(f"--pipeline-model-parallel-layout: {stages} stages do not split over "
                              f"--pipeline-model-parallel-size {pp}")
        knobs["vpp"] = stages // pp  # Megatron derives the virtual stages from the layout
    if knobs.get("pp", 1) == 1 and (knobs.get("vpp", 1) > 1 or vpp_layers):
        raise ConfigError("--virtual-pipeline-model-parallel-size / --num-layers-per-virtual-pipeline-stage "
                          "need --pipeline-model-parallel-size > 1")
    if method == "block" and recompute_num:  # the first N layers of each stage chunk recompute
        knobs["recompute_layers"] = recompute_num
    elif recompute_num is not None:
        not_modelled.append(("recompute_num_layers", NOT_MODELLED["recompute_num_layers"]))
    if account and ("first_stage_layers" in knobs or "last_stage_layers" in knobs):
        not_modelled += [(flag, NOT_MODELLED[flag]) for flag, knob in ACCOUNT_FLAGS.items() if knob in account]
    else:  # the embedding / loss take a layer slot of the first / last virtual stage (plan.account_for_*)
        knobs.update({knob: True for knob in account})
    if knobs.get("dtype") == "fp8":  # the FP8 recipe and FP8 weights matter only to an FP8 run
        knobs.update(fp8_only.values())
    else:
        ignored += list(fp8_only)
    knobs.setdefault("zero", 0)  # Megatron's defaults: optimizer not distributed, switches off
    for knob, _ in BOOL_KNOBS.values():
        knobs.setdefault(knob, False)
    return MegatronPlan(knobs=knobs, model_overrides=overrides, layers_per_virtual_stage=vpp_layers,
                        ignored=tuple(sorted(ignored)), not_modelled=tuple(not_modelled), unknown=tuple(unknown))


def _dispatcher(flags: dict, knobs: dict, ignored: list, not_modelled: list) -> None:
    """Megatron's dispatcher flags -> plan.dispatch (and dispatch_compute_units): alltoall,
    or flex with the DeepEP backend ("deepep", at --moe-deepep-num-sms SMs) or HybridEP (priced
    as "deepep")."""
    kind = str(flags.get("moe_token_dispatcher_type", ""))
    if kind and kind not in DISPATCHERS:
        raise ConfigError(f"--moe-token-dispatcher-type: expected {', '.join(DISPATCHERS)}, got {kind!r}")
    if "moe_enable_deepep" in flags and _truthy(flags["moe_enable_deepep"]):
        kind = "flex"  # Megatron-Core rewrites the deprecated switch to the flex dispatcher's DeepEP backend
    backend = str(flags.get("moe_flex_dispatcher_backend", "deepep"))
    if backend not in FLEX_BACKENDS:
        raise ConfigError(f"--moe-flex-dispatcher-backend: expected {', '.join(FLEX_BACKENDS)}, got {backend!r}")
    sms = flags.get("moe_deepep_num_sms")
    if kind == "flex":
        knobs["dispatch"] = "deepep"
        if backend == "hybridep":
            not_modelled.append(("moe_flex_dispatcher_backend", "HybridEP has no bandwidth table of its own; priced "
                                                                "by the cluster's DeepEP table, the kernels it "
                                                                "derives from"))
        if sms is not None:
            units = _int("moe_deepep_num_sms", sms)
            if backend == "deepep":
                knobs["dispatch_compute_units"] = units
            else:  # DeepEP's SM count, not HybridEP's
                ignored.append("moe_deepep_num_sms")
        return
    if kind == "allgather":
        not_modelled.append(("moe_token_dispatcher_type", "the allgather dispatcher is not modelled; priced as the "
                                                          "all-to-all"))
    if kind:
        knobs["dispatch"] = "alltoall"
    ignored += [name for name in DISPATCH_FLAGS if name in flags and name != "moe_token_dispatcher_type"
                and not (name == "moe_flex_dispatcher_backend" and kind == "flex")]


def parse_args(text: str) -> dict:
    """A Megatron command line (or the argument part of it) -> {underscored name: value}.
    The launcher and the script (``torchrun --nproc_per_node 8 pretrain_gpt.py``) are skipped."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--megatron-args: cannot split the command line ({exc})") from None
    scripts = [k for k, t in enumerate(tokens) if t.endswith(".py")]  # torchrun ... pretrain_gpt.py --flags
    start = scripts[-1] + 1 if scripts else 0
    out, i = {}, next((k for k, t in enumerate(tokens) if k >= start and t.startswith("--")), len(tokens))
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"--megatron-args: {token!r} is not a --flag or a flag's value")
        name, eq, value = token[2:].partition("=")
        if not eq:  # a switch, one value, or several (nargs='+': --recompute-modules layernorm moe_act)
            end = next((k for k in range(i + 1, len(tokens)) if tokens[k].startswith("--")), len(tokens))
            values = tokens[i + 1:end]
            value = True if not values else values[0] if len(values) == 1 else values
            i = end - 1
        out[name.replace("-", "_")] = value
        i += 1
    return out


def from_args(text: str) -> MegatronPlan:
    return from_mapping(parse_args(text))


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def _expand(value):
    """Primus' ``${NAME:default}``: the environment's value, else the default."""
    if isinstance(value, str):
        full = _ENV.fullmatch(value.strip())
        if full:
            got = os.environ.get(full.group(1), full.group(2))
            return _scalar(got) if got is not None else None
        return _ENV.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)
    return value


def _scalar(text: str):
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~", ""):
        return None
    try:
        return int(text)
    except ValueError:
        return text


def primus_overrides(data) -> dict:
    """The Megatron arguments of a Primus experiment: ``modules.pre_trainer.overrides``
    (or any module's ``overrides``); a flat mapping is taken as Megatron arguments."""
    if not isinstance(data, dict):
        raise ConfigError("--primus-config: expected a YAML mapping")
    modules = data.get("modules")
    if isinstance(modules, dict):
        trainer = modules.get("pre_trainer") or next((m for m in modules.values() if isinstance(m, dict)), {})
        overrides = trainer.get("overrides") if isinstance(trainer, dict) else None
        if not isinstance(overrides, dict):
            raise ConfigError("--primus-config: modules.pre_trainer has no 'overrides' mapping of Megatron arguments")
        return {k: _expand(v) for k, v in overrides.items()}
    return {k: _expand(v) for k, v in data.items() if not isinstance(v, dict | list)}


def from_primus_yaml(text: str) -> MegatronPlan:
    try:
        import yaml  # optional: only --primus-config needs it
    except ImportError:
        raise ConfigError("--primus-config: reading YAML needs PyYAML (pip install pyyaml)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--primus-config: invalid YAML ({str(exc).splitlines()[0]})") from None
    return from_mapping(primus_overrides(data))
