"""How far perfsim's own checks put a prediction like this one (what a report quotes).

``accuracy.toml`` beside this file holds the figures of docs/accuracy.md that bear on one
prediction, written by validation/accuracy_doc.py from the same evaluation (never typed):

- the software stack: the held-out error of the published training runs priced under it
  (leave one source out; validation/runs), or, for ``ideal``, how far those runs come out
  when priced with no framework cost at all;
- the GPU's kernel tables: held-out MAPE per kernel class and dtype (leave one source
  family out; validation/data/kernels), the base GPU's where a GPU takes its tables from
  another of the same die;
- the cluster profile's collectives: all_reduce error on the multi-node series no
  parameter was fitted to (validation/data/multinode).

``notes(stack, cluster, dtype, moe)`` gives the structured figures and one line each. A stack,
GPU or cluster that is not the shipped profile (edited, calibrated, a file of one's own) is
said to be unchecked rather than quoted at the shipped profile's error.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from perfsim.errors import ConfigError
from perfsim.system.hardware import ClusterSpec, GpuSpec, list_profiles, load_cluster, load_gpu
from perfsim.system.stacks import IDEAL, StackSpec, list_stacks, load_stack

VENDORS = {"amd": "AMD", "nvidia": "NVIDIA"}
MIN_POINTS = 5  # a derived GPU's own cell with fewer rows is quoted at its base GPU's cell
CLASSES = {"gemm": "GEMM", "attention": "attention", "grouped_gemm": "grouped GEMM"}


@functools.lru_cache(maxsize=1)
def figures() -> dict:
    """The parsed ``accuracy.toml`` (empty where a build ships none)."""
    try:
        text = resources.files("perfsim.calibration").joinpath("accuracy.toml").read_text()
    except FileNotFoundError:
        return {}
    return tomllib.loads(text)


@functools.lru_cache(maxsize=None)
def _shipped(name: str) -> StackSpec | None:
    return load_stack(name) if name in list_stacks() else None


def _stack_status(stack: StackSpec, vendor: str) -> str:
    """shipped | edited (a shipped name with other values) | own (a name perfsim does not ship).
    A shipped profile as the plan prices it on ``vendor``'s GPUs (``StackSpec.on_vendor``) is shipped."""
    shipped = _shipped(stack.name)
    if shipped is None:
        return "own"
    same = stack in (shipped, shipped.on_vendor(vendor)) or (stack.name == IDEAL.name and stack == IDEAL)
    return "shipped" if same else "edited"


_SHIPPED: dict[int, tuple[object, bool]] = {}  # id -> (the object, whether it is the shipped profile's)


def _is_shipped(obj, same) -> bool:
    """``same()``: whether ``obj`` is the profile perfsim ships under its name; remembered per
    object (a search prices thousands of plans on one cluster)."""
    hit = _SHIPPED.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    try:
        answer = bool(same())
    except ConfigError:
        answer = False
    if len(_SHIPPED) >= 256:
        _SHIPPED.clear()
    _SHIPPED[id(obj)] = (obj, answer)
    return answer


@functools.lru_cache(maxsize=None)
def _shipped_names(kind: str) -> frozenset[str]:
    return frozenset(list_profiles(kind))


def _fabric_parts(c: ClusterSpec) -> tuple:
    return c.gpu, c.node, c.fabric, c.collectives, c.dispatch


def gpu_is_shipped(gpu: GpuSpec) -> bool:
    """The GPU's tables are the ones perfsim ships (not calibrated, edited or a file of one's own)."""
    return gpu.name in _shipped_names("gpu") and _is_shipped(gpu, lambda: load_gpu(gpu.name) == gpu)


def cluster_is_shipped(cluster: ClusterSpec) -> bool:
    """GPU, node, fabric, collective and dispatch values as the shipped cluster profile of that
    name has them (any node count)."""
    return cluster.name in _shipped_names("cluster") and _is_shipped(
        cluster, lambda: _fabric_parts(load_cluster(cluster.name)) == _fabric_parts(cluster))


