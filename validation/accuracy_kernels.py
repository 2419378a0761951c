"""Kernel accuracy: the GPU tables fitted to all the public kernel measurements, and their
held-out MAPE by leave-one-source-family-out, per GPU, kernel class and dtype.

    .venv/bin/python -m validation.accuracy_kernels --refit   # rewrite hardware_profiles/gpus/*.toml
    .venv/bin/python -m validation.accuracy_kernels           # print the markdown section

Rows: ``validation/data/kernels/{fit,check}/<gpu>.csv`` pooled (``make_kernel_csvs.py``
wrote them as one split; here they are one pool labelled by source family). Held out:
for each family, the tables are fitted (``kernel_fit.fit_kernels``, what ``perfsim
calibrate`` runs) to every OTHER family's rows and price that family's rows; every row
is checked once, by tables that never saw its family. A cell with one family is split by
kernel backend within it (``family/backend``, a weak split). The shipped tables are fitted
to all families. MI325X, MI350X and H200 are fitted to nothing of their own: they take the
MI300X / MI355X / H100 tables (same die) with their own peak, clock under load and HBM, and their
rows of family F are priced by the base tables fitted without F.
"""

import argparse
import collections
import dataclasses
import functools
from pathlib import Path

import numpy as np
import tomli_w

from perfsim.calibration import kernel_fit
from perfsim.calibration.kernel_tables_fit import in_fit_range, with_head_dims_of
from perfsim.calibration.readers import KernelPoint, read_kernel_csv
from perfsim.system.hardware import PROFILE_DIR, GpuSpec, load_gpu
from perfsim.system.kernel_tables import table_provenance
from perfsim.system.specio import to_dict

DATA = Path(__file__).resolve().parent / "data" / "kernels"
GPUS = ("mi300x", "mi325x", "mi350x", "mi355x", "h100", "h200")
DERIVED = {"mi325x": "mi300x", "mi350x": "mi355x", "h200": "h100"}  # same die: tables copied, own peak/clock/HBM
TABLE_FIELDS = kernel_fit.TABLE_FIELDS
# a base GPU's tables are fitted to its own rows and those of the GPUs derived from it (same
# die; each row priced on its own GPU's spec: peak, clock under load, HBM), less the derived
# GPU's rows of a kernel library that has a table of its own (they fit that table)
POOLED = {base: tuple(sorted(d for d, b in DERIVED.items() if b == base)) for base in sorted(set(DERIVED.values()))}
# per-library attention tables (GpuSpec.attention_libraries): the rows of one kernel library,
# by the CSV's library column and head dim. aiter_v3: AITER's asm fmha v3 kernels (bf16, head
# dim 128 / 192; the other head dims fall back to its CK kernels), which Transformer Engine
# ROCm's CK fused attention runs under NVTE_CK_USES_FWD_V3 / NVTE_CK_USES_BWD_V3
# cudnn: cuDNN's fused flash attention (torch SDPA's cudnn backend in the H200 device run), which
# Transformer Engine prefers on Hopper where it and flash-attention both apply
# sdpa_flash: FlashAttention-2 as torch SDPA's flash backend (the same H200 device run), what SDPA
# picks on Hopper unless cuDNN is asked for (pytorch/pytorch#138522 made cuDNN opt-in), which
# torchtitan called on H100
ATTENTION_LIBRARIES = {"aiter_v3": lambda row, p: "AITER" in row["library"] and p.head_dim in (128, 192),
                       "cudnn": lambda row, p: row["library"].startswith("cuDNN"),
                       "sdpa_flash": lambda row, p: row["library"].startswith("FlashAttention-2 (torch SDPA flash")}
HELD_LIBRARY = ("in-sample MAPE; held out (each family's rows at this table fitted to the library's other families' "
                "rows) in docs/accuracy.md, family table, column library, where two families measure the library")
