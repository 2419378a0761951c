"""``perfsim calibrate``: fit a cluster profile's free parameters to measurements and
write a new, self-contained profile with provenance.

Inputs (any subset): rccl-tests/nccl-tests logs -> ``[collectives]`` (collective_fit);
kernel CSVs -> the GPU's ``[gemm]``, ``[hbm]``, ``[attention]`` tables (kernel_fit);
point-to-point tables -> xGMI, host and NIC bandwidth (kernel_fit.fit_links, applied
first so the collective fit sees the measured links). Everything the inputs do not
inform is copied unchanged. The output records which files, when, and the MAPE of
each fit before and after in ``provenance``, and each refit table's ``source`` says
it was calibrated. An existing output file is never replaced unless ``force``.
"""

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from perfsim.calibration import calibrate_fabric, collective_fit, kernel_fit
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, load_cluster, write_cluster
from perfsim.cost.collectives import ALGORITHMS
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape
from perfsim.calibration.readers import RcclLog, check_files, read_kernel_csv, read_p2p, read_rccl_log
from perfsim.system.specio import as_path, check_type

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FitSummary:
    name: str  # collectives, gemm, hbm, attention, links
    num_points: int
    mape_before: float | None  # percent; None for direct measurements (links)
    mape_after: float | None
    detail: str


@dataclass(frozen=True, kw_only=True)
class Calibration:
    cluster: ClusterSpec
    fits: tuple[FitSummary, ...]
    path: Path | None
    notes: tuple[str, ...] = ()  # skipped rows, ignored points


def collective_points(logs: list[RcclLog], in_place: bool = False, algorithm: str | None = None,
                      protocol: str | None = None) -> list[collective_fit.CollectivePoint]:
    """One point per row with a time: the log's collective, size and rank geometry, and the
    algorithm and protocol the run forced (``algorithm`` / ``protocol`` where given, else what
    the log prints: ``RcclLog.algorithm`` / ``protocol``)."""
    points = []
    for lg in logs:
        shape = GroupShape(size=lg.num_ranks, per_node=min(lg.gpus_per_node, lg.num_ranks), num_nodes=lg.num_nodes)
        label = f"{lg.op} {lg.num_ranks} ranks/{lg.num_nodes} node{'s' if lg.num_nodes > 1 else ''}"
        algo, proto = algorithm or lg.algorithm, protocol or lg.protocol
        points += [collective_fit.CollectivePoint(coll=Coll(lg.op), size_bytes=s, shape=shape, time_s=t * 1e-6, label=label,
                                                  launch=lg.launch, graph=lg.graph, algorithm=algo, protocol=proto)
                   for s, t in lg.series(in_place)]
    return points


def check_forced(cluster: ClusterSpec, algorithm, protocol, rccl_logs) -> None:
    """Argument check: a forced algorithm / protocol perfsim prices, and logs to apply it to."""
    for name, value, known in (("algorithm", algorithm, tuple(ALGORITHMS)),
                               ("protocol", protocol, tuple(cluster.collectives.protocols))):
        if value is None:
            continue
        if not isinstance(value, str) or value not in known:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(known)}")
        if not rccl_logs:
            raise ConfigError(f"{name}: {value!r} applies to rccl-tests logs (--rccl-log); none given")


def check_priceable(logs: list[RcclLog], cluster: ClusterSpec, algorithm=None, protocol=None) -> None:
    """Input check: each log's forced path can run on its rank geometry (NVLS inside one
    NVSwitch node, the one-shot kernel inside one node), else one line naming the log."""
    for lg, point in ((lg, p) for lg in logs for p in collective_points([lg], False, algorithm, protocol)[:1]):
        if point.algorithm is None and point.protocol is None:
            continue
        try:
            collective_fit.predict(point, cluster)
        except ConfigError as exc:
            raise ConfigError(f"{lg.path}: the run forced {forced_label(point.algorithm, point.protocol).removesuffix(' forced')}, "
                              f"which perfsim cannot price on {cluster.name} ({exc})") from None


