"""``perfsim sizing | moe-width | goodput | reshard``: model design and run planning
commands (presentation only; the work is in sizing, moe_width, goodput, checkpoint)."""

import csv
import io
import json
import math

from perfsim import api
from perfsim.cli import args as a
from perfsim.design import checkpoint, goodput, moe_width, sizing
from perfsim.errors import ConfigError
from perfsim.system.specio import check_finite_output
from perfsim.units import format_bytes

MAX_ALIGN = 1 << 16
MAX_EXPERTS = 4096  # experts per layer one width sweep may try
MAX_PARAMS = 1e15  # parameter budgets
MAX_BATCH = 1 << 20


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_EXPERTS:
        raise ConfigError(f"{flag}: expected integers in [1, {MAX_EXPERTS}], got {text!r}")
    return values


def _print_json(obj) -> None:
    check_finite_output(obj, "json")
    print(json.dumps(obj, indent=2, default=str, allow_nan=False))


# ---- sizing ------------------------------------------------------------------------------

def _cmd_sizing(args) -> int:
    model = api.load_model(args.model)
    _check_ep(model, args.ep)
    cluster = api.load_cluster(args.cluster, nodes=args.nodes)
    work = sizing.Workload(seq=args.seq, mbs=args.mbs, tp=args.tp, ep=args.ep)
    rows = sizing.sizing_table(model, cluster, work, align=args.align, window=args.window, min_gain_pct=args.min_gain)
    check_finite_output(rows, "sizing")
    if args.json:
        _print_json({"model": model.name, "gpu": cluster.gpu.name, "workload":
                     {"seq": work.seq, "mbs": work.mbs, "tp": work.tp, "ep": work.ep}, "rows": rows})
        return 0
    print(f"# {model.name} on {cluster.gpu.name} ({cluster.gpu.num_compute_units} CUs, tile "
          f"{cluster.gpu.gemm.tile_m}x{cluster.gpu.gemm.tile_n}): one layer's forward kernels, "
          f"{work.tokens} tokens/rank, tp={work.tp} ep={work.ep} (predicted)")
    print(f"{'kernel':<12} {'m':>6} {'n':>7} {'k':>6} {'grp':>4} {'TFLOPS':>7} {'eff':>6} {'quant':>6} {'bound':<7} "
          f"{'suggestion':<30} {'gain':>7} {'step':>7} {'TF/GPU':>7}")
    for r in rows:
        tip = r["suggestion"] or "-"
        extra = (f"{r['gain_pct']:+6.1f}% {r['step_time_change_pct']:+6.2f}% {r['tflops_per_gpu_change_pct']:+6.2f}%"
                 if r["suggestion"] else f"{'':>7} {'':>7} {'':>7}")
        print(f"{r['name']:<12} {r['m']:>6} {r['n']:>7} {r['k']:>6} {r['groups']:>4} {r['tflops']:>7.1f} "
              f"{100 * r['efficiency']:>5.1f}% {r['quantization']:>6.3f} {r['bound']:<7} {tip:<30} {extra}")
    if not any(r["suggestion"] for r in rows):
        print(f"no size within +-{100 * args.window:.1f}% (multiples of {args.align}) quantizes better over the "
              f"{cluster.gpu.num_compute_units} CUs; larger kernels still run faster per FLOP (size falloff)")
    print("gain: TFLOPS of the kernels that dimension sizes; step / TF/GPU: api.estimate of the changed model "
          f"on {cluster.num_gpus} GPUs (dp, zero 1)")
    return 0


def _check_ep(model, ep: int) -> None:
    if ep > 1 and not model.is_moe:
        raise ConfigError(f"--ep: {model.name} is dense (no experts to shard); got --ep {ep}")
    if model.is_moe and model.num_experts % ep:
        raise ConfigError(f"--ep: {ep} does not divide the {model.num_experts} experts of {model.name}")


# ---- moe-width ---------------------------------------------------------------------------

MOE_COLUMNS = ("experts", "top_k", "expert_ffn_hidden_size", "active_params", "total_params", "train_fits",
               "train_tokens_per_s_per_gpu", "train_mfu", "train_step_time_s", "decode_latency_ms",
               "decode_tokens_per_s", "experts_hit", "experts_per_gpu_read", "serve_ep", "serve_memory_bytes",
               "serve_fits", "pareto")


