"""Shared loader for the measured MI300X all_reduce sweeps (rccl-tests, 8 GPUs, 1 node),
read from the rccl-tests logs with perfsim's own log reader."""

from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.calibration.readers import read_rccl_log

# shipped in the repo (validation/data/calibration/SOURCES.md): a clone has no ../shared
LOGS = Path(__file__).resolve().parent / "data" / "calibration" / "rccl-tests"
FIT_SERIES = "mi300x_1node_8gpu_mpi_nograph_amdblog"
UNSEEN_SERIES = "mi300x_1node_8gpu_mpi_hipgraph_amdblog"


def load_series(name: str, folder: Path = LOGS) -> list[tuple[int, float]]:
    """(size_bytes, out-of-place time_us) of one series, by size."""
    try:
        log = read_rccl_log(folder / f"{name}.log")
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    return sorted((r.size_bytes, r.time_us_oop) for r in log.rows if r.time_us_oop is not None)
