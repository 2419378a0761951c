"""Fit the inter-node parameters of a cluster to multi-node collective sweeps (scipy).

Free parameters: the fabric's per-message NIC efficiency ramp (``message_efficiency``
at fixed knots of NIC bytes per phase, log interpolation), the per-step latency
of a network hop (``inter_step_latency_us``) and the floor of a step of a ring across
nodes (``ring_step_floor_us``: fitted only where some point is paced by it, such as the
1-2 GB rows of a 1,024-rank ring; likewise each protocol's own floor where the profile
gives one, ``protocols.<name>.ring_step_floor_us``, such as the 1-32 MB rows of a ring
with LL128 forced), and each protocol's cost per ring step across whole nodes where the
profile prices one (``protocols.<name>.ring_step_cost_us``: NCCL's Simple protocol on
InfiniBand) and some point over whole nodes runs that protocol. Everything intra-node (xGMI/NVLink
bandwidth, protocol latencies and efficiencies, launch latency) is held at the profile's
values, which come from single-node sweeps (``collective_fit``), so the two fits do not
trade against each other. Each point is priced by ``collectives.collective_cost`` itself,
with the algorithm/protocol the run forced (``NCCL_ALGO=Ring``) where the log says so.

Least squares on relative error, soft-L1 loss (f_scale 5%), a weak pull (``PRIOR``)
toward the starting values; a knot no point's message size reaches is pinned and
reported as not fitted, so a 1,024-rank sweep of 1-16 GB (256 MB-4 GB per NIC) moves
only the top knot.
"""

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from perfsim import units
from perfsim.calibration.collective_fit import CollectivePoint, cluster_for, predict
from perfsim.cost.collectives import pick_protocol
from perfsim.cost.phases import message_efficiency
from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec

KNOTS_KB = (0.1, 1.0, 16.0, 256.0, 4096.0, 65536.0)  # NIC bytes per phase, kB
EFF_BOUNDS = (0.002, 1.0)
INTER_STEP_BOUNDS_US = (0.0, 200.0)
FLOOR_BOUNDS_US = (0.0, 200.0)
STEP_COST_BOUNDS_US = (0.0, 200.0)
# how far the sensitivity probe moves the hop latency and the ring step floor: a floor
# shows only once it exceeds a ring's bandwidth time per step, so it is probed further
PROBE_US = (1.0, 20.0)
# the floor is a max() against the bytes: flat (no gradient) until it binds, so the fit
# also starts from a floor that binds on a long ring (a start, not a value: it is refitted)
FLOOR_STARTS_US = (0.0, 10.0)
PRIOR = 1e-3
STARTS = ((0.5, 10.0), (0.1, 10.0), (0.5, 30.0), (0.1, 30.0))  # (knot efficiency, hop latency us) starts
SENSITIVITY = 1e-3  # a knot whose -95% moves no point's time by this share is not fitted


@dataclass(frozen=True, kw_only=True)
class FabricFit:
    cluster: ClusterSpec
    mape_before: float  # percent
    mape_after: float
    num_points: int
    fitted: tuple[str, ...]


def mape(points: list[CollectivePoint], cluster: ClusterSpec) -> float:
    return 100 * float(np.mean([abs(predict(p, cluster) / p.time_s - 1) for p in points]))


def _ramp(theta: np.ndarray, used: np.ndarray | None, monotone: bool = True, fill: bool = True) -> np.ndarray:
    """Knot values: an unfitted knot takes its nearest fitted neighbour's value (``fill``:
    a flat start's value says nothing about it) or keeps its own (a start at the profile's
    ramp, whose knots hold values fitted to other data), then the ramp is made
    non-decreasing (a larger message never does worse)."""
    k = len(KNOTS_KB)
    eff = np.clip(theta[:k], *EFF_BOUNDS)
    if fill and used is not None and used[:k].any():
        fitted = np.flatnonzero(used[:k])
        eff = eff[[fitted[np.argmin(np.abs(fitted - i))] for i in range(k)]]
    return np.maximum.accumulate(eff) if monotone else eff


def protocol_floors(cluster: ClusterSpec) -> tuple[str, ...]:
    """The protocols of ``cluster`` with a ring step floor of their own."""
    return tuple(sorted(n for n, p in cluster.collectives.protocols.items() if p.ring_step_floor_us is not None))


def free_floors(cluster: ClusterSpec, points: list[CollectivePoint], fit_floor: bool = True) -> tuple[str, ...]:
    """The protocols whose own ring step floor the fit frees (after the profile-wide floor in
    the parameter vector, in this order): those with one that some point forced on a path
    that can run a ring (a floor paces rings only); the others keep their values."""
    forced = {p.protocol for p in points if p.protocol and p.algorithm in (None, "ring", "hierarchical")}
    return tuple(n for n in protocol_floors(cluster) if fit_floor and n in forced)


def step_costs(cluster: ClusterSpec) -> tuple[str, ...]:
    """The protocols of ``cluster`` with a cost per ring step of their own."""
    return tuple(sorted(n for n, p in cluster.collectives.protocols.items() if p.ring_step_cost_us > 0))