MIN_LIBRARY_ROWS = 20  # fewer rows of one library leave its table to the pooled one (an input bound)
# per-library grouped-GEMM tables (GpuSpec.grouped_libraries), BF16 rows by the CSV's library
# column. torch_grouped_mm: torch._grouped_mm (CUTLASS grouped GEMM on Hopper), which
# torchtitan's MoE experts call; measured on the H200 (validation/data/device/h200), the H100
# takes the same table (same die: the speed is against each GPU's own dense price)
GROUPED_LIBRARIES = {"torch_grouped_mm": lambda row, p: row["library"].startswith("torch._grouped_mm") and p.dtype == "bf16"}
MIN_GROUPED_LIBRARY_ROWS = 8
# a GPU with no grouped-GEMM rows of its own takes the grouped tables of the GPU named here, the
# previous generation of the same vendor's grouped kernels (CK, Primus-Turbo, hipBLASLt grouped),
# as speeds against its own dense price (the GPUs derived from it with them). MI355X: the public
# MI355X grouped-kernel tables are held back (validation/data/kernels/SOURCES.md), and the
# alternative, speed 1 (a grouped kernel as fast as one dense launch of the same work), is what
# every GPU with grouped measurements contradicts (MI300X, H100 and H200 all run them slower)
GROUPED_FROM = {"mi355x": "mi300x"}
# a GPU's attention fit starts from, and is weakly held to, the attention table of the GPU named
# here (``kernel_fit.fit_kernels(attention_prior=)``), fitted without the family checked: an axis
# the fold's rows do not measure keeps that table's shape instead of the fit's generic starts
# (plateau 0.5, factors 1). MI355X: with HipKittens' rows held out only aiter's 8 causal
# head-dim-128 forwards remain, which say nothing of backward passes, non-causal calls or head
# dim 64; MI300X's AITER / CK kernels (the previous generation of the same libraries) measure
# all three. Where the rows measure an axis the prior barely moves the fit (weight ``PRIOR``)
ATTENTION_FROM = {"mi355x": "mi300x"}
SAME_DIE = {"h100": "h200", "h200": "h100", "mi300x": "mi325x", "mi325x": "mi300x", "mi355x": "mi350x", "mi350x": "mi355x"}
TARGETS = {"gemm": 10.0, "attention": 15.0, "grouped_gemm": 15.0}  # issue 14 "done when", held-out MAPE %
SPLITS = ("fit", "check")  # the files make_kernel_csvs.py writes; pooled here (the folds are by family)


def points(gpu: GpuSpec, split: str):
    path = DATA / split / f"{gpu.name}.csv"
    rows = read_kernel_csv(path) if path.exists() and len(path.read_text().splitlines()) > 1 else []
    return kernel_fit.usable(rows, gpu)[0]


@functools.lru_cache(maxsize=None)
def csv_rows(split: str, name: str) -> dict[int, dict]:
    """CSV line -> row of ``split/name.csv`` (its metadata columns: family, library, source)."""
    import csv

    path = DATA / split / f"{name}.csv"
    if not path.exists():
        return {}
    with open(path) as handle:
        return {i: r for i, r in enumerate(csv.DictReader(handle), 2)}


def families(split: str, name: str) -> dict[int, str]:
    """CSV line -> source family of the rows in ``split/name.csv``."""
    return {i: r["meta_family"] for i, r in csv_rows(split, name).items()}


@functools.lru_cache(maxsize=None)
def _pool_rows(name: str) -> tuple[tuple[KernelPoint, str, str | None], ...]:
    """(point, family, kernel library with a table of its own or None) of every row measured on
    GPU ``name`` (both files)."""
    gpu = load_gpu(name)
    out = []
    for split in SPLITS:
        fam, rows = families(split, name), csv_rows(split, name)
        out += [(p, fam.get(p.line, "?"), library_of(rows[p.line], p) if p.line in rows else None)
                for p in points(gpu, split)]
    return tuple(out)


@functools.lru_cache(maxsize=None)
def pool(name: str) -> tuple[tuple[KernelPoint, str], ...]:
    """(point, family) of every row measured on GPU ``name`` (both files)."""
    return tuple((p, f) for p, f, _ in _pool_rows(name))


def library_of(row: dict, p: KernelPoint) -> str | None:
    """The kernel library with a table of its own (``ATTENTION_LIBRARIES``,
    ``GROUPED_LIBRARIES``) a CSV row times, if any."""
    selectors = ATTENTION_LIBRARIES if p.kind == "attention" else GROUPED_LIBRARIES if p.kind == "grouped_gemm" else {}
    return next((library for library, sel in selectors.items() if sel(row, p)), None)


@functools.lru_cache(maxsize=None)
def libraries(name: str) -> dict[int, str]:
    """id(point) -> its kernel library (``library_of``) for the rows of ``pool(name)`` that have one."""
    return {id(p): lib for p, _, lib in _pool_rows(name) if lib}


