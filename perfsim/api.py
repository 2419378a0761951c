"""The public facade: load inputs, simulate or estimate a step, time a collective."""

import functools
import logging
from dataclasses import fields, replace
from os import PathLike

from perfsim.estimators import engine, pipeline, summary
from perfsim.estimators.analytic import closed_form, link_loads
from perfsim.estimators.pipeline import checks_growth, steady_window
from perfsim.estimators.overlap import link_figures
from perfsim.cost.collectives import bus_bandwidth, collective_cost
from perfsim.errors import ConfigError, InfeasiblePlan
from perfsim.lowering.graph import build_graph
from perfsim.system.hardware import ClusterSpec
from perfsim.system.hardware import load_cluster as _load_cluster
from perfsim.lowering.layers import routed_tokens
from perfsim.lowering.memory import plan_memory
from perfsim.model.spec import ModelSpec
from perfsim.model.io import load_model as _load_model
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import (DEFAULT_RECOMPUTE_MODULES, V_SHAPES, ParallelPlan, Recompute,
                                    check_plan, derive_dp, group_shape, recompute_ladder)
from perfsim.cost.pricing import price
from perfsim.report import Report, assemble_report, extrapolate_figures, span_figures
from perfsim.plan.routing import UNIFORM, RoutingSpec, dropped_fraction, imbalance
from perfsim.plan.schedules import UNIT
from perfsim.plan.sharding import fewest_recompute_layers
from perfsim.plan.stragglers import NONE as NO_VARIABILITY
from perfsim.plan.stragglers import VariabilitySpec, ep_rank_speeds, gpu_speeds, stage_slowdowns
from perfsim.system.stacks import load_stack
from perfsim.system.specio import check_int, check_number, check_type
from perfsim.units import GiB, format_bytes

log = logging.getLogger(__name__)
ESTIMATORS = ("des", "analytic")
PLAN_KEYS = {f.name for f in fields(ParallelPlan)}
# Input bounds (not hardware numbers): past them the work an answer takes grows without use.
MAX_GPUS = 1 << 20  # ten times the 100k-GPU clusters the README targets
MAX_GBS = 1 << 24  # sequences per step
MAX_SEQ = 1 << 24  # tokens per sequence
MAX_BYTES = float(1 << 50)  # one collective: 1 PiB
# The engine walks every microbatch through every layer: ~2,000 layer passes a second on one
# core, so this keeps one simulate within a few seconds; the closed form has no such limit.
ENGINE_MAX_LAYER_PASSES = 8192
MAX_CAPACITY_FACTOR = 1024.0  # past num_experts / top_k no token is dropped; covers any expert count in use
AUTO_RECOMPUTE = "auto"  # recompute knob: the least recompute that fits (least_recompute)
MAX_LAYERS = 100_000  # the closed form prices ~25,000 layers a second; 10x the deepest model published


def load_model(model: str | ModelSpec) -> ModelSpec:
    check_type("model", model, (str, PathLike, ModelSpec), "a preset name, a model file path or a ModelSpec")
    spec = model if isinstance(model, ModelSpec) else _load_model(model)
    if spec.num_layers > MAX_LAYERS:
        raise ConfigError(f"model.num_layers: {spec.num_layers:,} layers (limit {MAX_LAYERS:,})")
    check_number("model.capacity_factor", spec.capacity_factor, 0.0, MAX_CAPACITY_FACTOR)
    return spec


def load_cluster(cluster: str | ClusterSpec, nodes: int | None = None, gpus: int | None = None) -> ClusterSpec:
    """A cluster by profile name or path, resized to ``nodes`` or to hold ``gpus``."""
    check_type("cluster", cluster, (str, PathLike, ClusterSpec), "a profile name, a profile path or a ClusterSpec")
    for name, value in (("nodes", nodes), ("gpus", gpus)):
        if value is not None:
            check_int(name, value, 1, MAX_GPUS)
    spec = cluster if isinstance(cluster, ClusterSpec) else _load_cluster(cluster)
    if nodes is not None and gpus is not None and gpus > nodes * spec.gpus_per_node:
        raise ConfigError(f"gpus: {gpus} GPUs do not fit on {nodes} nodes of {spec.gpus_per_node}")
    if nodes is None and gpus is None:
        return spec
    key = (id(spec), nodes, gpus)
    found = _RESIZED.get(key)
    if found is not None and found[0] is spec:  # the same resized object: the closed form's memo hits
        return found[1]
    if len(_RESIZED) > 64:
        _RESIZED.clear()
    resized = _resize(spec, nodes, gpus)
    _RESIZED[key] = (spec, resized)
    return resized