def _pct(x: float) -> str:
    return f"{x:+.0f}%" if abs(x) >= 10 else f"{x:+.1f}%"


def stack_note(stack: StackSpec, gpu: str, vendor: str) -> tuple[dict, str]:
    facts, status = figures(), _stack_status(stack, vendor)
    if status == "own":
        return {"stack": stack.name, "checked": False}, (
            f"stack {stack.name}: a profile of your own, not checked against published runs (perfsim calibrate "
            "--runs fits one to your measured runs and prints its leave-one-out error)")
    if status == "edited":
        return {"stack": stack.name, "checked": False}, (
            f"stack {stack.name}: not the shipped profile (edited or calibrated), so the shipped profile's held-out "
            "figures do not apply (perfsim calibrate --runs prints a fitted profile's leave-one-out error)")
    if stack.name == IDEAL.name:
        ideal = facts.get("ideal", {})
        parts = [f"{fam} {_pct(v['error_min_pct'])}..{_pct(v['error_max_pct'])} ({v['runs']} runs)"
                 for fam, v in sorted(ideal.items())]
        return {"stack": "ideal", "checked": False, "ideal_error_range_pct": ideal}, (
            "stack ideal adds no framework cost: the published runs priced with it came out "
            + (", ".join(parts) if parts else "unchecked")
            + " (+ = predicted faster than measured); name the framework you run (--stack) for a prediction")
    mine = facts.get("stacks", {}).get(stack.name)
    if mine is None:
        return {"stack": stack.name, "checked": False}, (
            f"stack {stack.name}: no published run in perfsim's reference set runs it; its values are the ones its "
            "profile cites or marks assumed (perfsim list --provenance)")
    by_vendor = mine.get("by_vendor", {})
    shown = by_vendor.get(vendor, mine) if len(by_vendor) > 1 else mine  # a stack runs other kernels per vendor
    name = VENDORS.get(vendor, vendor)
    scope = f" on {name} GPUs" if shown is not mine else ""
    off = ("" if gpu in shown["gpus"] else f"; none on {gpu}" if vendor in by_vendor or not by_vendor
           else f"; none on {name} GPUs")
    held = ("held out by source" if shown["sources"] > 1
            else "one source: its values assumed, not fitted to it")
    n = shown["sources"]
    return {"stack": stack.name, "checked": True, **mine}, (
        f"stack {stack.name}: {shown['runs']} published runs{scope} ({n} source{'s' * (n > 1)}, "
        f"{'/'.join(shown['gpus'])}{off}), {held}: median |error| {shown['held_out_median_abs_pct']:.1f}%, worst "
        f"{_pct(shown['worst_error_pct'])} ({shown['worst_run']}), {shown['within_25_pct']} of {shown['runs']} within 25%"
        + _memory_clause(shown))


def _memory_clause(shown: dict) -> str:
    """How far the stack's predicted peaks were from the peaks its sources print, and how many
    of its runs (all of which ran) perfsim predicted not to fit."""
    parts = []
    if shown.get("peaks"):
        parts.append(f"peak memory against {shown['peaks']} printed peak{'s' * (shown['peaks'] > 1)} (+ = predicted above): median |error| "
                     f"{shown['peak_median_abs_pct']:.0f}%, {_pct(shown['peak_error_min_pct'])} to "
                     f"{_pct(shown['peak_error_max_pct'])}")
    if shown.get("predicted_not_to_fit"):
        parts.append(f"{shown['predicted_not_to_fit']} of {shown['runs']} runs that ran predicted not to fit")
    return "; " + "; ".join(parts) if parts else ""


