"""Write kernel-sweep rows in the schema ``perfsim calibrate`` reads.

The column list comes from ``perfsim.calibration.readers.KERNEL_CSV_COLUMNS`` (documented in
validation/KERNEL_CSV.md); our extras start with ``meta_`` as the reader requires. Only
valid GPU timings become rows: an interpreter timing is refused, never written.
The file is written to a temporary name and renamed, so it is never half-written.
"""

import csv
import os
import tempfile
from pathlib import Path

from perfsim.calibration.readers import KERNEL_CSV_COLUMNS

META_COLUMNS = ("meta_counts", "meta_repeats", "meta_min_us", "meta_rel_error")
COLUMNS = (*KERNEL_CSV_COLUMNS, *META_COLUMNS)
ATTENTION_BWD_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # x forward FLOPs, as perfsim.calibration.readers


class NotAMeasurement(ValueError):
    """A timing from the interpreter / CPU was about to be written as a measurement."""


def row_flops(row: dict) -> float:
    """FLOPs of one call under the reader's conventions (GEMM 2mnk, attention 4bhs^2d)."""
    if row["kind"] == "gemm":
        return 2.0 * row["m"] * row["n"] * row["k"] * row.get("batch", 1)
    if row["kind"] == "grouped_gemm":
        return 2.0 * sum(map(int, row["meta_counts"].split())) * row["n"] * row["k"]
    if row["kind"] == "attention":
        fwd = 4.0 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"] * (0.5 if row["causal"] else 1.0)
        return fwd * ATTENTION_BWD_FACTOR[row["direction"]]
    return 0.0


SOURCES = {
    "triton": "validation/run.py (Triton kernels, median of repeats, CUDA events)",
    "torch": "validation/run.py --backend torch (library kernels through torch, median of repeats, CUDA events)",
}


def measured_row(case_row: dict, timing, meta: dict, rel_error: float, backend: str = "triton",
                 extra: dict | None = None) -> dict:
    """The CSV row of one timed case; raises NotAMeasurement for an invalid timing.
    ``extra``: cells the case adds (the torch backend's library name, a note)."""
    if not timing.valid:
        raise NotAMeasurement(f"{case_row['kind']}: timing from {meta.get('device_name', 'cpu')} is not a measurement")
    row = dict(case_row)
    row.update(time_us=f"{timing.median_s * 1e6:.3f}", meta_repeats=timing.repeats,
               meta_min_us=f"{timing.min_s * 1e6:.3f}", meta_rel_error=f"{rel_error:.2e}",
               device=meta["device_name"], source=SOURCES[backend], timing="device",
               library=software(meta), clock_MHz=row.get("clock_MHz") or meta.get("sm_clock_MHz", ""))
    extra = dict(extra or {})
    if extra.get("library"):
        row["library"] = f"{extra.pop('library')} ({row['library']})"
    if extra.get("note"):
        row["note"] = "; ".join(filter(None, [row.get("note", ""), extra.pop("note")]))
    row.update({k: v for k, v in extra.items() if k not in ("library", "note")})
    if row["kind"] == "memory":
        row["TBps"] = f"{row['bytes'] / timing.median_s / 1e12:.4f}"
    else:
        row["tflops"] = f"{row_flops(row) / timing.median_s / 1e12:.3f}"
    return row


def software(meta: dict) -> str:
    keys = ("triton", "torch", "cuda", "hip", "arch")
    return " ".join(f"{k}={meta[k]}" for k in keys if meta.get(k))


def write_rows(path: str | Path, rows: list[dict]) -> None:
    """Write rows (missing columns empty) atomically; unknown keys are an error."""
    path = Path(path)
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"kernel CSV: unknown column {sorted(unknown)[0]!r}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