def free_step_costs(cluster: ClusterSpec, points: list[CollectivePoint], fit_cost: bool = True) -> tuple[str, ...]:
    """The protocols whose step cost the fit frees (after the floors in the parameter vector):
    those with one that runs some point over every GPU of two or more nodes (the calls that
    pay it: ``collectives.step_cost_s``), forced or picked by the profile's windows."""
    if not fit_cost:
        return ()
    gpus = cluster.node.gpus_per_node
    ran = {p.protocol or pick_protocol(cluster, p.size_bytes, None, p.coll, p.shape.size)[0]
           for p in points if p.shape.num_nodes > 1 and p.shape.per_node >= gpus}
    return tuple(n for n in step_costs(cluster) if n in ran)


def with_params(cluster: ClusterSpec, theta: np.ndarray, source: str, digits: int | None = None,
                used: np.ndarray | None = None, monotone: bool = True, fill: bool = True,
                floor_names: tuple[str, ...] = (), cost_names: tuple[str, ...] = ()) -> ClusterSpec:
    k = len(KNOTS_KB)
    ramp = _ramp(theta, used, monotone, fill)
    eff = tuple(float(x) if digits is None else round(float(x), digits) for x in ramp)
    # latencies are >= 0: a value pinned at 0 (lo = value - 1e-9) may step a hair below it
    inter, floor, *own = (max(0.0, float(x) if digits is None else round(float(x), digits)) for x in theta[k:])
    fab = dataclasses.replace(cluster.fabric, message_kbytes=KNOTS_KB, message_efficiency=eff, message_source=source)
    protocols = dict(cluster.collectives.protocols)
    for name, value in zip(floor_names, own):
        protocols[name] = dataclasses.replace(protocols[name], ring_step_floor_us=value)
    for name, value in zip(cost_names, own[len(floor_names):]):
        protocols[name] = dataclasses.replace(protocols[name], ring_step_cost_us=value)
    tune = dataclasses.replace(cluster.collectives, inter_step_latency_us=inter, ring_step_floor_us=floor,
                               tree_inter_step_latency_us=_tree_hop(cluster.collectives, inter, digits),
                               protocols=protocols)
    return dataclasses.replace(cluster, fabric=fab, collectives=tune)


def _tree_hop(tune, inter: float, digits: int | None) -> float | None:
    """A profile's own tree hop moved with the fitted ring hop, in the ratio it has (NCCL's
    tuner keeps one per algorithm: refitting the ring's must not leave the tree's behind)."""
    own, old = tune.tree_inter_step_latency_us, tune.inter_step_latency_us
    if own is None or old <= 0:
        return own
    hop = own * inter / old
    return hop if digits is None else round(hop, digits)


def _times(points, cluster, theta, used=None, monotone=True, fill=True, floor_names=(), cost_names=()) -> np.ndarray:
    c = with_params(cluster, theta, "fit in progress", used=used, monotone=monotone, fill=fill, floor_names=floor_names,
                    cost_names=cost_names)
    return np.array([predict(p, c) for p in points])


def _used(points, cluster, theta0, measured, floor_names=(), cost_names=()) -> np.ndarray:
    base = _times(points, cluster, theta0, monotone=False, floor_names=floor_names, cost_names=cost_names)
    used = np.zeros(len(theta0), dtype=bool)
    for i in range(len(theta0)):
        trial = theta0.copy()
        trial[i] = trial[i] * 0.05 if i < len(KNOTS_KB) else trial[i] + PROBE_US[min(i - len(KNOTS_KB), 1)]
        moved = _times(points, cluster, trial, monotone=False, floor_names=floor_names, cost_names=cost_names) - base
        used[i] = bool(np.max(np.abs(moved) / measured) > SENSITIVITY)
    return used


def _fit_from(points, cluster, measured, theta0, min_knot_kb, fit_hop, fit_floor,
              fill: bool = True, floor_names: tuple[str, ...] = (),
              cost_names: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray, float]:
    floors = 1 + len(floor_names)  # the profile-wide floor and each freed protocol's own
    costs = len(cost_names)
    lo = np.array([EFF_BOUNDS[0]] * len(KNOTS_KB) + [INTER_STEP_BOUNDS_US[0]] + [FLOOR_BOUNDS_US[0]] * floors
                  + [STEP_COST_BOUNDS_US[0]] * costs)
    hi = np.array([EFF_BOUNDS[1]] * len(KNOTS_KB) + [INTER_STEP_BOUNDS_US[1]] + [FLOOR_BOUNDS_US[1]] * floors
                  + [STEP_COST_BOUNDS_US[1]] * costs)
    theta0 = np.clip(theta0, lo, hi)
    used = _used(points, cluster, theta0, measured, floor_names, cost_names)
    used[: len(KNOTS_KB)] &= np.array(KNOTS_KB) >= min_knot_kb
    used[len(KNOTS_KB)] &= fit_hop
    # where protocols have floors of their own, the profile-wide one is the library's constant
    # beneath them (RCCL's network post overhead) and stays: the two would trade on the same
    # rows; a protocol's own floor is fitted only from runs that forced that protocol
    used[len(KNOTS_KB) + 1] &= fit_floor and not protocol_floors(cluster)
    lo, hi = np.where(used, lo, theta0 - 1e-9), np.where(used, hi, theta0 + 1e-9)
    scale = np.maximum(np.abs(theta0), 0.05)

    def residuals(theta):
        return np.concatenate([_times(points, cluster, theta, used, fill=fill, floor_names=floor_names,
                                      cost_names=cost_names) / measured - 1, PRIOR * (theta - theta0) / scale])

    fit = least_squares(residuals, theta0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, x_scale=scale)
    err = float(np.mean(np.abs(_times(points, cluster, fit.x, used, fill=fill, floor_names=floor_names,
                                      cost_names=cost_names) / measured - 1)))
    return fit.x, used, err