def _cell(gpu: str, key: str) -> tuple[str, dict, bool] | None:
    """(GPU, held-out cell, borrowed) that quotes ``key`` for ``gpu``: its own cell; else its
    same-die base GPU's (``base``); else, for a grouped GEMM, the cell of the GPU whose grouped
    tables it prices at, having no grouped measurement of its own (``grouped_from``:
    validation/accuracy_kernels.py GROUPED_FROM; borrowed: that figure checks the donor's
    tables on the donor, not this GPU)."""
    kernels = figures().get("kernels", {})
    own = kernels.get(gpu)
    if own is None:
        return None
    cell = own["cells"].get(key)
    if cell is not None and (cell["points"] >= MIN_POINTS or own["base"] == gpu):
        return gpu, cell, False
    base = kernels.get(own["base"], {}).get("cells", {}).get(key)
    if base is not None and own["base"] != gpu:
        return own["base"], base, False
    donor = own.get("grouped_from") if key.startswith("grouped_gemm.") else None
    lent = kernels.get(donor, {}).get("cells", {}).get(key) if donor else None
    return (donor, lent, True) if lent is not None else None


def _library_cell(gpu: str, library: str) -> tuple[str, dict] | None:
    """(GPU, held-out figure) of kernel ``library``'s own table: measured on ``gpu``, else on a GPU
    of the same die (the library tables are shared across a die: validation/accuracy_kernels.py
    library_tables); None where no two families measure the library."""
    kernels = figures().get("kernels", {})
    base = kernels.get(gpu, {}).get("base", gpu)
    same_die = [gpu] + sorted(g for g, f in kernels.items() if g != gpu and base in (g, f.get("base")))
    for on in same_die:
        cell = kernels.get(on, {}).get("libraries", {}).get(library)
        if cell is not None:
            return on, cell
    return None


def kernel_note(gpu: str, dtype: str, moe: bool, libraries: dict[str, str], shipped: bool = True) -> tuple[dict, str]:
    if not shipped:
        return {"gpu": gpu, "checked": False}, (
            f"kernels {gpu}: not the shipped tables (calibrated, edited or a file of your own), so perfsim's held-out "
            "figures do not apply (perfsim calibrate prints a fit's error on its measurements)")
    if gpu not in figures().get("kernels", {}):
        return {"gpu": gpu, "checked": False}, (
            f"kernels {gpu}: a GPU perfsim has no kernel measurements for; its tables are not checked")
    keys = [("gemm", dtype if dtype in ("bf16", "fp16", "fp8") else "bf16"), ("attention", "bf16")]
    if moe:
        keys.append(("grouped_gemm", dtype if dtype == "fp8" else "bf16"))
    cells, parts = {}, []
    for kind, dt in keys:
        label = CLASSES[kind] + ("" if kind == "attention" else f" {dt}")
        if kind in libraries:
            held = _library_cell(gpu, libraries[kind])
            if held is None:
                parts.append(f"{label} at its {libraries[kind]} table (in-sample fit, no held-out figure)")
            else:
                on, cell = held
                cells[f"{kind}.{libraries[kind]}"] = {"gpu": on, **cell}
                parts.append(f"{label} at its {libraries[kind]} table {cell['held_out_mape_pct']:.1f}% ({cell['points']} "
                             f"points, each family against the library's other families" + ("" if on == gpu else f"; on {on}: same die") + ")")
            continue
        found = _cell(gpu, f"{kind}.{dt}")
        if found is None and kind != "attention" and dt != "bf16":  # an FP8 / FP16 cell falls back to BF16's
            found = _cell(gpu, f"{kind}.bf16")
            label = CLASSES[kind] + " bf16"
        if found is None:
            parts.append(f"{label} not checked (no measurement of it on this GPU)")
            continue
        on, cell, borrowed = found
        cells[f"{kind}.{dt}"] = {"gpu": on, **cell, **({"borrowed": True} if borrowed else {})}
        if borrowed:
            parts.append(f"{label} at {on}'s table, no measurement of it on this GPU ({on}'s held-out "
                         f"{cell['held_out_mape_pct']:.1f}%, {cell['points']} points)")
            continue
        parts.append(f"{label} {cell['held_out_mape_pct']:.1f}% ({cell['points']} points"
                     + ("" if on == gpu else f", on {on}: same die") + ")")
    return {"gpu": gpu, "checked": True, "cells": cells, "libraries": dict(libraries)}, (
        f"kernels {gpu}, held-out MAPE by source family: " + ", ".join(parts))


