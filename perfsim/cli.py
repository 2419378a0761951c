"""``perfsim`` command line: presentation only, everything else through ``perfsim.api``."""

import argparse
import json
import sys

from perfsim import api
from perfsim.errors import ConfigError, InfeasiblePlan, PerfsimError
from perfsim.hardware import list_profiles
from perfsim.modelio import list_models
from perfsim.report import Report, write_trace
from perfsim.routing import RoutingSpec
from perfsim.units import format_bytes, parse_size

PLAN_INTS = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs", "gbs", "seq")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise ConfigError(f"{self.prog}: {message}")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name, preset .toml or HF config.json")
    p.add_argument("--cluster", default="mi300x-pollara", help="cluster profile name or .toml path")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--nodes", type=int, help="number of nodes (overrides the profile)")
    size.add_argument("--gpus", type=int, help="number of GPUs (the cluster is sized to hold them)")
    for knob in PLAN_INTS:
        p.add_argument(f"--{knob}", type=int, default=None)
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp8"])
    p.add_argument("--recompute", default=None, choices=["none", "selective", "full"])
    p.add_argument("--schedule", default=None, choices=["gpipe", "1f1b", "interleaved"])
    p.add_argument("--no-overlap", action="store_true", help="do not overlap gradient reduction with backward")
    p.add_argument("--routing", default="uniform", choices=["uniform", "zipf", "dirichlet"], help="MoE token routing")
    p.add_argument("--routing-skew", type=float, default=1.0, help="Zipf exponent for --routing zipf")
    p.add_argument("--routing-concentration", type=float, default=1.0, help="Dirichlet alpha for --routing dirichlet")
    p.add_argument("--seed", type=int, default=0, help="seed for routing")


def _plan_knobs(args) -> dict:
    knobs = {k: getattr(args, k) for k in PLAN_INTS + ("dtype", "recompute", "schedule")}
    if args.no_overlap:
        knobs["overlap_grad_reduce"] = False
    return {k: v for k, v in knobs.items() if v is not None}


def _cmd_simulate(args) -> int:
    knobs = _plan_knobs(args)
    knobs.setdefault("gbs", None)
    knobs.setdefault("seq", None)
    if knobs["gbs"] is None or knobs["seq"] is None:
        raise ConfigError("simulate: --gbs and --seq are required")
    routing = RoutingSpec(distribution=args.routing, skew=args.routing_skew,
                          concentration=args.routing_concentration, seed=args.seed)
    report = api.simulate(args.model, args.cluster, nodes=args.nodes, gpus=args.gpus, estimator=args.engine,
                          check_memory=not args.allow_oom, routing=routing, **knobs)
    if args.trace:
        _write_trace(report, args.trace)
    print(json.dumps(report.to_dict(), indent=2) if args.json else _format_report(report))
    return 0


def _write_trace(report: Report, path: str) -> None:
    try:
        write_trace(report, path)
    except OSError as exc:
        raise ConfigError(f"trace: cannot write {path!r} ({exc.strerror or exc})") from None


def _format_report(r: Report) -> str:
    plan = " ".join(f"{k}={v}" for k, v in r.plan.items())
    lines = [
        f"{r.model} on {r.cluster} ({r.world_size} GPUs), estimator {r.estimator}",
        f"plan: {plan}",
        f"step time        {r.step_time_s * 1e3:10.2f} ms",
        f"tokens/s         {r.tokens_per_s:14,.0f}   ({r.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"TFLOPS/GPU       {r.tflops_per_gpu:10.1f}     MFU {100 * r.mfu:.1f}%",
        f"peak memory/GPU  {format_bytes(r.peak_memory_bytes)} of {format_bytes(r.memory_capacity_bytes)}",
        "breakdown (critical stage {}):".format(r.critical_stage),
    ]
    for name, seconds in r.breakdown.items():
        if seconds > 0:
            lines.append(f"  {name:<20} {seconds * 1e3:10.2f} ms  {100 * seconds / r.step_time_s:5.1f}%")
    lines += [f"warning: {w}" for w in r.warnings]
    return "\n".join(lines)


def _sizes(begin: int, end: int, factor: float) -> list[int]:
    if end < begin:
        raise ConfigError(f"-e: max size {end} is below min size {begin} (-b)")
    if factor <= 1:
        raise ConfigError(f"-f: step factor must be > 1, got {factor}")
    sizes, size = [], begin
    while size <= end:
        sizes.append(int(size))
        size *= factor
    return sizes


def _cmd_collective(args) -> int:
    cluster = api.load_cluster(args.cluster, nodes=args.nodes, gpus=args.gpus if args.nodes is None else None)
    sizes = _sizes(parse_size(args.minbytes, "-b"), parse_size(args.maxbytes, "-e"), args.stepfactor)
    rows = [api.collective(args.op, s, args.gpus, cluster, protocol=args.protocol, algorithm=args.algo)
            for s in sizes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"# perfsim collective: {args.op} over {args.gpus} GPUs of {cluster.name} (predicted)")
    print(f"#{'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}  algo/proto")
    print(f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for r in rows:
        print(f" {r['size_bytes']:>12} {r['size_bytes'] // 4:>12} {'float':>6} {r['time_us']:>10.2f} "
              f"{r['algbw_GBps']:>8.2f} {r['busbw_GBps']:>8.2f}  {r['algorithm']}/{r['protocol']}")
    return 0


def _cmd_list(args) -> int:
    print("clusters: " + ", ".join(list_profiles("cluster")))
    print("gpus:     " + ", ".join(list_profiles("gpu")))
    print("nodes:    " + ", ".join(list_profiles("node")))
    print("models:   " + ", ".join(list_models()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="perfsim", description="Predict LLM training step time on GPU clusters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sim = sub.add_parser("simulate", help="simulate one training step")
    _add_plan_args(sim)
    sim.add_argument("--engine", default="des", choices=["des", "analytic"])
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    sim.add_argument("--allow-oom", action="store_true", help="report a plan that does not fit instead of failing")
    sim.set_defaults(func=_cmd_simulate)
    col = sub.add_parser("collective", help="rccl-tests-style collective benchmark (predicted)")
    col.add_argument("--op", required=True)
    col.add_argument("--gpus", "-g", type=int, required=True)
    col.add_argument("--cluster", default="mi300x-pollara")
    col.add_argument("--nodes", type=int)
    col.add_argument("-b", "--minbytes", default="8")
    col.add_argument("-e", "--maxbytes", default="128M")
    col.add_argument("-f", "--stepfactor", type=float, default=2.0)
    col.add_argument("--protocol", default=None, help="force a protocol (ll, ll128, simple)")
    col.add_argument("--algo", default=None, help="force an algorithm (ring, tree, direct, hierarchical)")
    col.add_argument("--json", action="store_true")
    col.set_defaults(func=_cmd_collective)
    lst = sub.add_parser("list", help="list hardware profiles and model presets")
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


if __name__ == "__main__":
    sys.exit(main())