def forced_label(algorithm: str | None, protocol: str | None) -> str:
    """How a report names a forced path ("ring / ll128 forced"); "" where nothing is forced."""
    parts = [x for x in (algorithm, protocol) if x]
    return f"{' / '.join(parts)} forced" if parts else ""


def _stamp(text: str, files: list[str], when: str, how: str = "") -> str:
    return f"calibrated by perfsim calibrate at {when} from {', '.join(files)}{how}; previously: {text}"


def _fit_links(cluster, p2p_files, when, fits):
    points = [p for f in p2p_files for p in read_p2p(f)]
    cluster, links = kernel_fit.fit_links(points, cluster)
    for lf in links:
        fits.append(FitSummary(name="links", num_points=lf.num_points, mape_before=None, mape_after=None,
                               detail=f"{lf.name} {lf.before} -> {lf.after} (median, {lf.note})"))
    node = dataclasses.replace(cluster.node, source=_stamp(cluster.node.source, p2p_files, when))
    return dataclasses.replace(cluster, node=node)


def _fit_kernels(cluster, csv_files, when, fits, notes, regenerate_gemm):
    points, dropped = kernel_fit.usable([p for f in csv_files for p in read_kernel_csv(f)], cluster.gpu)
    notes.extend(f"kernel CSV {d} (not used)" for d in dropped)
    if not points:
        raise ConfigError(f"gemm-csv: no row in {', '.join(csv_files)} is for {cluster.gpu.name}")
    # the profile's attention table is the attention fit's start and weak prior: an axis the
    # rows do not measure (backward, non-causal, a head dim) keeps its shape, not a generic start
    gpu, tables = kernel_fit.fit_kernels(points, cluster.gpu, regenerate_gemm, attention_prior=cluster.gpu.attention)
    for t in tables:
        how = (" (started from the previous table: what these rows do not measure, the backward pass, "
               "non-causal calls or a head dim, keeps its shape)") if t.name == "attention" else ""
        gpu = kernel_fit.restamp(gpu, t.name, lambda text, h=how: _stamp(text, csv_files, when, h))
        fits.append(FitSummary(name=t.name, num_points=t.num_points, mape_before=t.mape_before, mape_after=t.mape_after,
                               detail=f"x={list(t.xs)} y={list(t.ys)} {t.note}".strip()))
    return dataclasses.replace(cluster, gpu=gpu)


def _fit_collectives(cluster, points, files, when, fits, fit_windows):
    """Single-node points fit the intra-node tuning; multi-node points then fit the
    inter-node parameters (NIC ramp, hop latency) with the intra-node values held."""
    single = [p for p in points if p.shape.num_nodes == 1]
    if single:
        fit = collective_fit.fit_collectives(single, cluster, fit_windows=fit_windows)
        tuning = dataclasses.replace(fit.tuning, source=_stamp(fit.tuning.source, files, when))
        fits.append(FitSummary(name="collectives", num_points=fit.num_points, mape_before=fit.mape_before,
                               mape_after=fit.mape_after, detail="fitted: " + ", ".join(fit.fitted)))
        cluster = dataclasses.replace(cluster, collectives=tuning)
    if len(single) < len(points):
        cluster = calibrate_fabric.fit(cluster, points, files, when, fits, FitSummary, _stamp)
    return cluster


def _provenance(base: str, files: list[str], when: str, fits: list[FitSummary]) -> dict[str, str]:
    prov = {"calibrated_at": when, "base_profile": base, "inputs": ", ".join(files), "tool": "perfsim calibrate"}
    for i, f in enumerate(fits):
        err = "" if f.mape_before is None else f" MAPE {f.mape_before:.2f}% -> {f.mape_after:.2f}% over {f.num_points} points;"
        prov[f"fit.{f.name}" + (f".{i}" if f.name == "links" else "")] = f"{err} {f.detail}".strip()
    return prov


