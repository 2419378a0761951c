"""The planner's scenario store (app/scenarios.py): SQLite in WAL mode, one transaction per
save, unique names, persistence across connections, and no lost saves under concurrency."""

import multiprocessing
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))

from scenarios import ENV_VAR, ScenarioStore, clean_name, default_path  # noqa: E402

INPUTS = {"model": "zaya1-base", "knobs": {"dp": 1024, "gbs": 2048}}
RESULTS = {"step_time_s": 0.45, "plan": {"dp": 1024}}


@pytest.fixture
def store(tmp_path):
    return ScenarioStore(tmp_path / "sub" / "scenarios.db")


def test_save_and_read_back(store):
    assert store.save("base", INPUTS, RESULTS) == "base"
    got = store.get("base")
    assert got.inputs == INPUTS and got.results == RESULTS and got.created_s > 0
    assert store.names() == ["base"] and len(store) == 1


def test_database_is_in_wal_mode(store):
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_survives_a_restart(tmp_path):
    path = tmp_path / "s.db"
    ScenarioStore(path).save("kept", INPUTS, RESULTS)
    assert ScenarioStore(path).get("kept").results == RESULTS


def test_duplicate_names_get_a_suffix(store):
    names = [store.save("run", INPUTS, {"i": i}) for i in range(4)]
    assert names == ["run", "run (2)", "run (3)", "run (4)"]
    assert [store.get(n).results["i"] for n in names] == [0, 1, 2, 3]


def test_suffix_does_not_confuse_similar_names(store):
    store.save("run (2)", INPUTS, RESULTS)
    store.save("runner", INPUTS, RESULTS)
    assert store.save("run", INPUTS, RESULTS) == "run"
    assert store.save("run", INPUTS, RESULTS) == "run (3)"  # "run (2)" is taken


def test_overwrite_replaces(store):
    store.save("x", INPUTS, {"v": 1})
    assert store.save("x", INPUTS, {"v": 2}, overwrite=True) == "x"
    assert store.names() == ["x"] and store.get("x").results == {"v": 2}


def test_delete_and_missing(store):
    store.save("gone", INPUTS, RESULTS)
    assert store.delete("gone") is True
    assert store.delete("gone") is False
    with pytest.raises(KeyError, match="gone"):
        store.get("gone")


@pytest.mark.parametrize("bad", ["", "   ", None, "x" * 121])
def test_bad_names_are_rejected(store, bad):
    with pytest.raises(ValueError, match="scenario name"):
        store.save(bad, INPUTS, RESULTS)
    assert len(store) == 0


def test_names_are_trimmed():
    assert clean_name("  a   b ") == "a b"


def test_unserializable_results_leave_nothing_behind(store):
    with pytest.raises(TypeError):
        store.save("half", INPUTS, {"bad": object()})
    assert store.names() == []


def test_path_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.db"))
    assert default_path() == tmp_path / "env.db"
    assert ScenarioStore().path == tmp_path / "env.db"
    monkeypatch.delenv(ENV_VAR)
    assert default_path() == Path("~/.perfsim/scenarios.db").expanduser()


def test_concurrent_saves_from_threads_lose_nothing(store):
    """Eight 'tabs' each save the same name 10 times at once: 80 rows, 80 distinct names."""
    barrier = threading.Barrier(8)
    saved: list[str] = []
    lock = threading.Lock()

    def tab(t: int) -> None:
        barrier.wait()
        for i in range(10):
            name = ScenarioStore(store.path).save("same", INPUTS, {"tab": t, "i": i})
            with lock:
                saved.append(name)

    threads = [threading.Thread(target=tab, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(saved) == len(set(saved)) == 80
    assert sorted(store.names()) == sorted(saved)
    assert {(store.get(n).results["tab"], store.get(n).results["i"]) for n in saved} == {
        (t, i) for t in range(8) for i in range(10)}


def _process_tab(path: str, tab: int, start) -> None:
    start.wait()
    store = ScenarioStore(path)
    for i in range(10):
        store.save("shared", INPUTS, {"tab": tab, "i": i})
        store.save(f"tab {tab} run {i}", INPUTS, {"tab": tab, "i": i})


def test_concurrent_saves_from_processes_lose_nothing(store):
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")  # fork: no re-import, fast
    start = ctx.Event()
    procs = [ctx.Process(target=_process_tab, args=(str(store.path), t, start)) for t in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    names = store.names()
    assert len(names) == len(set(names)) == 80
    shared = [n for n in names if n.startswith("shared")]
    assert len(shared) == 40
    assert {(store.get(n).results["tab"], store.get(n).results["i"]) for n in shared} == {
        (t, i) for t in range(4) for i in range(10)}
