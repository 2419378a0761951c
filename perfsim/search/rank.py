"""Ranking the searched plans: rows with the simulate contract's metrics, why each loses
to the winner, the Pareto front over GPU counts, and the answer when nothing is valid."""

from dataclasses import dataclass

from perfsim.estimators import summary
from perfsim.estimators.analytic import ClosedForm
from perfsim.estimators.fastmem import MemoryModel
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan, dispatch_label
from perfsim.search.space import AXES, DEFAULT_BUCKET, DOMINATED, OOM
from perfsim.units import format_bytes


@dataclass(kw_only=True)
class Candidate:
    num_gpus: int
    plan: ParallelPlan
    analytic_step_time_s: float
    objective: float
    key: tuple
    report: dict | None = None  # the engine's report, once confirmed
    engine_objective: float | None = None


@dataclass(frozen=True, kw_only=True)
class SearchRow:
    rank: int
    plan: dict
    world_size: int
    estimator: str  # 'des' when confirmed by the engine, else 'analytic'
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    memory_headroom_bytes: float
    exposed_comm_s: float
    breakdown: dict[str, float]
    analytic_step_time_s: float
    usd_per_mtoken: float | None
    pareto: bool | None  # on the GPU-count/throughput front (None: one GPU count)
    reason: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _metrics(cand: Candidate, coster: ClosedForm, memory: MemoryModel, model: ModelSpec, cluster) -> dict:
    plan, w = cand.plan, cand.num_gpus
    fast = summary.estimate(coster, plan)
    if cand.report is not None:
        r = cand.report
        exposed = sum(r["breakdown"].get(k, 0.0) for k in r["overlapped_comm_s"])
        keys = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_bytes",
                "breakdown")
        return {**{k: r[k] for k in keys}, "estimator": "des", "exposed_comm_s": exposed, "fast": fast.breakdown}
    step, tokens = fast.step_time_s, plan.tokens_per_step
    tflops = model.model_flops_per_token(plan.seq, plan.mtp_layers) * tokens / step / w / 1e12
    return {"step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / w,
            "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / cluster.gpu.peak_flops(plan.dtype),
            "peak_memory_bytes": memory.peak(plan)[0], "breakdown": fast.breakdown, "estimator": "analytic",
            "exposed_comm_s": fast.exposed_comm_s, "fast": fast.breakdown}


def _objective(m: dict, w: int, objective: str, usd: float | None) -> tuple[float, float | None]:
    cost = w * usd / 3600 / m["tokens_per_s"] * 1e6 if usd else None  # $ per million tokens
    return (cost if objective == "cost" else m["step_time_s"]), cost


def _differences(plan: dict, best: dict, w: int, best_w: int) -> str:
    diffs = [f"{k} {plan[k]} vs {best[k]}" for k in AXES if plan[k] != best[k]]
    if w != best_w:
        diffs.insert(0, f"{w} vs {best_w} GPUs")
    return ", ".join(diffs)


def _reason(m: dict, win: dict, objective: str) -> str:
    """Why a plan loses: how much, where most of the difference goes, which knobs differ."""
    if m is win:
        return "winner"
    both_des = m["estimator"] == win["estimator"] == "des"
    mine, theirs = (m["breakdown"], win["breakdown"]) if both_des else (m["fast"], win["fast"])
    delta = {k: mine.get(k, 0.0) - theirs.get(k, 0.0) for k in set(mine) | set(theirs)}
    cat, worst = max(sorted(delta.items()), key=lambda kv: kv[1])
    gap = 100 * (m["objective"] / win["objective"] - 1) if win["objective"] > 0 else 0.0
    what = "cost per token" if objective == "cost" else "step time"
    head = f"{gap:+.1f}% {what}" if abs(gap) >= 0.05 else f"ties on {what} (ranked by plan order)"
    if worst > 0:
        head += f"; largest excess {cat} +{worst * 1e3:.1f} ms ({'engine' if both_des else 'analytic'})"
    return f"{head}; {_differences(m['plan'], win['plan'], m['w'], win['w'])}"


def rank_rows(cands: list[Candidate], costers: dict, model: ModelSpec, contexts: dict, objective: str,
              usd: float | None, multi: bool, routing: RoutingSpec = UNIFORM) -> tuple[list[SearchRow], list[dict]]:
    """Rows ranked (confirmed by the engine first, then by the closed form) and the front."""
    memory = MemoryModel(model, routing)
    found = []
    for c in cands:
        m = _metrics(c, costers[c.num_gpus], memory, model, contexts[c.num_gpus].cluster)
        m["objective"], m["usd"] = _objective(m, c.num_gpus, objective, usd)
        m.update(w=c.num_gpus, plan=c.plan.priced_dict(), cand=c, cap=contexts[c.num_gpus].cluster.gpu.hbm_bytes)
        found.append(m)
    found.sort(key=lambda m: (m["estimator"] != "des", m["objective"], m["w"], m["cand"].key))
    front = _front(found) if multi else []
    on_front = {id(m) for m in front}
    rows = [SearchRow(
        rank=i + 1, plan=m["plan"], world_size=m["w"], estimator=m["estimator"], step_time_s=m["step_time_s"],
        tokens_per_s=m["tokens_per_s"], tokens_per_s_per_gpu=m["tokens_per_s_per_gpu"],
        tflops_per_gpu=m["tflops_per_gpu"], mfu=m["mfu"], peak_memory_bytes=m["peak_memory_bytes"],
        memory_capacity_bytes=m["cap"], memory_headroom_bytes=m["cap"] - m["peak_memory_bytes"],
        exposed_comm_s=m["exposed_comm_s"], breakdown=m["breakdown"], analytic_step_time_s=m["cand"].analytic_step_time_s,
        usd_per_mtoken=m["usd"], pareto=(id(m) in on_front) if multi else None, reason=_reason(m, found[0], objective),
    ) for i, m in enumerate(found)]
    pareto = [{"gpus": m["w"], "tokens_per_s": m["tokens_per_s"], "tokens_per_s_per_gpu": m["tokens_per_s_per_gpu"],
               "step_time_s": m["step_time_s"], "estimator": m["estimator"], "plan": m["plan"]} for m in front]
    return rows, pareto


