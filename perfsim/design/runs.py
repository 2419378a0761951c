"""Measured training runs as perfsim cases: predicted vs measured, per run and grouped.

A runs CSV (``validation/runs/*.csv``) holds one measured run per row: the model (a
preset, or a model file relative to the CSV), cluster, nodes and plan knobs, the
software stack, the measured metric and its source, and what the source did not state
(``assumed``). Each run is priced by the closed form (``api.simulate``) under its stack;
the error is signed, ``100 * (predicted - measured) / measured``.
"""

import csv
import dataclasses
import io
import math
import statistics
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import perfsim.api as api
from perfsim.errors import ConfigError, InfeasiblePlan
from perfsim.plan.parallel import split_recompute_modules
from perfsim.plan.routing import RoutingSpec, routing_fields
from perfsim.system.specio import as_path, read_text
from perfsim.system.stacks import StackSpec, load_stack

REQUIRED = ("id", "source_id", "source", "stack", "model", "cluster", "nodes", "mbs", "gbs", "seq",
            "metric", "measured")
INT_KNOBS = ("tp", "pp", "vpp", "ep", "etp", "cp", "zero", "mbs", "gbs", "seq", "first_stage_layers", "last_stage_layers",
             "dispatch_compute_units", "mtp_layers", "pipeline_flushes")
STR_KNOBS = ("dtype", "recompute", "schedule", "dispatch", "fp8_recipe", "zero3_gather", "pipeline_layout")  # plan fields of those names
BOOL_KNOBS = ("fp8_params", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "ep_comm_overlap",
              "shared_expert_overlap", "clip_grad",
              "account_for_embedding", "account_for_loss")  # true / false (empty: the stack's
# default: its [fp8] primary_weights under dtype fp8, its overlap policy)
OPTIONAL = (*INT_KNOBS, *STR_KNOBS, *BOOL_KNOBS, "recompute_modules", "capacity_factor", "routing", "family", "data",
            "assumed", "measured_peak_GB")
GROUPS = ("stack", "family", "scale", "source_id", "data")  # the splits accuracy is reported by
METRICS = ("tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s", "step_time_s")
MAX_RUNS = 10_000  # input bound: rows one runs file may hold
DATA_KINDS = ("", "synthetic", "real")  # what the run read (empty: the source does not say; priced as synthetic)


@dataclass(frozen=True, kw_only=True)
class RunCase:
    id: str
    source_id: str  # the source family accuracy is split by
    source: str
    stack: str
    model: str  # preset name or model file path (resolved against the CSV's folder)
    cluster: str
    nodes: int
    knobs: tuple[tuple[str, object], ...]
    capacity_factor: float | None
    metric: str
    measured: float
    family: str = ""
    data: str = ""
    assumed: str = ""
    measured_peak_bytes: float | None = None  # per-GPU peak memory, where the source prints it
    routing: RoutingSpec | None = None  # MoE routing the case states (None: uniform)

    @property
    def scale(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''}"


@dataclass(frozen=True, kw_only=True)
class RunResult:
    case: RunCase
    stack: str
    predicted: float
    peak_memory_bytes: float
    fits: bool

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted - self.case.measured) / self.case.measured

    @property
    def memory_error_pct(self) -> float | None:
        """Signed error of the predicted per-GPU peak against the printed one (None when not printed)."""
        peak = self.case.measured_peak_bytes
        return None if peak is None else 100 * (self.peak_memory_bytes - peak) / peak


@dataclass(frozen=True, kw_only=True)
class RunsValidation:
    results: tuple[RunResult, ...]
    label: str = ""  # what the stacks were fitted on

    @property
    def mape(self) -> float:
        return _mape(self.results)

    @property
    def median_abs_pct(self) -> float:
        return statistics.median(abs(r.error_pct) for r in self.results) if self.results else math.nan

    def by(self, key: str) -> dict[str, float]:
        """MAPE per ``stack``, ``family``, ``scale``, ``source_id`` or ``data`` (real / synthetic; - unstated)."""
        groups: dict[str, list[RunResult]] = {}
        for r in self.results:
            value = r.stack if key == "stack" else getattr(r.case, key)
            groups.setdefault(str(value) or "-", []).append(r)
        return {k: _mape(v) for k, v in groups.items()}

    def to_dict(self) -> dict:
        return {"label": self.label, "mape_pct": self.mape, "median_abs_error_pct": self.median_abs_pct,
                **{f"mape_by_{k}_pct": self.by(k) for k in GROUPS},
                "runs": [{"id": r.case.id, "source_id": r.case.source_id, "stack": r.stack, "family": r.case.family,
                          "scale": r.case.scale, "metric": r.case.metric, "measured": r.case.measured,
                          "predicted": r.predicted, "error_pct": r.error_pct, "fits": r.fits,
                          "peak_memory_GB": r.peak_memory_bytes / 1e9, "memory_error_pct": r.memory_error_pct,
                          "assumed": r.case.assumed}
                         for r in self.results]}


