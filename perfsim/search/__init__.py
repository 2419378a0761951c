"""Parallelism search: which plan should this model run on these GPUs at this batch?

1. Enumerate every plan (``search_space``), prune by divisibility (``ParallelPlan`` /
   ``check_plan``), memory (= ``memory.plan_memory``) and dominance (more recompute than
   fits), and cost every survivor in closed form (``estimators.analytic``, the one closed form) on an
   executor (``search_exec``: process pool, Dask or Ray; same answer on each).
2. Keep the best per GPU count, confirm the leaders with the discrete-event engine
   (``api.simulate``), rank them (confirmed first, by the engine; ties by plan tuple) and
   say why each loses to the winner: its largest breakdown excess and the knobs that differ.
3. Over several GPU counts, mark the Pareto front of GPU count vs throughput.
"""

import csv
import hashlib
import io
import logging
import pickle
import time
from dataclasses import dataclass, field

from perfsim import api
from perfsim.calibration.accuracy import notes as accuracy_notes, plan_to_plan_pct, text_block as accuracy_text
from perfsim.errors import ConfigError, InfeasiblePlan
from perfsim.estimators.analytic import ClosedForm, measured_disagreement
from perfsim.system.hardware import ClusterSpec
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import FP8_ONLY, FP8_RECIPES, PLAN_SWITCHES, ParallelPlan
from perfsim.plan.routing import UNIFORM, RoutingSpec, routing_label
from perfsim.system.stacks import IDEAL, ZERO3_GATHERS, StackSpec, load_stack
from perfsim.report import kernel_libraries
from perfsim.search.executors import make_executor
from perfsim.search.space import AXES, DOMINATED, OOM, Chunk, Context, build_space, cost_chunk, structures
from perfsim.search.rank import Candidate, explain_infeasible, format_table, rank_rows

STRING_KNOBS = {"fp8_recipe": FP8_RECIPES, "zero3_gather": ZERO3_GATHERS}  # plan_knobs that take a name
# plan_knobs that take a whole number, with its least value
COUNT_KNOBS = {"dispatch_compute_units": 0, "mtp_layers": 0, "pipeline_flushes": 1}