def _cmd_moe_width(args) -> int:
    base = api.load_model(args.model)
    cluster = api.load_cluster(args.cluster, nodes=args.nodes)
    serving = moe_width.Serving(batch=args.batch, context=args.context, ep=args.serve_ep)
    gbs = args.gbs or 2 * cluster.num_gpus
    training = moe_width.Training(seq=args.seq, gbs=gbs, mbs=args.mbs, zero=args.zero)
    rows = moe_width.sweep(base, cluster, args.active_params or 0.0, args.total_params or 0.0,
                           _ints(args.experts, "--experts"), _ints(args.top_k, "--top-k"), serving, training,
                           align=args.align)
    if not rows:
        raise ConfigError("moe-width: no (experts, top-k) fits the budget; raise it or change --experts/--top-k")
    check_finite_output(rows, "moe-width")
    if args.json:
        _print_json(rows)
    elif args.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=MOE_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        print(buf.getvalue(), end="")
    else:
        _print_moe(rows, base.name, cluster, serving, training)
    return 0


def _print_moe(rows, base, cluster, serving, training) -> None:
    print(f"# MoE width sweep from {base} on {cluster.name}: training {cluster.num_gpus} GPUs dp+ep, "
          f"seq {training.seq} gbs {training.gbs}; decode batch {serving.batch}, context {serving.context}, "
          f"serving ep {serving.ep}")
    print(f"{'E':>4} {'k':>2} {'width':>6} {'active':>8} {'total':>8} {'train tok/s/GPU':>15} {'MFU':>6} "
          f"{'decode ms/tok':>13} {'experts hit':>11} {'serve mem':>10}  pareto")
    for r in rows:
        train = f"{r['train_tokens_per_s_per_gpu']:>15,.0f} {100 * r['train_mfu']:>5.1f}%" if r["train_fits"] else \
            f"{'OOM':>15} {'':>6}"
        mark = "*" if r["pareto"] else ""
        print(f"{r['experts']:>4} {r['top_k']:>2} {r['expert_ffn_hidden_size']:>6} {r['active_params'] / 1e9:>7.3f}B "
              f"{r['total_params'] / 1e9:>7.2f}B {train} {r['decode_latency_ms']:>13.3f} {r['experts_hit']:>11.1f} "
              f"{format_bytes(r['serve_memory_bytes']):>10}  {mark}")
    print("* = Pareto-optimal (no other width trains faster and decodes sooner)")


# ---- goodput / reshard -------------------------------------------------------------------

def _hours(value: float | None, flag: str) -> float:
    if value is None:
        return math.inf
    if not value > 0:
        raise ConfigError(f"{flag}: must be > 0 hours, got {value!r}")
    return value * goodput.HOUR


def _plan_knobs(args, num_gpus: int) -> dict:
    knobs = {k: getattr(args, k) for k in ("tp", "pp", "ep", "cp", "zero", "mbs", "seq") if getattr(args, k) is not None}
    knobs["gbs"] = args.gbs or 2 * num_gpus
    return knobs


def _cmd_goodput(args) -> int:
    cluster = api.load_cluster(args.cluster, nodes=args.nodes)
    failures = goodput.FailureModel(mtbf_node_s=_hours(args.mtbf_node_hours, "--mtbf-node-hours"),
                                    mtbf_gpu_s=_hours(args.mtbf_gpu_hours, "--mtbf-gpu-hours"))
    out = goodput.plan_goodput(args.model, cluster, failures=failures, storage=args.storage, restart_s=args.restart_s,
                               async_checkpoint=args.async_checkpoint, interval_s=args.interval_s,
                               monte_carlo_runs=args.monte_carlo, run_days=args.run_days, seed=args.seed,
                               estimator=args.engine, **_plan_knobs(args, cluster.num_gpus))
    check_finite_output(out, "goodput")
    if args.json:
        _print_json(out)
        return 0
    mode = "async (snapshot blocks, write overlaps)" if out["async_checkpoint"] else "synchronous"
    lines = [
        f"{out['model']} on {out['num_nodes']} nodes x {out['num_gpus'] // out['num_nodes']} ({out['cluster']}), "
        f"plan {out['plan']}, storage {out['storage']}",
        f"step time            {out['step_time_s']:.3f} s   ({out['tokens_per_s']:,.0f} tokens/s without failures; "
        f"estimator {out['estimator']})",
        f"checkpoint           {format_bytes(out['checkpoint_bytes'])} (largest shard {format_bytes(out['checkpoint_per_rank_bytes'])}/rank), "
        f"{mode}: blocks {out['delta_s']:.2f} s, write {out['write_s']:.1f} s, read {out['read_s']:.1f} s",
        f"job MTBF             {out['system_mtbf_s'] / 3600:.2f} h ({out['failures_per_day']:.2f} failures/day); "
        f"restart {out['restart_total_s']:.0f} s incl. checkpoint read",
        f"interval             {out['interval_s']:.0f} s = {out['interval_s'] / 60:.1f} min "
        f"(~{out['steps_per_checkpoint']:.0f} steps); {out['formula']}",
        f"                     exact-expectation optimum {out['optimal_interval_s']:.0f} s",
        f"lost work/failure    {out['lost_work_per_failure_s']:.0f} s (+ restart)",
        f"goodput              {100 * out['goodput']:.2f}%",
        f"tokens/day           {out['tokens_per_day'] / 1e9:,.1f} B (no failures: {out['tokens_per_day_no_failures'] / 1e9:,.1f} B)",
    ]
    mc = out.get("monte_carlo")
    if mc:
        lo, hi = mc["ci95_goodput"]
        lines.append(f"monte-carlo          goodput {100 * mc['goodput']:.2f}% (95% CI {100 * lo:.2f}-{100 * hi:.2f}%, "
                     f"{mc['runs']} runs of {args.run_days:g} days, seed {args.seed}); closed form "
                     f"{'inside' if mc['agrees'] else 'OUTSIDE'} the CI")
    print("\n".join(lines))
    return 0