_RESIZED: dict[tuple, tuple[ClusterSpec, ClusterSpec]] = {}


def _resize(spec: ClusterSpec, nodes: int | None, gpus: int | None) -> ClusterSpec:
    if nodes is not None:
        spec = spec.with_nodes(nodes)
    elif gpus is not None:
        spec = spec.with_gpus(gpus)
    return spec


def make_plan(num_gpus: int, **knobs) -> ParallelPlan:
    """A ParallelPlan from keyword knobs; dp is derived from ``num_gpus`` when absent."""
    unknown = sorted(set(knobs) - PLAN_KEYS)
    if unknown:
        raise ConfigError(f"plan: unknown knob {unknown[0]!r} (known: {', '.join(sorted(PLAN_KEYS))})")
    knobs = {k: v for k, v in knobs.items() if v is not None}
    if "stack" in knobs:  # a software-stack profile: its overlap policy under the explicit knobs
        knobs["stack"] = load_stack(knobs["stack"])
        knobs = {**knobs["stack"].plan_defaults(knobs.get("dtype", "bf16")), **knobs}
    check_int("num_gpus", num_gpus, 1, MAX_GPUS)
    for key in ("tp", "pp", "cp"):  # derive_dp divides by them
        if key in knobs:
            check_int(f"plan.{key}", knobs[key], 1, MAX_GPUS)
    for key, most in (("gbs", MAX_GBS), ("seq", MAX_SEQ)):
        if key in knobs:
            check_int(f"plan.{key}", knobs[key], 1, most)
    if "dp" not in knobs:
        knobs["dp"] = derive_dp(num_gpus, knobs.get("tp", 1), knobs.get("pp", 1), knobs.get("cp", 1))
    if "gbs" not in knobs or "seq" not in knobs:
        raise ConfigError("plan: gbs and seq are required")
    return ParallelPlan(**knobs)


def _inputs(model, cluster, plan, nodes, gpus, knobs,
            routing: RoutingSpec = UNIFORM) -> tuple[ModelSpec, ClusterSpec, ParallelPlan, int]:
    model = load_model(model)
    cluster = load_cluster(cluster, nodes=nodes, gpus=gpus)
    num_gpus = gpus if gpus is not None else cluster.num_gpus
    auto = knobs.get("recompute") == AUTO_RECOMPUTE
    if plan is None:
        # a placeholder level that admits a named recompute_layers and module list (the plan
        # checks both); least_recompute picks the level
        placeholder = ("selective" if knobs.get("recompute_modules") not in (None, DEFAULT_RECOMPUTE_MODULES)
                       else "full" if knobs.get("recompute_layers") else None)
        plan = make_plan(num_gpus, **{**knobs, "recompute": placeholder} if auto else knobs)
    elif set(knobs) == {"stack"} and isinstance(plan, ParallelPlan):  # a plan priced under another stack
        plan = replace(plan, stack=load_stack(knobs["stack"]))
    elif knobs:
        raise ConfigError("plan: pass either a ParallelPlan or knobs, not both")
    check_type("plan", plan, ParallelPlan, "a ParallelPlan (or plan knobs)")
    stack = plan.stack.on_vendor(cluster.gpu.vendor)  # the stack's kernels on this GPU
    plan = plan if stack is plan.stack else replace(plan, stack=stack)
    check_plan(plan, model, num_gpus)
    return model, cluster, least_recompute(model, cluster, plan, routing) if auto else plan, num_gpus


