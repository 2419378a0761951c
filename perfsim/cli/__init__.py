"""``perfsim`` command line: presentation only, everything else through ``perfsim.api``."""

import argparse
import dataclasses
import json
import math
import sys

from perfsim import api
from perfsim.cli import args as a
from perfsim.errors import ConfigError, InfeasiblePlan, PerfsimError
from perfsim.system.hardware import list_profiles, load_gpu
from perfsim.system.kernel_tables import table_provenance
from perfsim.calibration.accuracy import text_block as accuracy_text
from perfsim.model.io import list_models
from perfsim.report import Report
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, FP8_RECIPES, RECOMPUTE_MODULES, Schedule
from perfsim.system.stacks import ZERO3_GATHERS
from perfsim.plan.routing import MAX_ROUTING_PARAM, RoutingSpec, load_histogram, routing_fields
from perfsim.plan.stragglers import VariabilitySpec
from perfsim.system.specio import check_finite_output, check_output, write_atomic
from perfsim.units import format_bytes

PLAN_INTS = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "gbs", "seq")
PLAN_TYPES = {"zero": a.ZERO, "gbs": a.GBS, "seq": a.SEQ, "mbs": a.GBS}
MAX_SIZES = 4096  # rows one collective sweep may print
MAX_CAPACITY_FACTOR = 1024.0  # past E / top_k no token is dropped; 1024 covers any expert count in use


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise ConfigError(f"{self.prog}: {message}")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name, preset .toml or HF config.json")
    p.add_argument("--cluster", default="mi300x-pollara", help="cluster profile name or .toml path")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--nodes", type=a.NODES, help="number of nodes (overrides the profile)")
    size.add_argument("--gpus", type=a.GPUS, help="number of GPUs (the cluster is sized to hold them)")
    for knob in PLAN_INTS:
        p.add_argument(f"--{knob}", type=PLAN_TYPES.get(knob, a.POSITIVE), default=None)
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp8"])
    p.add_argument("--recompute", default=None, choices=["none", "selective", "op", "full", "auto"],
                   help="activation recompute; selective: the attention core (Megatron's); op: torchtitan's per-op "
                        "checkpointing (every other matmul output kept, elementwise ops recomputed; dense models); "
                        "auto: the least that fits in memory among the stack's settings ([recompute] auto; "
                        "Megatron-style stacks: none, selective, full on the fewest layers per pipeline chunk, full; "
                        "torchtitan: none, op, fewest layers, full; maxtext: none, full)")
    p.add_argument("--recompute-modules", type=a.recompute_modules, default=None,
                   help="with --recompute selective (or auto): what it re-runs, comma-separated, as Megatron's "
                        f"--recompute-modules: {', '.join(RECOMPUTE_MODULES)} (default core_attn; mla_up_proj: MLA's "
                        "query / key / value up projections and their rope; layernorm: an MoE layer's pre-MLP norm, "
                        "the others being fused into the next linear under Transformer Engine; moe_act: the routed "
                        "experts' activation; shared_experts: the shared experts; mlp: a dense layer's MLP; moe: an "
                        "MoE layer's router, dispatch, experts and combine)")
    p.add_argument("--schedule", default=None, choices=[s.value for s in Schedule],
                   help="pipeline schedule; with --vpp > 1 gpipe loops breadth-first, 1f1b interleaves, zb-h1 splits W; "
                        "zbv / v-half / v-min are V-shaped (--vpp 2; 1F1B's activation memory, half, a third)")
    p.add_argument("--no-overlap", action="store_true", help="do not overlap gradient reduction with backward")
    p.add_argument("--no-param-prefetch", action="store_true",
                   help="ZeRO parameter all-gathers not prefetched: each layer waits for its gather (ZeRO-3), "
                        "or the updated weights are gathered after the optimizer step (ZeRO-1/2)")
    p.add_argument("--no-clip-grad", action="store_true",
                   help="no gradient clipping (default: clip by global norm, as Megatron --clip-grad 1.0 and MaxText do: "
                        "a norm + scale pass over the gradient shard and, under ZeRO, a scalar all-reduce before the optimizer step)")
    p.add_argument("--real-data", action="store_true",
                   help="the run reads real data: the stack's input pipeline adds its unhidden host time per step "
                        "([data] host_s_per_mtoken; 0 in every shipped stack but maxtext); default: synthetic data, none")
    p.add_argument("--grad-bucket-size", type=a.size(1), default=None,
                   help="gradient bucket in bytes (e.g. 80M; default 40M bf16 params)")
    p.add_argument("--overlap-cu-share", type=a.FRACTION_BELOW_ONE, default=None,
                   help="share of compute throughput lost while comm overlaps it (default 0)")
    p.add_argument("--dma-offload", action="store_true", help="comm on DMA engines: no compute interference")
    tp_overlap = p.add_mutually_exclusive_group()
    tp_overlap.add_argument("--tp-comm-overlap", action="store_true",
                            help="overlap TP all-gather/reduce-scatter with the adjacent GEMM (Megatron userbuffers)")
    tp_overlap.add_argument("--no-tp-comm-overlap", action="store_true",
                            help="TP all-gather/reduce-scatter on the chain, where the stack overlaps them by default")
    p.add_argument("--ep-comm-overlap", action="store_true",
                   help="overlap an MoE layer's expert-parallel all-to-alls with another microbatch's compute "
                        "(Megatron-Core --overlap-moe-expert-parallel-comm, Megatron-Bridge moe_a2a_overlap: "
                        "pp 1 or vpp > 1; not with TP-comm overlap or cp > 1; fully recomputed layers keep them)")
    p.add_argument("--first-stage-layers", type=a.integer(0, 1 << 20), default=None,
                   help="layers on the first pipeline stage, the other stages splitting the rest evenly "
                        "(Megatron --decoder-first-pipeline-num-layers; with vpp > 1 the first virtual stage, "
                        "under the interleaved or a V-shape schedule)")
    p.add_argument("--last-stage-layers", type=a.integer(0, 1 << 20), default=None,
                   help="layers on the last pipeline stage (Megatron --decoder-last-pipeline-num-layers; with vpp > 1 "
                        "the last virtual stage: on the last stage when interleaved, on stage 0 under a V shape)")
    p.add_argument("--account-for-embedding", action="store_true",
                   help="the embedding takes a layer slot of the first (virtual) stage: layers + slots split evenly, "
                        "that stage a layer short, none where each holds one (Megatron "
                        "--account-for-embedding-in-pipeline-split; pp > 1; not with --first/--last-stage-layers)")
    p.add_argument("--account-for-loss", action="store_true",
                   help="the loss takes a layer slot of the last (virtual) stage (Megatron "
                        "--account-for-loss-in-pipeline-split)")
    p.add_argument("--pipeline-flushes", type=a.integer(1, 1 << 20), default=None, metavar="N",
                   help="gradient accumulation as N pipeline schedules one after another, each filling and draining "
                        "the pipeline, as torch.distributed.pipelining runs one per accumulation step (torchtitan, NeMo "
                        "AutoModel); must divide the step's microbatches; needs pp > 1 (default 1: one schedule, as "
                        "Megatron runs every microbatch)")
    p.add_argument("--mtp-layers", type=a.integer(0, 64), default=None,
                   help="multi-token-prediction layers (DeepSeek-V3's MTP; Megatron --mtp-num-layers): each one more "
                        "transformer layer like the model's last, with its embedding, norms and 2h->h projection, on the "
                        "last virtual stage (or where --pipeline-layout puts it), and one more LM head and loss")
    p.add_argument("--pipeline-layout", default=None, metavar="LAYOUT",
                   help="which layers each virtual stage holds, Megatron's --pipeline-model-parallel-layout: stages in "
                        "forward order split by '|', E embedding, t decoder layer, m MTP layer, L loss, x*N and (...)*N "
                        "repeat (e.g. 'Et|(tt|)*30mL' for DeepSeek-V3 at pp 8 vpp 4); its stages must be pp x vpp")
    p.add_argument("--recompute-layers", type=a.integer(0, 1 << 20), default=None,
                   help="recompute only the first N layers of each pipeline stage chunk (Megatron --recompute-method "
                        "block --recompute-num-layers N; default every layer)")
    p.add_argument("--routing", default="uniform",
                   help="MoE token routing: uniform, blocked (uniform loads, each token's top-k experts one block "
                        "of expert ids, as NeMo AutoModel's benchmark gate routes: a dispatch kernel reaches the fewest "
                        "ranks), zipf[:S], dirichlet[:A] or a histogram file (CSV/JSON)")
    p.add_argument("--routing-histogram", default=None, help="measured tokens per expert (CSV or JSON file)")
    p.add_argument("--expert-placement", default=None,
                   help="contiguous (default), speed (hot experts on fast GPUs) or EP rank per expert: 0,0,1,1,...")
    p.add_argument("--capacity-factor", type=a.number(0, MAX_CAPACITY_FACTOR), default=None,
                   help="MoE capacity factor (0: no dropping)")
    p.add_argument("--gpu-variability", type=a.FRACTION_BELOW_ONE, default=0.0,
                   help="std-dev of per-GPU relative speed (seeded)")
    p.add_argument("--routing-skew", type=a.number(0, MAX_ROUTING_PARAM), default=1.0,
                   help="Zipf exponent for --routing zipf")
    p.add_argument("--routing-concentration", type=a.number(0, MAX_ROUTING_PARAM, lo_open=True), default=1.0,
                   help="Dirichlet alpha for --routing dirichlet")
    p.add_argument("--seed", type=a.SEED, default=0, help="seed for routing")
    p.add_argument("--stack", default=None,
                   help="software-stack profile name or .toml path (ideal, megatron-primus, maxtext, torchtitan, nemo; "
                        "default ideal: no framework cost)")
    p.add_argument("--dispatch", default=None,
                   help="MoE dispatch/combine implementation: alltoall (default: RCCL/NCCL all-to-all) or one of the "
                        "cluster profile's [dispatch] tables (deepep, deepep-ll on NVIDIA; rccl, mori on AMD)")
    p.add_argument("--dispatch-compute-units", type=a.integer(0, 1 << 20), default=None, metavar="N",
                   help="SMs / CUs the dispatch and combine kernels hold while they run (DeepEP's num_sms, Megatron's "
                        "--moe-deepep-num-sms): compute overlapped with them (--ep-comm-overlap) runs on the rest; "
                        "default: the cluster profile's (deepep 20 on NVIDIA)")
    p.add_argument("--shared-expert-overlap", action="store_true",
                   help="run an MoE layer's shared experts beside its dispatch and combine all-to-alls (Megatron-Core "
                        "--moe-shared-expert-overlap): TP gather, up projection and activation beside the dispatch, "
                        "down projection and TP scatter beside the combine; needs shared experts, not with "
                        "--ep-comm-overlap or the shared_experts recompute module")
    p.add_argument("--dispatch-fp8", action="store_true",
                   help="FP8 dispatch (needs --dtype fp8): tokens go to their experts as FP8 plus one FP32 scale per "
                        "128 values, as DeepEP and DeepSeek-V3 do; the combine stays BF16")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--fp8-params", action="store_true",
                         help="FP8 primary weights (needs --dtype fp8; Transformer Engine fp8_model_init, Megatron "
                              "--fp8-param-gather): weights held in FP8, no weight cast, ZeRO gathers in FP8; "
                              "default: the stack's ([fp8] primary_weights: on under nemo)")
    weights.add_argument("--no-fp8-params", action="store_true",
                         help="BF16 working weights under --dtype fp8 even where the stack keeps FP8 ones")
    p.add_argument("--fp8-recipe", default=None, choices=list(FP8_RECIPES),
                   help="FP8 scaling recipe (needs --dtype fp8): delayed (scales from earlier steps' amax history, "
                        "Megatron-LM's default) or current (an amax pass before each cast: --fp8-recipe tensorwise, "
                        "NVIDIA's FP8-CS); default: the stack's")
    p.add_argument("--zero3-gather", default=None, choices=list(ZERO3_GATHERS),
                   help="how ZeRO-3 holds its weights through the step: per-pass (gathered before every forward and "
                        "backward pass of every microbatch, FSDP2's default), once (gathered once, weights and gradients "
                        "unsharded until the last backward: PyTorch pipelining's FSDP path, MaxText "
                        "pipeline_fsdp_ag_once) or pipeline (once with pp > 1, torchtitan's default); default: the stack's")