def _library_rows(name: str, gpu: GpuSpec, kind: str, selects, minimum: int, own_only: bool = False,
                  held: str | None = None):
    """(GPU whose rows, that GPU's spec with ``gpu``'s tables, rows) of one kernel library: GPU
    ``name``'s own rows, else (``own_only`` False) those of the GPU of the same die
    (``SAME_DIE``), less those of source family ``held`` (by root family); None where neither
    has ``minimum`` rows."""
    for source in (name, None if own_only else SAME_DIE.get(name)):
        if source is None:
            continue
        host = gpu if source == name else dataclasses.replace(
            load_gpu(source), **{f: getattr(gpu, f) for f in TABLE_FIELDS})  # that GPU's spec, these tables
        mine = [p for split in SPLITS for p in points(host, split) if p.kind == kind
                and p.line in csv_rows(split, source) and selects(csv_rows(split, source)[p.line], p)
                and (held is None or _root(families(split, source).get(p.line)) != _root(held))]
        if len(mine) >= minimum:
            return source, host, mine
    return None


def _library_row(split: str, name: str, p: KernelPoint) -> bool:
    row = csv_rows(split, name).get(p.line)
    return row is not None and library_of(row, p) is not None


def _fit_library(kind: str, mine: list[KernelPoint], host: GpuSpec):
    """``fit_kernels``'s table of ``kind`` fitted to one library's rows on ``host`` (its own library
    tables set aside; a grouped speed against the host's dense price, from the fixed start). An
    attention table gains each head dim its rows do not measure and the host's pooled table has, at
    the pooled table's ratio to the nearest measured one (``kernel_tables_fit.with_head_dims_of``:
    the rule an attention prior's unmeasured head dims follow), rather than the nearest one's
    factor: AITER's v3 rows measure head dim 128 only, and MLA's 192 runs slower."""
    if kind == "attention":
        fitted, fits = kernel_fit.fit_kernels(mine, dataclasses.replace(host, attention_libraries={}))
        table = with_head_dims_of(fitted.attention, host.attention)
        filled = tuple(d for d in table.head_dim if d not in fitted.attention.head_dim)
        fits = [dataclasses.replace(f, prior_only=filled) if f.name == "attention" else f for f in fits]
        return dataclasses.replace(fitted, attention=table), fits
    return kernel_fit.fit_kernels(mine, dataclasses.replace(host, grouped_libraries={}, grouped_gemm={}))


@functools.lru_cache(maxsize=None)
def pooled(name: str) -> tuple[tuple[KernelPoint, str], ...]:
    """(point, family) of every row GPU ``name``'s tables are fitted to: its own and those of the
    GPUs derived from it (``POOLED``, each point read on its own GPU's spec) that are not rows
    of a kernel library with its own table."""
    out = list(pool(name))
    for d in POOLED.get(name, ()):
        gpu = load_gpu(d)
        for split in SPLITS:
            fam = families(split, d)
            out += [(p, fam.get(p.line, "?")) for p in points(gpu, split) if not _library_row(split, d, p)]
    return tuple(out)


def library_tables(name: str, gpu: GpuSpec, own_only: bool = False) -> dict:
    """``ATTENTION_LIBRARIES`` tables fitted (``kernel_fit.fit_kernels``) to each library's
    attention rows of GPU ``name`` (else of the GPU of the same die: derived), all families;
    in-sample only (docs/accuracy.md)."""
    tables = {}
    for library, selects in ATTENTION_LIBRARIES.items():
        found = _library_rows(name, gpu, "attention", selects, MIN_LIBRARY_ROWS, own_only)
        if found is None:
            continue
        source, host, mine = found
        fitted, fits = _fit_library("attention", mine, host)
        (fit,) = [f for f in fits if f.name == "attention"]
        derived = "" if source == name else f"derived: the {source} table (same die): "
        dims = (f"; head dims its rows do not measure ({', '.join(f'{d:g}' for d in fit.prior_only)}) at the pooled "
                f"table's ratio to the nearest measured one" if fit.prior_only else "")
        text = (f"{derived}fitted by validation/accuracy_kernels.py (kernel_fit.fit_kernels) to the {library} rows of "
                f"validation/data/kernels/{{fit,check}}/{source}.csv (library column, head dim; {fit.num_points} points; "
                f"MAPE on them {fit.mape_after:.1f}%, the pooled table's {kernel_fit.mape(mine, host):.1f}%{dims}): {HELD_LIBRARY}")
        tables[library] = dataclasses.replace(fitted.attention, source=text)
    return tables


def _cell(p: KernelPoint) -> tuple[str, str]:
    return p.kind, p.dtype


def _class(p: KernelPoint) -> str:
    """The reported kernel class: inference fused-MoE stages apart from the grouped GEMMs
    that price them (they check that pricing; they inform no table)."""
    return "fused_moe" if p.kernel == "moe_stage" else p.kind


