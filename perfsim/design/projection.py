"""Project a measured run to another cluster size: benchmark one node, predict N.

The run's stack profile is fitted to that one measurement (``runs_fit.fit_stack``; by
default the one parameter one run identifies, ``runs_fit.one_run_params``: the routed-expert
speed of an MoE run's dispatch path with kernels of its own, else the kernels' speed), then the
same model, stack and plan are priced on ``nodes`` nodes: data parallelism grows with
the GPUs and the per-GPU batch is kept (``keep='per_gpu'``, weak scaling) or the global
batch is (``keep='global'``). What changes -- communication, bubble -- is reported per
breakdown category.
"""

import dataclasses
from dataclasses import dataclass

import perfsim.api as api
from perfsim.design.runs import RunCase
from perfsim.design.runs_fit import fit_stack
from perfsim.errors import ConfigError
from perfsim.report import Report

KEEP = ("per_gpu", "global")


@dataclass(frozen=True, kw_only=True)
class Projection:
    case: RunCase
    fitted: dict[str, float]
    source: Report  # the run's own size under the fitted stack
    target: Report  # the same model, stack and plan on the target size

    def changes(self) -> list[tuple[str, float, float]]:
        """(category, seconds per step at the run's size, at the target size), largest change first."""
        keys = set(self.source.breakdown) | set(self.target.breakdown)
        rows = [(k, self.source.breakdown.get(k, 0.0), self.target.breakdown.get(k, 0.0)) for k in keys]
        return sorted(rows, key=lambda r: -abs(r[2] - r[1]))


def _report(case: RunCase, stack, nodes: int, gbs: int) -> Report:
    model = api.load_model(case.model)
    if case.capacity_factor is not None:
        model = dataclasses.replace(model, capacity_factor=case.capacity_factor)
    knobs = {**dict(case.knobs), "gbs": gbs}
    return api.simulate(model, case.cluster, nodes=nodes, estimator="analytic", check_memory=False, stack=stack,
                        **knobs)


def project(case: RunCase, nodes: int, keep: str = "per_gpu", params=None) -> Projection:
    if keep not in KEEP:
        raise ConfigError(f"--keep: {keep!r} is not one of {', '.join(KEEP)}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"--nodes: must be a positive integer, got {nodes!r}")
    fit = fit_stack([case], case.stack, params)
    gbs = dict(case.knobs)["gbs"]
    target_gbs = gbs * nodes // case.nodes if keep == "per_gpu" else gbs
    if keep == "per_gpu" and (gbs * nodes) % case.nodes:
        raise ConfigError(f"--nodes: {nodes} nodes do not keep the per-GPU batch of gbs {gbs} on {case.nodes}")
    source = _report(case, fit.stack, case.nodes, gbs)
    return Projection(case=case, fitted=fit.values, source=source, target=_report(case, fit.stack, nodes, target_gbs))
