"""calibrate: fits improve what they fit, generalise to points they never saw, and
write a new profile with provenance without overwriting silently.

Held-out figures (printed with -s) on the shipped data, fitted from the mi300x-pollara
profile as shipped: every-other-size all_reduce split 7.6% -> 3.1% on the unseen half;
hipgraph series (unseen launch mode) >= 1 MB 5.0% -> 3.0%; GEMM Azure FP8 run ->
AMD max-achievable-FLOPS points (other dtypes, other library build) 5.5% -> 3.7%.
"""

import csv
import dataclasses
import datetime as dt
import tomllib
from pathlib import Path

import pytest

import perfsim
from perfsim.calibration import kernel_fit
from perfsim.calibration.calibrate import collective_points
from perfsim.cli import main
from perfsim.calibration.collective_fit import fit_collectives, mape
from perfsim.errors import ConfigError
from perfsim.system.hardware import load_cluster
from perfsim.calibration.readers import read_kernel_csv, read_rccl_log

from conftest import write_kernel_csv

LOGS = Path(__file__).resolve().parents[1] / "validation" / "data" / "calibration" / "rccl-tests"
NOGRAPH = LOGS / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
HIPGRAPH = LOGS / "mi300x_1node_8gpu_mpi_hipgraph_amdblog.log"
P2P = LOGS.parent / "xgmi_p2p_measured.csv"
GEMM_CSV = Path(__file__).resolve().parents[1] / "validation" / "data" / "gemm_mi300x_measured.csv"
needs_data = pytest.mark.skipif(not LOGS.exists(), reason="shared calibration data not present")
WHEN = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def base():
    return load_cluster("mi300x-pollara")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "cal.toml"
    return perfsim.calibrate("mi300x-pollara", rccl_logs=[NOGRAPH], kernel_csvs=[GEMM_CSV], out=out, now=WHEN)


@needs_data
def test_done_when_calibrated_profile_reproduces_the_log_within_5pct(calibrated):
    """Issue 5: `perfsim collective --cluster cal.toml` reproduces the log within 5% MAPE."""
    log = read_rccl_log(NOGRAPH)
    errors = [abs(perfsim.collective("all_reduce", s, 8, str(calibrated.path))["time_us"] / t - 1)
              for s, t in log.series()]
    overall = 100 * sum(errors) / len(errors)
    print(f"\ncalibrated all_reduce MAPE on the nograph log: {overall:.2f}% over {len(errors)} sizes")
    assert len(errors) == 32 and overall <= 5.0
    fit = next(f for f in calibrated.fits if f.name == "collectives")
    assert fit.mape_after == pytest.approx(overall, abs=1e-6) and fit.mape_before > 7


@needs_data
def test_written_profile_is_self_contained_with_provenance(calibrated, base):
    data = tomllib.loads(calibrated.path.read_text())
    assert isinstance(data["gpu"], dict) and isinstance(data["node"], dict)  # inlined
    prov = data["provenance"]
    assert prov["calibrated_at"] == "2025-01-01T00:00:00+00:00" and prov["base_profile"] == "mi300x-pollara"
    assert str(NOGRAPH) in prov["inputs"] and str(GEMM_CSV) in prov["inputs"]
    assert "MAPE" in prov["fit.collectives"] and "MAPE" in prov["fit.gemm/fp8"]  # the sample CSV is FP8
    loaded = load_cluster(calibrated.path)
    assert loaded == calibrated.cluster
    assert loaded.fabric == base.fabric and loaded.node == base.node  # no p2p given: untouched
    assert loaded.gpu.hbm == base.gpu.hbm and loaded.gpu.attention == base.gpu.attention
    assert loaded.gpu.gemm != base.gpu.gemm and loaded.gpu.gemm.source.startswith("calibrated by perfsim calibrate")


@needs_data
def test_never_overwrites_silently(calibrated, tmp_path):
    before = calibrated.path.read_text()
    with pytest.raises(ConfigError, match="exists; pass --force"):
        perfsim.calibrate("mi300x-pollara", rccl_logs=[NOGRAPH], out=calibrated.path)
    assert calibrated.path.read_text() == before
    assert main(["calibrate", "--rccl-log", str(NOGRAPH), "--out", str(calibrated.path)]) == 2
    out = tmp_path / "c.toml"
    assert main(["calibrate", "--rccl-log", str(NOGRAPH), "--out", str(out), "--fix-windows"]) == 0
    assert main(["calibrate", "--rccl-log", str(NOGRAPH), "--out", str(out), "--force"]) == 0
    with pytest.raises(ConfigError, match="at least one measurement file"):
        perfsim.calibrate("mi300x-pollara")


