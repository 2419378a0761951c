"""readers: rccl-tests/nccl-tests logs, point-to-point tables, kernel CSVs."""

from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.calibration.readers import KERNEL_CSV_COLUMNS, read_kernel_csv, read_p2p, read_rccl_log

DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "calibration"  # repo copies, SOURCES.md
LOGS = DATA / "rccl-tests"
GEMM_CSV = Path(__file__).resolve().parents[1] / "validation" / "data" / "gemm_mi300x_measured.csv"
needs_data = pytest.mark.skipif(not LOGS.exists(), reason="shared calibration data not present")

HEADER = """# Collective test starting: all_gather_perf
# nThread 1 nGpus 8 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 1
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def rank_lines(nodes: int, per_node: int) -> str:
    return "".join(f"#  Rank {n * per_node + d:2d} Group  0 Pid  {100 + n} on  host{n} device {d} [0000:0{d}:00] AMD Instinct MI300X\n"
                   for n in range(nodes) for d in range(per_node))


def write(tmp_path, text: str, name: str = "x.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@needs_data
@pytest.mark.parametrize("name,graph", [("mi300x_1node_8gpu_mpi_nograph_amdblog", False),
                                        ("mi300x_1node_8gpu_mpi_hipgraph_amdblog", True)])
def test_shipped_mi300x_logs(name, graph):
    log = read_rccl_log(LOGS / f"{name}.log")
    assert (log.op, log.num_ranks, log.num_nodes, log.gpus_per_node, log.graph) == ("all_reduce", 8, 1, 8, graph)
    assert len(log.rows) == 32 and log.num_skipped == 0
    assert log.series()[0] == (8, pytest.approx(log.rows[0].time_us_oop))
    assert log.rows[-1].size_bytes == 16 << 30 and log.rows[-1].time_us_ip is not None


@needs_data
def test_nan_times_are_recovered_from_busbw():
    """The Azure NVLS log prints nan times with a finite in-place busbw."""
    log = read_rccl_log(LOGS / "azure_ndh100v5_1node_8gpu_nccl_nvls.log")
    row = log.rows[-1]
    assert row.time_us_oop is None
    algbw = row.busbw_GBps_ip / (2 * 7 / 8)  # rccl-tests all_reduce busbw factor 2(n-1)/n
    assert row.time_us_ip == pytest.approx(row.size_bytes / (algbw * 1e9) * 1e6)
    assert log.series() == [] and len(log.series(in_place=True)) == 24


def test_multi_node_graph_log_with_interleaved_and_truncated_lines(tmp_path):
    body = ("        1024           16     float    none      -1    20.00    0.05    0.05      0    19.00    0.05    0.05      0\n"
            "host1:55:55 [3] NCCL INFO Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/3\n"
            "        2048           32     float    none      -1    21.00    0.10    0.09      0    20.50    0.10    0.09      0\n"
            "        4096           64     float    none      -1    22.0")
    log = read_rccl_log(write(tmp_path, HEADER.format(ranks=rank_lines(2, 8)) + body))
    assert (log.op, log.num_ranks, log.num_nodes, log.gpus_per_node, log.graph) == ("all_gather", 16, 2, 8, True)
    assert [r.size_bytes for r in log.rows] == [1024, 2048]
    first = 8 + 16 + 1  # 8 header lines, 16 rank lines
    assert log.num_skipped == 2 and log.skipped_lines == (first + 1, first + 3)


def test_op_override_and_rank_count_without_rank_lines(tmp_path):
    text = HEADER.format(ranks="").replace("all_gather_perf", "alltoall_perf")
    text += "        1024           16     float    none      -1    20.00    0.05    0.05      0      N/A     N/A     N/A    N/A\n"
    log = read_rccl_log(write(tmp_path, text))
    assert log.op == "all_to_all" and log.num_ranks == 8 and log.rows[0].time_us_ip is None
    assert read_rccl_log(write(tmp_path, text), op="reduce_scatter").op == "reduce_scatter"
    with pytest.raises(ConfigError, match="unsupported collective 'hypercube'"):
        read_rccl_log(write(tmp_path, text), op="hypercube")


@pytest.mark.parametrize("text,match", [
    ("", r"x\.log:1: empty log"),
    ("# Collective test starting: all_reduce_perf\n   8  2 float sum -1 16.6 0.0 0.0 0 16.5 0.0 0.0 0\n",
     r"x\.log:1: no rccl-tests column header"),
    (HEADER.format(ranks=rank_lines(1, 8)) + "   8  2 float sum -1 16.6 0.0 0.0\n   16  4 float sum -1 16.6 0.0 0.0\n",
     r"x\.log:17: no valid data row \(expected 13 columns"),
    (HEADER.format(ranks=rank_lines(1, 8)) + "   8  2 float sum -1 nan nan nan 0 nan nan nan 0\n",
     r"x\.log:17: no valid data row \(times and bus bandwidths are nan"),
])
def test_garbled_logs_name_file_and_line(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        read_rccl_log(write(tmp_path, text))


@needs_data
def test_p2p_csv_picks_links_and_skips_aggregates():
    points = read_p2p(DATA / "xgmi_p2p_measured.csv")
    busy = sorted(p.GBps for p in points if p.link == "xgmi" and p.concurrent)
    assert len(busy) >= 56 and 45 < busy[len(busy) // 2] < 48  # TransferBench a2a, ~46.8 GB/s per link
    assert all(p.src != p.dst for p in points)  # local copies are not links
    assert {p.link for p in points} == {"xgmi", "pcie"}


def test_p2p_matrix_formats(tmp_path):
    transferbench = ("# TransferBench a2a, all transfers concurrent\n"
                     "SRC\\DST  GPU 00  GPU 01  GPU 02\n"
                     "GPU 00   N/A     47.0    46.5\n"
                     "GPU 01   46.9    N/A     47.1\n"
                     "GPU 02   46.8    46.7    N/A\n")
    points = read_p2p(write(tmp_path, transferbench, "tb.txt"))
    assert len(points) == 6 and all(p.concurrent and p.link == "xgmi" for p in points)
    cross = "D/D  node0:GPU0  node1:GPU0  CPU0\nnode0:GPU0  -  48.5  55.0\nnode1:GPU0  48.4  -  -\nCPU0  56.0  -  -\n"
    links = {(p.src, p.dst): p.link for p in read_p2p(write(tmp_path, cross, "x.txt"))}
    assert links[("node0:GPU0", "node1:GPU0")] == "nic" and links[("CPU0", "node0:GPU0")] == "pcie"
    with pytest.raises(ConfigError, match=r"bad\.txt:3: expected a source label and 2 values"):
        read_p2p(write(tmp_path, "x GPU0 GPU1\nGPU0 - 47\nGPU1 47\n", "bad.txt"))


def test_shipped_kernel_csv_follows_the_schema():
    points = read_kernel_csv(GEMM_CSV)
    assert len(points) == 12 and {p.dtype for p in points} == {"fp8", "fp16", "bf16"}
    bf16 = next(p for p in points if p.dtype == "bf16")
    assert bf16.time_s == pytest.approx(2 * 4096 * 4864 * 32896 / 708e12)  # 708 TFLOPS -> seconds
    assert GEMM_CSV.read_text().splitlines()[0].startswith(",".join(KERNEL_CSV_COLUMNS))


def test_kernel_csv_kinds_and_errors(tmp_path):
    head = ",".join(KERNEL_CSV_COLUMNS) + ",meta_run\n"

    def row(**cells):
        return ",".join(str(cells.get(c, "")) for c in KERNEL_CSV_COLUMNS) + ",r1\n"

    good = head + row(kind="attention", dtype="bf16", batch=2, seq=1024, heads=16, kv_heads=4, head_dim=128, causal=1,
                      direction="fwd_bwd", time_us=500, device="MI300X")
    good += row(kind="memory", bytes=2e9, kernel="copy", TBps=4.0, device="MI300X")
    attn, mem = read_kernel_csv(write(tmp_path, good, "k.csv"))
    assert attn.flops == pytest.approx(3.5 * 4 * 2 * 16 * 1024 ** 2 * 128 * 0.5) and attn.kv_heads == 4
    assert mem.time_s == pytest.approx(2e9 / 4e12)
    bad = head + row(kind="gemm", dtype="bf16", m="abc", n=1, k=1, time_us=1)
    with pytest.raises(ConfigError, match=r"k\.csv:2: column 'm' must be a positive integer, got 'abc'"):
        read_kernel_csv(write(tmp_path, bad, "k.csv"))
    with pytest.raises(ConfigError, match=r"k\.csv:2: needs time_us or tflops"):
        read_kernel_csv(write(tmp_path, head + row(kind="gemm", dtype="bf16", m=1, n=1, k=1), "k.csv"))
    with pytest.raises(ConfigError, match=r"k\.csv:1: unknown column 'time_ms'"):
        read_kernel_csv(write(tmp_path, "kind,time_ms\ngemm,1\n", "k.csv"))
    with pytest.raises(ConfigError, match=r"k\.csv:1: empty kernel CSV"):
        read_kernel_csv(write(tmp_path, "", "k.csv"))


def _forced_log(tmp_path, env_lines: str, name: str = "forced.log") -> Path:
    body = ("     4194304       1048576     float     sum      -1   540.03    7.77   14.56      0   541.23    7.75   14.53      0\n"
            "     8388608       2097152     float     sum      -1   543.09   15.45   28.96      0   544.58   15.40   28.88      0\n")
    text = HEADER.format(ranks=rank_lines(2, 8)).replace("all_gather_perf", "all_reduce_perf")
    head, _, cols = text.partition("#\n#      ")
    return write(tmp_path, head + env_lines + "#\n#      " + cols + body, name)


def test_a_log_that_forced_its_algorithm_and_protocol_says_so(tmp_path):
    """NCCL / RCCL acknowledge NCCL_ALGO / NCCL_PROTO under NCCL_DEBUG=INFO; the log carries
    the path (perfsim's names), a function prefix selects the log's own collective, and a list,
    an exclusion or a path perfsim does not price forces nothing (a note says so)."""
    info = "host0:100:100 [0] NCCL INFO NCCL_{} set by environment to {}\n"
    log = read_rccl_log(_forced_log(tmp_path, info.format("ALGO", "RING") + info.format("PROTO", "Simple")
                                    + info.format("ALGO", "RING")))
    assert (log.algorithm, log.protocol, log.env_notes) == ("ring", "simple", ())
    assert read_rccl_log(_forced_log(tmp_path, "")).algorithm is None
    log = read_rccl_log(_forced_log(tmp_path, info.format("ALGO", "allgather:ring;allreduce:tree")))
    assert log.algorithm == "tree"
    log = read_rccl_log(_forced_log(tmp_path, info.format("ALGO", "allgather:ring")))
    assert log.algorithm is None and log.env_notes == ()
    for value, why in (("ring,tree", "leaves the library's tuner a choice"), ("^nvls", "leaves the library's tuner"),
                       ("CollNetDirect", "does not price the CollNetDirect path")):
        log = read_rccl_log(_forced_log(tmp_path, info.format("ALGO", value)))
        assert log.algorithm is None and len(log.env_notes) == 1 and why in log.env_notes[0]
    with pytest.raises(ConfigError, match=r"forced\.log:\d+: NCCL_PROTO=LL256: 'LL256' is not one of"):
        read_rccl_log(_forced_log(tmp_path, info.format("PROTO", "LL256")))
    with pytest.raises(ConfigError, match=r"forced\.log:\d+: NCCL_ALGO is 'Tree' here and 'Ring' at line \d+"):
        read_rccl_log(_forced_log(tmp_path, info.format("ALGO", "Ring") + info.format("ALGO", "Tree")))