def _plan_knobs(args) -> dict:
    knobs = {k: getattr(args, k) for k in PLAN_INTS + ("dtype", "recompute", "schedule")}
    knobs.update(a.switch_knobs(args))
    if args.grad_bucket_size is not None:
        knobs["grad_bucket_bytes"] = int(args.grad_bucket_size)
    knobs["comm_compute_interference"] = args.overlap_cu_share
    if args.dma_offload:
        knobs["dma_offload"] = True
    if args.tp_comm_overlap:
        knobs["tp_comm_overlap"] = True
    knobs["stack"] = args.stack
    knobs["dispatch"] = args.dispatch
    knobs["dispatch_compute_units"] = args.dispatch_compute_units
    knobs["fp8_recipe"] = args.fp8_recipe
    knobs["zero3_gather"] = args.zero3_gather
    knobs["first_stage_layers"], knobs["last_stage_layers"] = args.first_stage_layers, args.last_stage_layers
    knobs["recompute_layers"] = args.recompute_layers
    knobs["mtp_layers"], knobs["pipeline_layout"] = args.mtp_layers, args.pipeline_layout
    knobs["pipeline_flushes"] = args.pipeline_flushes
    knobs["account_for_embedding"] = True if args.account_for_embedding else None
    knobs["account_for_loss"] = True if args.account_for_loss else None
    knobs["recompute_modules"] = args.recompute_modules
    return {k: v for k, v in knobs.items() if v is not None}