COLLECTIVE_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def fabric_note(cluster: str, shipped: bool = True) -> tuple[dict, str]:
    if not shipped:
        return {"cluster": cluster, "checked": False}, (
            f"collectives {cluster}: the profile is not as shipped (calibrated, edited or your own), so perfsim's "
            "held-out figures do not apply")
    series = figures().get("fabric", {}).get(cluster)
    if not series:
        return {"cluster": cluster, "checked": False}, (
            f"collectives {cluster}: no held-out collective series for this profile (its link values are the ones "
            "its cluster and node profiles cite or mark assumed)")
    large = [v["mape_ge_1MB_pct"] for v in series.values() if "mape_ge_1MB_pct" in v]
    small = [v["mape_lt_1MB_pct"] for v in series.values() if "mape_lt_1MB_pct" in v]

    def span(xs, fmt="{:.1f}", unit="%"):
        lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
        return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"

    order = {c: i for i, c in enumerate(COLLECTIVE_ORDER)}
    colls = sorted({v.get("collective", "all_reduce") for v in series.values()}, key=lambda c: order.get(c, len(order)))
    nodes = [v["nodes"] for v in series.values() if "nodes" in v]
    what = ", ".join(colls) + (f"; {span(nodes, '{:d}', ' node' if max(nodes) == 1 else ' nodes')}" if nodes else "")
    text = f"collectives {cluster}: {len(series)} held-out series ({what}), MAPE " + ", ".join(
        ([f"{span(large)} at >= 1 MB"] if large else []) + ([f"{span(small)} below"] if small else []))
    return {"cluster": cluster, "checked": True, "series": series}, text


def text_block(quoted: dict, scope: str = "") -> list[str]:
    """The printed form of ``quoted`` (what ``notes()`` gives): a heading and its lines indented; none
    where nothing is quoted. ``scope``: what the heading adds (a search: every plan)."""
    lines = quoted.get("lines") or []
    head = f"accuracy (perfsim's own held-out checks, docs/accuracy.md{scope}):"
    return [head, *(f"  {line}" for line in lines)] if lines else []


def scale_pairs() -> list[dict]:
    """The reference set's projections across scale (docs/accuracy.md, "Projected across scale"):
    a run of a few nodes calibrating the stack, the same plan on more nodes priced."""
    return list(figures().get("plans", {}).get("scale", []))


def plan_to_plan_pct() -> float | None:
    """The median error of a calibration on one run carried to the same model's other plans on
    its GPU (docs/accuracy.md, "Calibrated on one run"): how close two plans' predictions may be
    before their order is within perfsim's own error. None where no figure is shipped."""
    return figures().get("plans", {}).get("median_abs_pct")


def notes(stack: StackSpec, cluster: ClusterSpec, dtype: str, moe: bool,
          libraries: dict[str, str] | None = None) -> dict:
    """The figures a report quotes (``stack``, ``kernels``, ``collectives``) and a line each
    (``lines``); empty where no ``accuracy.toml`` is shipped. One dict per distinct question,
    shared by the reports that ask it (a search builds thousands): read it, do not change it."""
    if not figures():
        return {}
    return _notes(stack, cluster.name, cluster.gpu.name, cluster.gpu.vendor, dtype, moe,
                  tuple(sorted((libraries or {}).items())), gpu_is_shipped(cluster.gpu), cluster_is_shipped(cluster))


