"""Fault tolerance and goodput: optimal checkpoint interval, expected lost work,
goodput and tokens per day once failures, checkpoints and restarts are counted.

Failures are a Poisson process: nodes and GPUs fail independently with exponential
lifetimes, so the job's MTBF is M = 1 / (nodes / MTBF_node + GPUs / MTBF_gpu).
A checkpoint blocks training for delta seconds (the whole write when synchronous; the
device-to-host snapshot when asynchronous, the write to storage then overlaps the next
interval and the checkpoint is durable ``persist`` seconds later). A failure costs the
work since the last durable checkpoint plus a restart of R seconds (restart,
re-initialization, checkpoint read), which failures may interrupt too.

Interval: Daly 2006 first order, tau = sqrt(2 * delta * M) - delta (Young 1974:
sqrt(2 * delta * M)); for delta >= 2M, tau = M. Goodput: the exact expectation for this
failure model (Daly 2006 eq. for exponential failures, extended here for the async
window), which the seeded Monte-Carlo ``simulate_failures`` reproduces.
"""

import math
from dataclasses import dataclass
from os import PathLike

import numpy as np

from perfsim.errors import ConfigError

HOUR = 3600.0
DAY = 86400.0
Z95 = 1.959964  # two-sided 95% normal quantile
DAILY_FORMULA = "tau = sqrt(2*delta*M) - delta  (Daly 2006, first order; Young 1974: sqrt(2*delta*M))"