def least_recompute(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                    routing: RoutingSpec = UNIFORM) -> ParallelPlan:
    """``plan`` with the least activation recompute that fits in the GPU's memory, as a
    framework user sets it (``recompute='auto'``): the first setting of the stack's ladder
    (``stack.recompute.auto``, lightest first) that fits; full when none does. Megatron-style
    stacks: none, selective, then full recompute of the first N layers of each pipeline chunk
    for the smallest N that fits (Megatron's --recompute-method block --recompute-num-layers
    N, "block"), then every layer. Per-op checkpointing ("op") is tried only where it is
    modelled (``recompute_ladder``: dense layers). A ``recompute_layers`` the plan already names is kept (block
    recompute of those layers at each level); its ``recompute_modules`` apply where it settles on
    selective, and a plan at any other level holds the default list. Under the expert-parallel all-to-all overlap
    Megatron-Core refuses full recompute, of every layer or a block ("disable full
    recomputation when enabling overlap_moe_expert_parallel_comm", megatron/training/arguments.py):
    the ladder stops before it, and a plan none of whose remaining settings fits keeps the
    lightest of them (reported out of memory)."""
    def fits(candidate: ParallelPlan) -> bool:
        return max(m.total_bytes for m in _plan_memory(model, candidate, routing)) <= cluster.gpu.hbm_bytes

    fixed = plan.recompute_layers
    no_full = plan.overlaps_ep_comm
    full = None if no_full else plan.at_recompute(Recompute.FULL, fixed)
    # returned when nothing fits: full recompute, or beside the overlap the last (heaviest) level tried
    fallback = plan.at_recompute(Recompute.NONE) if no_full else full
    for level in recompute_ladder(plan.stack.recompute.auto, model):
        if level == "full" or (no_full and level == "block"):
            break
        if level == "block":
            if fixed:
                continue  # the plan names its own block
            layers = fewest_recompute_layers(model, full, lambda n: fits(replace(full, recompute_layers=n)))
            if layers:
                return replace(full, recompute_layers=layers)
            continue
        recompute = Recompute(level)
        candidate = plan.at_recompute(recompute, 0 if recompute == Recompute.NONE else fixed)
        if fits(candidate):
            return candidate
        if no_full:
            fallback = candidate
    return fallback


