"""The multi-node part of ``perfsim calibrate``: multi-node collective points fit the
fabric's NIC ramp and hop latency (fabric_fit), dispatch/combine tables fit the MoE
dispatch implementations' efficiencies (dispatch_fit). Each refit table's ``source``
is stamped with the files and time, and a FitSummary says what moved and by how much."""

import dataclasses
import statistics

from perfsim.calibration import dispatch_fit, fabric_fit
from perfsim.calibration.collective_fit import CollectivePoint, breakpoints, with_tuning
from perfsim.calibration.readers_multinode import CollectiveSeries, read_collective_table, read_dispatch_table
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec

FLOOR_BYTES = 64 * 1024  # launch floors are read off the latency-bound sizes


def table_series(tables, series=(), in_place: bool = False) -> list[CollectiveSeries]:
    """The named ``series`` (all when none is named) of multi-node CSV tables."""
    found = [s for t in tables for s in read_collective_table(t, in_place)]
    if series:
        missing = sorted(set(series) - {s.series for s in found})
        if missing:
            raise ConfigError(f"series: {missing[0]!r} is not a timed collective series of {', '.join(map(str, tables))}")
        found = [s for s in found if s.series in series]
    return found


def table_points(tables, series=(), in_place: bool = False) -> list[CollectivePoint]:
    """Points of the named ``series`` (all when none is named) of multi-node CSV tables."""
    return [p for s in table_series(tables, series, in_place) for p in s.points()]


def fit(cluster: ClusterSpec, points: list[CollectivePoint], files: list[str], when: str, fits: list,
        summary, stamp) -> ClusterSpec:
    """Fit the inter-node parameters to the multi-node ``points``; append a summary."""
    result = fabric_fit.fit_fabric(points, cluster)
    fab = result.cluster.fabric
    fab = dataclasses.replace(fab, message_source=stamp(f"fabric_fit over {result.num_points} multi-node points; "
                                                        f"{cluster.fabric.message_source or 'no ramp before'}",
                                                        files, when))
    costs = fabric_fit.step_costs(cluster)
    refit = [n for n in costs if f"protocols.{n}.ring_step_cost_us" in result.fitted]
    kept = ("; " + ", ".join(f"protocols.{n}.ring_step_cost_us " + ("refit, with the ramp" if n in refit else
                                                                     "held (no point over whole nodes that it moves)")
                             for n in costs)) if costs else ""
    tune = dataclasses.replace(result.cluster.collectives,
                               source=stamp(cluster.collectives.source + " | inter_step_latency_us and ring_step_floor_us refit by fabric_fit (with the tree hop, where the profile has its own, in its ratio, and each protocol's own ring step floor from runs that forced that protocol)" + kept,
                                            files, when))
    fits.append(summary(name="fabric", num_points=result.num_points, mape_before=result.mape_before,
                        mape_after=result.mape_after, detail="fitted: " + ", ".join(result.fitted)))
    return dataclasses.replace(cluster, fabric=fab, collectives=tune)


def fit_dispatch(cluster: ClusterSpec, tables, when: str, fits: list, summary, stamp) -> ClusterSpec:
    """Refit the efficiencies of the profile's dispatch implementations the tables measure."""
    points = [p for t in tables for p in read_dispatch_table(t)]
    results = dispatch_fit.fit_dispatch(points, cluster)
    if not results:
        have = ", ".join(cluster.dispatch) or "none"
        raise ConfigError(f"dispatch-csv: no usable row for this profile's implementations ({have})")
    dispatch = dict(cluster.dispatch)
    for r in results:
        spec = dispatch[r.impl]
        changes = {k: v for k, v in (("intra_efficiency", r.intra_efficiency), ("rdma_efficiency", r.rdma_efficiency))
                   if v is not None}
        dispatch[r.impl] = dataclasses.replace(spec, **changes, source=stamp(spec.source, [str(t) for t in tables], when))
        moved = ", ".join(f"{k} {getattr(spec, k)} -> {v}" for k, v in changes.items())
        fits.append(summary(name=f"dispatch.{r.impl}", num_points=r.num_points, mape_before=None, mape_after=None,
                            detail=f"median leg efficiency: {moved}"))
    return dataclasses.replace(cluster, dispatch=dispatch)


def _floor_gaps(points: list[CollectivePoint], cluster: ClusterSpec) -> list[float]:
    """Measured minus mpi/no-graph predicted time (us) at latency-bound sizes."""
    lo = cluster.collectives.direct_min_bytes
    plain = [dataclasses.replace(p, launch="mpi", graph=False) for p in points if lo <= p.size_bytes <= FLOOR_BYTES]
    return [(p.time_s - fabric_fit.predict(p, cluster)) * 1e6 for p in plain]


def graph_window(points: list[CollectivePoint], cluster: ClusterSpec) -> float | None:
    """The one-shot window's lower edge under graph capture: of the cuts between the
    captured log's sizes below ``direct_min_bytes`` (and that edge itself), the one whose
    prices of those rows are closest to the measured (mean |relative error|); None when the
    log has no row below the edge."""
    tune = cluster.collectives
    small = [p for p in points if p.shape.num_nodes == 1 and p.size_bytes < tune.direct_min_bytes]
    if not small or tune.direct_max_bytes <= 0:
        return None
    cuts = breakpoints(small) + [min(p.size_bytes for p in small), tune.direct_min_bytes]

    def error(cut: float) -> float:
        trial = with_tuning(cluster, graph_direct_min_bytes=cut)
        return statistics.mean(abs(fabric_fit.predict(p, trial) / p.time_s - 1) for p in small)

    return min(sorted(set(cuts)), key=error)


def fit_launch(cluster: ClusterSpec, points: list[CollectivePoint], files: list[str], when: str, fits: list,
               summary, stamp) -> ClusterSpec:
    """Single-process (-g N) logs set ``single_process_latency_us`` (median extra time over
    an mpi launch), graph-capture logs ``graph_saving_us`` (median time saved), both at
    latency-bound sizes (direct_min_bytes .. 64 KB), priced by the profile as fitted so far;
    graph-capture logs with rows below direct_min_bytes also ``graph_direct_min_bytes``
    (``graph_window``)."""
    tune, changes, details = cluster.collectives, {}, []
    single = _floor_gaps([p for p in points if p.launch == "single-process" and not p.graph], cluster)
    captured = [p for p in points if p.graph and p.launch == "mpi"]
    graph = _floor_gaps(captured, cluster)
    if single:
        changes["single_process_latency_us"] = round(max(0.0, statistics.median(single)), 3)
    if graph:
        changes["graph_saving_us"] = round(max(0.0, -statistics.median(graph)), 3)
        edge = graph_window(captured, with_tuning(cluster, graph_saving_us=changes["graph_saving_us"]))
        if edge is not None:
            changes["graph_direct_min_bytes"] = edge
    if not changes:
        raise ConfigError("rccl-log: the single-process / graph-capture logs have no row between "
                          f"{tune.direct_min_bytes:g} B and {FLOOR_BYTES} B to read a launch floor from")
    for key, value in changes.items():
        details.append(f"{key} {getattr(tune, key)} -> {value}")
    tune = dataclasses.replace(tune, **changes, source=stamp(tune.source + " | launch floors refit", files, when))
    fits.append(summary(name="launch", num_points=len(single) + len(graph), mape_before=None, mape_after=None,
                        detail="median floor at <= 64 KB: " + ", ".join(details)))
    return dataclasses.replace(cluster, collectives=tune)