@needs_data
def test_held_out_every_other_size(base):
    points = collective_points([read_rccl_log(NOGRAPH)])
    train, test = points[::2], points[1::2]
    fit = fit_collectives(train, base)
    fitted = dataclasses.replace(base, collectives=fit.tuning)
    unseen_before, unseen_after = mape(test, base), mape(test, fitted)
    print(f"\nall_reduce every-other-size: train {fit.mape_before:.2f}% -> {fit.mape_after:.2f}%, "
          f"unseen half {unseen_before:.2f}% -> {unseen_after:.2f}%")
    assert fit.mape_after < fit.mape_before
    # bound: the done-when target (5%) plus interpolation slack (protocol edges fall between sizes)
    assert unseen_after <= 6.0


@needs_data
def test_held_out_graph_launch_mode(base):
    fit = fit_collectives(collective_points([read_rccl_log(NOGRAPH)]), base)
    fitted = dataclasses.replace(base, collectives=fit.tuning)
    unseen = collective_points([read_rccl_log(HIPGRAPH)])
    large = [p for p in unseen if p.size_bytes >= 1 << 20]
    print(f"\nhipgraph (unseen launch mode): all sizes {mape(unseen, base):.1f}% -> {mape(unseen, fitted):.1f}%, "
          f">= 1 MB {mape(large, base):.2f}% -> {mape(large, fitted):.2f}%")
    # graph capture removes ~6 us of per-call launch cost the nograph fit includes, so small
    # sizes are not expected to transfer; bandwidth-bound sizes are (same kernels, same links)
    assert mape(large, fitted) <= 5.0
    assert mape(large, fitted) < mape(large, base)


def test_held_out_gemm_azure_run_to_maf_points(base):
    """Fit the FP8 GEMM table on the Azure run alone, starting from a profile without one
    (FP8 priced with BF16's table), and check it on the unseen AMD MAF blog points. (The
    shipped MI300X FP8 table is fitted to every source family, validation/accuracy_kernels.py.)"""
    points = read_kernel_csv(GEMM_CSV)
    with open(GEMM_CSV, newline="") as handle:
        series = [r["meta_series"] for r in csv.DictReader(handle)]
    train = [p for p, s in zip(points, series) if s.startswith("azure")]
    test = [p for p, s in zip(points, series) if s == "amd_maf_blog"]
    start = dataclasses.replace(base.gpu, gemm_dtypes={k: v for k, v in base.gpu.gemm_dtypes.items() if k != "fp8"})
    gpu, fits = kernel_fit.fit_kernels(train, start)
    print(f"\nGEMM Azure FP8 run: train {fits[0].mape_before:.1f}% -> {fits[0].mape_after:.1f}%; unseen MAF points "
          f"{kernel_fit.mape(test, start):.1f}% -> {kernel_fit.mape(test, gpu):.1f}%")
    assert fits[0].mape_after < 0.5 * fits[0].mape_before and [f.name for f in fits] == ["gemm/fp8"]
    # GEMM tables are per dtype (issue 14): the FP8 sweep refits only the FP8 table; the
    # unseen FP8 MAF point stays within 25% (20.6% when this was written: the Azure sweep
    # tops out at 1160 TFLOPS, the MAF run reaches 1273) and the BF16 / FP16 points are
    # priced exactly as before
    fp8 = [p for p in test if p.dtype == "fp8"]
    assert kernel_fit.mape(fp8, gpu) < 25.0
    for p in test:
        if p.dtype != "fp8":
            assert kernel_fit.predict_kernel(p, gpu) == kernel_fit.predict_kernel(p, start)


def test_membound_fit_recovers_a_known_curve(base, tmp_path):
    """Synthetic memory-bound kernel sweep priced by a known ``membound`` curve (plateau x
    x / (x + x_half)): the fit gets that curve back; the streaming-copy ``hbm`` table is left
    as it was, and rows below the fit's size floor (launch-bound) are not fitted."""
    import numpy as np

    from perfsim.calibration.kernel_tables_fit import MEMORY_FIT_MIN_MBYTES, TableRef

    ref = TableRef("memory")
    knots = ref.knots([])  # the parametric grid the fit writes
    truth = ref.apply(base.gpu, knots, np.array([0.45, 2.0]))  # plateau 0.45, half at 100 MB
    path = tmp_path / "mem.csv"
    sizes = [2 ** k * 64e6 for k in range(0, 8)] + [1e6, 4e6]  # the last two: under the floor
    rows = [{"kind": "memory", "bytes": b, "kernel": "rmsnorm", "device": "MI300X",
             "time_us": kernel_fit.predict_kernel(_mem(b), truth) * 1e6 * (5.0 if b < MEMORY_FIT_MIN_MBYTES * 1e6 else 1.0)}
            for b in sizes]
    write_kernel_csv(path, rows)
    result = perfsim.calibrate(base, kernel_csvs=[path])
    fitted = result.cluster.gpu
    assert fitted.membound.efficiency == pytest.approx(truth.membound.efficiency, rel=0.03, abs=0.003)
    assert fitted.hbm == base.gpu.hbm
    assert result.path is None and result.cluster.name == "mi300x-pollara-calibrated"