def _root(family: str | None) -> str | None:
    """The source family of a ``family/backend`` label (a one-family cell split by backend)."""
    return family.split("/", 1)[0] if family else family


def _kept(family: str, held: str | None, root: bool) -> bool:
    """A row of ``family`` is in the fold that holds out ``held``; ``root``: compare source
    families, so every backend of the held one is out (a derived GPU's fold on its base's rows)."""
    return _root(family) != _root(held) if root else family != held


def fit_tables(name: str, held: str | None = None, root: bool = False) -> tuple[GpuSpec, frozenset, tuple]:
    """GPU ``name`` with its tables fitted (``kernel_fit.fit_kernels``, the code ``perfsim
    calibrate --gemm-csv`` runs) to its rows of every family but ``held``; a derived GPU
    takes its base's tables fitted so. Also the (kind, dtype) cells that had rows and the
    ``TableFit``s. A table no row informs is dropped where the profile can do without it
    (an FP8 / FP16 GEMM table falls back to the BF16 one, a grouped one to the dense GEMM),
    so no fold keeps numbers fitted to the family it checks."""
    if name in DERIVED:
        # the base GPU's rows of the held family are left out too: its root family (a derived GPU's
        # lone family is split by backend, ``family/backend``, but its base's rows carry the root)
        base, cells, fits = fit_tables(DERIVED[name], _root(held), root=True)
        gpu = load_gpu(name)
        return dataclasses.replace(gpu, **{f: getattr(base, f) for f in TABLE_FIELDS}), cells, fits
    # every family's rows but the held one's: folds that keep the same families are one fit
    # (a derived GPU's fold by root family is its base's fold where that family has no backends)
    gpu, cells, fits = _fold(name, frozenset(f for _, f in pooled(name) if _kept(f, held, root)),
                             _root(held) if name in ATTENTION_FROM else None)
    if name in GROUPED_FROM:  # that GPU's fold without the held family (its root: every backend)
        gpu = borrow_grouped(gpu, fit_tables(GROUPED_FROM[name], _root(held), root=True)[0])
    return gpu, cells, fits


def borrow_grouped(gpu: GpuSpec, donor: GpuSpec) -> GpuSpec:
    """``gpu`` with ``donor``'s grouped tables for the dtypes it has none of (``GROUPED_FROM``):
    speeds against the dense price, so each GPU's own dense table carries its own peak and
    fall-off; the source says where they come from."""
    borrowed = {d: dataclasses.replace(t, source=f"derived: the {donor.name} table (no grouped-GEMM measurement of "
                                                f"this GPU in the repository; speeds against this GPU's own dense "
                                                f"price, the previous generation's grouped kernels); {t.source}")
                for d, t in donor.grouped_gemm.items() if d not in gpu.grouped_gemm}
    return dataclasses.replace(gpu, grouped_gemm={**gpu.grouped_gemm, **borrowed}) if borrowed else gpu


@functools.lru_cache(maxsize=None)
def _fold(name: str, kept: frozenset, prior_held: str | None = None) -> tuple[GpuSpec, frozenset, tuple]:
    """``fit_tables`` of GPU ``name`` (not derived) on the rows of the families ``kept``; its
    attention fit from ``ATTENTION_FROM``'s table fitted without the family ``prior_held``."""
    gpu = load_gpu(name)
    # memory-bound rows fit ``membound`` (the copy table ``hbm`` stays from BabelStream);
    # FP8 rows timed with their casts are priced with them
    train = [p for p, f in pooled(name) if f in kept]
    cells = {_cell(p) for p in train if in_fit_range(p) or p.kind == "memory"}
    gpu = dataclasses.replace(
        gpu, gemm_dtypes={d: t for d, t in gpu.gemm_dtypes.items() if ("gemm", d) in cells},
        grouped_gemm={d: t for d, t in gpu.grouped_gemm.items() if ("grouped_gemm", d) in cells},
        membound=None,  # refit from the fold's memory-bound rows, else the streaming copy prices them
        attention_libraries={}, grouped_libraries={})  # per-library tables are in-sample fits: no fold carries them
    siblings = {d: load_gpu(d) for d in POOLED.get(name, ())}
    prior = fit_tables(ATTENTION_FROM[name], prior_held, root=True)[0].attention if name in ATTENTION_FROM else None
    fitted, fits = kernel_fit.fit_kernels(train, gpu, regenerate_gemm=True, siblings=siblings, attention_prior=prior)
    return fitted, frozenset(cells), tuple(fits)


