"""Fit a stack profile's free parameters to measured runs (bounded least squares).

The residual of a run is ``log(predicted / measured)`` (a relative error, symmetric in
over- and under-prediction); ``scipy.optimize.least_squares`` minimises their squares
inside each parameter's bounds. ``leave_one_out`` refits without each source in turn
(each run when the runs come from one source only) and prices what was left out: the
error a user should expect on a run the fit has not seen.
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

import perfsim.api as api

from perfsim.design.runs import RunCase, RunsValidation, validate_runs
from perfsim.errors import ConfigError
from perfsim.system.stacks import VENDOR_SPEEDS, CalibrationProtocol, Dispatch, StackSpec, load_stack, speed_param

# Physically meaningful ranges (input bounds, not hardware numbers): more than 5 ms of
# framework time per layer pass or per host sync, or kernels 5x slower or 2x faster than
# the tuned ones the tables hold, would be some other cost the fit is absorbing (a bound
# reached says so: ``StackFit.at_bound``).
BOUNDS = {
    "kernels.speed": (0.2, 2.0),
    "kernels.speed_amd": (0.2, 2.0),
    "kernels.speed_nvidia": (0.2, 2.0),
    "launch.layer_overhead_us": (0.0, 5_000.0),
    "launch.kernel_gap_us": (0.0, 500.0),
    "moe.host_sync_us": (0.0, 5_000.0),
    "moe.padded_speed": (0.2, 2.0),
    "moe.dropless_speed": (0.2, 2.0),
    # more than 2000 s per million tokens per GPU (under 500 tokens/s per GPU) would be a
    # stalled pipeline, not a cost of the step
    "data.host_s_per_mtoken": (0.0, 2000.0),
    # the share of an overlapped TP collective hidden behind its GEMM: none to all of it
    "overlap.tp_comm_share": (0.0, 1.0),
    # the share of an overlapped expert-parallel all-to-all hidden behind the other pass
    "overlap.ep_comm_share": (0.0, 1.0),
}
# where no run informs a parameter (the input pipeline without a real-data run, a GPU
# vendor's kernels' speed without a run on that vendor), a fit holding those runs out sets it
# to the profile's assumed value, not the shipped fit: no input cost, and no speed of the
# vendor's own (its GPUs run at the stack's kernels.speed)
PRIORS = {"data.host_s_per_mtoken": 0.0, "kernels.speed_amd": None, "kernels.speed_nvidia": None,
          "overlap.tp_comm_share": 1.0, "overlap.ep_comm_share": 1.0, "moe.padded_speed": 1.0,
          "moe.dropless_speed": 1.0}
# the routed-expert speed of a dispatch path: informed only by MoE runs on that path (its
# prior 1: the tuned grouped kernels the GPU's tables price)
PATH_SPEEDS = ("moe.padded_speed", "moe.dropless_speed")
# the default where the runs are dense: one parameter, identified by every run. MoE runs
# also fit the routed-expert kernels' speed of each dispatch path with its own kernels
# (``params_for``); a per-layer overhead fitted beside them runs to its bound on the
# MaxText sources (the misfit is not a per-layer constant)
DEFAULT_PARAMS = ("kernels.speed",)
MAX_EVALS = 60  # residual evaluations per fit (each prices every run once)


@dataclass(frozen=True, kw_only=True)
class StackFit:
    stack: StackSpec
    values: dict[str, float]
    fitted_on: tuple[str, ...]  # source ids
    num_runs: int
    rms_log_error: float
    at_bound: tuple[str, ...] = ()  # parameters the fit pushed to a bound


def _current(stack: StackSpec, param: str) -> float:
    table, _, key = param.partition(".")
    value = getattr(getattr(stack, table), key)
    return float(stack.kernels.speed if value is None else value)  # an unset vendor speed is the speed


def vendor_of(case: RunCase) -> str:
    """The GPU vendor a run ran on (its cluster profile's GPU)."""
    return api.load_cluster(case.cluster).gpu.vendor


def _speeds(cases, base: StackSpec | None = None) -> tuple[str, ...]:
    """The kernels' speed the runs identify: one, or one per GPU vendor where the runs span
    vendors (the stack's kernel libraries differ by vendor: ``KernelQuality.speed_amd``)."""
    vendors = {vendor_of(c) for c in cases}
    if len(vendors) > 1:
        return tuple(sorted({speed_param(v) for v in vendors}))
    # one vendor: its own speed where a run's stack sets one (that speed, not kernels.speed,
    # prices the run), else the stack's kernels.speed
    (vendor,) = vendors or {""}
    field = VENDOR_SPEEDS.get(vendor)
    stacks = [base] if base is not None else [load_stack(c.stack) for c in cases]
    if field and any(getattr(s.kernels, field) is not None for s in stacks):
        return (speed_param(vendor),)
    return DEFAULT_PARAMS


def _prices(param: str, cases, base: StackSpec) -> bool:
    """Whether ``param`` of ``base`` prices any of ``cases``: a vendor's kernels' speed only
    that vendor's runs, ``kernels.speed`` only runs whose vendor has no speed of its own set."""
    if not param.startswith("kernels.speed"):
        return True
    vendors = {vendor_of(c) for c in cases}
    if param == "kernels.speed":
        return any(v not in VENDOR_SPEEDS or getattr(base.kernels, VENDOR_SPEEDS[v]) is None for v in vendors)
    return any(speed_param(v) == param for v in vendors)


def _check(params) -> tuple[str, ...]:
    params = tuple(params)
    for p in params:
        if p not in BOUNDS:
            raise ConfigError(f"--fit: {p!r} is not a free stack parameter (one of {', '.join(BOUNDS)})")
    if not params:
        raise ConfigError("--fit: name at least one parameter")
    return params


def params_for(cases, base: StackSpec | None = None) -> tuple[str, ...]:
    """The free parameters the runs identify: the kernels' speed, which every run's dense
    GEMMs and attention set, plus the routed-expert speed of each MoE dispatch path with
    kernels of its own (dropless grouped GEMMs; padded to capacity unless the stack runs
    the padded experts as batched dense GEMMs, ``moe.mask_einsum``, which are the dense
    kernels the speed already covers: the two would be one parameter fitted twice), plus
    the input pipeline's cost where runs on real and on synthetic data are both present."""
    paths = _path_speeds(cases)
    data = ("data.host_s_per_mtoken",) if identified("data.host_s_per_mtoken", cases) else ()
    # overlap.tp_comm_share is fitted only where asked (--fit): on torchtitan's two sources,
    # the runs that identify it, a share fitted on either priced the other worse than the
    # shipped full overlap (validation/runs/SOURCES.md)
    return (*_speeds(cases, base), *sorted(paths, reverse=True), *data)


def _declared(cases, base: StackSpec) -> tuple[str, ...]:
    """The stack's calibration protocol (``[calibration] fit``) less what ``cases`` do not
    identify or that prices none of them (``identified``, ``_prices``)."""
    return tuple(p for p in base.calibration.fit if identified(p, cases) and _prices(p, cases, base))


def protocol_params(cases, base: StackSpec) -> tuple[str, ...]:
    """The parameters a fit of ``cases`` under ``base`` frees by default: the stack's
    calibration protocol, those of it the runs identify (``_declared``); every parameter the
    runs identify (``params_for``) where the profile names none, or where the runs identify
    none of those it names (runs on another vendor's GPUs)."""
    return _declared(cases, base) or params_for(cases, base)


def default_params(cases, base: StackSpec) -> tuple[str, ...]:
    """What ``fit_stack`` frees when no parameter is named: the one a single run identifies
    (``one_run_params``), else the stack's protocol among those the runs identify
    (``protocol_params``)."""
    return one_run_params(cases[0], base) if len(cases) == 1 else protocol_params(cases, base)


def default_reason(cases, base: StackSpec) -> str:
    """Why ``default_params`` frees what it does, in a few words (calibrate prints it)."""
    if len(cases) == 1:
        return "one run: the one parameter it identifies"
    if not base.calibration.fit:
        return "every parameter the runs identify"
    if _declared(cases, base):
        return "the stack's protocol, [calibration] fit"
    return "every parameter the runs identify: none of the stack's protocol"


def _path_speeds(cases) -> set[str]:
    """The routed-expert speeds (``PATH_SPEEDS``) the MoE runs among ``cases`` price: each
    run's dispatch path under its stack, where that path has kernels of its own."""
    paths = set()
    for c in cases:
        if not api.load_model(c.model).is_moe:
            continue
        stack = load_stack(c.stack)
        pads = stack.moe.dispatch is Dispatch.CAPACITY and (c.capacity_factor or 0) > 0
        if not (pads and stack.moe.mask_einsum):
            paths.add("moe.padded_speed" if pads else "moe.dropless_speed")
    return paths


def _overlap_states(cases, degree: str, knob: str, policy: str) -> set[bool]:
    """Whether each run with ``degree`` > 1 (tp, ep) overlapped that communication (``knob`` as
    the run states it, else its stack's ``overlap.<policy>``): runs in both states tell the
    overlap's hidden share apart."""
    states = set()
    for c in cases:
        knobs = dict(c.knobs)
        if knobs.get(degree, 1) > 1:
            stated = knobs.get(knob)
            states.add(bool(getattr(load_stack(c.stack).overlap, policy)) if stated is None else stated)
    return states


def identified(param: str, cases) -> bool:
    """Whether ``cases`` inform ``param``: every parameter without a prior (``PRIORS``) is
    informed by any run. The input pipeline's cost: only runs on real data beside runs on
    synthetic data (stated as such) on one vendor's GPUs tell it apart from the kernels' speed,
    which stretches both alike (real runs on one vendor beside synthetic runs on another contrast
    the two vendors' speeds, each its own parameter).
    A GPU vendor's kernels' speed: only runs on that vendor's GPUs. The TP overlap's hidden share:
    only runs with tensor parallelism both with and without the overlap; the expert-parallel
    overlap's likewise, with expert parallelism. A dispatch path's
    routed-expert speed: only MoE runs on that path (a fold without one prices the path at its
    prior, never at a shipped fit that saw the held-out runs)."""
    if param.startswith("kernels.speed_"):
        return any(speed_param(vendor_of(c)) == param for c in cases)
    if param == "overlap.tp_comm_share":  # the same plans with and without the overlap
        return _overlap_states(cases, "tp", "tp_comm_overlap", "tp_comm") == {True, False}
    if param == "overlap.ep_comm_share":  # expert-parallel runs with and without the overlap
        return _overlap_states(cases, "ep", "ep_comm_overlap", "ep_comm") == {True, False}
    if param in PATH_SPEEDS:  # only runs on that dispatch path
        return param in _path_speeds(cases)
    if param == "data.host_s_per_mtoken":  # real beside synthetic data on one vendor's GPUs
        kinds: dict[str, set] = {}
        for c in cases:
            kinds.setdefault(vendor_of(c), set()).add(c.data)
        return any({"real", "synthetic"} <= k for k in kinds.values())
    return param not in PRIORS


def one_run_params(case: RunCase, base: StackSpec | None = None) -> tuple[str]:
    """The one parameter a single measured run identifies (one measurement fits one value):
    the routed-expert speed of an MoE run's dispatch path where that path has kernels of its
    own, else the kernels' speed (its vendor's where the stack sets one)."""
    paths = [p for p in params_for([case], base) if p.startswith("moe.")]
    return (paths[0],) if paths else _speeds([case], base)


def fit_stack(cases: list[RunCase], base: StackSpec | str, params=None, memo: dict | None = None,
              executor=None) -> StackFit:
    """``base`` with ``params`` fitted to ``cases`` (all priced under it); by default the
    stack's protocol among those the runs identify (``protocol_params``), and for a single run the
    one it identifies (``one_run_params``).
    ``memo``: prices already computed under stacks that differ from ``base`` only in their free
    parameters (``BOUNDS``), by run and those parameters' values; ``leave_one_out`` shares one
    across its folds, which all start from the same values and so price the same points first.
    ``executor`` (``perfsim.search.executors``): where each evaluation's runs are priced
    (default: here, one after another); the fit does not depend on it."""
    if not cases:
        raise ConfigError("calibrate --runs: no runs to fit")
    base = load_stack(base)
    if params is None:
        params = default_params(cases, base)
    params = _check(params)
    flat = [p for p in params if not _prices(p, cases, base)]
    if flat:
        raise ConfigError(f"--fit: {flat[0]} prices none of these runs (a GPU vendor's kernels' speed prices only "
                          f"its runs; kernels.speed only runs whose vendor has no speed of its own in {base.name})")
    lo = np.array([BOUNDS[p][0] for p in params])
    hi = np.array([BOUNDS[p][1] for p in params])
    start = np.clip([_current(base, p) for p in params], lo, hi)
    scale = np.maximum(hi - lo, 1e-9) / 10

    shared = memo if memo is not None else {}  # this fit's own prices where no memo is shared

    def residuals(x: np.ndarray) -> np.ndarray:
        stack = base.with_values(**dict(zip(params, map(float, x))))
        values = tuple(_current(stack, p) for p in BOUNDS)  # once per stack, not per run
        todo = [c for c in cases if (c.id, values) not in shared]
        for r in validate_runs(todo, dict.fromkeys((c.id for c in todo), stack), executor=executor).results:
            shared[(r.case.id, values)] = r.predicted
        return np.array([math.log(shared[(c.id, values)] / c.measured) for c in cases])

    result = least_squares(residuals, start, bounds=(lo, hi), x_scale=scale, diff_step=1e-3, max_nfev=MAX_EVALS)
    values = dict(zip(params, map(float, result.x)))
    source = f"fitted by perfsim calibrate --runs to {len(cases)} runs of {', '.join(sorted({c.source_id for c in cases}))}"
    stack = base.with_values(**values)
    stack = stack.with_values(**{f"{t}.source": source for t in {p.partition('.')[0] for p in params}})
    # the profile records what it was fitted on, so that refitting it frees the same parameters
    stack = dataclasses.replace(stack, calibration=CalibrationProtocol(
        fit=tuple(params), source=f"perfsim calibrate --runs fitted these to {len(cases)} runs "
                                  f"({', '.join(sorted({c.source_id for c in cases}))})"))
    rms = float(np.sqrt(np.mean(result.fun ** 2)))
    at_bound = tuple(p for p, v, a, b in zip(params, result.x, lo, hi) if min(v - a, b - v) <= 1e-6 * (b - a))
    return StackFit(stack=stack, values=values, fitted_on=tuple(sorted({c.source_id for c in cases})),
                    num_runs=len(cases), rms_log_error=rms, at_bound=at_bound)


def _informing(param: str, rest: list[RunCase], held: list[RunCase]) -> list[RunCase]:
    """The runs of ``rest`` that may inform ``param`` for pricing ``held``: a dispatch path's
    routed-expert speed only runs on the held-out runs' GPU vendors, where the runs span
    vendors (the stack's grouped kernels differ by vendor, as its kernels' speed does:
    ``kernels.speed_amd`` / ``speed_nvidia``); every other parameter, all of them."""
    if param not in PATH_SPEEDS:
        return rest
    vendors = {vendor_of(c) for c in held}
    return [c for c in rest if vendor_of(c) in vendors]


def leave_one_out(cases: list[RunCase], base: StackSpec | str, params=None, executor=None) -> RunsValidation:
    """Each held-out group (a source; a run when there is one source) priced by a fit to the
    rest (``params``: default the stack's protocol among those the runs identify,
    ``protocol_params``)."""
    base = load_stack(base)
    params = protocol_params(cases, base) if params is None else params
    sources = sorted({c.source_id for c in cases})
    by_source = len(sources) > 1
    groups = sources if by_source else [c.id for c in cases]
    stacks, memo = {}, {}  # the folds' shared prices (``fit_stack``)
    for group in groups:
        held = [c for c in cases if (c.source_id if by_source else c.id) == group]
        rest = [c for c in cases if c not in held]
        if not rest:
            continue
        fold = [p for p in params if identified(p, _informing(p, rest, held)) and _prices(p, rest, base)]
        # uninformed: the prior, or the profile's own value (a vendor's speed: the stack's speed)
        start = base.with_values(**{p: PRIORS[p] for p in params if p not in fold and p in PRIORS})
        fitted = fit_stack(rest, start, fold, memo=memo, executor=executor).stack if fold else start  # nothing the rest informs: as assumed
        stacks.update({c.id: fitted for c in held})
    label = "leave-one-source-out" if by_source else "leave-one-run-out (one source)"
    kept = [c for c in cases if c.id in stacks]
    return validate_runs(kept, stacks, label=label, executor=executor)


def held_out_summary(loo: RunsValidation) -> str:
    """One line on a ``leave_one_out`` result for the CLI and the planner; with one run
    nothing is left to fit when it is held out, so there is no figure (not a NaN)."""
    if not loo.results:
        return f"{loo.label}: not reported (one run: nothing is left to fit when it is held out)"
    return f"{loo.label}: MAPE {loo.mape:.1f}%, median |error| {loo.median_abs_pct:.1f}% over {len(loo.results)} runs"


def sources_by_stack(cases) -> dict[str, set[str]]:
    """The sources each stack's runs come from (two or more: ``held_out_by_stack`` refits it)."""
    out: dict[str, set[str]] = {}
    for c in cases:
        out.setdefault(c.stack, set()).add(c.source_id)
    return out


def held_out_by_stack(cases: list[RunCase], params=None, executor=None) -> RunsValidation:
    """Per stack: leave-one-source-out fits where the stack has runs from two or more
    sources; runs of a single-source stack keep the shipped profile (nothing to hold out)."""
    results = []
    for stack, sources in sorted(sources_by_stack(cases).items()):
        mine = [c for c in cases if c.stack == stack]
        if len(sources) > 1:
            results += leave_one_out(mine, stack, params, executor).results
        else:
            results += validate_runs(mine, executor=executor).results
    return RunsValidation(results=tuple(results), label="leave-one-source-out per stack "
                          "(single-source stacks: shipped profile, not fitted)")