def _cmd_simulate(args) -> int:
    from perfsim.cli import frameworks

    knobs, model = frameworks.apply(args, _plan_knobs(args), api.load_model(args.model))
    if not model.is_moe:
        a.refuse_given(args, MOE_ONLY, f"applies to MoE models; {model.name} is dense")
        if args.routing != "uniform":
            raise ConfigError(f"--routing: applies to MoE models; {model.name} is dense")
    knobs.setdefault("gbs", None)
    knobs.setdefault("seq", None)
    if knobs["gbs"] is None or knobs["seq"] is None:
        raise ConfigError("simulate: --gbs and --seq are required")
    if args.trace:
        check_output(args.trace, args.force, "--trace")
    if args.html:
        check_output(args.html, args.force, "--html")
    if args.capacity_factor is not None:
        model = dataclasses.replace(model, capacity_factor=args.capacity_factor)
    variability = VariabilitySpec(cv=args.gpu_variability, seed=args.seed)
    from perfsim.cli import traceout

    if args.trace_stages and not args.trace:
        raise ConfigError("--trace-stages: needs --trace FILE")
    stages = traceout.parse_stages(args.trace_stages, knobs.get("pp") or 1)
    if args.trace:
        print("perfsim: simulating the step with every op recorded for the trace...", file=sys.stderr, flush=True)
    if args.no_fold and args.engine != "des":
        raise ConfigError("--no-fold: only the engine folds a long step (--engine des)")
    report = api.simulate(model, args.cluster, nodes=args.nodes, gpus=args.gpus, estimator=args.engine,
                          check_memory=not args.allow_oom, routing=_routing(args), variability=variability,
                          trace=bool(args.trace or args.html), fold=not args.no_fold, **knobs)
    check_finite_output(report.to_dict(), "simulate")
    if args.trace:
        traceout.write(report, args.trace, stages)
    if args.html:
        from perfsim.cli import html_report

        _write_text(args.html, html_report.render(report), "--html")
    if args.json:
        print(dumps(report.to_dict()))
    else:
        auto = "\n" + _auto_recompute_note(report) if args.recompute == "auto" else ""
        print(_format_report(report) + auto)
    return 0


