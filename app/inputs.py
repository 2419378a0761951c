"""The planner's inputs as one plain, JSON-able dict, and how they become a perfsim call.

The same dict is the cache key of a simulation, what a saved scenario stores, and what
the Search page writes when a user opens a plan. Pages never build perfsim calls by hand.
"""

import copy
import dataclasses
import json

import perfsim
from perfsim.model import io as modelio
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, FP8_RECIPES, PLAN_SWITCHES, RECOMPUTE_MODULE_LEVELS
from perfsim.system.stacks import ZERO3_GATHERS
from perfsim.plan.routing import RoutingSpec, routing_fields
from perfsim.plan.stragglers import VariabilitySpec

KNOBS = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "gbs", "seq")
CHOICES = {
    "dtype": ("bf16", "fp16", "fp8"),
    "recompute": ("none", "selective", "op", "full", "auto"),  # auto: the least that fits (api.least_recompute)
    "schedule": ("1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "v-half", "v-min"),  # the V-shaped ones need vpp 2
    # blocked: uniform loads, each token's top-k one block of expert ids (a benchmark's balanced gate)
    "distribution": ("uniform", "blocked", "zipf", "dirichlet"),
    "estimator": ("des", "analytic"),
}

# ZAYA1-base on 128 nodes x 8 MI300X + Pollara, as trained (Zyphra ZAYA1 report; perfsim/model/presets/zaya1-base.toml)
DEFAULT = {
    "model": "zaya1-base",
    "model_config": None,  # text of an uploaded Hugging Face config.json; overrides "model"
    "cluster": "mi300x-pollara",
    "nodes": 128,
    "knobs": {
        "tp": 1, "pp": 1, "vpp": 1, "dp": 1024, "ep": 1, "etp": 1, "cp": 1, "zero": 1,
        "mbs": 1, "gbs": 2048, "seq": 4096, "dtype": "bf16", "recompute": "none", "schedule": "1f1b",
    },
    "routing": {"distribution": "uniform", "skew": 1.0, "concentration": 1.0, "seed": 0, "placement": "contiguous"},
    # the rest of `perfsim simulate`'s plan knobs, at the CLI's defaults (ParallelPlan / ModelSpec)
    "fidelity": {
        # None: the software stack's overlap policy decides (its plan defaults); True/False override it
        "tp_comm_overlap": None, "ep_comm_overlap": None, "overlap_grad_reduce": None, "overlap_param_gather": None, "overlap_cu_share": 0.0, "dma_offload": False,
        "grad_bucket_mb": 80.0, "capacity_factor": None, "gpu_variability": 0.0, "variability_seed": 0,
        "first_stage_layers": 0, "last_stage_layers": 0, "recompute_layers": 0,
        # Megatron's account-for-embedding/loss-in-pipeline-split: the ends take a layer slot
        "account_for_embedding": False, "account_for_loss": False,
        # --mtp-layers (Megatron --mtp-num-layers) and --pipeline-layout (--pipeline-model-parallel-layout; "" = none)
        "mtp_layers": 0, "pipeline_layout": "",
        # --pipeline-flushes: the step's microbatches as that many pipeline schedules one after another (1: one)
        "pipeline_flushes": 1,
        # --recompute-modules: what selective recompute re-runs (Megatron's); used under recompute selective / auto
        "recompute_modules": ["core_attn"],
        # MoE dispatch/combine implementation (--dispatch): alltoall or one of the cluster's [dispatch.<name>]
        "dispatch": "alltoall",
        # --dispatch-fp8: FP8 (+ scales) in the dispatch direction; only under dtype fp8, on an MoE model
        "dispatch_fp8": False,
        # --shared-expert-overlap: shared experts beside the all-to-alls; only on a model with shared experts
        "shared_expert_overlap": False,
        # --dispatch-compute-units: SMs / CUs the dispatch kernels hold; None: the cluster profile's
        "dispatch_compute_units": None,
        # --fp8-recipe: "" (the stack's), delayed or current; only under dtype fp8
        "fp8_recipe": "",
        # --fp8-params / --no-fp8-params: FP8 primary weights; only under dtype fp8; None: the stack's
        "fp8_params": None,
        # --zero3-gather: "" (the stack's), per-pass, once or pipeline; how ZeRO-3 holds its weights
        "zero3_gather": "",
        "clip_grad": True,  # --no-clip-grad turns the gradient clip off
        "real_data": False,  # --real-data: the stack's input pipeline cost per step ([data])
    },
    "model_edit": {},  # ModelSpec fields changed on the Plan page (from the preset's values)
    "hardware_edit": {},  # GPU / link / NIC numbers changed on the Plan page (editing.HARDWARE_FIELDS)
    "estimator": "des",
    "stack": "ideal",  # software-stack profile (perfsim/hardware_profiles/stacks); ideal adds no framework cost
}
PLACEMENTS = ("contiguous", "speed")


def default_inputs() -> dict:
    return copy.deepcopy(DEFAULT)


def normalize(inputs: dict) -> dict:
    """``inputs`` over the defaults: keys missing from an older scenario take default values."""
    out = default_inputs()
    for key, value in (inputs or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def cache_key(inputs: dict) -> str:
    """Canonical JSON: equal inputs, equal key."""
    return json.dumps(inputs, sort_keys=True)


def with_plan(inputs: dict, plan: dict) -> dict:
    """``inputs`` with the knobs of ``plan`` (a Report.plan dict or any subset of knobs)."""
    out = copy.deepcopy(inputs)
    for key in (*KNOBS, "dtype", "recompute", "schedule"):
        if key in plan and plan[key] is not None:
            out["knobs"][key] = str(plan[key]) if key in CHOICES else int(plan[key])
    # the plan's switches the Plan page holds as fidelity knobs, so an opened search plan prices as searched:
    # dispatch, block recompute (full on the first N layers per chunk), TP-comm overlap, gradient bucket size
    fidelity = dict(out.get("fidelity") or {})
    if plan.get("dispatch"):
        fidelity["dispatch"] = str(plan["dispatch"])
    if "recompute_layers" in plan:
        fidelity["recompute_layers"] = int(plan["recompute_layers"] or 0)
    if plan.get("recompute_modules"):
        fidelity["recompute_modules"] = [str(m) for m in plan["recompute_modules"]]
    for key in ("tp_comm_overlap", "ep_comm_overlap", "shared_expert_overlap"):
        if plan.get(key) is not None:
            fidelity[key] = bool(plan[key])
    if plan.get("grad_bucket_bytes"):
        fidelity["grad_bucket_mb"] = float(plan["grad_bucket_bytes"]) / 1e6
    if plan.get("zero3_gather") in ZERO3_GATHERS:
        fidelity["zero3_gather"] = str(plan["zero3_gather"])
    out["fidelity"] = fidelity
    return out


def dispatch_options(cluster) -> tuple[str, ...]:
    """The MoE dispatch implementations a plan may use on ``cluster`` (a ClusterSpec or a
    profile name): alltoall, then the profile's [dispatch.<name>] tables."""
    from perfsim.cost.dispatch import implementations

    return implementations(perfsim.load_cluster(cluster) if isinstance(cluster, str) else cluster)


def dispatch_choice(inputs: dict, cluster, model=None) -> str:
    """The plan's ``dispatch``: the stored choice when ``cluster`` offers it and the model
    has experts, else alltoall (a scenario saved on another cluster, a dense model)."""
    chosen = (inputs.get("fidelity") or {}).get("dispatch") or DEFAULT["fidelity"]["dispatch"]
    if model is not None and not model.num_experts:
        return DEFAULT["fidelity"]["dispatch"]
    return chosen if chosen in dispatch_options(cluster) else DEFAULT["fidelity"]["dispatch"]


def nodes_for(num_gpus: int, gpus_per_node: int) -> int:
    """Nodes needed to hold ``num_gpus`` GPUs (at least one)."""
    return max(1, -(-int(num_gpus) // int(gpus_per_node)))


def model_spec(inputs: dict):
    """The ModelSpec: an uploaded config.json when given, else the preset or path."""
    text = inputs.get("model_config")
    if not text:
        return perfsim.load_model(inputs["model"])
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise perfsim.ConfigError(f"model config: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(config, dict):
        raise perfsim.ConfigError("model config: a config.json must hold a JSON object")
    return modelio.from_hf_config(config, inputs.get("model") or "uploaded")


def routing_spec(inputs: dict) -> RoutingSpec:
    r = inputs.get("routing") or {}
    fields = routing_fields(r.get("distribution", "uniform"), "MoE routing", skew=float(r.get("skew", 1.0)),
                            concentration=float(r.get("concentration", 1.0)))  # as --routing names them
    return RoutingSpec(**fields, seed=int(r.get("seed", 0)), speed_aware=r.get("placement") == "speed")


def fidelity_knobs(inputs: dict) -> dict:
    """The Plan page's fidelity knobs as ParallelPlan fields (as `perfsim simulate` passes them)."""
    f = {**DEFAULT["fidelity"], **(inputs.get("fidelity") or {})}
    overlap = {k: bool(f[k]) for k in ("tp_comm_overlap", "ep_comm_overlap", "overlap_grad_reduce",
                                       "overlap_param_gather") if f[k] is not None}
    return {**overlap,  # unset: the stack's overlap policy (api.simulate applies its plan defaults)
            "comm_compute_interference": float(f["overlap_cu_share"]), "dma_offload": bool(f["dma_offload"]),
            "grad_bucket_bytes": int(float(f["grad_bucket_mb"]) * 1e6),
            "first_stage_layers": int(f["first_stage_layers"]), "last_stage_layers": int(f["last_stage_layers"]),
            "account_for_embedding": bool(f["account_for_embedding"]), "account_for_loss": bool(f["account_for_loss"]),
            "recompute_layers": int(f["recompute_layers"]), "clip_grad": bool(f["clip_grad"]),
            "mtp_layers": int(f["mtp_layers"] or 0), "pipeline_layout": str(f["pipeline_layout"] or "").strip(),
            "pipeline_flushes": int(f.get("pipeline_flushes") or 1),
            "real_data": bool(f["real_data"]), "zero3_gather": zero3_gather_choice(inputs),
            **recompute_modules_choice(inputs), **fp8_params_choice(inputs)}


def recompute_modules_choice(inputs: dict) -> dict:
    """``recompute_modules`` where the plan's recompute is selective or auto and the page names
    other modules than the attention core (the API refuses them beside another recompute)."""
    modules = tuple((inputs.get("fidelity") or {}).get("recompute_modules") or DEFAULT_RECOMPUTE_MODULES)
    recompute = (inputs.get("knobs") or {}).get("recompute")
    if recompute not in RECOMPUTE_MODULE_LEVELS or modules == DEFAULT_RECOMPUTE_MODULES:
        return {}
    return {"recompute_modules": modules}


def fp8_params_choice(inputs: dict) -> dict:
    """``fp8_params`` where the user set it under dtype fp8 (unset: the stack's ``[fp8]
    primary_weights``, which api.simulate applies)."""
    chosen = (inputs.get("fidelity") or {}).get("fp8_params")
    fp8 = (inputs.get("knobs") or {}).get("dtype") == "fp8"
    return {"fp8_params": bool(chosen)} if fp8 and chosen is not None else {}


def zero3_gather_choice(inputs: dict) -> str:
    """``zero3_gather``: the stored policy (per-pass, once, pipeline); "" (the stack's) otherwise."""
    chosen = str((inputs.get("fidelity") or {}).get("zero3_gather") or "")
    return chosen if chosen in ZERO3_GATHERS else ""


def variability_spec(inputs: dict) -> VariabilitySpec:
    f = {**DEFAULT["fidelity"], **(inputs.get("fidelity") or {})}
    return VariabilitySpec(cv=float(f["gpu_variability"]), seed=int(f["variability_seed"]))


def model_with_overrides(inputs: dict):
    """model_spec with the Plan page's shape edits and capacity factor (None: the model's own)."""
    spec = model_spec(inputs)
    edits = dict(inputs.get("model_edit") or {})
    factor = (inputs.get("fidelity") or {}).get("capacity_factor")
    if factor is not None:
        edits["capacity_factor"] = float(factor)
    if edits:
        spec = dataclasses.replace(spec, name=f"{spec.name} (edited)" if inputs.get("model_edit") else spec.name, **edits)
    return spec


def cluster_spec(inputs: dict):
    """The cluster at the inputs' node count, with the Plan page's hardware edits."""
    cluster = perfsim.load_cluster(inputs["cluster"], nodes=int(inputs["nodes"]))
    edits = inputs.get("hardware_edit") or {}
    if not edits:
        return cluster
    gpu, node, fabric = cluster.gpu, cluster.node, cluster.fabric
    if "dense_tflops" in edits:
        dtype = inputs["knobs"].get("dtype", "bf16")
        scale = edits["dense_tflops"] / gpu.peak_tflops.get(dtype, gpu.peak_tflops["bf16"])
        gpu = dataclasses.replace(gpu, peak_tflops={k: v * scale for k, v in gpu.peak_tflops.items()})
    gpu = dataclasses.replace(gpu, **{k: edits[k] for k in ("hbm_capacity_GB", "hbm_bw_GBps") if k in edits})
    if "hbm_capacity_GB" in edits:
        gpu = dataclasses.replace(gpu, hbm_capacity_source=f"edited in the planner: {edits['hbm_capacity_GB']:g} GB as GiB, "
                                  f"less the profile's driver reserve ({gpu.hbm_reserved_MiB:g} MiB)")
    if "link_bw_GBps" in edits:
        ratio = edits["link_bw_GBps"] / node.link_bw_GBps
        node = dataclasses.replace(node, link_bw_GBps=edits["link_bw_GBps"], link_bw_raw_GBps=node.link_bw_raw_GBps * ratio)
    if "nic_bw_Gbps" in edits:
        fabric = dataclasses.replace(fabric, nic_bw_Gbps=edits["nic_bw_Gbps"])
    return dataclasses.replace(cluster, name=f"{cluster.name} (edited)", gpu=gpu, node=node, fabric=fabric)


def refit(knobs: dict, num_gpus: int, num_layers: int, num_experts: int) -> tuple[dict, list[str]]:
    """``knobs`` with the ones that no longer fit a new model or GPU count reset (dp to
    'derive', ep/etp/vpp/tp/pp/cp to 1), and one line per reset saying why."""
    out, notes = dict(knobs), []

    def reset(key, value, why):
        if out.get(key) != value:
            notes.append(f"{key} {out.get(key)} -> {value or 'auto'}: {why}")
            out[key] = value
    if out.get("tp", 1) * out.get("pp", 1) * out.get("cp", 1) > num_gpus or num_gpus % (
            out.get("tp", 1) * out.get("pp", 1) * out.get("cp", 1)):
        for key in ("tp", "pp", "cp"):
            reset(key, 1, f"tp*pp*cp must divide the {num_gpus} GPUs")
    if out.get("dp") and out["tp"] * out["pp"] * out["cp"] * out["dp"] != num_gpus:
        reset("dp", 0, f"derived from the {num_gpus} GPUs")
    if num_layers % out.get("pp", 1):
        reset("pp", 1, f"{num_layers} layers do not split into pp={out['pp']} stages")
    if num_layers % (out.get("pp", 1) * out.get("vpp", 1)):
        reset("vpp", 1, f"{num_layers} layers do not split into pp*vpp chunks")
    if out.get("ep", 1) > 1 and (not num_experts or num_experts % out["ep"]):
        reset("ep", 1, f"the model has {num_experts or 'no'} experts")
    if out.get("etp", 1) > 1 and not num_experts:
        reset("etp", 1, "the model has no experts")
    return out, notes


def plan_knobs(inputs: dict) -> dict:
    """Knobs for perfsim.simulate; dp 0 means 'derive from the GPU count'."""
    knobs = dict(inputs["knobs"])
    if not knobs.get("dp"):
        knobs.pop("dp", None)
    return knobs


def simulate(inputs: dict):
    """perfsim.simulate (or estimate) for ``inputs``; OOM is a report warning, not an error."""
    model, cluster = model_with_overrides(inputs), cluster_spec(inputs)
    return perfsim.simulate(
        model, cluster, estimator=inputs.get("estimator", "des"), check_memory=False, routing=routing_spec(inputs),
        variability=variability_spec(inputs), trace=True, stack=inputs.get("stack") or "ideal", **plan_knobs(inputs),
        **fidelity_knobs(inputs), dispatch=dispatch_choice(inputs, cluster, model),
        dispatch_fp8=dispatch_fp8_choice(inputs, model), fp8_recipe=fp8_recipe_choice(inputs),
        dispatch_compute_units=dispatch_units_choice(inputs, model),
        shared_expert_overlap=shared_overlap_choice(inputs, model),
    )


def search_switches(inputs: dict, model) -> dict:
    """The Plan page's plan switches a search applies to every plan (perfsim.search's
    ``plan_knobs``): gradient clip, the overlap choices the user set (unset: the stack's
    policy), real data where chosen, FP8 dispatch, shared-expert overlap and the dispatch's
    compute units where they apply to ``model``, the FP8 recipe, the ZeRO-3 gather policy and
    the pipeline schedules per step (search applies them to its pipelined plans)."""
    fidelity = fidelity_knobs(inputs)
    knobs = {k: v for k, v in fidelity.items() if k in PLAN_SWITCHES and (v or k != "real_data")}
    if dispatch_fp8_choice(inputs, model):
        knobs["dispatch_fp8"] = True
    if shared_overlap_choice(inputs, model):
        knobs["shared_expert_overlap"] = True
    if fp8_recipe_choice(inputs):
        knobs["fp8_recipe"] = fp8_recipe_choice(inputs)
    if (units := dispatch_units_choice(inputs, model)) is not None:
        knobs["dispatch_compute_units"] = units
    if zero3_gather_choice(inputs):
        knobs["zero3_gather"] = zero3_gather_choice(inputs)
    if fidelity["pipeline_flushes"] > 1:  # the pipelined plans' schedules per step
        knobs["pipeline_flushes"] = fidelity["pipeline_flushes"]
    return knobs


def fp8_recipe_choice(inputs: dict) -> str:
    """``fp8_recipe``: the stored recipe (delayed, current) under dtype fp8; "" (the stack's)
    otherwise, so a BF16 plan never carries one."""
    chosen = str((inputs.get("fidelity") or {}).get("fp8_recipe") or "")
    return chosen if chosen in FP8_RECIPES and inputs["knobs"].get("dtype") == "fp8" else ""


def dispatch_units_choice(inputs: dict, model=None) -> int | None:
    """``dispatch_compute_units``: the stored count on a model with experts; None (the
    cluster profile's) otherwise."""
    chosen = (inputs.get("fidelity") or {}).get("dispatch_compute_units")
    if chosen is None:
        return None
    model = model if model is not None else model_spec(inputs)
    return int(chosen) if model.is_moe else None


def dispatch_fp8_choice(inputs: dict, model=None) -> bool:
    """``dispatch_fp8``: the stored choice where it applies (dtype fp8, a model with experts);
    otherwise off, so a BF16 plan or a dense model never carries it."""
    chosen = bool((inputs.get("fidelity") or {}).get("dispatch_fp8"))
    model = model if model is not None else model_spec(inputs)
    return chosen and inputs["knobs"].get("dtype") == "fp8" and model.is_moe


def shared_overlap_choice(inputs: dict, model=None) -> bool:
    """``shared_expert_overlap``: the stored choice where the model has shared experts;
    otherwise off, so a model without them never carries it."""
    chosen = bool((inputs.get("fidelity") or {}).get("shared_expert_overlap"))
    model = model if model is not None else model_spec(inputs)
    return chosen and model.has_shared_experts


def describe(inputs: dict) -> str:
    """One line naming the model, cluster and the knobs that differ from 1."""
    k = inputs["knobs"]
    axes = " ".join(f"{a}={k[a]}" for a in ("tp", "pp", "vpp", "dp", "ep", "etp", "cp") if k.get(a, 1) != 1)
    model = "uploaded config" if inputs.get("model_config") else inputs["model"]
    model += " (edited)" if inputs.get("model_edit") else ""
    cluster = inputs["cluster"] + (" (edited)" if inputs.get("hardware_edit") else "")
    return (f"{model} on {inputs['nodes']} x {cluster} nodes: {axes or 'dp=auto'} zero={k['zero']} "
            f"mbs={k['mbs']} gbs={k['gbs']} seq={k['seq']} {k['dtype']}"
            + (f" stack={inputs['stack']}" if inputs.get("stack", "ideal") != "ideal" else "")
            + (f" dispatch={dispatch}" if (dispatch := (inputs.get("fidelity") or {}).get("dispatch") or "alltoall")
               != "alltoall" else ""))