def _front(found: list[dict]) -> list[dict]:
    """Per GPU count its fastest plan; kept when no smaller count is at least as fast."""
    best: dict[int, dict] = {}
    for m in found:
        if m["w"] not in best or m["tokens_per_s"] > best[m["w"]]["tokens_per_s"]:
            best[m["w"]] = m
    front, fastest = [], 0.0
    for w in sorted(best):
        if best[w]["tokens_per_s"] > fastest:
            front.append(best[w])
            fastest = best[w]["tokens_per_s"]
    return front


def explain_infeasible(model: ModelSpec, cluster, counts, gbs: int, seq: int, sweep, fraction: float) -> str:
    """One line naming the constraint that leaves no plan."""
    where = f"{model.name} on {'/'.join(map(str, counts))} GPUs of {cluster.name} (gbs {gbs}, seq {seq})"
    rejected: dict[str, int] = {}
    for res in sweep:
        for reason, n in res.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    smallest = min((r.smallest for r in sweep if r.smallest), default=None, key=lambda e: e[:2])
    enumerated = sum(r.enumerated for r in sweep)
    if enumerated == 0:
        return f"no valid plan for {where}: the fixed axes and limits leave no plan to try"
    divisibility = sorted(((n, k) for k, n in rejected.items() if k not in (OOM, DOMINATED)), reverse=True)
    if smallest is None:
        top = "; ".join(f"{k} ({n:,} plans)" for n, k in divisibility[:2])
        return f"no valid plan for {where}: all {enumerated:,} plans fail divisibility, mostly: {top}"
    peak, _, plan = smallest
    cap = cluster.gpu.hbm_bytes
    return (f"no valid plan for {where}: memory binds -- {rejected.get(OOM, 0):,} plans divide but none fits; "
            f"the smallest footprint is {format_bytes(peak)} per GPU ({plan.describe()}, {plan.schedule}) "
            f"against {fraction:.0%} of {cluster.gpu.name}'s {format_bytes(cap)}"
            + (f"; {sum(n for n, _ in divisibility):,} more fail divisibility" if divisibility else ""))


def format_table(rows: list[SearchRow]) -> list[str]:
    """The ranked table (a ``dispatch`` column: the MoE dispatch implementation, '-' where
    ep == 1); a ``$/Mtok`` column (dollars per million tokens at the given GPU-hour
    price) whenever the rows were priced (``--usd-per-gpu-hour``, always with ``--objective cost``)."""
    priced = any(r.usd_per_mtoken is not None for r in rows)
    head = f"{'#':>3} {'gpus':>5}  {'plan':<44} {'dispatch':<9} {'step ms':>9} {'tok/s/GPU':>10} {'MFU':>6} {'mem GB':>7} {'free GB':>7} {'comm ms':>8}"
    lines = [head + (f" {'$/Mtok':>8}" if priced else "") + "  est"]
    for r in rows:
        p = r.plan
        knobs = " ".join(f"{k}{p[k]}" for k in ("tp", "pp", "vpp", "cp", "dp", "ep", "etp") if p[k] > 1 or k in ("tp", "pp", "dp"))
        zero = f"z{p['zero']}" + ("-once" if p["zero"] == 3 and p.get("zero3_gather") == "once" else "")
        knobs += f" {zero} mbs{p['mbs']}" + (f" rc-{p['recompute']}" if p["recompute"] != "none" else "") + \
            (f"/{p['recompute_layers']}" if p.get("recompute_layers") else "")
        knobs += f" {p['schedule']}" if p["pp"] > 1 else ""
        knobs += f" flushes{p['pipeline_flushes']}" if p.get("pipeline_flushes", 1) > 1 else ""
        knobs += " tp-overlap" if p.get("tp_comm_overlap") else ""
        knobs += " ep-overlap" if p.get("ep_comm_overlap") and p["ep"] > 1 else ""
        knobs += " shared-overlap" if p.get("shared_expert_overlap") and p["ep"] > 1 else ""
        knobs += f" bucket{p['grad_bucket_bytes'] / 1e6:g}MB" if p.get("grad_bucket_bytes", DEFAULT_BUCKET) != DEFAULT_BUCKET else ""
        lines.append(f"{r.rank:>3} {r.world_size:>5}  {knobs:<44} {dispatch_label(p):<9} {r.step_time_s * 1e3:>9.1f} {r.tokens_per_s_per_gpu:>10,.0f} "
                     f"{r.mfu:>6.1%} {r.peak_memory_bytes / 1e9:>7.1f} {r.memory_headroom_bytes / 1e9:>7.1f} "
                     f"{r.exposed_comm_s * 1e3:>8.1f}" + (f" {_usd(r.usd_per_mtoken):>8}" if priced else "")
                     + f"  {r.estimator}{' *' if r.pareto else ''}")
    return lines


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.3f}"