def _write_text(path: str, text: str, flag: str) -> None:
    write_atomic(path, text, flag)  # a unique temporary per writer, renamed into place


def dumps(obj) -> str:
    """Strict JSON (no NaN / Infinity): refuse, naming the place, rather than print it."""
    check_finite_output(obj, "json")
    return json.dumps(obj, indent=2, allow_nan=False, default=str)


def _routing(args) -> RoutingSpec:
    """--routing uniform | blocked | zipf[:S] | dirichlet[:A] | FILE, --routing-histogram, --expert-placement."""
    spec = dict(skew=args.routing_skew, concentration=args.routing_concentration, seed=args.seed)
    if args.routing_histogram:
        spec.update(distribution="histogram", histogram=load_histogram(args.routing_histogram))
    else:
        spec.update(routing_fields(args.routing, "--routing", skew=args.routing_skew,
                                   concentration=args.routing_concentration))
    placement = args.expert_placement
    if placement == "speed":
        spec["speed_aware"] = True
    elif placement is not None and placement != "contiguous":
        try:
            spec["placement"] = tuple(a.integer(0, a.MAX_GPUS)(x) for x in placement.split(","))
        except argparse.ArgumentTypeError:
            raise ConfigError(f"--expert-placement: {placement!r} is not contiguous, speed or a list of ranks") from None
    try:
        return RoutingSpec(**spec)
    except ConfigError as exc:
        flag = "--expert-placement" if "placement" in str(exc) else "--routing"
        raise ConfigError(f"{flag}: {exc}") from None


def _auto_recompute_note(r: Report) -> str:
    """What --recompute auto chose (api.least_recompute's ladder)."""
    level, layers = r.plan["recompute"], r.plan.get("recompute_layers", 0)
    modules = ", ".join(r.plan.get("recompute_modules") or DEFAULT_RECOMPUTE_MODULES)
    chosen = {"none": "no recompute", "selective": f"selective recompute ({modules})",
              "op": "per-op checkpointing (torchtitan's)"}.get(
        level, f"full recompute of the first {layers} layers of each pipeline chunk" if layers else
        "full recompute of every layer")
    why = "the least that fits in memory" if r.fits else "nothing lighter fits, and this does not fit either"
    return f"recompute auto   {chosen}: {why} (among the settings of stack {r.stack})"


def _format_report(r: Report) -> str:
    plan = " ".join(f"{k}={v}" for k, v in r.plan.items())
    lines = [
        f"{r.model} on {r.cluster} ({r.world_size} GPUs), estimator {r.estimator}, stack {r.stack}"
        + ("".join(f", {k} {v}" for k, v in r.kernel_libraries.items()) if r.kernel_libraries else ""),
        f"plan: {plan}",
        f"step time        {r.step_time_s * 1e3:10.2f} ms",
        f"tokens/s         {r.tokens_per_s:14,.0f}   ({r.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"TFLOPS/GPU       {r.tflops_per_gpu:10.1f}     MFU {100 * r.mfu:.1f}%",
        f"peak memory/GPU  {format_bytes(r.peak_memory_bytes)} of {format_bytes(r.memory_capacity_bytes)}",
        f"breakdown (where critical stage {r.critical_stage}'s step goes; sums to the step, its idle time is "
        "pipeline_bubble):",
    ]
    for name, seconds in r.breakdown.items():
        if seconds > 0:
            lines.append(f"  {name:<20} {seconds * 1e3:10.2f} ms  {100 * seconds / r.step_time_s:5.1f}%")
    lines += _format_fidelity(r)
    lines += accuracy_text(r.accuracy)
    lines += [f"warning: {w}" for w in r.warnings]
    return "\n".join(lines)


CRITICAL_PATH_NOTES = {  # what the critical-path line means, per estimator
    "des": "                 (the longest chain of dependent ops through all stages: where the critical stage waits, "
           "the chain runs through the ops of the stage it waits for, so its times differ from the breakdown's "
           "and hold no bubble)",
    "analytic": "                 (closed form: it traces no op chain, so this is the critical stage's breakdown, "
                "bubble included; the engine (--engine des) finds the chain)",
}