def refit(name: str) -> GpuSpec:
    """The shipped tables: fitted to every family's rows, sources stamped with the data and MAPE."""
    if name in DERIVED:
        base = load_gpu(DERIVED[name])
        tables = {f: _derived(getattr(base, f), base.name) for f in TABLE_FIELDS}
        gpu = dataclasses.replace(load_gpu(name), **tables)
        own = library_tables(name, gpu, own_only=True)  # a library measured on this GPU itself: its own table
        return dataclasses.replace(gpu, attention_libraries={**gpu.attention_libraries, **own},
                                   grouped_libraries=grouped_library_tables(name, gpu))  # its own rows, if any
    fitted, _, fits = fit_tables(name)
    for f in fits:
        same_die = "".join(f" and {d}.csv (same die, each row priced on its own GPU; library rows left to "
                           f"their library tables)" for d in POOLED.get(name, ()))
        text = (f"fitted by validation/accuracy_kernels.py (kernel_fit.fit_kernels, as perfsim calibrate) to "
                f"validation/data/kernels/{{fit,check}}/{name}.csv{same_die}, all source families ({f.num_points} points; "
                f"MAPE on them {f.mape_after:.1f}%; {f.note or 'no tile choice'}); held-out MAPE (leave one family "
                f"out) and sources in docs/accuracy.md, validation/data/kernels/SOURCES.md")
        if f.name == "attention" and name in ATTENTION_FROM:
            text += (f"; started from and weakly held to the {ATTENTION_FROM[name]} attention table (ATTENTION_FROM): "
                     f"head dims only it measures ({', '.join(f'{d:g}' for d in f.prior_only) or 'none'}) at its ratio to the nearest "
                     f"measured one")
        fitted = kernel_fit.restamp(fitted, f.name, lambda _old, t=text: t)
    return dataclasses.replace(fitted, attention_libraries=library_tables(name, fitted),
                               grouped_libraries=grouped_library_tables(name, fitted))


def grouped_library_tables(name: str, gpu: GpuSpec) -> dict:
    """``GROUPED_LIBRARIES`` tables fitted (``kernel_fit.fit_kernels``) to each library's BF16
    grouped rows of GPU ``name``, or of the GPU of the same die (``SAME_DIE``) where ``name``
    has too few: the speed is against the dense price, so it carries across. In-sample only:
    a held-out fold without the library's rows prices them at the GPU's grouped table."""
    tables = {}
    for library, selects in GROUPED_LIBRARIES.items():
        found = _library_rows(name, gpu, "grouped_gemm", selects, MIN_GROUPED_LIBRARY_ROWS)
        if found is None:
            continue
        source, host, mine = found
        fitted, fits = _fit_library("grouped_gemm", mine, host)
        (fit,) = [f for f in fits if f.name.startswith("grouped_gemm")]
        derived = "" if source == name else f"derived: the {source} table (same die; speeds against this GPU's own dense price): "
        text = (f"{derived}fitted by validation/accuracy_kernels.py (kernel_fit.fit_kernels) to the {library} rows of "
                f"validation/data/kernels/{{fit,check}}/{source}.csv (library column; {fit.num_points} points; MAPE on them "
                f"{fit.mape_after:.1f}%, the GPU's grouped_gemm table's {kernel_fit.mape(mine, host):.1f}%"
                f"{'; ' + fit.note if fit.note else ''}): {HELD_LIBRARY}")
        tables[library] = dataclasses.replace(fitted.grouped_table("bf16"), source=text)
    return tables


def _derived(table, base: str):
    if table is None:
        return None
    if isinstance(table, dict):
        return {k: _derived(v, base) for k, v in table.items()}
    return dataclasses.replace(table, source=f"derived: the {base} table (same die), scaled by this GPU's own "
                                             f"peak, clock under load and HBM; {table.source}")


def write_profile(gpu: GpuSpec, previous: str | None = None) -> Path:
    """The profile as TOML with one-line arrays (scalars first, then one table per block);
    the comment lines above each top-level key of ``previous`` (default: the file being
    replaced) are kept above that key -- they carry provenance (clock, launch gap)."""
    path = PROFILE_DIR / "gpus" / f"{gpu.name}.toml"
    old = previous if previous is not None else (path.read_text() if path.exists() else "")
    path.write_text(with_comments(toml_text(to_dict(gpu)), old))
    return path


