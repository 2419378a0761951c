"""Shared loader for the measured MI300X all_reduce sweeps (rccl-tests, 8 GPUs, 1 node)."""

import csv
from pathlib import Path

CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "calibration" / "allreduce_busbw_vs_size.csv"
FIT_SERIES = "mi300x_1node_8gpu_mpi_nograph_amdblog"
UNSEEN_SERIES = "mi300x_1node_8gpu_mpi_hipgraph_amdblog"


def load_series(name: str, path: Path = CSV) -> list[tuple[int, float]]:
    """(size_bytes, out-of-place time_us) of one series, by size."""
    with open(path, newline="") as handle:
        rows = [(int(r["size_bytes"]), float(r["time_us_oop"])) for r in csv.DictReader(handle) if r["series"] == name]
    if not rows:
        raise SystemExit(f"series {name!r} not found in {path}")
    return sorted(rows)