def _format_fidelity(r: Report) -> list[str]:
    lines = [f"pipeline bubble  {r.bubble_s * 1e3:10.2f} ms  ({100 * r.bubble_fraction:.1f}%)   "
             f"exposed comm {r.exposed_comm_s * 1e3:.2f} ms"]
    for link, v in r.links.items():
        lines.append(f"link {link:<11} busy {v['busy_s'] * 1e3:10.2f} ms  ({v['utilization']:.0%} of the step)   "
                     f"exposed comm on it {v['exposed_s'] * 1e3:.2f} ms")
    if r.moe_imbalance > 1.0 or r.moe_imbalance_cost_s:
        lines.append(f"MoE imbalance    {r.moe_imbalance:10.2f}x    costs {r.moe_imbalance_cost_s * 1e3:.2f} ms")
    if r.straggler_slowdown > 1.0:
        lines.append(f"stragglers       {r.straggler_slowdown:10.3f}x    costs {r.straggler_cost_s * 1e3:.2f} ms")
    if r.simulated_microbatches:
        first, second = r.simulated_microbatches
        total = r.plan["gbs"] // (r.plan["mbs"] * r.plan["dp"])
        lines.append(f"engine folded    simulated {first} and {second} of {total:,} microbatches "
                     "and extended the step linearly from them (--no-fold simulates every one)")
    top = list(r.critical_path_s.items())[:4]
    if top:
        path = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in top)
        lines.append(f"critical path    {r.critical_path_ops:,} ops, {sum(r.critical_path_s.values()) * 1e3:.1f} ms: {path}")
        lines.append(CRITICAL_PATH_NOTES.get(r.estimator, CRITICAL_PATH_NOTES["des"]))
    return lines


def _sizes(begin: int, end: int, factor: float) -> list[int]:
    if end < begin:
        raise ConfigError(f"-e: max size {end} is below min size {begin} (-b)")
    if not (math.isfinite(factor) and factor > 1):
        raise ConfigError(f"-f: step factor must be a finite number > 1, got {factor}")
    count = math.floor(math.log(end / begin) / math.log(factor)) + 1 if end > begin else 1
    if count > MAX_SIZES:
        raise ConfigError(f"-f: {factor} from -b {begin} to -e {end} makes {count:,} sizes (limit {MAX_SIZES:,}); "
                          "raise -f or narrow -b/-e")
    sizes, size = [], begin
    while size <= end:
        sizes.append(int(size))
        size *= factor
    return sizes