log = logging.getLogger(__name__)
OBJECTIVES = ("time", "cost")
CHUNKS_PER_WORKER = 4
MAX_CONFIRM = 32  # engine runs a search may spend confirming (each 0.01-0.5 s)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    model: str
    cluster: str
    objective: str
    gpus: tuple[int, ...]
    gbs: int
    seq: int
    rows: list  # SearchRow, ranked
    enumerated: int
    costed: int  # valid plans that fit, priced in closed form
    bounded: int  # valid plans that fit, ruled out of the best by a lower bound
    rejected: dict[str, int]
    sweep_cpu_s: float  # CPU seconds the workers spent enumerating, pruning and costing
    sweep_wall_s: float
    confirm_wall_s: float
    total_s: float
    executor: str
    workers: int
    pareto: list[dict] = field(default_factory=list)
    confirmed: int = 0  # plans re-run on the engine
    confirm_bound: float = 0.0  # closed-form disagreement bound used to pick them
    max_disagreement: float = 0.0  # largest |closed form / engine - 1| among them
    confirm_capped: bool = False  # max_confirm stopped the confirmation before the bound did
    # how far perfsim's held-out checks put plans like these (calibration.accuracy; one stack,
    # GPU and cluster for every row)
    accuracy: dict = field(default_factory=dict)
    routing: str = "uniform"  # the MoE routing every plan was priced under (routing_label)

    @property
    def valid(self) -> int:
        """Plans that pass divisibility: memory-checked, then costed, bounded or pruned."""
        pruned = self.rejected.get(OOM, 0) + self.rejected.get(DOMINATED, 0)
        return self.costed + self.bounded + pruned

    @property
    def valid_per_s_per_core(self) -> float:
        return self.valid / self.sweep_cpu_s if self.sweep_cpu_s > 0 else 0.0

    @property
    def plans_per_s_per_core(self) -> float:
        """Sweep rate: valid plans that fit, ranked per CPU-second of a worker
        (enumeration and pruning included)."""
        return (self.costed + self.bounded) / self.sweep_cpu_s if self.sweep_cpu_s > 0 else 0.0

    def to_list(self) -> list[dict]:
        return [r.to_dict() for r in self.rows]

    def to_csv(self) -> str:
        out = io.StringIO()
        keys = ["rank", "world_size", *AXES, "estimator", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
                "tflops_per_gpu", "mfu", "peak_memory_bytes", "memory_headroom_bytes", "exposed_comm_s",
                "analytic_step_time_s", "usd_per_mtoken", "pareto", "reason"]
        writer = csv.DictWriter(out, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({**row.to_dict(), **{k: row.plan[k] for k in AXES}})
        return out.getvalue()

    def summary(self) -> str:
        """A short human answer: the table, the winner and the runner-up with the reason."""
        lines = [f"{self.model} on {self.cluster}, {'/'.join(map(str, self.gpus))} GPUs, gbs {self.gbs} x seq {self.seq}: "
                 f"{self.enumerated:,} plans enumerated, {self.costed + self.bounded:,} valid and fit "
                 f"({self.plans_per_s_per_core:,.0f} plans/s/core, {self.total_s:.1f} s on {self.executor}, "
                 f"{self.workers} worker{'s' if self.workers > 1 else ''})"
                 + (f"; MoE routing {self.routing}" if self.routing != "uniform" else "")]
        lines += format_table(self.rows)
        win = self.rows[0]
        lines.append(f"winner: {_describe(win)} -- {win.tokens_per_s_per_gpu:,.0f} tok/s/GPU, MFU {win.mfu:.1%} ({win.estimator})")
        if len(self.rows) > 1:
            lines.append(f"runner-up: {_describe(self.rows[1])} -- {self.rows[1].reason}")
        lines += self._too_close()
        if self.pareto:
            front = ", ".join(f"{p['gpus']} GPUs {p['tokens_per_s']:,.0f} tok/s" for p in self.pareto)
            lines.append(f"Pareto front (GPUs vs throughput): {front}")
        lines.append(self.confirmation_line())
        lines += accuracy_text(self.accuracy, "; the same for every plan here")
        return "\n".join(lines)

    def _too_close(self) -> list[str]:
        """A line counting the ranked plans whose score is nearer the winner's than perfsim's
        plan-to-plan error (the median error of a one-run calibration carried to other plans of
        the same model, docs/accuracy.md): their order is within perfsim's own error."""
        margin, win = plan_to_plan_pct(), self.rows[0]
        score, label = ("usd_per_mtoken", "cost per token") if self.objective == "cost" else ("step_time_s", "step time")
        best = getattr(win, score)
        if margin is None or not best:
            return []
        peers = [r for r in self.rows[1:] if r.world_size == win.world_size and getattr(r, score) is not None]
        close = [r for r in peers if 100 * (getattr(r, score) / best - 1) < margin]
        if not close:
            return []
        return [f"{len(close)} of the other {len(peers)} ranked plans on {win.world_size} GPUs are within {margin:.1f}% "
                f"of the winner's {label}, perfsim's plan-to-plan error (after a calibration on one run, the same "
                "model's other plans come out a median that far off: docs/accuracy.md); their order is not settled: "
                "measure the distinct ones before choosing"]

    def confirmation_line(self) -> str:
        capped = f"; stopped at max_confirm={self.confirmed}, more were within the bound" if self.confirm_capped else ""
        return (f"confirmed {self.confirmed} plan{'s' if self.confirmed != 1 else ''} on the engine (every plan whose "
                f"closed form is within {self.confirm_bound:.1%} of the best engine answer{capped}); largest "
                f"closed-form vs engine disagreement seen: {self.max_disagreement:.1%}")


def _describe(row) -> str:
    p = row.plan
    text = ParallelPlan(**p).describe()
    return f"{text} {p['schedule']}" + (f" on {row.world_size} GPUs" if row.pareto is not None else "")


def gpu_counts(gpus) -> tuple[int, ...]:
    """GPU counts from an int, a list, or text: '1024', '256,512', '256-2048' (doublings)."""
    if isinstance(gpus, str):
        try:
            if "-" in gpus:
                lo, hi = (int(x) for x in gpus.split("-", 1))
                if not 1 <= lo <= hi <= api.MAX_GPUS:  # argument check: a 0 start doubles forever
                    raise ConfigError(f"gpus: range {gpus!r} needs 1 <= LO <= HI <= {api.MAX_GPUS}")
                counts = []
                while lo <= hi:
                    counts.append(lo)
                    lo *= 2
                gpus = counts
            else:
                gpus = [int(x) for x in gpus.split(",")]
        except ValueError:
            raise ConfigError(f"gpus: {gpus!r} is not N, N,M,... or LO-HI") from None
    if isinstance(gpus, bool) or not isinstance(gpus, int | list | tuple):
        raise ConfigError(f"gpus: expected a count, a list of counts or 'LO-HI', got {gpus!r}")
    gpus = [gpus] if isinstance(gpus, int) else list(gpus)
    if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gpus):
        raise ConfigError(f"gpus: must be positive integers, got {gpus!r}")
    return tuple(sorted(set(gpus)))