def with_comments(text: str, previous: str) -> str:
    """``text`` with the comment block that preceded each top-level ``key =`` in ``previous``."""
    notes, block = {}, []
    for line in previous.splitlines():
        if line.startswith("#"):
            block.append(line)
            continue
        if line.startswith("["):
            break
        if "=" in line and block:
            notes[line.split("=", 1)[0].strip()] = block
        block = []
    out = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("[") else None
        out += notes.pop(key, []) if key else []
        out.append(line)
        if line.startswith("["):
            notes = {}
    return "\n".join(out) + "\n"


def toml_text(data: dict, prefix: str = "") -> str:
    data = {k: v for k, v in data.items() if v is not None and v != {}}  # an absent or empty optional table
    plain = {k: v for k, v in data.items() if not isinstance(v, dict)}
    lines = [f"{k} = {tomli_w.dumps({'x': v}).split(' = ', 1)[1].strip()}" if not isinstance(v, list)
             else f"{k} = [{', '.join(repr(float(x)) if isinstance(x, float) else str(x) for x in v)}]"
             for k, v in plain.items()]
    text = "\n".join(lines) + "\n"
    for k, v in data.items():
        if isinstance(v, dict):
            name = f"{prefix}{k}"
            sub = toml_text(v, f"{name}.")
            text += f"\n[{name}]\n{sub}" if any(not isinstance(x, dict) for x in v.values()) else sub
    return text


def _fold_cell(p: KernelPoint, cells: set) -> bool:
    """A fold can price ``p`` honestly: memory-bound, or its table was refit in the fold
    (or, FP8 / FP16 GEMM and grouped GEMM, falls back to a table that was)."""
    if p.kind == "memory" or _cell(p) in cells:
        return True
    if p.kind == "gemm":
        return ("gemm", "bf16") in cells
    return p.kind == "grouped_gemm" and (("gemm", p.dtype) in cells or ("gemm", "bf16") in cells)


@functools.lru_cache(maxsize=None)
def held_out_errors(name: str) -> tuple[tuple[KernelPoint, str, float | None], ...]:
    """Leave one source family out: for each family, the tables fitted to all the other
    families' rows (``fit_tables``) price that family's rows. (point, family, error);
    error None where no other family informs the row's table (no honest prediction)."""
    rows = pool(name)
    library = libraries(name)
    out = []
    for held in sorted({f for _, f in rows}):
        gpu, cells, _ = fit_tables(name, held)
        for p, f in rows:
            if f == held:
                ok = _fold_cell(p, cells)
                priced = with_library_fold(gpu, name, library.get(id(p)), held)
                out.append((p, f, kernel_fit.predict_kernel(p, priced) / p.time_s - 1 if ok else None))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def pooled_errors(name: str) -> tuple[tuple[KernelPoint, str, float | None], ...]:
    """``held_out_errors`` with every row priced at the fold's pooled tables, its kernel
    library's own table never used (what a stack naming no library prices it with)."""
    out = []
    for held in sorted({f for _, f in pool(name)}):
        gpu, cells, _ = fit_tables(name, held)
        out += [(p, f, kernel_fit.predict_kernel(p, gpu) / p.time_s - 1 if _fold_cell(p, cells) else None)
                for p, f in pool(name) if f == held]
    return tuple(out)


def with_library_fold(gpu: GpuSpec, name: str, library: str | None, held: str) -> GpuSpec:
    """``gpu`` (the fold that holds out ``held``) pricing a row of kernel ``library`` as a stack
    naming that library does: at the library's own table, here fitted to the library's rows of
    the other families (``library_fold``); the pooled tables where the library has too few."""
    table = library_fold(name, library, held)[0] if library else None
    if table is None:
        return gpu
    if library in ATTENTION_LIBRARIES:
        return dataclasses.replace(gpu, attention=table)
    return dataclasses.replace(gpu, grouped_gemm={**gpu.grouped_gemm, "bf16": table})


@functools.lru_cache(maxsize=None)
def library_fold(name: str, library: str, held: str) -> tuple[object, int]:
    """(table, rows fitted) of kernel ``library``'s table (``library_tables``, ``grouped_library_tables``) fitted to its
    rows of every family but ``held`` (by root family): GPU ``name``'s own rows, else those of
    the GPU of the same die, at least ``MIN_LIBRARY_ROWS`` / ``MIN_GROUPED_LIBRARY_ROWS`` of
    them, on the fold's own tables (the dense price under a grouped speed is fitted without
    ``held`` too); (None, 0) where too few remain."""
    attention = library in ATTENTION_LIBRARIES
    kind, selects, minimum = (("attention", ATTENTION_LIBRARIES[library], MIN_LIBRARY_ROWS) if attention else
                              ("grouped_gemm", GROUPED_LIBRARIES[library], MIN_GROUPED_LIBRARY_ROWS))
    found = _library_rows(name, fit_tables(name, held)[0], kind, selects, minimum, held=held)
    if found is None:
        return None, 0
    _, host, mine = found
    fitted = _fit_library(kind, mine, host)[0]
    return (fitted.attention if attention else fitted.grouped_table("bf16")), len(mine)


