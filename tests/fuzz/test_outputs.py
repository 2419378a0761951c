"""Exit codes as real processes, and outputs that are checked before work and written
atomically: a unique temporary name per writer, nothing left behind, nothing replaced
without --force (issue 18: two calibrate writers collided on one fixed '.tmp' name)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.system.hardware import load_cluster
from perfsim.system.specio import check_output, write_atomic
from fuzz_inputs import GOOD_TIMES, rccl_log

ROOT = Path(__file__).resolve().parents[2]


def perfsim_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfsim", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.parametrize("argv, field", [
    (["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--gbs", "8", "--seq", "2048", "--tp", "0"], "--tp"),
    (["collective", "--op", "all_reduce", "--gpus", "8", "-f", "1.0000001"], "-f"),
    (["search", "--model", "llama3.1-8b", "--gpus", "0-8", "--gbs", "16", "--seq", "2048"], "--gpus"),
    (["goodput", "--model", "llama3.1-8b", "--nodes", "2", "--mtbf-node-hours", "100", "--interval-s", "inf"],
     "--interval-s"),
])
def test_bad_input_exits_2_with_one_line(argv, field):
    done = perfsim_cli(*argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and field in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_binary_model_file_is_one_line(tmp_path):
    path = tmp_path / "weights.json"
    path.write_bytes(bytes(range(256)))
    done = perfsim_cli("simulate", "--model", str(path), "--nodes", "1", "--gbs", "8", "--seq", "2048")
    assert done.returncode == 2 and str(path) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_unreachable_dask_scheduler_fails_fast():
    pytest.importorskip("dask.distributed")
    t0 = time.perf_counter()
    done = perfsim_cli("search", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "16", "--seq", "2048",
                       "--executor", "dask://127.0.0.1:1")
    assert done.returncode == 2 and "127.0.0.1:1" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert time.perf_counter() - t0 < 20  # 5 s connect timeout + interpreter start


def test_concurrent_calibrate_writers_do_not_collide(tmp_path):
    log = tmp_path / "sweep.log"
    log.write_text(rccl_log(GOOD_TIMES))
    out = tmp_path / "cal.toml"
    argv = [sys.executable, "-m", "perfsim", "calibrate", "--rccl-log", str(log), "--out", str(out), "--force"]
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in results), results
    assert load_cluster(out).name == "cal"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.toml", "sweep.log"]  # no temporary left behind


def test_write_atomic_gives_each_writer_its_own_temporary(tmp_path):
    target = tmp_path / "out.txt"
    errors = []

    def writer(i):
        try:
            for _ in range(20):
                write_atomic(target, f"writer {i}\n" * 1000, "out")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    text = target.read_text()
    assert len(set(text.splitlines())) == 1 and len(text.splitlines()) == 1000  # one whole writer's file
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_check_output_refuses_before_any_work(tmp_path):
    existing = tmp_path / "keep.txt"
    existing.write_text("keep")
    for path, force, match in ((tmp_path, True, "is a directory"), (tmp_path / "no" / "x.txt", False, "does not exist"),
                               (existing, False, "exists; pass --force")):
        with pytest.raises(ConfigError, match=match):
            check_output(path, force, "--out")
    assert check_output(existing, True, "--out") == existing and existing.read_text() == "keep"
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="not writable"):
            check_output(locked / "x.txt", False, "--out")


def test_write_atomic_keeps_the_usual_file_mode(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic = write_atomic(tmp_path / "atomic.txt", "x", "out")
    assert os.stat(atomic).st_mode == os.stat(plain).st_mode  # not mkstemp's 0600