def _cmd_reshard(args) -> int:
    model = api.load_model(args.model)
    cluster = api.load_cluster(args.cluster)
    plans = []
    for gpus in (args.from_gpus, args.to_gpus):
        if gpus < 1:
            raise ConfigError(f"--from-gpus/--to-gpus: must be positive, got {gpus}")
        knobs = {k: getattr(args, k) for k in ("tp", "pp", "ep", "zero") if getattr(args, k) is not None}
        dp = gpus // ((knobs.get("tp") or 1) * (knobs.get("pp") or 1))
        plan = api.make_plan(gpus, seq=4096, gbs=max(dp, 1), **knobs)
        plans.append(plan)
    out = checkpoint.reshard(model, cluster, plans[0], plans[1], checkpoint.load_storage(args.storage))
    check_finite_output(out, "reshard")
    if args.json:
        _print_json(out)
        return 0
    print(f"{model.name}: checkpoint {format_bytes(out['checkpoint_bytes'])} from {out['source_gpus']} to "
          f"{out['target_gpus']} GPUs ({out['target_nodes']} nodes), storage {args.storage}")
    print(f"shard/rank           {format_bytes(out['source_shard_bytes'])} -> {format_bytes(out['target_shard_bytes'])}")
    print(f"offline reshape      {out['offline_s']:.1f} s = read {out['read_s']:.1f} + redistribute "
          f"{out['redistribute_s']:.1f} + write {out['write_s']:.1f}")
    print(f"reshard on load      {out['on_load_s']:.1f} s (each rank reads its new shard)")
    print(f"peak memory/rank     {format_bytes(out['peak_memory_per_rank_bytes'])}")
    return 0


def _model_cluster(p, model_default: str | None = None) -> None:
    if model_default:
        p.add_argument("--model", default=model_default, help="preset name, preset .toml or HF config.json")
    else:
        p.add_argument("--model", required=True, help="preset name, preset .toml or HF config.json")
    p.add_argument("--cluster", default="mi300x-pollara", help="cluster profile name or .toml path")
    p.add_argument("--json", action="store_true")


def _add_sizing(sub) -> None:
    p = sub.add_parser("sizing", help="MI300X-aware sizing: predicted efficiency of a layer's GEMMs, better sizes")
    _model_cluster(p)
    p.add_argument("--nodes", type=a.NODES, default=1, help="nodes for the whole-model impact estimate (default 1)")
    for knob, default, kind in (("seq", 4096, a.SEQ), ("mbs", 1, a.GBS), ("tp", 1, a.POSITIVE), ("ep", 1, a.POSITIVE),
                                ("align", 64, a.integer(1, MAX_ALIGN))):
        p.add_argument(f"--{knob}", type=kind, default=default)
    p.add_argument("--window", type=a.number(0, 1, lo_open=True), default=0.125,
                   help="search +-this fraction around each dimension")
    p.add_argument("--min-gain", type=a.number(0, 1e4), default=1.0, help="suggest only when kernels gain this many %% TFLOPS")
    p.set_defaults(func=_cmd_sizing)