def held_out(gpu: GpuSpec) -> list[tuple[str, str, str, str, int, float, float]]:
    """(kind, dtype, family, library, points, MAPE %, median signed error %) of the held-out
    rows; library: the kernel library whose own table priced them (``library_fold``), "" for
    the pooled tables; MAPE NaN where no other family informs the table."""
    cells = collections.defaultdict(list)
    for p, fam, e in held_out_errors(gpu.name):
        cells[(_class(p), p.dtype, fam, priced_library(gpu.name, p, fam))].append(e)
    out = []
    for (k, d, f, lib), e in sorted(cells.items()):
        got = [x for x in e if x is not None]
        out.append((k, d, f, lib, len(e), 100 * float(np.mean(np.abs(got))) if got else float("nan"),
                    100 * float(np.median(got)) if got else float("nan")))
    return out


def priced_library(name: str, p: KernelPoint, held: str) -> str:
    """The kernel library whose own table the fold holding out ``held`` prices ``p`` at, or ""."""
    library = libraries(name).get(id(p))
    return library if library and library_fold(name, library, held)[0] is not None else ""


def fold_rows(name: str, kind: str, dtype: str, held: str) -> int:
    """Rows of (kind, dtype) the fold that holds out ``held`` fits its table to (``fit_tables``)."""
    base = DERIVED.get(name, name)
    kind = "grouped_gemm" if kind == "fused_moe" else kind  # the table that prices a fused-MoE stage

    def rows(gpu: str, root: bool) -> int:
        return sum(1 for p, f in pooled(gpu) if _kept(f, held, root) and _cell(p) == (kind, dtype) and in_fit_range(p))

    own = rows(base, name in DERIVED)
    if own or kind != "grouped_gemm" or base not in GROUPED_FROM:
        return own
    return rows(GROUPED_FROM[base], True)  # the borrowed table's rows (``borrow_grouped``)


def summary(gpu: GpuSpec, pooled_only: bool = False) -> dict[tuple[str, str], tuple[int, float]]:
    """(kind, dtype) -> (points priced, MAPE %) over all held-out families pooled; each row at
    its kernel library's own table where the library has one (``held_out_errors``), or
    (``pooled_only``) every row at the pooled tables (``pooled_errors``)."""
    cells = collections.defaultdict(list)
    for p, _, e in (pooled_errors if pooled_only else held_out_errors)(gpu.name):
        if e is not None:
            cells[(_class(p), p.dtype)].append(abs(e))
    return {k: (len(v), 100 * float(np.mean(v))) for k, v in sorted(cells.items())}


def _provenance(gpu: GpuSpec) -> list[str]:
    return [f"{table}: {status}" for table, status, _ in table_provenance(gpu)]


