"""A hardware profile may name a ``base`` profile and state only what differs (a GPU variant:
another clock, HBM or power limit; a cluster with that GPU): the rest is inherited, tables
merged key by key; bad references are one ConfigError line."""

import json

import pytest

from perfsim import api
from perfsim.errors import ConfigError
from perfsim.system.hardware import load_cluster, load_gpu


def test_a_gpu_variant_inherits_its_base_and_changes_what_it_names(tmp_path):
    path = tmp_path / "h100-capped.toml"
    path.write_text('base = "h100"\nname = "h100-capped"\nhbm_bw_GBps = 2400.0\nclock_under_load_MHz = 1500.0\n'
                    '[hbm]\nefficiency = [0.3, 0.5, 0.7, 0.8]\n')
    base, gpu = load_gpu("h100"), load_gpu(path)
    assert gpu.name == "h100-capped" and gpu.hbm_bw_GBps == 2400.0 and gpu.clock_under_load_MHz == 1500.0
    assert gpu.gemm == base.gemm and gpu.peak_tflops == base.peak_tflops  # inherited
    assert gpu.hbm.efficiency == (0.3, 0.5, 0.7, 0.8) and gpu.hbm.mbytes == base.hbm.mbytes  # merged key by key
    assert gpu.hbm.source == base.hbm.source


def test_a_cluster_variant_with_an_inline_gpu_variant_prices_slower_compute(tmp_path):
    (tmp_path / "capped.toml").write_text(
        'base = "h100-ib"\nname = "h100-capped"\nnum_nodes = 2\n[gpu]\nbase = "h100"\nname = "h100-capped"\n'
        'clock_under_load_MHz = 915.0\n')
    cluster = load_cluster(tmp_path / "capped.toml")
    base = load_cluster("h100-ib")
    assert cluster.num_nodes == 2 and cluster.fabric == base.fabric and cluster.node == base.node
    assert cluster.gpu.clock_under_load_MHz == 915.0
    knobs = dict(model="llama3.1-8b", nodes=1, mbs=1, gbs=8, seq=4096, zero=3, recompute="full")
    slow = api.simulate(cluster=str(tmp_path / "capped.toml"), **knobs).step_time_s
    fast = api.simulate(cluster="h100-ib", **knobs).step_time_s
    assert slow > 1.3 * fast  # half the clock: compute-bound steps take much longer


def test_a_gpu_file_named_by_a_cluster_file_is_read_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "g.toml").write_text('base = "h100"\nname = "g"\nhbm_capacity_GB = 96.0\n')
    (folder / "c.toml").write_text('base = "h100-ib"\nname = "c"\ngpu = "g.toml"\n')
    monkeypatch.chdir(tmp_path)  # not the profile's folder
    assert load_cluster(folder / "c.toml").gpu.hbm_capacity_GB == 96.0


@pytest.mark.parametrize("text, needle", [
    ('base = "no-such-gpu"\n', "unknown profile 'no-such-gpu'"),
    ("base = 3\n", "base: expected a gpu profile name or file"),
    ('base = "loop.toml"\n', "profiles deep"),
])
def test_a_bad_base_is_one_clear_error(tmp_path, text, needle):
    path = tmp_path / "loop.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="base|unknown") as err:
        load_gpu(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_an_inherited_profile_is_not_the_shipped_one_in_the_accuracy_notes(tmp_path):
    (tmp_path / "c.toml").write_text('base = "h100-ib"\nname = "h100-ib"\n[gpu]\nbase = "h100"\nhbm_bw_GBps = 2400.0\n')
    report = api.simulate(model="llama3.1-8b", cluster=str(tmp_path / "c.toml"), nodes=1, mbs=1, gbs=8, seq=4096, zero=3, recompute="full")
    shipped = api.simulate(model="llama3.1-8b", cluster="h100-ib", nodes=1, mbs=1, gbs=8, seq=4096, zero=3,
                           recompute="full")
    assert shipped.accuracy["kernels"]["checked"] is True
    assert report.accuracy["kernels"]["checked"] is False  # its GPU's HBM differs from the shipped h100's


def test_editing_a_gpu_file_beside_a_cluster_file_is_seen_on_the_next_load(tmp_path):
    (tmp_path / "g.toml").write_text('base = "h100"\nname = "g"\nhbm_capacity_GB = 96.0\n')
    (tmp_path / "c.toml").write_text('base = "h100-ib"\nname = "c"\ngpu = "g.toml"\n')
    assert load_cluster(tmp_path / "c.toml").gpu.hbm_capacity_GB == 96.0
    (tmp_path / "g.toml").write_text('base = "h100"\nname = "g"\nhbm_capacity_GB = 120.0\n')
    assert load_cluster(tmp_path / "c.toml").gpu.hbm_capacity_GB == 120.0


def test_two_cluster_files_in_one_folder_load_as_themselves(tmp_path):
    (tmp_path / "a.toml").write_text('base = "h100-ib"\nname = "a"\nnum_nodes = 2\n')
    (tmp_path / "b.toml").write_text('base = "h100-ib"\nname = "b"\nnum_nodes = 3\n')
    assert (load_cluster(tmp_path / "a.toml").name, load_cluster(tmp_path / "b.toml").name) == ("a", "b")


def test_the_cli_prices_a_cluster_variant_and_names_a_bad_one_in_one_line(tmp_path, capsys):
    from perfsim.cli import main

    (tmp_path / "capped.toml").write_text('base = "h100-ib"\nname = "capped"\n[gpu]\nbase = "h100"\n'
                                          'name = "h100-capped"\nclock_under_load_MHz = 1200.0\n')
    args = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--gbs", "8", "--seq", "4096", "--zero", "3",
            "--recompute", "full", "--engine", "analytic", "--json"]
    assert main([*args, "--cluster", str(tmp_path / "capped.toml")]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert main([*args, "--cluster", "h100-ib"]) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert capped["step_time_s"] > shipped["step_time_s"] and capped["cluster"] == "capped"
    (tmp_path / "bad.toml").write_text('base = "h100-ib"\nname = "bad"\n[gpu]\nbase = "no-such-gpu"\n')
    assert main([*args, "--cluster", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err
    assert "unknown profile 'no-such-gpu'" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
