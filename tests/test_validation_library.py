"""The library backend of the validation sweep (validation.library, ``--backend torch``), the
kernel-gap measurement (validation.launch), the head-start timing, and the H200 device rows
that become kernel data (validation/data/kernels/make_kernel_csvs.device_rows)."""

import csv
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")


def _cpu_only():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CPU check path is not taken")


def test_torch_backend_check_runs_every_suite_on_the_libraries_without_a_gpu():
    _cpu_only()
    proc = subprocess.run([sys.executable, "-m", "validation.run", "--backend", "torch", "--suite", "all", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert not [line for line in lines if line.startswith("FAIL")]
    ok = [line for line in lines if line.startswith("ok")]
    for label in ("gemm bf16", "gemm fp16", "grouped bf16", "attention fwd", "attention bwd", "memory copy", "memory triad"):
        assert any(label in line for line in ok), label
    # what a library refuses is a skip with its reason, never a failure (cuDNN has no CPU kernel)
    assert all("[cudnn]" in line for line in lines if line.startswith("skip"))


def _gqa_inputs(direction):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn((1, 4, 33, 16), generator=gen).to(torch.bfloat16)
    k, v = (torch.randn((1, 2, 33, 16), generator=gen).to(torch.bfloat16) for _ in range(2))
    do = torch.randn((1, 4, 33, 16), generator=gen).to(torch.bfloat16)
    return q, k, v, do


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_attention_falls_back_to_repeated_kv_heads_and_sums_their_gradients(monkeypatch, direction):
    """A backend that refuses enable_gqa runs with K/V repeated to the query heads; dK and dV
    are summed back over each group, so the error against the GQA reference stays small."""
    from validation import library

    real = library.F.scaled_dot_product_attention

    def no_gqa(*args, enable_gqa=False, **kw):
        if enable_gqa:
            raise RuntimeError("this backend has no GQA")
        return real(*args, **kw)
    monkeypatch.setattr(library.F, "scaled_dot_product_attention", no_gqa)
    run, error, extra = library.prepare_attention(*_gqa_inputs(direction), True, direction, "flash")
    assert "repeated" in extra["note"] and extra["library"].startswith("FlashAttention-2")
    assert error() < 2e-2
    run()


def test_fp8_gemm_that_the_library_refuses_is_unsupported_not_a_crash(monkeypatch):
    from validation import library

    def refuse(*_a, **_k):
        raise RuntimeError("mat2 shape (2000x3000) must be divisible by 16\nmore")
    monkeypatch.setattr(torch, "_scaled_mm", refuse, raising=False)
    a = torch.randn(8, 32).to(torch.float8_e4m3fn)
    b = torch.randn(32, 24).to(torch.float8_e4m3fn)
    with pytest.raises(library.Unsupported, match="divisible by 16"):
        library.prepare_gemm(a, b, "fp8")


def test_a_torch_backend_row_names_its_library_and_source():
    from validation.csvout import SOURCES, measured_row
    from validation.timing import Timing

    meta = {"device_name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"}
    row = measured_row(dict(kind="attention", dtype="bf16", batch=1, seq=4096, heads=32, kv_heads=8, head_dim=128,
                            causal=1, direction="fwd", note="grid"),
                       Timing(median_s=1e-3, min_s=9e-4, repeats=20, valid=True), meta, 1e-3, backend="torch",
                       extra={"library": "cuDNN fused attention (torch SDPA cudnn backend)", "note": "cudnn"})
    assert row["library"] == "cuDNN fused attention (torch SDPA cudnn backend) (triton=3.6.0 torch=2.11.0 cuda=13.0)"
    assert row["note"] == "grid; cudnn" and row["source"] == SOURCES["torch"] and row["timing"] == "device"


# ---- the gap between dependent kernels ------------------------------------------------


def _trace(starts, dur=1.0):
    return {"traceEvents": [{"cat": "kernel", "ph": "X", "ts": t, "dur": dur} for t in starts]
            + [{"cat": "cpu_op", "ph": "X", "ts": 0.5, "dur": 100.0}]}


def test_kernel_gaps_come_from_kernel_stamps_only():
    from validation.launch import gaps, kernel_spans, summarize

    spans = kernel_spans(_trace([30.0, 0.0, 10.0, 12.0] + [20.0 + 2.0 * i for i in range(1, 5)]))
    assert spans[0] == (0.0, 1.0) and len(spans) == 8  # CPU ops are not kernels; sorted by start
    assert gaps([(0.0, 1.0), (0.5, 2.0), (5.0, 6.0)]) == [0.0, 3.0]  # overlap is no gap
    row = summarize("queued", kernel_spans(_trace([100.0] + [1000.0 + 3.0 * i for i in range(40)])), drop=1)
    assert row["gap_us_median"] == 2.0 and row["kernels"] == 40 and row["kernel_us_median"] == 1.0


def test_too_few_kernels_is_one_clear_problem():
    from validation.env import EnvironmentProblem
    from validation.launch import kernel_spans, summarize

    with pytest.raises(EnvironmentProblem, match="eager: the trace holds 3 kernels"):
        summarize("eager", kernel_spans(_trace([0.0, 2.0, 4.0])))


def test_launch_without_gpu_exits_2_with_one_line(tmp_path):
    _cpu_only()
    out = tmp_path / "launch.csv"
    proc = subprocess.run([sys.executable, "-m", "validation.launch", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no GPU") and proc.stderr.count("\n") == 1
    assert not out.exists()


def test_h200_profile_takes_the_measured_queued_gap():
    from perfsim.system.hardware import load_gpu

    with open(ROOT / "validation/data/device/h200/launch.csv", newline="") as handle:
        queued = next(r for r in csv.DictReader(handle) if r["mode"] == "queued")
    h200, h100 = load_gpu("h200"), load_gpu("h100")
    assert h200.kernel_launch_us == pytest.approx(float(queued["gap_us_median"]), abs=0.005)
    assert "launch.csv" in h200.kernel_launch_source and not h200.kernel_launch_source.startswith(("assumed", "derived"))
    assert h100.kernel_launch_us == h200.kernel_launch_us and h100.kernel_launch_source.startswith("derived")


# ---- head-start timing -----------------------------------------------------------------


def _fake_torch(slept):
    return SimpleNamespace(cuda=SimpleNamespace(_sleep=slept.append, synchronize=lambda: None))


def test_head_start_covers_three_times_the_hosts_issue_time():
    from validation.timing import HEAD_START_MIN_S, SLEEP_CYCLES_PER_S, _head_start

    slept = []
    start = _head_start(lambda: time.sleep(2e-3), _fake_torch(slept))
    start()
    assert slept[-1] >= 3 * 2e-3 * SLEEP_CYCLES_PER_S  # a slow host issue gets a longer head start
    slept.clear()
    _head_start(lambda: None, _fake_torch(slept))()
    assert slept[-1] == int(SLEEP_CYCLES_PER_S * HEAD_START_MIN_S)  # never under the minimum


def test_no_sleep_kernel_means_no_head_start():
    from validation.timing import _head_start

    calls = []
    start = _head_start(lambda: calls.append(1), SimpleNamespace(cuda=SimpleNamespace()))
    assert start() is None and calls == []


# ---- the device rows as kernel data ------------------------------------------------------


def _make_kernel_csvs():
    spec = importlib.util.spec_from_file_location("make_kernel_csvs", ROOT / "validation/data/kernels/make_kernel_csvs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_h200_device_rows_are_in_the_committed_kernel_data():
    """Every library row the rules keep (balanced grouped GEMM, the faster attention backend per
    shape) is an H200 row of family perfsim-device in the committed fit/check files."""
    mk = _make_kernel_csvs()
    rows = mk.device_rows("h200")
    with open(ROOT / "validation/data/device/h200/library.csv", newline="") as handle:
        raw = list(csv.DictReader(handle))
    balanced = [r for r in raw if r["kind"] == "grouped_gemm" and len(set(r["meta_counts"].split())) == 1]
    assert sum(r["kind"] == "grouped_gemm" for r in rows) == len(balanced) > 0
    assert {r["meta_family"] for r in rows} == {"perfsim-device"} and {r["device"] for r in rows} == {"h200"}
    key = ("kind", "dtype", "m", "n", "k", "seq", "heads", "kv_heads", "head_dim", "direction", "bytes", "time_us")
    kept = {tuple(r[c] for c in key) for r in mk.fastest(rows)}
    committed = set()
    for part in ("fit", "check"):
        with open(ROOT / f"validation/data/kernels/{part}/h200.csv", newline="") as handle:
            committed |= {tuple(r[c] for c in key) for r in csv.DictReader(handle)
                          if r["meta_family"].startswith("perfsim-device")}
    assert kept == committed
    attention = [r for r in mk.fastest(rows) if r["kind"] == "attention"]
    assert attention and all("cuDNN" in r["library"] or "FlashAttention" in r["library"] for r in attention)


def test_merge_csvs_joins_the_written_parts_and_removes_them(tmp_path):
    from validation.csvout import measured_row, write_rows
    from validation.gpu_check import merge_csvs
    from validation.timing import Timing

    meta = {"device_name": "NVIDIA H200", "torch": "2.11.0"}
    timing = Timing(median_s=1e-4, min_s=1e-4, repeats=5, valid=True)
    parts = [tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "missing.csv"]
    write_rows(parts[0], [measured_row(dict(kind="gemm", dtype="bf16", m=64, n=64, k=64, batch=1), timing, meta, 0.0)])
    write_rows(parts[1], [measured_row(dict(kind="memory", dtype="fp32", bytes=2**20, kernel="copy"), timing, meta, 0.0)])
    merge_csvs(parts, tmp_path / "all.csv")
    from perfsim.calibration.readers import read_kernel_csv

    assert [p.kind for p in read_kernel_csv(tmp_path / "all.csv")] == ["gemm", "memory"]
    assert not parts[0].exists() and not parts[1].exists()
