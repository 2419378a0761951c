"""Fit a cluster's ``[collectives]`` tuning to measured collective sweeps (scipy).

perfsim.cost.collectives prices a call as

    launch + protocol latency + n_intra x intra step + n_inter x inter step + B / efficiency
           + fixed latency + fixed bandwidth time

where n_intra, n_inter, B (bandwidth seconds at efficiency 1) and the fixed terms (an
all-to-all implementation's own latency and its bandwidth time at its own efficiency,
``[dispatch.<impl>]``; NVLS's latency) depend only on the algorithm, the buffer and the
group, not on the tuning fitted here. So each measured point is
decomposed once per algorithm through ``collectives.collective_cost`` itself (a unit
tuning), and the fit evaluates that linear form vectorised; the selector (fastest
applicable algorithm, protocol by size window, direct window single-node only) is
``collectives``' own. Free parameters:

* per protocol: the per-call latency L (written back as launch = min L, protocol
  latency = L - launch) and the bandwidth efficiency;
* the intra-node (and, with multi-node data, inter-node) per-step latency;
* change points: the protocol windows and the direct (one-shot) window, each placed
  at a geometric midpoint between two measured sizes (coordinate descent, keep a
  move only when it lowers the MAPE). ``fit_windows=False`` keeps the profile's.

Continuous parameters use ``least_squares`` on relative error with a soft-L1 loss
(f_scale 5%: quadratic near the fit, linear for outliers, i.e. close to the MAPE the
fit is judged by) and a weak pull (weight ``PRIOR``) toward the profile's values so
parameters the data cannot identify stay where they were.
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from perfsim.cost import collectives
from perfsim.cost.collectives import ALGORITHMS, collective_cost
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, CollectiveTuning
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape

PRIOR = 1e-3
MIN_BW_SHARE = 0.2  # a window must hold a point whose bandwidth term is >= this share of its time
EFF_BOUNDS = (0.02, 1.0)
STEP_BOUNDS_US = {"intra": (0.0, 5.0), "inter": (0.0, 50.0)}
LATENCY_MAX_US = 500.0


@dataclass(frozen=True, kw_only=True)
class CollectivePoint:
    coll: Coll
    size_bytes: float
    shape: GroupShape
    time_s: float
    label: str = ""
    algorithm: str | None = None  # forced by the run (NCCL_ALGO), None: the selector's pick
    protocol: str | None = None  # forced by the run (NCCL_PROTO)
    launch: str = "mpi"  # mpi | single-process (rccl-tests -g N)
    graph: bool = False  # graph capture (rccl-tests -G 1)


@dataclass(frozen=True, kw_only=True)
class CollectiveFit:
    tuning: CollectiveTuning
    mape_before: float  # percent, the input profile on the points
    mape_after: float
    num_points: int
    fitted: tuple[str, ...]  # names of the parameters the data moved


def cluster_for(cluster: ClusterSpec, shape: GroupShape) -> ClusterSpec:
    return cluster if cluster.num_nodes >= shape.num_nodes else cluster.with_nodes(shape.num_nodes)


def predict(point: CollectivePoint, cluster: ClusterSpec) -> float:
    """perfsim's time (s) for one measured point, on the path and launch the run used (its
    forced algorithm and protocol, launch mode, graph capture)."""
    return collective_cost(point.coll, point.size_bytes, point.shape, cluster_for(cluster, point.shape),
                           protocol=point.protocol, algorithm=point.algorithm, launch=point.launch,
                           graph=point.graph).time_s


def mape(points: list[CollectivePoint], cluster: ClusterSpec) -> float:
    return 100 * float(np.mean([abs(predict(p, cluster) / p.time_s - 1) for p in points]))


def with_tuning(cluster: ClusterSpec, **changes) -> ClusterSpec:
    return dataclasses.replace(cluster, collectives=dataclasses.replace(cluster.collectives, **changes))


def _unit(cluster: ClusterSpec, intra: float, inter: float, efficiency: float = 1.0) -> ClusterSpec:
    protos = {k: dataclasses.replace(v, latency_us=0.0, bw_efficiency=efficiency)
              for k, v in cluster.collectives.protocols.items()}
    return with_tuning(cluster, launch_latency_us=0.0, intra_step_latency_us=intra, inter_step_latency_us=inter,
                        protocols=protos)


def _basis(points: list[CollectivePoint], cluster: ClusterSpec) -> np.ndarray:
    """[point, algorithm, (n_intra, n_inter, B seconds, fixed us, fixed bandwidth seconds)];
    nan where the algorithm cannot run. ``fixed``: what no tuning value fitted here scales,
    read at zero steps and at two protocol efficiencies: an all-to-all implementation's own
    per-call latency (or NVLS's), not steps, and its bandwidth time at the implementation's
    efficiency, not the protocol's (``dispatch.<impl>``)."""
    algos = list(ALGORITHMS)
    out = np.full((len(points), len(algos), 5), np.nan)
    units = (_unit(cluster, 0.0, 0.0), _unit(cluster, 1.0, 0.0), _unit(cluster, 0.0, 1.0),
             _unit(cluster, 0.0, 0.0, efficiency=0.5))
    for i, p in enumerate(points):
        for j, algo in enumerate(algos):
            try:
                zero, a, b, half = (collective_cost(p.coll, p.size_bytes, p.shape, cluster_for(u, p.shape),
                                                    algorithm=algo) for u in units)
            except ConfigError:
                continue
            fixed = zero.latency_s * 1e6
            bw, bw_half = zero.time_s - zero.latency_s, half.time_s - half.latency_s  # B_s + B_f, 2 B_s + B_f
            out[i, j] = (a.latency_s * 1e6 - fixed, b.latency_s * 1e6 - fixed, bw_half - bw, fixed, 2 * bw - bw_half)
    return out


@dataclass
class _Problem:
    points: list[CollectivePoint]
    basis: np.ndarray
    measured: np.ndarray
    protocols: list[str]

    def masks(self, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
        """(protocol index per point, allowed-algorithm mask) under ``cluster``'s windows."""
        algos = list(ALGORITHMS)
        proto = np.array([self.protocols.index(collectives.pick_protocol(cluster, p.size_bytes, p.protocol, p.coll, p.shape.size)[0])
                          for p in self.points])  # a run's forced protocol, else the size's window
        allowed = np.zeros(self.basis.shape[:2], dtype=bool)
        for i, p in enumerate(self.points):  # a run's forced algorithm, else the selector's candidates
            names = collectives._candidates(p.coll, p.size_bytes, p.shape, cluster, p.algorithm, p.graph)
            allowed[i] = [a in names for a in algos]
        return proto, allowed & ~np.isnan(self.basis[:, :, 0])

    def times(self, theta: np.ndarray, proto: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        k = len(self.protocols)
        latency, eff, s_intra, s_inter = theta[:k], theta[k:2 * k], theta[2 * k], theta[2 * k + 1]
        b = self.basis
        t = (latency[proto][:, None] + s_intra * b[:, :, 0] + s_inter * b[:, :, 1] + b[:, :, 3]) * 1e-6 \
            + b[:, :, 2] / eff[proto][:, None] + b[:, :, 4]
        return np.where(allowed, t, np.inf).min(axis=1)


def _theta(tuning: CollectiveTuning, protocols: list[str]) -> np.ndarray:
    ps = tuning.protocols
    return np.array([tuning.launch_latency_us + ps[n].latency_us for n in protocols]
                    + [ps[n].bw_efficiency for n in protocols]
                    + [tuning.intra_step_latency_us, tuning.inter_step_latency_us])


def _bounds(problem: _Problem, theta0: np.ndarray, proto: np.ndarray, allowed: np.ndarray):
    """Bounds; a parameter the points cannot move is pinned (lo == hi - tiny)."""
    k = len(problem.protocols)
    lo = np.array([0.0] * k + [EFF_BOUNDS[0]] * k + [STEP_BOUNDS_US["intra"][0], STEP_BOUNDS_US["inter"][0]])
    hi = np.array([LATENCY_MAX_US] * k + [EFF_BOUNDS[1]] * k + [STEP_BOUNDS_US["intra"][1], STEP_BOUNDS_US["inter"][1]])
    used = np.zeros(len(theta0), dtype=bool)
    used[np.unique(proto)] = True
    for q in np.unique(proto):  # an efficiency only where some point's bandwidth time scales with it
        used[k + q] = bool(np.nansum(problem.basis[proto == q][:, :, 2][allowed[proto == q]]) > 0)
    used[2 * k] = bool(np.nansum(problem.basis[:, :, 0][allowed]) > 0)
    used[2 * k + 1] = bool(np.nansum(problem.basis[:, :, 1][allowed]) > 0)
    theta0 = np.clip(theta0, lo, hi)
    lo = np.where(used, lo, theta0 - 1e-12)
    hi = np.where(used, hi, theta0 + 1e-12)
    return theta0, lo, hi, used


def _fit_continuous(problem: _Problem, cluster: ClusterSpec) -> tuple[np.ndarray, float, np.ndarray]:
    proto, allowed = problem.masks(cluster)
    theta0, lo, hi, used = _bounds(problem, _theta(cluster.collectives, problem.protocols), proto, allowed)
    scale = np.maximum(np.abs(theta0), 0.1)

    def residuals(theta):
        rel = problem.times(theta, proto, allowed) / problem.measured - 1
        return np.concatenate([rel, PRIOR * (theta - theta0) / scale])

    fit = least_squares(residuals, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, x_scale=scale)
    err = 100 * float(np.mean(np.abs(problem.times(fit.x, proto, allowed) / problem.measured - 1)))
    return fit.x, err, used, _identified(problem, fit.x, proto, allowed)


def _identified(problem: _Problem, theta: np.ndarray, proto: np.ndarray, allowed: np.ndarray) -> bool:
    """Every protocol that serves points has one where bandwidth is >= MIN_BW_SHARE of the
    time, so its efficiency is set by data (a window of only tiny messages is not)."""
    k = len(problem.protocols)
    times = problem.times(theta, proto, allowed)
    b = np.where(allowed, problem.basis[:, :, 2], np.inf).min(axis=1)  # bw seconds of a fast algorithm
    share = b / theta[k + proto] / times
    return all(share[proto == q].max() >= MIN_BW_SHARE for q in np.unique(proto))


def _apply(cluster: ClusterSpec, theta: np.ndarray, protocols: list[str]) -> ClusterSpec:
    k = len(protocols)
    launch = float(min(theta[:k]))
    protos = {n: dataclasses.replace(cluster.collectives.protocols[n], latency_us=round(float(theta[i]) - launch, 4),
                                     bw_efficiency=round(float(theta[k + i]), 5)) for i, n in enumerate(protocols)}
    return with_tuning(cluster, launch_latency_us=round(launch, 4), protocols=protos,
                        intra_step_latency_us=round(float(theta[2 * k]), 4),
                        inter_step_latency_us=round(float(theta[2 * k + 1]), 4))


def breakpoints(points: list[CollectivePoint]) -> list[float]:
    sizes = sorted({p.size_bytes for p in points})
    return [float(round(math.sqrt(a * b))) for a, b in zip(sizes, sizes[1:])]


def _set_window(cluster: ClusterSpec, name: str, cut: float) -> ClusterSpec | None:
    """``cluster`` with one window edge at ``cut``; None when that breaks the window order."""
    tune = cluster.collectives
    if name == "direct_min_bytes":
        return with_tuning(cluster, direct_min_bytes=cut) if cut <= tune.direct_max_bytes else None
    if name == "direct_max_bytes":
        return with_tuning(cluster, direct_max_bytes=cut) if cut >= tune.direct_min_bytes else None
    ordered = sorted(tune.protocols, key=lambda n: tune.protocols[n].max_bytes)
    idx = ordered.index(name)
    below = tune.protocols[ordered[idx - 1]].max_bytes if idx else 0.0
    if not below < cut < tune.protocols[ordered[idx + 1]].max_bytes:
        return None
    return with_tuning(cluster, protocols=dict(tune.protocols, **{name: dataclasses.replace(tune.protocols[name], max_bytes=cut)}))


def _window_names(cluster: ClusterSpec, single_node: bool) -> list[str]:
    tune = cluster.collectives
    ordered = sorted(tune.protocols, key=lambda n: tune.protocols[n].max_bytes)
    direct = ["direct_min_bytes", "direct_max_bytes"] if single_node and tune.direct_max_bytes > 0 else []
    return ordered[:-1] + direct


def fit_collectives(points: list[CollectivePoint], cluster: ClusterSpec, fit_windows: bool = True,
                    max_sweeps: int = 3) -> CollectiveFit:
    """Refit ``cluster.collectives`` to ``points``; the rest of the cluster is untouched."""
    if not points:
        raise ConfigError("collectives: no measured points to fit")
    protocols = list(cluster.collectives.protocols)
    problem = _Problem(points=points, basis=_basis(points, cluster), protocols=protocols,
                       measured=np.array([p.time_s for p in points]))
    before = mape(points, cluster)
    theta, best, used, _ = _fit_continuous(problem, cluster)
    moved, cuts = set(), breakpoints(points)
    for _ in range(max_sweeps if fit_windows else 0):
        improved = False
        for name in _window_names(cluster, any(p.shape.num_nodes == 1 for p in points)):
            for cut in cuts:
                trial = _set_window(cluster, name, cut)
                if trial is None:
                    continue
                t_theta, err, t_used, identified = _fit_continuous(problem, trial)
                if identified and err < best - 1e-6:
                    cluster, theta, best, used, improved = trial, t_theta, err, t_used, True
                    moved.add(name if name.startswith("direct") else f"{name}.max_bytes")
        if not improved:
            break
    fitted = _apply(cluster, theta, protocols)
    names = [f"{n}.latency" for n in protocols] + [f"{n}.bw_efficiency" for n in protocols] + ["intra_step", "inter_step"]
    return CollectiveFit(tuning=fitted.collectives, mape_before=before, mape_after=mape(points, fitted),
                         num_points=len(points), fitted=tuple(sorted(moved)) + tuple(n for n, u in zip(names, used) if u))