def _mem(num_bytes):
    from perfsim.calibration.readers import KernelPoint
    return KernelPoint(kind="memory", dtype="bf16", device="MI300X", time_s=1.0, bytes=num_bytes, kernel="copy")


@needs_data
def test_p2p_sets_link_bandwidths(base):
    result = perfsim.calibrate(base, p2p=[P2P])
    assert 46 < result.cluster.node.link_bw_GBps < 47.5  # median of the 56 concurrent a2a links
    assert 54 < result.cluster.node.pcie_bw_GBps < 58
    assert result.cluster.fabric == base.fabric  # no cross-node rows
    assert {f.name for f in result.fits} == {"links"}


def test_calibrate_fits_a_grouped_kernel_speed_from_grouped_and_moe_mlp_rows(tmp_path):
    """Grouped-kernel rows (one plain grouped GEMM, one MoE MLP timed whole) through the
    CLI: the written profile holds a grouped speed fitted to them, loads back, and prices
    grouped GEMMs at it (slower than the dense price the base H100 table would give)."""
    from perfsim.cost import kernels as costs
    from perfsim.system.hardware import load_gpu

    gpu = dataclasses.replace(load_gpu("h100"), grouped_gemm={})
    dense = costs.grouped_gemm_time((512,) * 128, 1536, 2048, gpu, "bf16")
    rows = [dict(kind="grouped_gemm", dtype="bf16", m="512", n="1536", k="2048", batch="128", time_us=f"{3 * dense * 1e6:.3f}"),
            dict(kind="grouped_gemm", dtype="bf16", m="2048", n="768", k="2048", batch="128", kernel="moe_mlp",
                 time_us="10218")]
    path = tmp_path / "grouped.csv"
    write_kernel_csv(path, rows)
    out = tmp_path / "h100-cal.toml"
    assert main(["calibrate", "--cluster", "h100-ib", "--gemm-csv", str(path), "--out", str(out)]) == 0
    written = tomllib.loads(out.read_text())["gpu"]["grouped_gemm"]["bf16"]
    speed = written["forward_speed"][0]
    assert 0.05 < speed < 1.0
    fitted = load_cluster(str(out)).gpu
    assert costs.grouped_gemm_time((512,) * 128, 1536, 2048, fitted, "bf16") > 1.5 * dense


def test_host_timed_rows_calibrate_with_a_host_time_and_validate_says_they_are_host_timed(tmp_path, capsys):
    """Through the CLI: a host-timed series whose small calls read the harness's 80 us is
    fitted with that host time beside the table (reported), and validate notes how many
    host-timed rows it priced at their GPU time."""
    from perfsim.calibration.readers import KernelPoint
    from perfsim.system.hardware import load_gpu

    gpu = load_gpu("mi300x")
    rows = []
    for size in (512, 1024, 2048, 3072, 4096, 8192):
        p = KernelPoint(kind="gemm", dtype="bf16", device="MI300X", time_s=1.0, m=size, n=size, k=size)
        t = max(kernel_fit.predict_kernel(p, gpu), 80e-6)
        rows.append(dict(kind="gemm", dtype="bf16", m=size, n=size, k=size, device="MI300X", time_us=f"{t * 1e6:.3f}",
                         timing="host", source="my-timer-harness", direction="fwd"))
    path = tmp_path / "host.csv"
    write_kernel_csv(path, rows)
    out = tmp_path / "cal.toml"
    assert main(["calibrate", "--cluster", "mi300x-pollara", "--gemm-csv", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "my-timer-harness fwd: 80 us, sets 3 of 6 rows" in printed
    assert main(["validate", "--cluster", "mi300x-pollara", "--kernel-csv", str(path)]) == 0
    assert f"note: {path}: 6 host-timed rows priced at their GPU time" in capsys.readouterr().out

    rows[0]["timing"] = "wall"  # not a timing: one line naming file, line, column and value; exit 2
    write_kernel_csv(path, rows)
    assert main(["validate", "--cluster", "mi300x-pollara", "--kernel-csv", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}:2: timing 'wall' is not one of device, host" in err


def test_validate_prints_each_kernel_point_whole_with_its_direction(tmp_path, capsys):
    """A grouped row's label (shape, groups, direction) is never cut to the column: a row timed
    forward and backward together says so, and its 128 groups do not read as 1."""
    path = write_kernel_csv(tmp_path / "k.csv", [
        dict(kind="grouped_gemm", dtype="bf16", m=512, n=1536, k=2048, batch=128, direction="fwd_bwd", kernel="sum_loss",
             time_us="2568.95", device="h100"),
        dict(kind="gemm", dtype="bf16", m=4096, n=4096, k=4096, direction="bwd", time_us="500", device="h100")])
    assert main(["validate", "--cluster", "h100-ib", "--kernel-csv", str(path)]) == 0
    out = capsys.readouterr().out
    assert " 512x1536x2048 x128 fwd_bwd " in out and " 4096x4096x4096 bwd " in out
