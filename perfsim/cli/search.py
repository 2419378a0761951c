"""``perfsim search``: find the best parallel plan (presentation only; ``perfsim.search`` decides)."""

import argparse
import json
import os
import sys
import tempfile

from perfsim.cli import args as a
from perfsim.errors import ConfigError
from perfsim.plan.parallel import FP8_RECIPES
from perfsim.system.stacks import ZERO3_GATHERS
from perfsim.system.specio import check_finite_output, check_output
from perfsim.system.specio import write_atomic as _write_atomic
from perfsim.search import DEFAULT_MAX_MEMORY_FRACTION, search
from perfsim.search.executors import EXECUTORS

FIXABLE_INTS = ("tp", "pp", "vpp", "dp", "ep", "etp", "cp", "zero", "mbs")
LIMITS = ("tp", "pp", "vpp", "ep", "etp", "cp", "mbs")


MAX_TOP = 10_000
MAX_COUNTS = 64  # GPU counts one search may sweep


def gpu_counts(text: str) -> tuple[int, ...]:
    """--gpus N | N,M,... | LO-HI (doublings from LO), each count in [1, MAX_GPUS]."""
    def count(token: str) -> int:
        try:
            return a.GPUS(token.strip())
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--gpus: {token.strip()!r} in {text!r} {exc}") from None

    if "-" in text.strip().lstrip("-"):
        lo, hi = (count(t) for t in text.split("-", 1))
        if lo > hi:
            raise ConfigError(f"--gpus: range {text!r} runs backwards (LO {lo} > HI {hi})")
        counts = [lo << i for i in range((hi // lo).bit_length()) if lo << i <= hi]
    else:
        counts = [count(t) for t in text.split(",")]
    if len(set(counts)) > MAX_COUNTS:
        raise ConfigError(f"--gpus: {text!r} gives {len(set(counts))} GPU counts (limit {MAX_COUNTS})")
    return tuple(sorted(set(counts)))


def _values(text: str, axis: str, cast=int) -> tuple:
    try:
        return tuple(cast(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--{axis}: {text!r} is not a value or a comma list of values") from None


def add_command(sub) -> None:
    p = sub.add_parser("search", help="find the best parallel plan for a model, GPU count and batch")
    p.add_argument("--model", required=True, help="preset name, preset .toml or HF config.json")
    p.add_argument("--cluster", default="mi300x-pollara", help="cluster profile name or .toml path")
    p.add_argument("--gpus", required=True, help="GPU count, a list (256,512) or a doubling range (256-2048)")
    p.add_argument("--gbs", type=a.GBS, required=True)
    p.add_argument("--seq", type=a.SEQ, required=True)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    p.add_argument("--stack", default=None, help="software-stack profile name or .toml path every plan runs under "
                                                 "(default ideal)")
    for axis in FIXABLE_INTS:
        p.add_argument(f"--{axis}", help=f"fix {axis} to a value or a comma list")
    p.add_argument("--recompute", help="fix recompute (none, selective, op, full; comma list; default: the settings "
                                       "the stack offers, its [recompute] auto)")
    p.add_argument("--schedule", help="fix the pipeline schedule (comma list)")
    p.add_argument("--dispatch", help="MoE dispatch implementations to try where ep > 1 (comma list: alltoall, or the "
                                      "cluster's [dispatch] tables such as mori, deepep; default alltoall)")
    p.add_argument("--ep-comm-overlap", action="store_true", dest="try_ep_comm_overlap",
                   help="also try the expert-parallel all-to-all overlap (Megatron-Core's combined 1F1B, "
                        "--overlap-moe-expert-parallel-comm) where it can run: ep > 1, cp 1, pp 1 or vpp > 1, "
                        "without TP-comm overlap (default: the stack's setting alone)")
    for axis in LIMITS:
        p.add_argument(f"--max-{axis}", type=a.POSITIVE, help=f"largest {axis} to try")
    p.add_argument("--max-memory", type=a.number(0, 1, lo_open=True), default=DEFAULT_MAX_MEMORY_FRACTION,
                   help=f"usable share of HBM per GPU (default {DEFAULT_MAX_MEMORY_FRACTION})")
    p.add_argument("--no-overlap", action="store_true", help="every plan: gradient reduction not overlapped with backward")
    p.add_argument("--no-param-prefetch", action="store_true",
                   help="every plan: ZeRO parameter all-gathers not prefetched (as simulate --no-param-prefetch)")
    p.add_argument("--no-clip-grad", action="store_true", help="every plan: no gradient clipping (as simulate --no-clip-grad)")
    p.add_argument("--real-data", action="store_true",
                   help="every plan: real data through the stack's input pipeline (as simulate --real-data)")
    p.add_argument("--dispatch-compute-units", type=a.integer(0, 1 << 20), default=None, metavar="N",
                   help="every MoE plan: the SMs / CUs its dispatch kernels hold (as simulate --dispatch-compute-units; "
                        "default: the cluster profile's)")
    p.add_argument("--mtp-layers", type=a.integer(0, 64), default=None, metavar="N",
                   help="every plan: N multi-token-prediction layers on its last virtual stage (as simulate --mtp-layers)")
    p.add_argument("--pipeline-flushes", type=a.integer(1, 1 << 20), default=None, metavar="N",
                   help="every pipelined plan: its microbatches as N pipeline schedules one after another, as "
                        "torch.distributed.pipelining runs each accumulation step (as simulate --pipeline-flushes); "
                        "plans without a pipeline are unaffected, plans whose microbatches N does not divide are "
                        "rejected (default 1)")
    p.add_argument("--dispatch-fp8", action="store_true",
                   help="every MoE plan: FP8 dispatch (needs --dtype fp8; as simulate --dispatch-fp8)")
    p.add_argument("--routing", default=None,
                   help="every MoE plan priced under this token routing (as simulate --routing: uniform, blocked, "
                        "zipf[:S], dirichlet[:A] or a histogram file; default uniform): a skewed routing's busiest "
                        "expert rank paces the layer, so it weighs on wide expert parallelism")
    p.add_argument("--seed", type=a.SEED, default=None, help="seed of a skewed --routing (default 0)")
    p.add_argument("--shared-expert-overlap", action="store_true",
                   help="every MoE plan: the shared experts beside the dispatch and combine all-to-alls (as simulate "
                        "--shared-expert-overlap; plans with --ep-comm-overlap keep their own)")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--fp8-params", action="store_true",
                         help="every plan: FP8 primary weights (needs --dtype fp8; as simulate --fp8-params)")
    weights.add_argument("--no-fp8-params", action="store_true",
                         help="every plan: BF16 working weights under --dtype fp8 (as simulate --no-fp8-params)")
    p.add_argument("--fp8-recipe", default=None, choices=list(FP8_RECIPES),
                   help="every plan: the FP8 scaling recipe (needs --dtype fp8; as simulate --fp8-recipe)")
    p.add_argument("--zero3-gather", default=None, choices=list(ZERO3_GATHERS),
                   help="every ZeRO-3 plan: how it holds its weights through the step (as simulate --zero3-gather; "
                        "default: the stack's)")
    p.add_argument("--objective", default="time", choices=["time", "cost"], help="minimize step time or $/token")
    p.add_argument("--usd-per-gpu-hour", type=a.number(0, 1e6, lo_open=True),
                   help="GPU price for --objective cost and the $/Mtoken column")
    p.add_argument("--top", type=a.integer(1, MAX_TOP), default=10, help="plans to list")
    p.add_argument("--confirm", type=a.integer(0, MAX_TOP), default=1,
                   help="re-run at least this many leaders on the discrete-event engine (default 1)")
    p.add_argument("--confirm-bound", type=a.number(0, 10), default=None,
                   help="also re-run every plan whose closed form is within this share of the best engine answer "
                        "(default: the largest disagreement of the closed form from the engine measured on the seeded plan sample, estimators/agreement.toml)")
    p.add_argument("--max-confirm", type=a.integer(0, 4096), default=32, help="most plans re-run on the engine (default 32)")
    p.add_argument("--all-recompute", action="store_true", help="also cost recompute variants of plans that fit without")
    p.add_argument("--executor", default="local", help=f"where the sweep runs: {EXECUTORS}")
    p.add_argument("--workers", type=a.integer(1, 4096), help="worker processes (local pool / dask-local)")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr even when it is not a terminal")
    p.add_argument("--json", action="store_true", help="print the ranked list as JSON")
    p.add_argument("--csv", help="write the ranked list to this CSV file")
    p.add_argument("--force", action="store_true", help="replace an existing --csv file")
    p.set_defaults(func=run)


def _routing(args):
    """--routing / --seed as a RoutingSpec (None: uniform)."""
    from perfsim.plan.routing import RoutingSpec, routing_fields

    if args.routing is None and args.seed is None:
        return None
    fields = routing_fields(args.routing or "uniform", "--routing")
    try:
        return RoutingSpec(**fields, seed=args.seed or 0)
    except ConfigError as exc:
        raise ConfigError(f"--routing: {exc}") from None


def _constraints(args) -> tuple[dict, dict]:
    fixed = {a: _values(getattr(args, a), a) for a in FIXABLE_INTS if getattr(args, a) is not None}
    for axis in ("recompute", "schedule", "dispatch"):
        if getattr(args, axis) is not None:
            fixed[axis] = _values(getattr(args, axis), axis, str)
    if args.try_ep_comm_overlap:
        fixed["ep_comm_overlap"] = (False, True)
    limits = {a: getattr(args, f"max_{a}") for a in LIMITS if getattr(args, f"max_{a}") is not None}
    return fixed, _clamp(limits, max(gpu_counts(args.gpus)), args.gbs)


def _clamp(limits: dict, most_gpus: int, gbs: int) -> dict:
    """A limit past what any plan can use changes nothing; clamp it so that the space
    stays the size of the answer (mbs and vpp <= gbs, the others <= the GPU count)."""
    return {axis: min(value, gbs if axis in ("mbs", "vpp") else most_gpus) for axis, value in limits.items()}


class _Bar:
    """A one-line progress bar on stderr."""

    def __init__(self, enabled: bool):
        self.enabled, self.phase = enabled, None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r{phase:<8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never half-written."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".perfsim-", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(f"csv: cannot write {path!r} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# search's options that only an MoE model reads (as simulate's MOE_ONLY): one line on a dense model
MOE_ONLY = {"--dispatch": "dispatch", "--dispatch-compute-units": "dispatch_compute_units",
            "--dispatch-fp8": "dispatch_fp8", "--ep-comm-overlap": "try_ep_comm_overlap",
            "--shared-expert-overlap": "shared_expert_overlap", "--routing": "routing", "--seed": "seed"}


def _refuse_moe_only(args) -> None:
    from perfsim import api

    if a.given(args, MOE_ONLY):
        model = api.load_model(args.model)  # only to check: the search loads it itself
        if not model.is_moe:
            a.refuse_given(args, MOE_ONLY, f"applies to MoE models; {model.name} is dense")
        if args.shared_expert_overlap and not model.has_shared_experts:
            raise ConfigError(f"--shared-expert-overlap: {model.name} has no shared experts")


def run(args) -> int:
    _refuse_moe_only(args)
    if args.dispatch_fp8 and args.dtype != "fp8":
        raise ConfigError(f"--dispatch-fp8: FP8 dispatch needs --dtype fp8 (got {args.dtype})")
    if args.fp8_params and args.dtype != "fp8":
        raise ConfigError(f"--fp8-params: FP8 primary weights need --dtype fp8 (got {args.dtype})")
    if args.fp8_recipe and args.dtype != "fp8":
        raise ConfigError(f"--fp8-recipe: an FP8 scaling recipe needs --dtype fp8 (got {args.dtype})")
    knobs = a.switch_knobs(args) | ({"fp8_recipe": args.fp8_recipe} if args.fp8_recipe else {})
    knobs |= {"zero3_gather": args.zero3_gather} if args.zero3_gather else {}
    knobs |= {} if args.dispatch_compute_units is None else {"dispatch_compute_units": args.dispatch_compute_units}
    knobs |= {"mtp_layers": args.mtp_layers} if args.mtp_layers else {}
    knobs |= {"pipeline_flushes": args.pipeline_flushes} if args.pipeline_flushes and args.pipeline_flushes > 1 else {}
    counts = gpu_counts(args.gpus)
    fixed, limits = _constraints(args)
    routing = _routing(args)
    if args.csv:
        check_output(args.csv, args.force, "--csv")
    bar = _Bar(args.progress or sys.stderr.isatty())
    try:
        result = search(
            args.model, args.cluster, gpus=counts, gbs=args.gbs, seq=args.seq, fixed=fixed, limits=limits,
            max_memory_fraction=args.max_memory, objective=args.objective, usd_per_gpu_hour=args.usd_per_gpu_hour,
            top=args.top, confirm=args.confirm, executor=args.executor, workers=args.workers, dtype=args.dtype,
            dominance=not args.all_recompute, progress=bar, confirm_bound=args.confirm_bound,
            max_confirm=args.max_confirm, stack=args.stack, plan_knobs=knobs, routing=routing,
        )
    except KeyboardInterrupt:
        print("\nperfsim: search cancelled; nothing written", file=sys.stderr)
        return 130
    check_finite_output(result.to_list(), "search")
    if args.csv:
        _write_atomic(args.csv, result.to_csv(), "--csv")
    print(json.dumps(result.to_list(), indent=2, allow_nan=False) if args.json else result.summary())
    if args.json:
        print(result.confirmation_line(), file=sys.stderr)
    return 0