def _mape(results) -> float:
    return sum(abs(r.error_pct) for r in results) / len(results) if results else math.nan


# ---- reading ---------------------------------------------------------------------------


def read_runs(path: str | PathLike) -> tuple[RunCase, ...]:
    """The cases of a runs CSV; ConfigError naming the file, row and column of a bad value."""
    path = as_path(path, "--runs")
    reader = csv.DictReader(io.StringIO(read_text(path, "runs CSV")))
    columns = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise ConfigError(f"{path}: missing column {missing[0]!r} (required: {', '.join(REQUIRED)})")
    unknown = [c for c in columns if c not in REQUIRED and c not in OPTIONAL]
    if unknown:
        raise ConfigError(f"{path}: unknown column {unknown[0]!r}")
    cases = []
    for i, row in enumerate(reader, start=2):
        if len(cases) >= MAX_RUNS:
            raise ConfigError(f"{path}: more than {MAX_RUNS:,} runs")
        cases.append(_case(row, f"{path}:{i}", path.parent))
    if not cases:
        raise ConfigError(f"{path}: no runs")
    return tuple(cases)


def _case(row: dict, where: str, folder: Path) -> RunCase:
    for key in REQUIRED:
        if not (row.get(key) or "").strip():
            raise ConfigError(f"{where}: {key}: empty")
    knobs = {k: _int(row, k, where) for k in INT_KNOBS if (row.get(k) or "").strip()}
    knobs.update({k: row[k].strip() for k in STR_KNOBS if (row.get(k) or "").strip()})
    for key in BOOL_KNOBS:
        text = (row.get(key) or "").strip().lower()
        if text not in ("", "true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"{where}: {key}: expected true or false, got {row[key]!r}")
        if text:
            knobs[key] = text in ("true", "1", "yes")
    modules = (row.get("recompute_modules") or "").strip()
    if modules:  # Megatron's --recompute-modules as written: names separated by spaces (or commas)
        knobs["recompute_modules"] = split_recompute_modules(modules)
    if row["metric"] not in METRICS:
        raise ConfigError(f"{where}: metric: {row['metric']!r} is not one of {', '.join(METRICS)}")
    measured = _float(row, "measured", where)
    if not measured > 0:
        raise ConfigError(f"{where}: measured: must be > 0, got {row['measured']!r}")
    data = (row.get("data") or "").strip()
    if data not in DATA_KINDS:
        raise ConfigError(f"{where}: data: {data!r} is not one of synthetic, real (or empty: not stated)")
    if data == "real":  # priced through the stack's input pipeline (plan.real_data)
        knobs["real_data"] = True
    factor = _float(row, "capacity_factor", where) if (row.get("capacity_factor") or "").strip() else None
    peak = _float(row, "measured_peak_GB", where) * 1e9 if (row.get("measured_peak_GB") or "").strip() else None
    routing = _routing(row, where, folder)
    model, stack = row["model"].strip(), row["stack"].strip()
    if model.endswith((".toml", ".json")):
        model = str(folder / model)
    if stack.endswith(".toml"):
        stack = str(folder / stack)
    cluster = row["cluster"].strip()
    if cluster.endswith(".toml"):  # a cluster profile file beside the CSV (e.g. a GPU variant of a shipped one)
        cluster = str(folder / cluster)
    try:
        load_stack(stack)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return RunCase(id=row["id"].strip(), source_id=row["source_id"].strip(), source=row["source"].strip(),
                   stack=stack, model=model, cluster=cluster,
                   nodes=_int(row, "nodes", where), knobs=tuple(sorted(knobs.items())), capacity_factor=factor,
                   metric=row["metric"], measured=measured, family=(row.get("family") or "").strip(),
                   data=data, assumed=(row.get("assumed") or "").strip(),
                   measured_peak_bytes=peak, routing=routing)


def _routing(row: dict, where: str, folder: Path) -> RoutingSpec | None:
    """The MoE routing the case states (``uniform``, ``blocked``, ``zipf[:S]``, ``dirichlet[:A]`` or a
    histogram file beside the CSV); None when empty (perfsim's uniform default)."""
    text = (row.get("routing") or "").strip()
    if not text:
        return None
    try:
        return RoutingSpec(**routing_fields(text, "routing", folder))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _int(row: dict, key: str, where: str) -> int:
    try:
        value = int(row[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key}: expected an integer, got {row[key]!r}") from None
    if value < 0:
        raise ConfigError(f"{where}: {key}: must be >= 0, got {value}")
    return value


def _float(row: dict, key: str, where: str) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key}: expected a number, got {row[key]!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {key}: must be finite, got {row[key]!r}")
    return value


# ---- predicting ------------------------------------------------------------------------


def predict(case: RunCase, stack: StackSpec | None = None, estimator: str = "analytic") -> RunResult:
    """The case priced under ``stack`` (default: the case's own stack profile)."""
    spec = stack if stack is not None else load_stack(case.stack)
    model = api.load_model(case.model)
    if case.capacity_factor is not None:
        model = dataclasses.replace(model, capacity_factor=case.capacity_factor)
    try:
        report = api.simulate(model, case.cluster, nodes=case.nodes, estimator=estimator, check_memory=False,
                              stack=spec, routing=case.routing, **dict(case.knobs))
    except (ConfigError, InfeasiblePlan) as exc:
        raise ConfigError(f"run {case.id}: {exc}") from None
    return RunResult(case=case, stack=spec.name, predicted=_metric(report, case), fits=report.fits,
                     peak_memory_bytes=report.peak_memory_bytes)


def _metric(report, case: RunCase) -> float:
    seq = dict(case.knobs)["seq"]
    return {"tokens_per_s_per_gpu": report.tokens_per_s_per_gpu, "tokens_per_s": report.tokens_per_s,
            "samples_per_s": report.tokens_per_s / seq, "step_time_s": report.step_time_s}[case.metric]


def validate_runs(cases, stacks: dict[str, StackSpec] | None = None, estimator: str = "analytic",
                  label: str = "", executor=None) -> RunsValidation:
    """Every case priced under ``stacks[case.id]`` when given, else its own stack profile;
    ``executor`` (``perfsim.search.executors``): where the runs are priced (default: here,
    one after another)."""
    stacks = stacks or {}
    tasks = [(c, stacks.get(c.id), estimator) for c in cases]
    results = executor.map(predict_task, tasks) if executor is not None else map(predict_task, tasks)
    return RunsValidation(results=tuple(results), label=label)


def predict_task(task: tuple) -> RunResult:
    """``predict`` of one (case, stack, estimator): the picklable task an executor maps."""
    return predict(*task)


def unstated_routing(cases) -> tuple[str, ...]:
    """Ids of MoE runs on real data with no stated routing: priced under uniform routing,
    which real tokens do not follow (the expert load skews), so their error carries it."""
    return tuple(c.id for c in cases if c.data == "real" and c.routing is None and api.load_model(c.model).is_moe)


def routing_note(cases) -> str:
    """What ``validate`` says about ``unstated_routing`` runs ('' when there are none)."""
    skewed = unstated_routing(cases)
    if not skewed:
        return ""
    return (f"{len(skewed)} MoE run(s) on real data state no routing and are priced with uniform routing "
            f"(give a routing column to price their expert skew): {', '.join(skewed)}")


def memory_stats(results) -> dict:
    """The predicted per-GPU peaks against the printed ones (``peaks``, ``peak_median_abs_pct``,
    ``peak_error_min_pct``, ``peak_error_max_pct``: only where a source prints one) and the runs
    perfsim predicts not to fit (``predicted_not_to_fit``: every run in a runs file ran)."""
    errs = [r.memory_error_pct for r in results if r.memory_error_pct is not None]
    out = {"predicted_not_to_fit": sum(not r.fits for r in results)}
    if errs:
        out.update(peaks=len(errs), peak_median_abs_pct=statistics.median(abs(e) for e in errs),
                   peak_error_min_pct=min(errs), peak_error_max_pct=max(errs))
    return out


def memory_note(result: RunsValidation) -> str:
    """``memory_stats`` as one line; empty when neither applies."""
    m = memory_stats(result.results)
    parts = ([f"{m['peaks']} printed peak{'s' * (m['peaks'] > 1)}, median |error| {m['peak_median_abs_pct']:.1f}% "
              f"({m['peak_error_min_pct']:+.1f}% to {m['peak_error_max_pct']:+.1f}%)"] if "peaks" in m else [])
    if m["predicted_not_to_fit"]:
        parts.append(f"{m['predicted_not_to_fit']} of {len(result.results)} runs predicted not to fit")
    return "memory: " + "; ".join(parts) if parts else ""


def read_all(paths) -> tuple[RunCase, ...]:
    if not isinstance(paths, list | tuple) or not paths:
        raise ConfigError(f"--runs: expected one or more runs CSV files, got {paths!r}")
    cases = tuple(c for p in paths for c in read_runs(p))
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise ConfigError(f"--runs: run id {c.id!r} appears twice")
        seen.add(c.id)
    return cases