def _check_options(estimator, check_memory, routing, variability, trace) -> None:
    if not isinstance(estimator, str) or estimator not in ESTIMATORS:
        raise ConfigError(f"engine: {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    check_type("check_memory", check_memory, bool, "True or False")
    check_type("trace", trace, bool, "True or False")
    if routing is not None:
        check_type("routing", routing, RoutingSpec, "a RoutingSpec (or None for uniform)")
    if variability is not None:
        check_type("variability", variability, VariabilitySpec, "a VariabilitySpec such as VariabilitySpec(cv=0.1)")


def _check_engine_work(model: ModelSpec, plan: ParallelPlan, fold: bool) -> None:
    """The engine walks the microbatches it simulates: folded, the short steps that check a
    growth against the next (``pipeline.steady_window``; a step whose growth takes longer to
    repeat walks up to FOLD_TRIES groups more)."""
    points = fold_points(plan) if fold else None
    if points:  # first + second, and second + a group where the plan leaves room to check the growth
        check = 2 * points[1] - points[0] if checks_growth(*points, plan.num_microbatches) else 0
        walked = sum(points) + check
    else:
        walked = plan.num_microbatches
    passes = walked * model.num_layers
    if passes > ENGINE_MAX_LAYER_PASSES:
        if points:
            smaller = "a shallower pipeline (it folds into short steps of ~2 pp vpp microbatches)"
        elif fold_points(plan):
            smaller = "let the engine fold the step (no --no-fold; fold=True)"
        else:
            smaller = "fewer microbatches (a larger mbs or a smaller gbs)"
        raise ConfigError(
            f"plan: the engine would walk {walked:,} microbatches x {model.num_layers:,} layers = "
            f"{passes:,} layer passes (limit {ENGINE_MAX_LAYER_PASSES:,}); use the closed form (--engine analytic, "
            f"estimator='analytic') or {smaller}")


_plan_memory = functools.lru_cache(maxsize=256)(plan_memory)  # immutable answers, reused per plan


def _memory_hint(plan: ParallelPlan) -> str:
    """What a user can change when a plan does not fit: less activation memory first (and,
    for FP8 with BF16 working weights, FP8 primary weights: half the weights' bytes)."""
    weights = ("; FP8 primary weights (fp8_params=True, --fp8-params) halve the working weights"
               if plan.dtype == "fp8" and not plan.fp8_params else "")
    if plan.overlaps_ep_comm:  # never with full recompute (ep_overlap_conflict)
        return ("Megatron-Core refuses full recompute beside the expert-parallel all-to-all overlap: "
                "without it (ep_comm_overlap=False, no --ep-comm-overlap) recompute='auto' may fit, or try a "
                "smaller mbs or more pp / ep" + weights)
    if plan.recompute != Recompute.FULL or plan.recompute_layers:
        return "recompute='auto' (--recompute auto) picks the least recompute that fits" + weights
    if plan.keeps_weights_gathered:  # its weights and gradients unsharded through the step
        return ("it does not fit with full recompute: ZeRO-3 gathering per pass (zero3_gather='per-pass', "
                "--zero3-gather per-pass) shards the weights and gradients during the step too" + weights)
    zero = "" if plan.zero >= 3 else ", a higher zero stage"
    return f"it does not fit with full recompute: try more tp / pp{zero} or a smaller mbs" + weights


def _memory_check(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, check_memory: bool,
                  routing: RoutingSpec = UNIFORM):
    memory = _plan_memory(model, plan, routing)
    worst = max(memory, key=lambda m: m.total_bytes)
    warnings = []
    if worst.total_bytes > cluster.gpu.hbm_bytes:
        message = (
            f"out of memory: stage {worst.stage} needs {format_bytes(worst.total_bytes)} per GPU "
            f"(weights {format_bytes(worst.weights_bytes)}, grads {format_bytes(worst.gradients_bytes)}, "
            f"optimizer {format_bytes(worst.optimizer_bytes)}, activations {format_bytes(worst.activations_bytes)}, "
            f"logits {format_bytes(worst.logits_bytes)}, fragmentation {format_bytes(worst.fragmentation_bytes)}"
            + (f", ZeRO buffers {format_bytes(worst.zero_buffers_bytes)}" if worst.zero_buffers_bytes else "")
            + (f", less {format_bytes(worst.reused_bytes)} the gradients reuse as activations free"
               if worst.reused_bytes else "") + ") "
            f"but {cluster.gpu.name} has {format_bytes(cluster.gpu.hbm_bytes)} "
            f"({cluster.gpu.hbm_bytes / GiB:.2f} GiB usable of {cluster.gpu.hbm_capacity_GB:g}); {_memory_hint(plan)}"
        )
        if check_memory:
            raise InfeasiblePlan(message)
        warnings.append(message)
    return memory, warnings


def simulate(
    model, cluster, plan: ParallelPlan | None = None, *, nodes: int | None = None, gpus: int | None = None,
    estimator: str = "des", check_memory: bool = True, routing: RoutingSpec | None = None,
    variability: VariabilitySpec | None = None, trace: bool = False, fold: bool = True, **knobs,
) -> Report:
    """Simulate one training step. ``estimator``: 'des' (SimPy engine) or 'analytic'
    (the closed form). ``routing``: MoE token routing (uniform by default);
    ``variability``: seeded per-GPU speed spread (none by default). The engine's report
    always holds its spans; the closed form lays spans out only with ``trace=True``.
    ``fold``: when there are many microbatches the engine simulates short steps past the
    pipeline's warm-up until the step's growth per group of microbatches repeats, and
    extends the last two linearly to the plan's microbatches (the spans are the longer
    one's; ``Report.simulated_microbatches`` says which: ``pipeline.steady_window``); False
    runs every microbatch. ``knobs`` are ParallelPlan fields; ``dispatch`` picks the MoE
    dispatch/combine implementation (``alltoall``, the default, or one of the cluster's
    ``[dispatch]`` tables: ``mori``, ``deepep``, ``deepep-ll``; ``perfsim.cost.dispatch``).

    Raises ConfigError for bad input and InfeasiblePlan when the plan does not fit in
    memory (pass ``check_memory=False`` to get a report with a warning instead).
    """
    _check_options(estimator, check_memory, routing, variability, trace)
    routing, variability = routing or UNIFORM, variability or NO_VARIABILITY
    model, cluster, plan, _ = _inputs(model, cluster, plan, nodes, gpus, knobs, routing)
    if estimator == "des":
        _check_engine_work(model, plan, fold)
    memory, warnings = _memory_check(model, cluster, plan, check_memory, routing)
    warnings += _routing_warnings(model, plan, routing) + _gradient_warnings(plan)
    extras = _moe_and_straggler_costs(model, cluster, plan, routing, variability)
    common = dict(memory=memory, model=model, plan=plan, cluster=cluster, estimator=estimator, warnings=warnings,
                  **extras)
    if estimator == "analytic":
        cf = closed_form(model, cluster, routing, variability)
        figures = summary.estimate(cf, plan).__dict__
        spans = summary.spans(cf, plan) if trace else []
        return assemble_report(figures=figures, spans=spans, straggler_slowdown=max(cf.speeds(plan)[0]), **common)
    speeds = gpu_speeds(plan.world_size, variability)
    slow = stage_slowdowns(plan, speeds)
    ep_speeds = ep_rank_speeds(plan, speeds) if model.is_moe and plan.ep > 1 else None
    weights = (closed_form(model, cluster, routing, variability).pass_weights(plan)  # a V-shape schedule's order
               if plan.schedule in V_SHAPES else UNIT)
    runs: dict[int, tuple] = {}

    def run(m: int) -> tuple:
        if m not in runs:
            short = plan if m == plan.num_microbatches else plan.with_microbatches(m)
            graph = price(build_graph(model, short, routing=routing, ep_speeds=ep_speeds, weights=weights), cluster, slow)
            runs[m] = _engine_figures(graph)
        return runs[m]

    start = fold_points(plan) if fold else None
    points = steady_window(lambda m: run(m)[0]["step_time_s"], *start, plan.num_microbatches) if start else None
    if points is None:
        figures, spans = run(plan.num_microbatches)
        return assemble_report(figures=figures, spans=spans, straggler_slowdown=max(slow), **common)
    figures = extrapolate_figures(run(points[0])[0], run(points[1])[0], *points, plan.num_microbatches)
    return assemble_report(figures=figures, spans=run(points[1])[1], straggler_slowdown=max(slow),
                           simulated_microbatches=points, **common)


def _engine_figures(graph) -> tuple[dict, list]:
    """Run a priced graph on the engine: the report's figures (with per-link busy and
    exposed seconds of the critical stage) and the spans."""
    spans = engine.run(graph)
    figures = span_figures(spans)
    loads: dict[str, dict[str, float]] = {}
    for op in graph.ops:
        if op.stage == figures["critical_stage"] and op.is_comm:
            key = f"{op.category}/{op.collective.coll if op.collective else op.kind}"
            for link, busy in link_loads([op]).items():
                loads.setdefault(key, {})[link] = loads.get(key, {}).get(link, 0.0) + busy
    figures["links"] = link_figures(loads, figures["comm_by_collective"], figures["step_time_s"])
    return figures, spans


def fold_points(plan: ParallelPlan) -> tuple[int, int] | None:
    """Microbatch counts of the first two short steps the engine may extend from, or None
    to run them all. Both are past the pipeline's warm-up (2 pp vpp + 2 microbatches: every
    stage in its steady 1F1B cycle; 2 without a pipeline, where only the first microbatch
    (ZeRO-1/2 gathers) and the last (gradient drain) differ), a whole number of
    interleaving groups (pp) apart; ``pipeline.steady_window`` moves them on until the
    step's growth per group repeats; folding pays only when the plan has at least twice
    the second count."""
    # one pipeline stage: only microbatch 0 and the last differ, so 2 and 3; schedules run one after
    # another (plan.pipeline_flushes): one and two of them; else the closed form's points
    if plan.pipeline_flushes > 1:
        first, second = plan.flush_microbatches, 2 * plan.flush_microbatches
    else:
        first, second = (2, 3) if plan.pp == 1 else pipeline.fold_points(plan.pp, plan.vpp)
    return (first, second) if plan.num_microbatches >= 2 * second else None


def _closed_form_step(model, cluster, plan, routing, variability) -> float:
    return closed_form(model, cluster, routing, variability).step_time_s(plan)


def _moe_and_straggler_costs(model, cluster, plan, routing, variability) -> dict:
    """Imbalance (max/mean routed tokens per EP rank) and what skew and GPU variability
    cost: the closed-form step minus the same plan with uniform routing, or without
    variability (zero when the feature is off)."""
    out = {"moe_imbalance": 1.0, "moe_imbalance_cost_s": 0.0, "straggler_cost_s": 0.0}
    moe = model.is_moe and plan.ep > 1
    if moe:
        speeds = ep_rank_speeds(plan, gpu_speeds(plan.world_size, variability))
        out["moe_imbalance"] = imbalance(model, plan, routed_tokens(model, plan), routing, speeds)
    skewed = moe and routing.skewed
    if not skewed and variability.cv == 0:
        return out
    full = _closed_form_step(model, cluster, plan, routing, variability)
    if skewed:
        out["moe_imbalance_cost_s"] = full - _closed_form_step(model, cluster, plan, UNIFORM, variability)
    if variability.cv > 0:
        out["straggler_cost_s"] = full - _closed_form_step(model, cluster, plan, routing, NO_VARIABILITY)
    return out


def _gradient_warnings(plan: ParallelPlan) -> list[str]:
    """What the step's gradient reduction leaves out: a pipeline under ZeRO-2 / per-pass
    ZeRO-3 reduces once per step (``plan.grad_syncs``) while memory counts sharded gradients."""
    if plan.pp == 1 or plan.step_zero not in (2, 3) or plan.num_microbatches == 1:
        return []
    return [f"zero {plan.zero} with pp {plan.pp}: the gradients are reduced once, after the last of "
            f"{plan.num_microbatches} microbatches, while memory counts them sharded; a stack that reduce-scatters "
            "every microbatch (MaxText's pipeline) is slower, one that keeps them unsharded until then "
            "(PyTorch pipelining: zero3_gather='once') needs more memory"]


def _routing_warnings(model: ModelSpec, plan: ParallelPlan, routing: RoutingSpec) -> list[str]:
    if not model.is_moe or plan.ep == 1:
        return []
    routed = routed_tokens(model, plan)
    out = []
    skew = imbalance(model, plan, routed, routing)
    if skew > 1.0:
        out.append(f"MoE imbalance: each layer's busiest EP rank gets {skew:.2f}x the mean tokens (mean over the MoE layers)")
    dropped = dropped_fraction(model, plan, routed, routing)
    if dropped > 0:
        out.append(f"capacity factor {model.capacity_factor} drops {100 * dropped:.1f}% of routed tokens")
    return out


def estimate(model, cluster, plan: ParallelPlan | None = None, **kwargs) -> Report:
    """The closed-form estimate (about a millisecond per plan once its blocks are priced;
    ``trace=True`` also lays out spans for a trace)."""
    return simulate(model, cluster, plan, estimator="analytic", **kwargs)


def _coll(op: str) -> Coll:
    try:
        return Coll(op)
    except ValueError:
        raise ConfigError(f"op: {op!r} is not one of {', '.join(c.value for c in Coll)}") from None


def collective(op: str, size_bytes: float, ranks: int, cluster, protocol: str | None = None,
               algorithm: str | None = None, launch: str = "mpi", graph: bool = False,
               impl: str | None = None) -> dict:
    """Time of one collective over ``ranks`` consecutive GPUs (rccl-tests conventions);
    ``algorithm`` forces ring, tree, direct, hierarchical or nvls, ``protocol`` ll, ll128 or
    simple; ``launch`` is ``mpi`` (one process per GPU) or ``single-process`` (-g N),
    ``graph`` prices graph capture; ``impl`` picks an all-to-all implementation of the
    profile's ``[dispatch]`` (rccl, mori, deepep, ...)."""
    if not isinstance(op, str):
        raise ConfigError(f"op: expected a collective name, got {op!r}")
    coll = _coll(op)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int | float) or not 0 <= size_bytes <= MAX_BYTES:
        raise ConfigError(f"size: must be a number of bytes in [0, {MAX_BYTES:g}], got {size_bytes!r}")
    for name, value in (("protocol", protocol), ("algorithm", algorithm)):
        if value is not None:
            check_type(name, value, str, "a name or None")
    spec = load_cluster(cluster)
    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"gpus: must be a positive integer, got {ranks!r}")
    if ranks > spec.num_gpus:
        raise ConfigError(f"gpus: {ranks} ranks do not fit on {spec.name} ({spec.num_gpus} GPUs)")
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int | float):
        raise ConfigError(f"size: must be a number of bytes, got {size_bytes!r}")
    if ranks < 2 and coll is not Coll.SEND_RECV:
        raise ConfigError(f"gpus: a collective needs at least 2 ranks, got {ranks}")
    if size_bytes < 0:
        raise ConfigError(f"size: must be >= 0 bytes, got {size_bytes!r}")
    shape = group_shape(max(ranks, 2), 1, spec.gpus_per_node)
    cost = collective_cost(coll, size_bytes, shape, spec, protocol, algorithm, launch=launch, graph=graph, impl=impl)
    algbw, busbw = bus_bandwidth(coll, size_bytes, ranks, cost.time_s)
    return {
        "op": coll.value, "size_bytes": int(size_bytes), "ranks": ranks, "time_us": cost.time_s * 1e6,
        "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw / 1e9,
        "algorithm": cost.algorithm, "protocol": cost.protocol,
    }
