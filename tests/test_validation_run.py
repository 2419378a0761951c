"""validation.run and validation.csvout: the kernel CSV matches perfsim's reader schema,
interpreter timings are never written, and a missing GPU / stack is one line, exit 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from perfsim.calibration.readers import KERNEL_CSV_COLUMNS, read_kernel_csv
from validation.csvout import COLUMNS, NotAMeasurement, measured_row, write_rows
from validation.timing import Timing

ROOT = Path(__file__).resolve().parents[1]
META = {"device_name": "NVIDIA H200", "triton": "3.7.1", "torch": "2.13.0", "cuda": "12.8", "sm_clock_MHz": 1980}
GPU_TIMING = Timing(median_s=2e-3, min_s=1.9e-3, repeats=20, valid=True)
CASE_ROWS = [
    dict(kind="gemm", dtype="bf16", m=4096, n=4096, k=4096, batch=1, note="cube"),
    dict(kind="grouped_gemm", dtype="bf16", m=512, n=4096, k=2048, batch=4, note="uneven", meta_counts="1024 512 512 0"),
    dict(kind="attention", dtype="bf16", batch=2, seq=4096, heads=8, kv_heads=2, head_dim=128, causal=1, direction="bwd"),
    dict(kind="memory", dtype="fp32", bytes=3 * 2**28, kernel="triad"),
]


def test_columns_extend_the_reader_schema_with_meta_only():
    assert COLUMNS[:len(KERNEL_CSV_COLUMNS)] == KERNEL_CSV_COLUMNS
    assert all(c.startswith("meta_") for c in COLUMNS[len(KERNEL_CSV_COLUMNS):])


def test_written_rows_read_back_with_the_same_time_and_work(tmp_path):
    path = tmp_path / "kernels.csv"
    write_rows(path, [measured_row(r, GPU_TIMING, META, 1e-3) for r in CASE_ROWS])
    points = read_kernel_csv(path)
    assert [p.kind for p in points] == [r["kind"] for r in CASE_ROWS]
    assert all(p.time_s == pytest.approx(2e-3) and p.device == "NVIDIA H200" and p.timing == "device" for p in points)
    assert points[0].flops == 2 * 4096**3
    assert points[1].flops == 2 * 2048 * 4096 * 2048  # m x batch = tokens when counts sum to it
    assert points[2].flops == pytest.approx(2.5 * 4 * 2 * 8 * 4096**2 * 128 * 0.5)
    assert points[3].bytes == 3 * 2**28


def test_interpreter_timings_are_refused():
    with pytest.raises(NotAMeasurement):
        measured_row(CASE_ROWS[0], Timing(median_s=float("nan"), min_s=float("nan"), repeats=1, valid=False), META, 0.0)


def test_unknown_column_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "k.csv"
    with pytest.raises(ValueError, match="unknown column 'flops'"):
        write_rows(path, [dict(kind="gemm", flops=1)])
    assert not path.exists()


def test_missing_stack_is_one_line():
    from validation.env import EnvironmentProblem, _import

    with pytest.raises(EnvironmentProblem, match="not_a_real_module is not installed"):
        _import("not_a_real_module")


def _no_gpu() -> bool:
    import importlib.util

    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None:  # not imported here: setup() must import it first
        pytest.skip("triton is not installed")
    return not torch.cuda.is_available()


def test_out_without_gpu_exits_2_with_one_line(tmp_path):
    if not _no_gpu():
        pytest.skip("a GPU is present")
    out = tmp_path / "r.csv"
    proc = subprocess.run([sys.executable, "-m", "validation.run", "--suite", "gemm", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no GPU") and proc.stderr.count("\n") == 1
    assert not out.exists()


def test_check_runs_the_moe_suite_in_the_interpreter(capsys):
    if not _no_gpu():
        pytest.skip("a GPU is present")
    from validation.run import main

    assert main(["--suite", "moe", "--check"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(lines) == 6 and all(line.startswith("ok") for line in lines)
    assert "Triton interpreter" in out


@pytest.mark.gpu
def test_gpu_sweep_writes_a_csv_perfsim_reads(tmp_path):
    if _no_gpu():
        pytest.skip("no GPU")
    out = tmp_path / "mem.csv"
    proc = subprocess.run([sys.executable, "-m", "validation.run", "--suite", "memory", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    points = read_kernel_csv(out)
    assert points and all(p.kind == "memory" and p.time_s > 0 for p in points)


def test_gpu_check_maps_each_instinct_and_hopper_name_to_its_own_profile():
    """The device name torch reports picks that GPU's cluster profile (MI350X is not MI355X),
    and a GPU perfsim has no profile for is one clear error that says to pass --cluster."""
    from perfsim.system import hardware
    from validation.env import EnvironmentProblem
    from validation.gpu_check import profile_for

    names = {"AMD Instinct MI300X": "mi300x-pollara", "AMD Instinct MI325X": "mi325x-pollara",
             "AMD Instinct MI350X": "mi350x-pollara", "AMD Instinct MI355X": "mi355x-pollara",
             "NVIDIA H100 80GB HBM3": "h100-ib", "NVIDIA H200": "h200-ib"}
    for device, cluster in names.items():
        assert profile_for(device) == cluster and cluster in hardware.list_profiles("cluster")
    with pytest.raises(EnvironmentProblem, match="--cluster"):
        profile_for("NVIDIA B200")