def _cmd_collective(args) -> int:
    cluster = api.load_cluster(args.cluster, nodes=args.nodes, gpus=args.gpus if args.nodes is None else None)
    sizes = _sizes(args.minbytes, args.maxbytes, args.stepfactor)
    rows = [api.collective(args.op, s, args.gpus, cluster, protocol=args.protocol, algorithm=args.algo,
                           launch=args.launch, graph=args.graph, impl=args.impl)
            for s in sizes]
    check_finite_output(rows, "collective")
    if args.json:
        print(dumps(rows))
        return 0
    print(f"# perfsim collective: {args.op} over {args.gpus} GPUs of {cluster.name} (predicted)")
    print(f"#{'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}  algo/proto")
    print(f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for r in rows:
        print(f" {r['size_bytes']:>12} {r['size_bytes'] // 4:>12} {'float':>6} {r['time_us']:>10.2f} "
              f"{r['algbw_GBps']:>8.2f} {r['busbw_GBps']:>8.2f}  {r['algorithm']}/{r['protocol']}")
    return 0


def _cmd_calibrate(args) -> int:
    from perfsim.calibration.calibrate import calibrate  # layer 7

    if args.runs:
        from perfsim.cli import runs

        a.refuse_given(args, RUNS_UNUSED["calibrate"], "not used with --runs (the runs name their own clusters; "
                "calibrate --runs fits a stack profile)")
        return runs.cmd_calibrate(args)
    a.refuse_given(args, {"--stack": "stack", "--fit": "fit", "--workers": "workers"},
                   "needs --runs (a stack profile is fitted to measured runs)")
    check_output(args.out, args.force, "--out")
    args.cluster = args.cluster or DEFAULT_CLUSTER
    result = calibrate(args.cluster, rccl_logs=args.rccl_log, kernel_csvs=args.gemm_csv, p2p=args.p2p, out=args.out,
                       force=args.force, fit_windows=not args.fix_windows, in_place=args.in_place,
                       regenerate_gemm=args.regenerate_gemm, collective_tables=args.collective_csv,
                       series=args.series, dispatch_tables=args.dispatch_csv, algorithm=args.algo,
                       protocol=args.protocol)
    print(f"# perfsim calibrate: {result.cluster.name} from {args.cluster} -> {result.path}")
    for f in result.fits:
        err = "" if f.mape_before is None else f"MAPE {f.mape_before:6.2f}% -> {f.mape_after:6.2f}%  "
        print(f"{f.name:<12} {f.num_points:>4} points  {err}{f.detail}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


DEFAULT_CLUSTER = "mi300x-pollara"
# options of calibrate / validate that measure hardware, which a --runs call would silently ignore
_HARDWARE = {"--cluster": "cluster", "--rccl-log": "rccl_log", "--in-place": "in_place", "--algo": "algo",
             "--protocol": "protocol"}
RUNS_UNUSED = {
    "calibrate": {**_HARDWARE, "--kernel-csv": "gemm_csv", "--p2p": "p2p", "--collective-csv": "collective_csv",
                  "--series": "series", "--dispatch-csv": "dispatch_csv", "--fix-windows": "fix_windows",
                  "--regenerate-gemm": "regenerate_gemm"},
    "validate": {**_HARDWARE, "--kernel-csv": "kernel_csv", "--collective-csv": "collective_csv", "--series": "series"},
}

# simulate's options that only an MoE model reads
MOE_ONLY = {"--capacity-factor": "capacity_factor", "--dispatch": "dispatch", "--dispatch-fp8": "dispatch_fp8",
            "--dispatch-compute-units": "dispatch_compute_units",
            "--ep-comm-overlap": "ep_comm_overlap", "--shared-expert-overlap": "shared_expert_overlap",
            "--routing-histogram": "routing_histogram",
            "--expert-placement": "expert_placement"}


def _need_plotly(flag: str) -> None:
    """A report that needs plotly says so in one line (exit 2) before any work is done."""
    try:
        import plotly  # noqa: F401 - optional: only the HTML reports need it
    except ImportError:
        raise ConfigError(f"{flag}: the HTML report needs plotly, which is not installed "
                          "(pip install plotly, or pip install 'perfsim[planner]')") from None


def _cmd_validate(args) -> int:
    from perfsim.calibration.validate import validate, write_html  # layer 7

    if args.runs:
        from perfsim.cli import runs

        a.refuse_given(args, RUNS_UNUSED["validate"], "not used with --runs (the runs name their own clusters)")
        if args.fit and not args.loso:
            raise ConfigError("--fit: needs --loso (validate --runs prices the runs at the stack profiles as they are; "
                              "perfsim calibrate --runs fits one)")
        if args.stack and args.loso:
            raise ConfigError("--stack: with --loso each stack is refitted to its own runs; drop --stack, or drop "
                              "--loso to price every run under it")
        if args.html:
            _need_plotly("--html")
        return runs.cmd_validate(args, dumps)
    a.refuse_given(args, {"--stack": "stack", "--fit": "fit", "--loso": "loso", "--workers": "workers"}, "needs --runs")
    if args.html:
        _need_plotly("--html")
    if args.html:
        check_output(args.html, args.force, "--html")
    args.cluster = args.cluster or DEFAULT_CLUSTER
    result = validate(args.cluster, rccl_logs=args.rccl_log, kernel_csvs=args.kernel_csv, in_place=args.in_place,
                      algorithm=args.algo, protocol=args.protocol, collective_tables=args.collective_csv,
                      series=args.series)
    if args.html:
        write_html(result, args.html, plotlyjs=args.plotlyjs)
    check_finite_output(result.to_dict(), "validate")
    if args.json:
        print(dumps(result.to_dict()))
    else:
        print(f"# perfsim validate: {result.cluster}; error = (predicted - measured) / measured")
        width = max([16] + [len(p.label) for p in result.points])  # a point's label is never cut
        print(f"{'category':<58} {'point':>{width}} {'measured_us':>12} {'predicted_us':>12} {'error_%':>8}")
        for p in result.points:
            print(f"{p.category[:58]:<58} {p.label:>{width}} {p.measured_s * 1e6:>12.3f} {p.predicted_s * 1e6:>12.3f} "
                  f"{p.error_pct:>+8.2f}")
        for cat, err in result.by_category().items():
            print(f"MAPE {err:6.2f}%  {cat}")
        print(f"MAPE {result.mape:6.2f}%  overall ({len(result.points)} points)")
        for note in result.notes:
            print(f"note: {note}")
    if args.max_mape is not None and result.mape > args.max_mape:
        print(f"perfsim: accuracy gate failed: MAPE {result.mape:.2f}% > --max-mape {args.max_mape}%", file=sys.stderr)
        return 1
    return 0


def _add_forced_args(parser) -> None:
    parser.add_argument("--algo", default=None,
                        help="the algorithm the --rccl-log runs forced (NCCL_ALGO: ring, tree, nvls, nvls_tree), where the logs do "
                             "not print it (a log run with NCCL_DEBUG=INFO does and is priced on it)")
    parser.add_argument("--protocol", default=None,
                        help="the protocol the --rccl-log runs forced (NCCL_PROTO: ll, ll128, simple), likewise")


def _add_calibration_parsers(sub) -> None:
    cal = sub.add_parser("calibrate", help="fit a cluster profile to measurements; write a new profile")
    cal.add_argument("--cluster", default=None, help=f"base profile name or .toml path (default {DEFAULT_CLUSTER})")
    cal.add_argument("--rccl-log", action="append", default=[], help="rccl-tests/nccl-tests stdout log (repeatable)")
    cal.add_argument("--gemm-csv", "--kernel-csv", dest="gemm_csv", action="append", default=[],
                     help="kernel sweep CSV (schema: validation/KERNEL_CSV.md; repeatable)")
    cal.add_argument("--p2p", action="append", default=[], help="point-to-point bandwidth CSV or matrix (repeatable)")
    cal.add_argument("--collective-csv", action="append", default=[],
                     help="multi-node collective table (validation/data/multinode/collectives_multinode.csv layout; repeatable)")
    cal.add_argument("--series", action="append", default=[], help="use only this series of --collective-csv (repeatable)")
    cal.add_argument("--dispatch-csv", action="append", default=[],
                     help="MoE dispatch/combine table (MORI-EP / DeepEP rows of the same layout; repeatable)")
    cal.add_argument("--out", required=True, help="where to write the calibrated profile (.toml)")
    cal.add_argument("--force", action="store_true", help="replace --out if it exists")
    cal.add_argument("--fix-windows", action="store_true", help="keep the protocol and direct-kernel size windows")
    cal.add_argument("--in-place", action="store_true", help="fit the in-place rccl-tests columns")
    _add_forced_args(cal)
    cal.add_argument("--regenerate-gemm", action="store_true", help="new GEMM table knots over the measured sizes")
    _add_runs_args(cal, "fit a software-stack profile to these measured runs (validation/runs/*.csv layout) "
                        "and write it to --out")
    cal.set_defaults(func=_cmd_calibrate)
    val = sub.add_parser("validate", help="predicted vs measured; exit 1 when --max-mape is exceeded")
    val.add_argument("--cluster", default=None, help=f"profile name or .toml path (default {DEFAULT_CLUSTER})")
    val.add_argument("--rccl-log", action="append", default=[], help="rccl-tests/nccl-tests stdout log (repeatable)")
    val.add_argument("--kernel-csv", "--gemm-csv", dest="kernel_csv", action="append", default=[],
                     help="kernel sweep CSV (repeatable)")
    val.add_argument("--collective-csv", action="append", default=[],
                     help="multi-node collective table (validation/data/multinode/collectives_multinode.csv layout; "
                          "repeatable): each series priced on the path and launch it ran")
    val.add_argument("--series", action="append", default=[],
                     help="use only this series of --collective-csv (repeatable)")
    val.add_argument("--in-place", action="store_true", help="use the in-place rccl-tests columns")
    _add_forced_args(val)
    val.add_argument("--html", help="write a Plotly report here (works offline)")
    val.add_argument("--plotlyjs", default="embed", choices=["embed", "directory"],
                     help="embed plotly.js in the report, or write plotly.min.js beside it")
    val.add_argument("--max-mape", type=a.number(0), help="accuracy gate: exit 1 when the overall MAPE (%%) exceeds it")
    val.add_argument("--force", action="store_true", help="replace an existing --html report")
    val.add_argument("--json", action="store_true")
    _add_runs_args(val, "measured training runs (validation/runs/*.csv layout): signed error per run, MAPE per "
                        "stack, model family, scale and source")
    val.add_argument("--loso", action="store_true",
                     help="with --runs: fit each stack leaving one source out and price the held-out source")
    val.set_defaults(func=_cmd_validate)
    prj = sub.add_parser("project", help="fit the stack to one measured run, predict the same plan on --nodes nodes")
    prj.add_argument("--runs", action="append", required=True, help="runs CSV holding the measured run (repeatable)")
    prj.add_argument("--id", required=True, help="the run to project")
    prj.add_argument("--nodes", type=a.NODES, required=True, help="target number of nodes")
    prj.add_argument("--keep", default="per_gpu", choices=["per_gpu", "global"],
                     help="keep the per-GPU batch (weak scaling, default) or the global batch")
    prj.add_argument("--fit", action="append", default=None, help="stack parameter fitted to the run (default: the one parameter one run identifies: the routed-expert "
                          "speed of an MoE run's dispatch path with kernels of its own, else the kernels' speed, its GPU "
                          "vendor's where the stack sets one)")
    prj.add_argument("--json", action="store_true")
    prj.set_defaults(func=_cmd_project)


def _cmd_project(args) -> int:
    from perfsim.cli import runs

    return runs.cmd_project(args, dumps)


def _add_runs_args(p, runs_help: str) -> None:
    p.add_argument("--runs", action="append", default=[], help=runs_help + " (repeatable)")
    p.add_argument("--stack", default=None, help="with --runs: stack profile to use (validate) or fit (calibrate)")
    p.add_argument("--fit", action="append", default=None,
                   help="with --runs: a free stack parameter to fit (repeatable; default: the stack profile's calibration "
                        "protocol, [calibration] fit, among the parameters the runs identify; where it names none: kernels.speed, or kernels.speed_amd and "
                        "kernels.speed_nvidia where the runs span both GPU vendors, the routed-expert "
                        "speed of each MoE dispatch path the runs use, and data.host_s_per_mtoken where runs on real and "
                        "synthetic data are both given; one run: the one parameter it identifies, as project fits; also "
                        "launch.layer_overhead_us, launch.kernel_gap_us, moe.host_sync_us)")
    p.add_argument("--workers", type=a.integer(1, 4096), default=None,
                   help="with --runs: price the runs in this many local worker processes (default: one, this process); "
                        "the figures do not depend on it")


def _cmd_list(args) -> int:
    print("clusters: " + ", ".join(list_profiles("cluster")))
    print("gpus:     " + ", ".join(list_profiles("gpu")))
    print("nodes:    " + ", ".join(list_profiles("node")))
    print("models:   " + ", ".join(list_models()))
    from perfsim.system.stacks import list_stacks

    print("stacks:   " + ", ".join(list_stacks()))
    if getattr(args, "provenance", False):
        for name in list_profiles("gpu"):
            print(f"\n{name}:")
            for table, status, source in table_provenance(load_gpu(name)):
                print(f"  {table:<18} {status:<9} {source}")
        from perfsim.system.hardware import cluster_provenance
        from perfsim.system.stacks import load_stack, stack_provenance

        for name in list_profiles("cluster"):
            print(f"\ncluster {name}:")
            for table, status, source in cluster_provenance(api.load_cluster(name)):
                print(f"  {table:<18} {status:<9} {source}")
        for name in list_stacks():
            print(f"\nstack {name}:")
            for table, status, source in stack_provenance(load_stack(name)):
                print(f"  {table:<18} {status:<9} {source}")
    if getattr(args, "accuracy", False):
        from perfsim.calibration.accuracy import summary_lines

        print("\n" + "\n".join(summary_lines() or ["no accuracy figures shipped with this build"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="perfsim", description="Predict LLM training step time on GPU clusters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sim = sub.add_parser("simulate", help="simulate one training step")
    _add_plan_args(sim)
    sim.add_argument("--engine", default="des", choices=["des", "analytic"])
    sim.add_argument("--no-fold", action="store_true",
                     help="the engine simulates every microbatch (by default a step of many is extended from "
                          "short steps once its growth per group of microbatches repeats)")
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here (.json.gz: gzip-compressed)")
    sim.add_argument("--trace-stages", help="only these pipeline stages in the trace: 0,3 or first,last")
    sim.add_argument("--allow-oom", action="store_true", help="report a plan that does not fit instead of failing")
    sim.add_argument("--force", action="store_true", help="replace an existing --trace / --html file")
    sim.add_argument("--html", help="write a self-contained HTML run report here (plan, breakdown, memory, "
                                    "comm sizes per collective and layer, timeline)")
    from perfsim.cli import frameworks

    frameworks.add_arguments(sim)
    sim.set_defaults(func=_cmd_simulate)
    col = sub.add_parser("collective", help="rccl-tests-style collective benchmark (predicted)")
    col.add_argument("--op", required=True)
    col.add_argument("--gpus", "-g", type=a.GPUS, required=True)
    col.add_argument("--cluster", default="mi300x-pollara")
    col.add_argument("--nodes", type=a.NODES)
    col.add_argument("-b", "--minbytes", type=a.size(1), default="8")
    col.add_argument("-e", "--maxbytes", type=a.size(1), default="128M")
    col.add_argument("-f", "--stepfactor", type=a.number(1, 1e6, lo_open=True), default=2.0)
    col.add_argument("--protocol", default=None, help="force a protocol (ll, ll128, simple)")
    col.add_argument("--algo", default=None, help="force an algorithm (ring, tree, direct, hierarchical, nvls, nvls_tree)")
    col.add_argument("--launch", default="mpi", choices=["mpi", "single-process"],
                     help="rccl-tests launch: one process per GPU (-np N -g 1) or one process for all (-g N)")
    col.add_argument("--graph", action="store_true", help="graph capture (rccl-tests -G 1): no per-call launch cost")
    col.add_argument("--impl", default=None, help="all-to-all implementation from the profile's [dispatch] (rccl, mori, deepep)")
    col.add_argument("--json", action="store_true")
    col.set_defaults(func=_cmd_collective)
    _add_calibration_parsers(sub)
    from perfsim.cli.design import add_commands as add_design_commands  # sizing, moe-width, goodput, reshard

    add_design_commands(sub)
    from perfsim.cli.search import add_command as add_search_command  # search

    add_search_command(sub)
    lst = sub.add_parser("list", help="list hardware profiles and model presets")
    lst.add_argument("--provenance", action="store_true",
                     help="per GPU: each kernel table, measured (fitted to its own data) or assumed/derived, and its "
                          "source; per cluster: its node, fabric, collectives and dispatch tables, fitted, sourced or "
                          "assumed; per stack: each table, fitted (perfsim calibrate --runs), sourced or assumed")
    lst.add_argument("--accuracy", action="store_true",
                     help="perfsim's own held-out figures: per stack (published runs), per GPU kernel table, per "
                          "cluster's collectives, and after a one-run calibration (docs/accuracy.md)")
    lst.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except InfeasiblePlan as exc:
        print(f"perfsim: infeasible plan: {exc}", file=sys.stderr)
        return 2
    except PerfsimError as exc:
        print(f"perfsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except (MemoryError, RecursionError, OverflowError) as exc:  # an input too large for any check to foresee
        print(f"perfsim: error: an input is too large ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