def _context(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, gbs: int, seq: int, dtype: str,
             routing: RoutingSpec, fraction: float, stack: StackSpec = IDEAL, plan_knobs: tuple = ()) -> Context:
    sized = cluster.with_gpus(num_gpus)
    key = hashlib.sha1(pickle.dumps((model, sized, routing))).hexdigest()
    return Context(key=key, model=model, cluster=sized, num_gpus=num_gpus, gbs=gbs, seq=seq, dtype=dtype,
                   routing=routing, max_bytes=fraction * sized.gpu.hbm_bytes, stack=stack, plan_knobs=plan_knobs)


def _plan_switches(knobs: dict | None, dtype: str) -> tuple[tuple[str, bool | str], ...]:
    """``plan_knobs`` checked: known switches, booleans, the FP8-only knobs only under FP8."""
    if knobs is None:
        return ()
    if not isinstance(knobs, dict):
        raise ConfigError(f"plan_knobs: expected a dict of switch -> bool, got {knobs!r}")
    for key, value in knobs.items():
        if key in STRING_KNOBS:  # an FP8 scaling recipe, a ZeRO-3 gather policy
            if value not in STRING_KNOBS[key]:
                raise ConfigError(f"plan_knobs.{key}: expected one of {', '.join(STRING_KNOBS[key])}, got {value!r}")
            continue
        if key in COUNT_KNOBS:  # the compute units a dispatch holds, MTP layers, pipeline schedules a step
            if isinstance(value, bool) or not isinstance(value, int) or value < COUNT_KNOBS[key]:
                raise ConfigError(f"plan_knobs.{key}: expected a whole number >= {COUNT_KNOBS[key]}, got {value!r}")
            continue
        if key not in PLAN_SWITCHES:
            known = ", ".join(PLAN_SWITCHES + tuple(STRING_KNOBS) + tuple(COUNT_KNOBS))
            raise ConfigError(f"plan_knobs: unknown switch {key!r} (known: {known})")
        if not isinstance(value, bool):
            raise ConfigError(f"plan_knobs.{key}: expected true or false, got {value!r}")
    for key, why in FP8_ONLY.items():  # the plan's own rule, said before any plan is enumerated
        if knobs.get(key) and dtype != "fp8":
            raise ConfigError(f"plan_knobs.{key}: {why} dtype fp8 (got dtype {dtype!r})")
    return tuple(sorted(knobs.items()))