def _add_moe_width(sub) -> None:
    p = sub.add_parser("moe-width", help="MoE width trade-off: training throughput vs decode latency, Pareto front")
    _model_cluster(p, "zaya1-base")
    p.add_argument("--active-params", type=a.number(0, MAX_PARAMS, lo_open=True), help="active parameter budget (e.g. 0.8e9)")
    p.add_argument("--total-params", type=a.number(0, MAX_PARAMS, lo_open=True), help="total parameter budget")
    p.add_argument("--experts", default=",".join(map(str, moe_width.DEFAULT_EXPERTS)))
    p.add_argument("--top-k", default=",".join(map(str, moe_width.DEFAULT_TOP_K)))
    serving = moe_width.Serving()  # defaults shared with the planner's MoE width page
    p.add_argument("--batch", type=a.integer(1, MAX_BATCH), default=serving.batch, help="sequences decoding together")
    p.add_argument("--context", type=a.SEQ, default=serving.context, help="tokens in each sequence's KV cache")
    p.add_argument("--serve-ep", type=a.GPUS, default=serving.ep, help="serving expert-parallel degree")
    p.add_argument("--nodes", type=a.NODES, help="training nodes (default: the profile's)")
    for knob, default, kind in (("seq", 4096, a.SEQ), ("mbs", 1, a.GBS), ("zero", 1, a.ZERO),
                                ("align", 64, a.integer(1, MAX_ALIGN))):
        p.add_argument(f"--{knob}", type=kind, default=default)
    p.add_argument("--gbs", type=a.GBS, help="training global batch (default 2 x GPUs)")
    p.add_argument("--csv", action="store_true", help="print CSV rows instead of the table")
    p.set_defaults(func=_cmd_moe_width)


def _add_goodput(sub) -> None:
    p = sub.add_parser("goodput", help="checkpoint interval, goodput and tokens/day under failures")
    _model_cluster(p)
    p.add_argument("--nodes", type=a.NODES)
    hours = a.number(0, a.MAX_HOURS, lo_open=True)
    p.add_argument("--mtbf-node-hours", type=hours, help="mean time between failures of one node")
    p.add_argument("--mtbf-gpu-hours", type=hours, help="mean time between failures of one GPU")
    p.add_argument("--storage", default=goodput.DEFAULT_STORAGE, help="storage profile name or .toml path")
    p.add_argument("--engine", default=goodput.DEFAULT_ESTIMATOR, choices=["des", "analytic"],
                   help="estimator of the step time (default des: the step time perfsim simulate reports)")
    p.add_argument("--restart-s", type=a.number(0, a.MAX_SECONDS), default=goodput.DEFAULT_RESTART_S,
                   help="restart + re-initialization seconds, before the checkpoint read (default: assumed 600)")
    p.add_argument("--async", dest="async_checkpoint", action="store_true", help="asynchronous checkpointing")
    p.add_argument("--interval-s", type=a.number(0, a.MAX_SECONDS, lo_open=True), help="checkpoint interval (default: Daly's optimum)")
    p.add_argument("--monte-carlo", type=a.integer(0, a.MAX_RUNS), default=0, metavar="RUNS",
                   help="also simulate RUNS seeded runs")
    p.add_argument("--run-days", type=a.number(0, a.MAX_DAYS, lo_open=True), default=30.0,
                   help="useful training days per Monte-Carlo run")
    p.add_argument("--seed", type=a.SEED, default=0)
    for knob in ("tp", "pp", "ep", "cp", "zero", "mbs", "gbs"):
        p.add_argument(f"--{knob}", type={"zero": a.ZERO, "gbs": a.GBS}.get(knob, a.POSITIVE))
    p.add_argument("--seq", type=a.SEQ, default=4096)
    p.set_defaults(func=_cmd_goodput)


def _add_reshard(sub) -> None:
    p = sub.add_parser("reshard", help="time and memory to convert a checkpoint between two GPU counts")
    _model_cluster(p)
    p.add_argument("--from-gpus", type=a.GPUS, required=True)
    p.add_argument("--to-gpus", type=a.GPUS, required=True)
    p.add_argument("--storage", default=goodput.DEFAULT_STORAGE)
    for knob in ("tp", "pp", "ep", "zero"):
        p.add_argument(f"--{knob}", type=a.ZERO if knob == "zero" else a.POSITIVE)
    p.set_defaults(func=_cmd_reshard)


def add_commands(sub) -> None:
    """Register the design/planning subcommands on ``perfsim``'s subparsers."""
    for add in (_add_sizing, _add_moe_width, _add_goodput, _add_reshard):
        add(sub)