@dataclass(frozen=True, kw_only=True)
class FailureModel:
    """Per-node and per-GPU mean times between failures (seconds; inf = never)."""

    mtbf_node_s: float = math.inf
    mtbf_gpu_s: float = math.inf

    def __post_init__(self):
        for key in ("mtbf_node_s", "mtbf_gpu_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"failures.{key} must be a number of seconds (inf = never), got {value!r}")
            if not value > 0:
                raise ConfigError(f"failures.{key} must be > 0, got {getattr(self, key)!r}")
        if math.isinf(self.mtbf_node_s) and math.isinf(self.mtbf_gpu_s):
            raise ConfigError("failures: give a node or GPU MTBF (--mtbf-node-hours / --mtbf-gpu-hours)")

    def system_mtbf_s(self, num_nodes: int, gpus_per_node: int) -> float:
        rate = num_nodes / self.mtbf_node_s + num_nodes * gpus_per_node / self.mtbf_gpu_s
        return 1.0 / rate


@dataclass(frozen=True, kw_only=True)
class CheckpointCost:
    """delta_s blocks training; the checkpoint is durable persist_s after it starts
    (0 when synchronous); a failure costs restart_s before work resumes."""

    delta_s: float
    restart_s: float
    persist_s: float = 0.0

    def __post_init__(self):
        for key in ("delta_s", "restart_s", "persist_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"checkpoint.{key} must be a finite number >= 0, got {value!r}")


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly 2006 first-order optimum: sqrt(2*delta*M) - delta, and M when delta >= 2M."""
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    return max(math.sqrt(2.0 * delta_s * mtbf_s) - delta_s, 1e-9)


def young_interval(delta_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * delta_s * mtbf_s)


def _restart_phase_s(restart_s: float, m: float) -> float:
    """E[time to get through a restart of R that failures restart]: M (e^{R/M} - 1)."""
    return m * math.expm1(restart_s / m)


def segment_time_s(tau_s: float, cost: CheckpointCost, mtbf_s: float, vulnerable: bool = True) -> float:
    """Expected wall time to finish tau of work and its checkpoint.

    Not vulnerable (previous checkpoint durable): S = M e^{R/M} (e^{P/M} - 1), P = tau +
    delta (Daly 2006). Vulnerable (the previous async checkpoint persists during the first
    L seconds): a failure in that window also loses the previous interval, so with
    p_w = 1 - e^{-L/M}, p_s = e^{-P/M}:
    V = [M (1 - p_s) + (1 - p_s) E_R + (1 - p_s - p_w) S + p_w S] / (1 - p_w), E_R = M (e^{R/M} - 1).
    """
    m, p = mtbf_s, tau_s + cost.delta_s
    s = m * math.exp(cost.restart_s / m) * math.expm1(p / m)
    if not vulnerable or cost.persist_s == 0:
        return s
    if cost.persist_s > p:
        raise ConfigError(f"interval: {tau_s:.0f} s + checkpoint {cost.delta_s:.0f} s is shorter than the "
                          f"asynchronous write ({cost.persist_s:.0f} s); the next checkpoint would start before it is durable")
    p_s, p_w = math.exp(-p / m), -math.expm1(-cost.persist_s / m)
    e_r = _restart_phase_s(cost.restart_s, m)
    return (m * (1 - p_s) + (1 - p_s) * e_r + (1 - p_s) * s) / (1 - p_w)


def expected_wall_s(tau_s: float, num_intervals: int, cost: CheckpointCost, mtbf_s: float) -> float:
    """Expected wall time of ``num_intervals`` intervals; the first starts from a durable state."""
    first = segment_time_s(tau_s, cost, mtbf_s, vulnerable=False)
    return first + (num_intervals - 1) * segment_time_s(tau_s, cost, mtbf_s)


def goodput(tau_s: float, cost: CheckpointCost, mtbf_s: float) -> float:
    """Useful training time / wall time in steady state."""
    return tau_s / segment_time_s(tau_s, cost, mtbf_s)


def lost_work_s(tau_s: float, cost: CheckpointCost, mtbf_s: float) -> float:
    """Expected work lost per failure, first order: half an interval (tau + delta)/2, plus
    the async window L (a failure there, probability L/(tau+delta), also loses the previous
    interval)."""
    return (tau_s + cost.delta_s) / 2.0 + cost.persist_s


def optimal_interval(cost: CheckpointCost, mtbf_s: float) -> float:
    """tau maximizing the exact goodput (bounded: the async write must finish in time)."""
    from scipy.optimize import minimize_scalar

    lo = max(cost.persist_s - cost.delta_s, 1.0)
    guess = max(daly_interval(cost.delta_s or 1e-3, mtbf_s), lo)
    hi = max(20 * guess, 10 * mtbf_s, 2 * lo)
    res = minimize_scalar(lambda x: -goodput(math.exp(x), cost, mtbf_s), bounds=(math.log(lo), math.log(hi)),
                          method="bounded", options={"xatol": 1e-6})
    return float(math.exp(res.x))


def _restart_draws(rng: np.random.Generator, n: int, restart_s: float, m: float) -> np.ndarray:
    """Wall time of n restarts of R seconds, each restarted when a failure interrupts it."""
    total, active = np.zeros(n), np.arange(n)
    while active.size:
        y = rng.exponential(m, active.size)
        ok = y >= restart_s
        total[active] += np.where(ok, restart_s, y)
        active = active[~ok]
    return total


def simulate_failures(tau_s: float, num_intervals: int, cost: CheckpointCost, mtbf_s: float, runs: int = 200,
                      seed: int = 0) -> dict:
    """Monte-Carlo of ``runs`` training runs of ``num_intervals`` intervals (seeded numpy).

    Each interval is attempted until it runs tau + delta without a failure; a failure at
    x costs x plus a restart (which can fail too); with an async window, a failure in
    the first L seconds after a completed interval also redoes that interval. Returns
    the mean wall time with its 95% CI, the implied goodput and the closed form."""
    _check_mc_args(tau_s, num_intervals, cost, mtbf_s, runs, seed)
    if runs < 2 or num_intervals < 1:
        raise ConfigError(f"monte-carlo: runs must be >= 2 and intervals >= 1, got {runs}, {num_intervals}")
    _check_draws(runs, num_intervals, tau_s, cost, mtbf_s)
    rng = np.random.default_rng(seed)
    p, window, m = tau_s + cost.delta_s, cost.persist_s, mtbf_s
    n = runs * num_intervals
    wall = np.zeros(n)
    redo = np.zeros(n, dtype=bool)  # re-running the previous interval (its checkpoint was lost)
    vulnerable = np.ones(n, dtype=bool)
    vulnerable[::num_intervals] = False  # each run starts from a durable state
    active = np.arange(n)
    while active.size:
        x = rng.exponential(m, active.size)
        ok = x >= p
        wall[active] += np.where(ok, p, x)
        failed, xf = active[~ok], x[~ok]
        wall[failed] += _restart_draws(rng, failed.size, cost.restart_s, m)
        finished_redo = active[ok & redo[active]]
        redo[finished_redo], vulnerable[finished_redo] = False, True
        main_fail = ~redo[failed]
        lost_previous = failed[main_fail & vulnerable[failed] & (xf < window)]
        vulnerable[failed[main_fail]] = False
        redo[lost_previous] = True
        active = np.concatenate([active[~ok], finished_redo])
        active.sort()
    totals = wall.reshape(runs, num_intervals).sum(axis=1)
    return _mc_summary(totals, tau_s * num_intervals, expected_wall_s(tau_s, num_intervals, cost, mtbf_s))


MAX_MC_SAMPLES = 4_000_000  # intervals simulated at once (runs x intervals): ~100 MB of arrays
MAX_MC_DRAWS = 40_000_000  # expected random draws of one Monte-Carlo (seconds of numpy work)
MAX_EXPONENT = 30.0  # (interval or restart) / MTBF past which a run almost never completes (e^30 tries)


def _check_draws(runs: int, num_intervals: int, tau_s: float, cost: CheckpointCost, mtbf_s: float) -> None:
    """Refuse a Monte-Carlo whose work would not end in seconds: each interval takes
    e^{P/M} attempts on average and each failed one a restart of e^{R/M} attempts."""
    n = runs * num_intervals
    if n > MAX_MC_SAMPLES:
        raise ConfigError(f"monte-carlo: {runs} runs x {num_intervals} intervals = {n:,} simulated intervals "
                          f"(limit {MAX_MC_SAMPLES:,}); lower --monte-carlo or --run-days, or lengthen --interval-s")
    _check_progress(tau_s, cost, mtbf_s)
    attempts = math.exp((tau_s + cost.delta_s) / mtbf_s)
    draws = n * (attempts + (attempts - 1) * math.exp(cost.restart_s / mtbf_s))
    if draws > MAX_MC_DRAWS:
        raise ConfigError(f"monte-carlo: about {draws:,.0f} random draws (failures every {mtbf_s:.0f} s against "
                          f"intervals of {tau_s + cost.delta_s:.0f} s and restarts of {cost.restart_s:.0f} s; limit "
                          f"{MAX_MC_DRAWS:,}); lower --monte-carlo or --run-days (the closed form needs no draws)")


def _check_progress(tau_s: float, cost: CheckpointCost, mtbf_s: float) -> None:
    """The closed form holds e^{P/M} and e^{R/M}; past e^MAX_EXPONENT the run makes no progress."""
    for what, seconds in (("an interval plus checkpoint", tau_s + cost.delta_s), ("a restart", cost.restart_s)):
        if seconds / mtbf_s > MAX_EXPONENT:
            raise ConfigError(f"failures: the job fails every {mtbf_s:.3g} s on average, {seconds / mtbf_s:.3g}x "
                              f"shorter than {what} ({seconds:.3g} s): the run would almost never get through one; "
                              "raise the MTBF or shorten the interval / restart")


def _number(name: str, value, lo_open: bool = True) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or not (value > 0 if lo_open else value >= 0):
        raise ConfigError(f"{name}: must be a finite number {'>' if lo_open else '>='} 0, got {value!r}")


def _count(name: str, value, lo: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{name}: must be an integer >= {lo}, got {value!r}")


def _check_mc_args(tau_s, num_intervals, cost, mtbf_s, runs, seed) -> None:
    if not isinstance(cost, CheckpointCost):
        raise ConfigError(f"cost: expected a CheckpointCost, got {cost!r}")
    _number("tau_s", tau_s)
    _number("mtbf_s", mtbf_s)
    _count("num_intervals", num_intervals, 1)
    _count("monte-carlo runs", runs, 2)
    _count("seed", seed)


def _check_run(restart_s, interval_s, monte_carlo_runs, run_days, seed, failures) -> None:
    if not isinstance(failures, FailureModel):
        raise ConfigError(f"failures: expected a FailureModel, got {failures!r}")
    _number("restart-s", restart_s, lo_open=False)
    if interval_s is not None:
        _number("interval-s", interval_s)
    _number("run-days", run_days)
    _count("monte-carlo", monte_carlo_runs)
    _count("seed", seed)


def _mc_summary(totals: np.ndarray, work_s: float, closed_wall_s: float) -> dict:
    mean = float(totals.mean())
    half = Z95 * float(totals.std(ddof=1)) / math.sqrt(totals.size)
    return {
        "runs": int(totals.size), "work_s": work_s, "mean_wall_s": mean, "ci95_wall_s": [mean - half, mean + half],
        "goodput": work_s / mean, "ci95_goodput": [work_s / (mean + half), work_s / max(mean - half, 1e-12)],
        "closed_form_wall_s": closed_wall_s, "closed_form_goodput": work_s / closed_wall_s,
        "agrees": mean - half <= closed_wall_s <= mean + half,
    }


def goodput_curve(tau_s: float, cost: CheckpointCost, mtbf_s: float, points: int = 41) -> list[dict]:
    """Goodput over intervals from tau/10 to 10 tau (log-spaced), for charts."""
    lo = max(tau_s / 10, cost.persist_s - cost.delta_s, 1e-3)
    taus = np.geomspace(lo, max(10 * tau_s, 2 * lo), points)
    return [{"interval_s": float(t), "goodput": goodput(float(t), cost, mtbf_s)} for t in taus]


DEFAULT_STORAGE = "pfs-shared"  # the CLI's and the planner's default storage profile
DEFAULT_ESTIMATOR = "des"  # the step time `perfsim simulate` reports (its default engine), not the closed form
DEFAULT_RESTART_S = 600.0  # assumed: reschedule + container start + process-group init + warm-up (not measured)


def checkpoint_cost(times: dict, restart_s: float, async_checkpoint: bool) -> CheckpointCost:
    """Synchronous: the write blocks. Asynchronous: the host snapshot blocks and the write
    persists in the background. A restart also reads the checkpoint back."""
    if async_checkpoint:
        return CheckpointCost(delta_s=times["snapshot_s"], restart_s=restart_s + times["read_s"],
                              persist_s=times["write_s"])
    return CheckpointCost(delta_s=times["write_s"], restart_s=restart_s + times["read_s"])


def plan_goodput(model, cluster, plan=None, *, failures: FailureModel, storage=DEFAULT_STORAGE,
                 restart_s: float = DEFAULT_RESTART_S, async_checkpoint: bool = False, interval_s: float | None = None,
                 nodes: int | None = None, monte_carlo_runs: int = 0, run_days: float = 30.0, seed: int = 0,
                 estimator: str = DEFAULT_ESTIMATOR, **knobs) -> dict:
    """Goodput of a training run: step time from ``api.simulate`` with ``estimator`` (by default
    the engine, so it equals ``perfsim simulate``'s), checkpoint size from the
    model and plan, save/load times from the storage profile, the Daly interval (or
    ``interval_s``), goodput, lost work per failure and tokens per day; optionally a
    seeded Monte-Carlo over ``run_days`` of useful training."""
    from perfsim import api
    from perfsim.design import checkpoint  # layer 7 peers

    _check_run(restart_s, interval_s, monte_carlo_runs, run_days, seed, failures)
    if not isinstance(storage, str | PathLike | checkpoint.StorageSpec):
        raise ConfigError(f"storage: expected a storage profile name, path or StorageSpec, got {storage!r}")
    model = api.load_model(model)
    cl = api.load_cluster(cluster, nodes=nodes)
    plan = plan or api.make_plan(cl.num_gpus, **knobs)
    report = api.simulate(model, cl, plan, estimator=estimator)
    store = checkpoint.load_storage(storage)
    size = checkpoint.checkpoint_size(model, plan)
    times = checkpoint.checkpoint_times(size, cl, store)
    cost = checkpoint_cost(times, restart_s, async_checkpoint)
    delta, m = cost.delta_s, failures.system_mtbf_s(cl.num_nodes, cl.gpus_per_node)
    daly = daly_interval(delta, m)
    tau = interval_s if interval_s is not None else max(daly, cost.persist_s - delta)
    if not tau > 0:
        raise ConfigError(f"interval-s: must be > 0, got {interval_s!r}")
    _check_progress(tau, cost, m)
    if monte_carlo_runs:
        _check_draws(monte_carlo_runs, max(1, math.ceil(run_days * DAY / tau)), tau, cost, m)
    g = goodput(tau, cost, m)
    out = {
        "model": model.name, "cluster": cl.name, "num_nodes": cl.num_nodes, "num_gpus": cl.num_gpus,
        "plan": plan.describe(), "storage": store.name, "async_checkpoint": async_checkpoint,
        "step_time_s": report.step_time_s, "tokens_per_s": report.tokens_per_s, "estimator": report.estimator,
        "checkpoint_bytes": size.total_bytes, "checkpoint_per_rank_bytes": size.per_rank_bytes, **times,
        "system_mtbf_s": m, "failures_per_day": DAY / m, "delta_s": delta, "restart_total_s": cost.restart_s,
        "persist_s": cost.persist_s, "formula": DAILY_FORMULA, "daly_interval_s": daly,
        "young_interval_s": young_interval(delta, m), "interval_s": tau,
        "optimal_interval_s": optimal_interval(cost, m), "steps_per_checkpoint": tau / report.step_time_s,
        "lost_work_per_failure_s": lost_work_s(tau, cost, m), "goodput": g,
        "tokens_per_day": report.tokens_per_s * DAY * g, "tokens_per_day_no_failures": report.tokens_per_s * DAY,
    }
    out["curve"] = goodput_curve(tau, cost, m)
    if monte_carlo_runs:
        intervals = max(1, math.ceil(run_days * DAY / tau))
        out["monte_carlo"] = simulate_failures(tau, intervals, cost, m, runs=monte_carlo_runs, seed=seed)
    return out