def _chunks(ctx: Context, space, num_chunks: int, keep: int, dominance: bool, bound: bool) -> list[Chunk]:
    groups: dict[tuple, list] = {}
    for st in structures(space, ctx.num_gpus):  # (tp, cp, pp, dp, ep, etp)
        groups.setdefault((st[0], st[1], st[4], st[5]), []).append(st)
    parts: list[list] = [[] for _ in range(num_chunks)]
    # one (tp, cp, ep, etp) group per chunk: a worker prices each block template once;
    # largest groups first onto the lightest chunk (deterministic)
    for key in sorted(groups, key=lambda k: (-len(groups[k]), k)):
        min(parts, key=len).extend(groups[key])
    parts = [tuple(p) for p in parts]
    return [Chunk(context=ctx, space=space, structures=p, keep=keep, dominance=dominance, bound=bound)
            for p in parts if p]


def confirm_plan(task: tuple) -> dict:
    """The engine's report of one plan (a sweep task: picklable in, dict out)."""
    model, cluster, plan, routing = task
    report = api.simulate(model, cluster, plan, estimator="des", routing=routing, check_memory=False)
    return report.to_dict()


def _check_args(gbs, seq, top, confirm, fraction, objective, usd_per_gpu_hour) -> None:
    for name, value, most in (("gbs", gbs, api.MAX_GBS), ("seq", seq, api.MAX_SEQ), ("top", top, api.MAX_GBS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ConfigError(f"{name}: must be an integer in [1, {most}], got {value!r}")
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
        raise ConfigError(f"confirm: must be an integer >= 0, got {confirm!r}")
    if not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ConfigError(f"max_memory_fraction: must be in (0, 1], got {fraction!r}")
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if usd_per_gpu_hour is not None and not (isinstance(usd_per_gpu_hour, int | float)
                                             and 0 < usd_per_gpu_hour < float("inf")):
        raise ConfigError(f"usd_per_gpu_hour: must be a finite number > 0, got {usd_per_gpu_hour!r}")
    if objective == "cost" and usd_per_gpu_hour is None:
        raise ConfigError("objective: 'cost' needs usd_per_gpu_hour (a $/GPU-hour price)")


DEFAULT_MAX_MEMORY_FRACTION = 1.0  # share of HBM a plan may use: the CLI's and the planner's default


def _bounded(limits: dict | None, most_gpus: int, gbs: int, num_layers: int) -> dict | None:
    """Argument check: limits are integers >= 1; one past what any plan can use (tp beyond
    the GPUs, mbs beyond gbs, vpp beyond the layers) is clamped, so a limit of 1e9 costs
    what the useful range costs instead of enumerating a billion values."""
    if limits is None:
        return None
    if not isinstance(limits, dict):
        raise ConfigError(f"limits: expected a dict of axis -> largest value, got {limits!r}")
    caps = {"mbs": gbs, "vpp": num_layers}
    out = {}
    for axis, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"limits.{axis}: must be a positive integer, got {value!r}")
        out[axis] = min(value, caps.get(axis, most_gpus))
    return out


def search(
    model, cluster, *, gpus, gbs: int, seq: int, fixed: dict | None = None, limits: dict | None = None,
    max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION, objective: str = "time", usd_per_gpu_hour: float | None = None,
    top: int = 10, confirm: int = 1, executor: str = "local", workers: int | None = None, dtype: str = "bf16",
    routing: RoutingSpec | None = None, dominance: bool = True, bound: bool = True, progress=None,
    confirm_bound: float | None = None, max_confirm: int = MAX_CONFIRM, stack: StackSpec | str | None = None,
    plan_knobs: dict | None = None,
) -> SearchResult:
    """Find the best plans for ``model`` on ``gpus`` GPUs (a count, a list or 'LO-HI').

    ``fixed`` pins axes ({'tp': 1, 'zero': (1, 2)}); ``limits`` caps them ({'pp': 8});
    ``objective`` 'time' (step time) or 'cost' ($ per token at ``usd_per_gpu_hour``).
    Confirmation: at least the ``confirm`` best, and every plan whose closed-form score
    is within ``confirm_bound`` (default: the largest disagreement of the closed form from the
    engine measured over the seeded plan sample, ``estimators/agreement.toml``) of the best engine score, are re-run on the engine, up
    to ``max_confirm``; rows are ranked by the engine first. ``progress(phase, done, total)`` is
    called as chunks finish. ``stack``: the software-stack profile every plan runs under
    (default ideal). ``plan_knobs``: plan switches every plan carries, over the stack's
    defaults (``PLAN_SWITCHES``: overlap_grad_reduce, overlap_param_gather, clip_grad,
    dispatch_fp8, real_data; e.g. ``{"clip_grad": False}``; ``fp8_recipe``, delayed or
    current, under dtype fp8; ``zero3_gather``, per-pass, once or pipeline;
    ``dispatch_compute_units``, the SMs / CUs the dispatch kernels hold; ``pipeline_flushes``,
    the accumulation steps of every pipelined plan run as that many pipeline schedules, as
    torch.distributed.pipelining runs them: plans without a pipeline are unaffected, a plan
    whose microbatches it does not divide is rejected). Raises
    InfeasiblePlan naming the binding constraint when no plan is valid and fits,
    ConfigError for bad input.
    """
    t0 = time.perf_counter()
    _check_args(gbs, seq, top, confirm, max_memory_fraction, objective, usd_per_gpu_hour)
    bound_rel = measured_disagreement()["max_rel"] if confirm_bound is None else confirm_bound
    if isinstance(bound_rel, bool) or not isinstance(bound_rel, int | float) or not 0 <= bound_rel < 10:
        raise ConfigError(f"confirm_bound: must be a number in [0, 10), got {confirm_bound!r}")
    if isinstance(max_confirm, bool) or not isinstance(max_confirm, int) or max_confirm < 0:
        raise ConfigError(f"max_confirm: must be an integer >= 0, got {max_confirm!r}")
    model, base = api.load_model(model), api.load_cluster(cluster)
    counts, routing = gpu_counts(gpus), routing or UNIFORM
    if fixed is not None and not isinstance(fixed, dict):
        raise ConfigError(f"fixed: expected a dict of axis -> value(s), got {fixed!r}")
    spec = (IDEAL if stack is None else load_stack(stack)).on_vendor(base.gpu.vendor)
    space = build_space(model, base.gpus_per_node, fixed, _bounded(limits, max(counts), gbs, model.num_layers), spec)
    switches = _plan_switches(plan_knobs, dtype)
    contexts = {w: _context(model, base, w, gbs, seq, dtype, routing, max_memory_fraction, spec, switches)
                for w in counts}
    keep = max(top, confirm, max_confirm)
    ex = make_executor(executor, workers)
    try:
        n = CHUNKS_PER_WORKER * ex.workers
        chunks = [c for ctx in contexts.values() for c in _chunks(ctx, space, n, keep, dominance, bound)]
        sweep = ex.map(cost_chunk, chunks, _phase(progress, "sweep"))
        t_sweep = time.perf_counter()
        candidates = _candidates(sweep, contexts, keep, objective, usd_per_gpu_hour, gbs * seq)
        if not candidates:
            raise InfeasiblePlan(explain_infeasible(model, base, counts, gbs, seq, sweep, max_memory_fraction))
        policy = (confirm, bound_rel, max_confirm)
        capped = _confirm(ex, candidates, policy, model, contexts, routing, objective, usd_per_gpu_hour, progress)
    finally:
        ex.close()
    costers = {w: ClosedForm(model, ctx.cluster, routing) for w, ctx in contexts.items()}
    rows, pareto = rank_rows(candidates, costers, model, contexts, objective, usd_per_gpu_hour, multi=len(counts) > 1,
                              routing=routing)
    confirmed = [c for c in candidates if c.report is not None]
    rows = [r for i, r in enumerate(rows) if i < top or r.pareto]  # confirmed first; the front stays
    accuracy = accuracy_notes(spec, base, dtype, model.is_moe, kernel_libraries(spec, base.gpu))
    return SearchResult(
        accuracy=accuracy,
        confirmed=len(confirmed), confirm_bound=bound_rel, confirm_capped=capped,
        max_disagreement=max((abs(c.analytic_step_time_s / c.report["step_time_s"] - 1) for c in confirmed), default=0.0),
        model=model.name, cluster=base.name, objective=objective, gpus=counts, gbs=gbs, seq=seq, rows=rows,
        enumerated=sum(r.enumerated for r in sweep), costed=sum(r.costed for r in sweep),
        bounded=sum(r.bounded for r in sweep),
        rejected=_merge_rejected(sweep), sweep_cpu_s=sum(r.seconds for r in sweep), sweep_wall_s=t_sweep - t0,
        confirm_wall_s=time.perf_counter() - t_sweep, total_s=time.perf_counter() - t0, executor=ex.name,
        workers=ex.workers, pareto=pareto, routing=routing_label(routing),
    )


def _confirm(ex, candidates, policy, model, contexts, routing, objective, usd, progress) -> bool:
    """Run the engine on the leaders (in closed-form order, a batch per worker round):
    at least ``confirm`` of them, then every next one whose closed-form score divided by
    (1 + bound) could still beat the best engine score -- the closed form is within
    ``bound`` of the engine -- up to ``max_confirm``. True when the cap stopped it."""
    confirm, bound, cap = policy
    done, tokens, batch_size = 0, candidates[0].plan.tokens_per_step, max(1, confirm, ex.workers)
    best = float("inf")
    while done < len(candidates):
        batch = []
        for cand in candidates[done:done + batch_size]:
            if done + len(batch) >= confirm and cand.objective / (1 + bound) >= best:
                break
            batch.append(cand)
        if not batch:
            return False
        if done + len(batch) > cap:
            batch = batch[:max(0, cap - done)]
            if not batch:
                return True
        tasks = [(model, contexts[c.num_gpus].cluster, c.plan, routing) for c in batch]
        for cand, report in zip(batch, ex.map(confirm_plan, tasks, _phase(progress, "confirm"))):
            cand.report = report
            cand.engine_objective = _score(report["step_time_s"], cand.num_gpus, objective, usd, tokens)
            best = min(best, cand.engine_objective)
        done += len(batch)
    return False


def _score(step: float, num_gpus: int, objective: str, usd: float | None, tokens: int) -> float:
    """Step time, or $ per million tokens at ``usd`` per GPU-hour."""
    return step * num_gpus * usd / 3600 / tokens * 1e6 if objective == "cost" else step


def _phase(progress, phase: str):
    return None if progress is None else (lambda done, total: progress(phase, done, total))


def _merge_rejected(sweep) -> dict[str, int]:
    out: dict[str, int] = {}
    for res in sweep:
        for reason, n in res.rejected.items():
            out[reason] = out.get(reason, 0) + n
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _candidates(sweep, contexts, top, objective, usd, tokens) -> list[Candidate]:
    """The ``top`` best over all GPU counts, plus each count's best (for the front)."""
    every = [Candidate(num_gpus=res.num_gpus, plan=plan, analytic_step_time_s=step,
                       objective=_score(step, res.num_gpus, objective, usd, tokens), key=key)
             for res in sweep for step, key, plan in res.best]
    every.sort(key=lambda c: (c.objective, c.num_gpus, c.key))
    chosen = every[:top]
    for w in contexts:
        best = next((c for c in every if c.num_gpus == w), None)
        if best is not None and len(contexts) > 1 and all(best is not c for c in chosen):
            chosen.append(best)
    return chosen