@functools.lru_cache(maxsize=256)
def _notes(stack: StackSpec, cluster: str, gpu: str, vendor: str, dtype: str, moe: bool,
           libraries: tuple[tuple[str, str], ...], gpu_shipped: bool, cluster_shipped: bool) -> dict:
    parts = {"stack": stack_note(stack, gpu, vendor),
             "kernels": kernel_note(gpu, dtype, moe, dict(libraries), gpu_shipped),
             "collectives": fabric_note(cluster, cluster_shipped)}
    return {**{k: v[0] for k, v in parts.items()}, "lines": [v[1] for v in parts.values()],
            "source": "docs/accuracy.md (perfsim's held-out checks; generated by validation/accuracy_doc.py)"}


def summary_lines() -> list[str]:
    """Every figure of ``accuracy.toml`` as text (``perfsim list --accuracy``): per stack, per GPU
    kernel cell, per cluster profile, and the plan-to-plan error; empty where none is shipped."""
    facts = figures()
    if not facts:
        return []
    out = ["perfsim's own held-out checks (docs/accuracy.md; + = predicted faster than measured)", "",
           "stacks (published runs, each source priced by values fitted without it):"]
    for name, f in sorted(facts.get("stacks", {}).items()):
        out.append(f"  {name:<16} {f['runs']:>3} runs, {f['sources']} source{'s' * (f['sources'] > 1)} "
                   f"({'/'.join(f['gpus'])}): median |error| {f['held_out_median_abs_pct']:.1f}%, "
                   f"worst {_pct(f['worst_error_pct'])} ({f['worst_run']}), {f['within_25_pct']}/{f['runs']} within 25%")
        memory = _memory_clause(f).removeprefix("; ")
        if memory:
            out.append(f"  {'':<16}     {memory}")
        by_vendor = f.get("by_vendor", {})
        for vendor, v in sorted(by_vendor.items()) if len(by_vendor) > 1 else ():
            out.append(f"  {'':<16}     on {VENDORS.get(vendor, vendor)} GPUs {v['runs']} runs: median |error| "
                       f"{v['held_out_median_abs_pct']:.1f}%, worst {_pct(v['worst_error_pct'])} ({v['worst_run']})")
    for fam, v in sorted(facts.get("ideal", {}).items()):
        out.append(f"  {'ideal':<16} {v['runs']:>3} {fam} runs priced with no framework cost: "
                   f"{_pct(v['error_min_pct'])}..{_pct(v['error_max_pct'])}")
    out += ["", "kernel tables (held-out MAPE by source family; target GEMM 10%, attention and grouped GEMM 15%):"]
    for gpu, v in facts.get("kernels", {}).items():
        cells = ", ".join(f"{k} {c['held_out_mape_pct']:.1f}% ({c['points']})" for k, c in v["cells"].items())
        base = "" if v["base"] == gpu else f" [tables from {v['base']}]"
        base += f" [grouped tables from {v['grouped_from']}]" if v.get("grouped_from") else ""
        out.append(f"  {gpu:<8}{base} {cells or 'no rows of its own'}")
    plans = facts.get("plans", {})
    if plans.get("groups"):
        out += ["", f"plans after a calibration on one run (same model and GPU, same source): median "
                    f"{plans['median_abs_pct']:.1f}% over {len(plans['groups'])} groups"]
        out += [f"  {g['source']} {g['model']} on {g['cluster']}: MAPE {g['mape_pct']:.1f}% ({g['pairs']} pairs)"
                for g in plans["groups"]]
    out += ["", "collectives (series no parameter was fitted to; MAPE >= 1 MB / below):"]
    for cluster, series in sorted(facts.get("fabric", {}).items()):
        for name, v in series.items():
            large, small = v.get("mape_ge_1MB_pct"), v.get("mape_lt_1MB_pct")
            what = f"{v['collective']}, {v['nodes']} node{'s' if v['nodes'] > 1 else ''}, " if "nodes" in v else ""
            out.append(f"  {cluster:<16} {name}: {'-' if large is None else f'{large:.1f}%'} / "
                       f"{'-' if small is None else f'{small:.1f}%'} ({what}{v['points']} points)")
    return out