def calibrate(cluster: str | ClusterSpec, *, rccl_logs=(), kernel_csvs=(), p2p=(), out: str | Path | None = None,
              force: bool = False, fit_windows: bool = True, in_place: bool = False, regenerate_gemm: bool = False,
              name: str | None = None, now: dt.datetime | None = None, collective_tables=(), series=(),
              dispatch_tables=(), algorithm: str | None = None, protocol: str | None = None) -> Calibration:
    """Fit ``cluster`` (name, path or spec) to the given files; write to ``out`` when given.

    ``in_place`` fits the in-place rccl-tests columns instead of out-of-place;
    ``fit_windows=False`` keeps the protocol and direct windows; ``regenerate_gemm``
    places new GEMM table knots over the measured sizes instead of refitting the old ones.
    ``collective_tables`` are multi-node CSV tables (readers_multinode; ``series`` picks
    some of their series), ``dispatch_tables`` MoE dispatch/combine tables. ``algorithm`` /
    ``protocol`` name the path the rccl-tests runs forced (NCCL_ALGO / NCCL_PROTO) where their
    logs do not print it; a log that does is fitted on its own path either way.
    """
    rccl_logs, kernel_csvs, p2p = (check_files(n, f) for n, f in (("rccl_logs", rccl_logs),
                                                                   ("kernel_csvs", kernel_csvs), ("p2p", p2p)))
    check_type("cluster", cluster, (str, PathLike, ClusterSpec), "a profile name, path or ClusterSpec")
    if out is not None:
        as_path(out, "out")
    if not (rccl_logs or kernel_csvs or p2p or collective_tables or dispatch_tables):
        raise ConfigError("calibrate: give at least one measurement file (--rccl-log, --gemm-csv, --p2p, "
                          "--collective-csv, --dispatch-csv)")
    out = Path(out) if out is not None else None
    if out is not None and out.exists() and not force:
        raise ConfigError(f"out: {str(out)!r} exists; pass --force (force=True) to replace it")
    base = cluster.name if isinstance(cluster, ClusterSpec) else str(cluster)
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    when = (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")
    check_forced(spec, algorithm, protocol, rccl_logs)
    logs = [read_rccl_log(f) for f in rccl_logs]
    check_priceable(logs, spec, algorithm, protocol)
    notes = [f"{lg.path}: skipped {lg.num_skipped} unparsable lines {list(lg.skipped_lines)}" for lg in logs if lg.num_skipped]
    notes += [note for lg in logs for note in lg.env_notes]
    files = [str(Path(f).resolve()) for f in (*p2p, *kernel_csvs, *rccl_logs, *collective_tables, *dispatch_tables)]
    fits: list[FitSummary] = []
    if p2p:
        spec = _fit_links(spec, [str(f) for f in p2p], when, fits)
    if kernel_csvs:
        spec = _fit_kernels(spec, [str(f) for f in kernel_csvs], when, fits, notes, regenerate_gemm)
    points = (collective_points(logs, in_place, algorithm, protocol)
              + calibrate_fabric.table_points(collective_tables, series, in_place))
    plain = [p for p in points if p.launch == "mpi" and not p.graph]  # launch-mode runs refit only their floor
    collective_files = [str(f) for f in (*rccl_logs, *collective_tables)]
    if plain:
        spec = _fit_collectives(spec, plain, collective_files, when, fits, fit_windows)
    if len(plain) < len(points):
        spec = calibrate_fabric.fit_launch(spec, [p for p in points if p not in plain], collective_files, when, fits,
                                           FitSummary, _stamp)
    if dispatch_tables:
        spec = calibrate_fabric.fit_dispatch(spec, dispatch_tables, when, fits, FitSummary, _stamp)
    new_name = name or (out.stem if out is not None else f"{spec.name}-calibrated")
    spec = dataclasses.replace(spec, name=new_name, provenance=_provenance(base, files, when, fits),
                               description=f"{spec.description} [calibrated {when}]")
    for note in notes:
        log.warning(note)
    path = write_cluster(spec, out, overwrite=force) if out is not None else None
    return Calibration(cluster=spec, fits=tuple(fits), path=path, notes=tuple(notes))