def fit_fabric(points: list[CollectivePoint], cluster: ClusterSpec, source: str = "",
               min_knot_kb: float = 0.0, fit_hop: bool = True, fit_floor: bool = True,
               fit_cost: bool = True) -> FabricFit:
    """Refit the NIC ramp and network hop latency of ``cluster`` to multi-node ``points``;
    knots below ``min_knot_kb`` are left out of the fit (and take the nearest fitted value);
    ``fit_hop=False`` keeps the profile's hop latency (bandwidth-bound points cannot set it),
    ``fit_floor=False`` its ring step floors (the profile-wide one and each protocol's own; a
    protocol's own only from points that forced it, the profile-wide one only where no
    protocol has its own), ``fit_cost=False`` each protocol's cost per ring step (else fitted
    where some point over whole nodes runs that protocol).
    The ramp is not smooth in its knots (nearest-fill, running max), so the fit starts
    from the profile's own values and from each of ``STARTS`` (efficiency, hop latency) x
    ``FLOOR_STARTS_US``, and keeps the lowest MAPE (the profile's on a tie)."""
    points = [p for p in points if p.shape.num_nodes > 1]
    if not points:
        raise ConfigError("fabric: no multi-node points to fit (every log is single-node)")
    measured = np.array([p.time_s for p in points])
    best = None
    tune = cluster.collectives
    floors = {tune.ring_step_floor_us, *(FLOOR_STARTS_US if fit_floor else ())}
    # the profile itself first, its knots no point moves keeping their values (no fill): a
    # fit never ends worse than the values it was given, and a flat start replaces it only
    # where it fits the points strictly better (a series that reaches one knot keeps the rest)
    own = [message_efficiency(cluster.fabric, kb * units.KB) for kb in KNOTS_KB]
    names_free = free_floors(cluster, points, fit_floor)
    held = bool(protocol_floors(cluster))  # the profile-wide floor stays beneath protocol floors
    mine = [tune.protocols[n].ring_step_floor_us for n in names_free]
    cost_names = free_step_costs(cluster, points, fit_cost)
    costs = [tune.protocols[n].ring_step_cost_us for n in cost_names]  # every start from the profile's costs
    starts = [(np.array([*own, tune.inter_step_latency_us, tune.ring_step_floor_us, *mine, *costs]), False)]
    # a flat start tries each floor start for the freed protocol floors (and the profile-wide one, when free)
    starts += [(np.concatenate([np.full(len(KNOTS_KB), eff), [hop if fit_hop else tune.inter_step_latency_us,
                                tune.ring_step_floor_us if held else floor], [floor] * len(names_free), costs]), True)
               for (eff, hop), floor in itertools.product(STARTS, sorted(floors) if names_free or not held
                                                          else [tune.ring_step_floor_us])]  # no floor free: one start each
    for theta0, fill in starts:
        theta, used, err = _fit_from(points, cluster, measured, theta0, min_knot_kb, fit_hop, fit_floor, fill, names_free,
                                     cost_names)
        if best is None or err < best[2] - 1e-9:
            best = (theta, used, err, fill)
    theta, used, _, fill = best
    out = with_params(cluster, theta, source or f"fitted by perfsim fabric_fit to {len(points)} multi-node points", 4,
                      used, fill=fill, floor_names=names_free, cost_names=cost_names)
    names = ([f"message_efficiency@{kb:g}kB" for kb in KNOTS_KB] + ["inter_step_latency_us", "ring_step_floor_us"]
             + [f"protocols.{n}.ring_step_floor_us" for n in names_free]
             + [f"protocols.{n}.ring_step_cost_us" for n in cost_names])
    before, after = mape(points, cluster), mape(points, out)
    if after > before:  # rounding to 4 digits can undo a start at the profile that moved nothing
        return FabricFit(cluster=cluster, mape_before=before, mape_after=before, num_points=len(points), fitted=())
    return FabricFit(cluster=out, mape_before=before, mape_after=after,
                     num_points=len(points), fitted=tuple(n for n, u in zip(names, used) if u))
