"""validation.collective_sweep writes logs that perfsim's rccl-tests reader reads back
exactly (the multi-GPU sweep itself needs GPUs; the format is checked here)."""

import pytest

from perfsim.calibration.readers import read_rccl_log
from validation.collective_sweep import BUSBW, Point, RankInfo, format_log, format_row, main, sizes

RANKS = [RankInfo(rank=r, host=f"node{r // 4}", device=r % 4, name="NVIDIA H200", pid=100 + r) for r in range(8)]


@pytest.mark.parametrize("op", sorted(BUSBW))
def test_log_round_trips_through_the_reader(tmp_path, op):
    points = [Point(size_bytes=s, count=s // 4, oop_us=10.0 + s / 1e4, ip_us=9.0 + s / 1e4) for s in sizes(8, 1 << 20)]
    path = tmp_path / f"{op}.log"
    path.write_text(format_log(op, points, RANKS, "float32", warmup=5, iters=20))
    log = read_rccl_log(path)
    assert (log.op, log.num_ranks, log.num_nodes, log.gpus_per_node, log.num_skipped) == (op, 8, 2, 4, 0)
    assert [r.size_bytes for r in log.rows] == [p.size_bytes for p in points]
    for row, p in zip(log.rows, points):
        assert row.time_us_oop == pytest.approx(p.oop_us, abs=0.005)
        assert row.time_us_ip == pytest.approx(p.ip_us, abs=0.005)


def test_busbw_follows_rccl_tests_factors():
    # 1 GB all_reduce in 10,000 us: algbw 100 GB/s, busbw 100 x 2 x 7/8 = 175 GB/s (PERFORMANCE.md)
    cells = format_row("all_reduce", Point(size_bytes=10**9, count=250_000_000, oop_us=1e4, ip_us=1e4), 8, "float32").split()
    assert cells[6:8] == ["100.00", "175.00"]


def test_sizes_double():
    assert sizes(8, 64) == [8, 16, 32, 64]


def test_without_torchrun_exits_2(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--out", "/tmp/never"]) == 2
    assert "torchrun" in capsys.readouterr().err