def section() -> str:
    """Markdown: the split, held-out MAPE per GPU / class / dtype, and by family."""
    out = ["## Kernels (GEMM, grouped GEMM, attention)", "",
           "Rows: `validation/data/kernels/{fit,check}/<gpu>.csv` pooled. Held out by leave one source family "
           "out: each family's rows are priced by tables fitted to all the other families' rows (never its own "
           "rows, never its family); `family/backend` marks a cell with one family, split by kernel backend "
           "within it (a weak split). The shipped tables are fitted to all families. MI325X, MI350X and H200 "
           "take the MI300X / MI355X / H100 tables (same die, own peak, clock under load and HBM), fitted "
           "without the family checked (all its backends, on the base GPU's rows too). MI355X (and MI350X with it) has no "
           "grouped-GEMM rows of its own: it takes MI300X's grouped tables (speeds against its own dense price; "
           "`GROUPED_FROM`), fitted without the family checked. MI355X's attention fit starts from, and is weakly held "
           "to, MI300X's attention table fitted without the family checked (`ATTENTION_FROM`): an axis its fold's rows "
           "do not measure keeps MI300X's shape (with HipKittens held out, aiter's 8 causal head-dim-128 forwards remain: "
           "no backward, non-causal or head-dim-64 row), a head dim only MI300X measures at MI300X's ratio to the "
           "nearest measured one. FP8 rows timed with their input casts are fitted and priced as GEMM + modelled casts. "
           "Host-timed rows (`timing = host`: Primus-Turbo's Timer.timeit harness, hipblaslt-bench's host-clocked loop of back-to-back calls) are fitted as the longer of the GPU time "
           "and a host time per call fitted per series that shows one (`kernel_fit.host_floors`), and checked at their GPU "
           "time. "
           "The stages of AITER's inference fused-MoE kernel (class `fused_moe`: stage 1 gathers its tokens by "
           "index, stage 2 scatters them weighted) are priced by the grouped-GEMM pricing and fitted to nothing; so are "
           "MoE MLP forwards timed whole (VeOmni's, in class `grouped_gemm`: their timing holds routing-side work "
           "perfsim's MoE-MLP pricing does not). A row with direction `fwd_bwd` times a forward and its backward "
           "together (tgale96's: the grouped layer's whole step with `out.sum()` as the loss, priced with the sum's "
           "two passes over the output). "
           "Per-library tables (`attention_libraries`, `grouped_libraries`: a stack names the kernel library it "
           "runs, and perfsim prices that library's kernels at its own table) are shipped fitted to that library's rows "
           "of every family. Held out, a row of such a library is priced as a stack naming it prices it: at the "
           "library's table fitted to the library's rows of the other families (`library_fold`, on the fold's own "
           "dense tables; the GPU's own rows, else its same-die GPU's), where at least 20 attention or 8 grouped rows "
           "remain, else at the pooled tables (column `library` in the family table). The cell table also gives each "
           "cell with every row at the pooled tables (`pooled tables`: what a stack naming no library prices), which "
           "cannot know the library: H200's FlashAttention-2 rows (SDPA flash) against a table fitted to "
           "FlashAttention-3, cuDNN and FlashAttention-4 rows, its torch._grouped_mm backwards against the "
           "generic grouped table's backward speed, set by tgale96's steps. "
           "Error = (predicted - measured) / measured; MAPE = mean |error|. "
           "Regenerate with `.venv/bin/python validation/accuracy_doc.py`.", "",
           "### Held-out MAPE per GPU, kernel class and dtype", "",
           "Targets (issue 14): GEMM <= 10%, attention and grouped GEMM <= 15%; memory-bound kernels (the `membound` "
           "table) and inference fused-MoE stages have none.", "",
           "| GPU | class | dtype | points | held-out MAPE % | target % | met | pooled tables % |",
           "| --- | --- | --- | --- | ---: | ---: | --- | ---: |"]
    gpus = {name: load_gpu(name) for name in GPUS}
    for name, gpu in gpus.items():
        pooled_cells = summary(gpu, pooled_only=True)
        for (kind, dtype), (n, err) in summary(gpu).items():
            target = TARGETS.get(kind)
            met = "" if target is None else ("yes" if err <= target else "no")
            dt = "-" if kind == "memory" else dtype
            out.append(f"| {name} | {kind} | {dt} | {n} | {err:.1f} | {target or '-'} | {met} | "
                       f"{pooled_cells[(kind, dtype)][1]:.1f} |")
    out += ["", "### Held-out error by source family", "",
            "`fold rows`: the rows of the same class and dtype the fold's table was fitted to (the other "
            "families'; for MI325X / MI350X / H200 their base GPU's; `library`: the rows of that kernel library the "
            "library's table was fitted to). A handful means the figure checks a table that "
            "little informs (0: the fold falls back to the BF16 / dense GEMM table, or, memory-bound kernels, "
            "to the streaming-copy HBM table).", "",
            "| GPU | class | dtype | family | library | points | fold rows | MAPE % | median error % |",
            "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for name, gpu in gpus.items():
        for kind, dtype, fam, lib, n, err, med in held_out(gpu):
            rows = library_fold(name, lib, fam)[1] if lib else fold_rows(name, kind, dtype, fam)
            out.append(f"| {name} | {kind} | {dtype} | {fam} | {lib or '-'} | {n} | {rows} | {err:.1f} | {med:+.1f} |")
    out += ["", "### Table provenance (`perfsim list --provenance`)", ""]
    out += [f"- {name}: " + "; ".join(_provenance(gpu)) for name, gpu in gpus.items()]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true", help="refit and rewrite hardware_profiles/gpus/*.toml")
    args = parser.parse_args()
    if args.refit:
        for name in sorted(GPUS, key=lambda g: g in DERIVED):  # bases before the GPUs derived from them
            write_profile(refit(name))
        _fold.cache_clear()  # the folds start from the profiles just written
    print(section())


if __name__ == "__main__":
    main()
