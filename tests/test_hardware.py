"""Hardware profiles: every shipped profile loads, round-trips, and bad files fail loudly."""

import csv
import dataclasses
import re
import tomllib
import typing
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.system.hardware import (
    PROFILE_DIR,
    ClusterSpec,
    GpuSpec,
    NodeSpec,
    dump_cluster,
    list_profiles,
    load_cluster,
    load_gpu,
)
from perfsim.system.specio import from_dict

REPO_ROOT = Path(__file__).resolve().parent.parent
CALIBRATION_DIR = REPO_ROOT / "validation" / "data" / "calibration"  # copies of the public data, with SOURCES.md

GPUS = list_profiles("gpu")
NODES = list_profiles("node")
CLUSTERS = list_profiles("cluster")
KIND_CLASS = {"gpu": GpuSpec, "node": NodeSpec, "cluster": ClusterSpec}


def profile_path(kind: str, name: str) -> Path:
    return PROFILE_DIR / f"{kind}s" / f"{name}.toml"


def load_node(name: str) -> NodeSpec:
    path = profile_path("node", name)
    return from_dict(NodeSpec, tomllib.loads(path.read_text()), str(path))


def write_variant(tmp_path: Path, kind: str, name: str, old: str, new: str) -> Path:
    """Copy a shipped profile into tmp_path with one exact text replacement."""
    text = profile_path(kind, name).read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {name}"
    path = tmp_path / f"{name}-bad.toml"
    path.write_text(text.replace(old, new))
    return path


# ---- the shipped profiles --------------------------------------------------------------


def test_expected_profiles_are_shipped():
    for name in ("mi300x", "mi325x", "mi355x", "h100", "h200"):
        assert name in GPUS
    for name in ("mi300x-8", "mi325x-8", "mi355x-8", "h100-8", "h200-8"):
        assert name in NODES
    for name in ("mi300x-pollara", "mi325x-pollara", "mi355x-pollara", "h100-ib", "h200-ib"):
        assert name in CLUSTERS


@pytest.mark.parametrize("name", GPUS)
def test_gpu_profile_loads(name):
    gpu = load_gpu(name)
    assert gpu.name == name
    assert gpu.peak_flops("bf16") > 0
    assert gpu.clock_under_load_MHz <= gpu.clock_peak_MHz
    assert load_gpu(profile_path("gpu", name)) == gpu  # by path as well as by name


@pytest.mark.parametrize("name", NODES)
def test_node_profile_loads(name):
    node = load_node(name)
    assert node.name == name
    assert node.link_bw_GBps <= node.link_bw_raw_GBps
    assert node.gpu_bw_Bps(node.gpus_per_node - 1) > 0


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_profile_loads(name):
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.num_gpus == cluster.num_nodes * cluster.node.gpus_per_node
    assert cluster.gpu == load_gpu(cluster.gpu.name)
    assert cluster.node == load_node(cluster.node.name)


def test_every_gpu_and_node_is_used_by_a_cluster():
    clusters = [load_cluster(name) for name in CLUSTERS]
    assert {c.gpu.name for c in clusters} == set(GPUS)
    assert {c.node.name for c in clusters} == set(NODES)


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_round_trips_through_dump(name, tmp_path):
    cluster = load_cluster(name)
    path = tmp_path / f"{name}-dumped.toml"
    path.write_text(dump_cluster(cluster))
    assert load_cluster(path) == cluster
    assert load_cluster(str(path)) == cluster


@pytest.mark.parametrize("name", CLUSTERS)
def test_protocol_windows_cover_every_size(name):
    protocols = load_cluster(name).collectives.protocols
    assert set(protocols) == {"ll", "ll128", "simple"}
    windows = [protocols[p].max_bytes for p in ("ll", "ll128", "simple")]
    assert windows == sorted(windows)
    assert windows[-1] >= 1e15  # simple takes anything larger than the LL windows


# ---- sources: every table that can carry one has a non-empty `source` ------------------


def _dataclass_fields(cls: type) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_sources(cls: type, raw: dict, where: str) -> int:
    """Walk raw TOML alongside the spec class; return how many sources were checked."""
    checked = 0
    fields = _dataclass_fields(cls)
    if "source" in fields:
        source = raw.get("source")
        assert isinstance(source, str) and source.strip(), f"{where}: empty or missing source"
        checked += 1
    for key, value in raw.items():
        hint = fields.get(key)
        if isinstance(value, dict) and dataclasses.is_dataclass(hint):
            checked += _check_sources(hint, value, f"{where}.{key}")
    return checked


@pytest.mark.parametrize(
    "kind,name", [(k, n) for k in ("gpu", "node", "cluster") for n in list_profiles(k)]
)
def test_every_table_has_a_source(kind, name):
    path = profile_path(kind, name)
    raw = tomllib.loads(path.read_text())
    checked = _check_sources(KIND_CLASS[kind], raw, str(path))
    assert checked == {"gpu": 4, "node": 1, "cluster": 3}[kind]  # top + gemm/attention/hbm; top + fabric/collectives


# ---- resizing ----------------------------------------------------------------------------


def test_with_nodes_and_with_gpus():
    cluster = load_cluster("mi300x-pollara")
    assert cluster.with_nodes(2).num_gpus == 16
    assert cluster.with_gpus(16).num_nodes == 2
    assert cluster.with_gpus(17).num_nodes == 3  # a partial node still needs a whole node
    assert cluster.with_gpus(1).num_nodes == 1
    assert load_cluster("mi300x-pollara", num_nodes=4).num_gpus == 32
    assert cluster.with_nodes(2).gpu == cluster.gpu


@pytest.mark.parametrize("bad", [0, -1, -8, 2.0, "8"])
def test_with_nodes_rejects_non_positive_integers(bad):
    cluster = load_cluster("h100-ib")
    with pytest.raises(ConfigError, match="nodes must be a positive integer"):
        cluster.with_nodes(bad)


@pytest.mark.parametrize("bad", [0, -1, -64, 8.0])
def test_with_gpus_rejects_non_positive_integers(bad):
    cluster = load_cluster("h100-ib")
    with pytest.raises(ConfigError, match="gpus must be a positive integer"):
        cluster.with_gpus(bad)


# ---- strict loading ----------------------------------------------------------------------


def test_unknown_key_names_file_and_key(tmp_path):
    old = "kernel_launch_us = 3.0"
    path = write_variant(tmp_path, "gpu", "mi300x", old, old + "\nturbo_mode = true")
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    assert str(path) in str(err.value) and "'turbo_mode'" in str(err.value)


@pytest.mark.parametrize("bad", ["0.0", "1.2", "-0.5"])
def test_split_accumulator_speed_outside_0_1_names_the_field(tmp_path, bad):
    old = "fp8_split_accumulator_speed = 0.87"
    path = write_variant(tmp_path, "gpu", "h100", old, f"fp8_split_accumulator_speed = {bad}")
    with pytest.raises(ConfigError, match="fp8_split_accumulator_speed"):
        load_gpu(path)


def test_unknown_key_in_a_table_names_the_table(tmp_path):
    path = write_variant(tmp_path, "cluster", "h100-ib", 'routing = "ecmp_hash"', 'routing = "ecmp_hash"\nmtu = 4096')
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    assert str(path) in str(err.value) and "fabric" in str(err.value) and "'mtu'" in str(err.value)


def test_missing_key_names_file_and_key(tmp_path):
    path = write_variant(tmp_path, "gpu", "h100", "hbm_bw_GBps = 3350.0\n", "")
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    assert str(path) in str(err.value) and "hbm_bw_GBps" in str(err.value)
    assert "missing" in str(err.value)


def test_wrong_type_names_file_key_and_value(tmp_path):
    path = write_variant(tmp_path, "gpu", "mi355x", "num_compute_units = 256", 'num_compute_units = "256 CUs"')
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    message = str(err.value)
    assert str(path) in message and "num_compute_units" in message and "256 CUs" in message


def test_bool_is_not_a_number(tmp_path):
    path = write_variant(tmp_path, "gpu", "mi300x", "hbm_capacity_GB = 192.0", "hbm_capacity_GB = true")
    with pytest.raises(ConfigError, match="hbm_capacity_GB"):
        load_gpu(path)


def test_negative_bandwidth_names_file_key_and_value(tmp_path):
    path = write_variant(tmp_path, "gpu", "h200", "hbm_bw_GBps = 4800.0", "hbm_bw_GBps = -4800.0")
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    message = str(err.value)
    assert str(path) in message and "hbm_bw_GBps" in message and "-4800" in message


def test_negative_nic_bandwidth_in_a_cluster(tmp_path):
    path = write_variant(tmp_path, "cluster", "mi300x-pollara", "nic_bw_Gbps = 400.0", "nic_bw_Gbps = -400.0")
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    message = str(err.value)
    assert str(path) in message and "nic_bw_Gbps" in message and "-400" in message


def test_efficiency_above_one_names_file_key_and_value(tmp_path):
    gemm = load_gpu("mi300x").gemm  # the first 'efficiency = [...]' line of the file is [gemm]'s
    old = f"efficiency = [{', '.join(repr(v) for v in gemm.efficiency)}]"
    new = f"efficiency = [{', '.join(repr(v) for v in gemm.efficiency[:-1])}, 1.25]"
    path = write_variant(tmp_path, "gpu", "mi300x", old, new)
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    message = str(err.value)
    assert str(path) in message and "gemm" in message and "efficiency" in message and "1.25" in message


def test_protocol_efficiency_above_one(tmp_path):
    path = write_variant(tmp_path, "cluster", "h100-ib", "bw_efficiency = 0.9375", "bw_efficiency = 1.5")
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    message = str(err.value)
    assert str(path) in message and "bw_efficiency" in message and "1.5" in message


def test_non_increasing_table_x_names_file_key_and_values(tmp_path):
    path = write_variant(
        tmp_path, "gpu", "h100", "mbytes = [1.0, 8.0, 64.0, 512.0]", "mbytes = [1.0, 64.0, 8.0, 512.0]"
    )
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    message = str(err.value)
    assert str(path) in message and "hbm" in message and "mbytes" in message and "[1.0, 64.0, 8.0, 512.0]" in message


def test_repeated_table_x_is_rejected(tmp_path):
    xs = load_gpu("mi325x").gemm.gflop  # the first 'gflop = [...]' of the file is [gemm]'s
    old = f"gflop = [{', '.join(repr(v) for v in xs)}]"
    new = f"gflop = [{', '.join(repr(v) for v in (xs[0], xs[0], *xs[2:]))}]"
    text = profile_path("gpu", "mi325x").read_text()
    assert old in text
    path = tmp_path / "mi325x-bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=r"gemm.*gflop"):
        load_gpu(path)


def test_table_lengths_must_match(tmp_path):
    old = "efficiency = [0.321, 0.589, 0.803, 0.835]"
    path = write_variant(tmp_path, "gpu", "h200", old, "efficiency = [0.321, 0.589]")
    with pytest.raises(ConfigError, match="lengths differ"):
        load_gpu(path)


def test_malformed_toml_names_file_and_line(tmp_path):
    path = write_variant(tmp_path, "gpu", "mi300x", "num_compute_units = 304", "num_compute_units 304")
    with pytest.raises(ConfigError) as err:
        load_gpu(path)
    message = str(err.value)
    assert str(path) in message and "not valid TOML" in message
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text == "num_compute_units 304")
    assert f"line {line}" in message


def test_malformed_cluster_toml(tmp_path):
    path = write_variant(tmp_path, "cluster", "h200-ib", "[fabric]", "[fabric")
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_cluster(path)


def test_bad_enum_value_lists_the_choices(tmp_path):
    path = write_variant(tmp_path, "node", "h100-8", 'intra_topology = "switch"', 'intra_topology = "torus"')
    with pytest.raises(ConfigError) as err:
        from_dict(NodeSpec, tomllib.loads(path.read_text()), str(path))
    message = str(err.value)
    assert "intra_topology" in message and "'torus'" in message and "full_mesh" in message and "switch" in message


def test_usable_link_above_raw_is_rejected(tmp_path):
    path = write_variant(tmp_path, "node", "mi355x-8", "link_bw_GBps = 60.81", "link_bw_GBps = 80.0")
    with pytest.raises(ConfigError, match="exceeds link_bw_raw_GBps"):
        from_dict(NodeSpec, tomllib.loads(path.read_text()), str(path))


def test_unknown_gpu_name_lists_known_names(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_gpu("mi999x")
    assert "mi999x" in str(err.value)
    for name in GPUS:
        assert name in str(err.value)
    path = write_variant(tmp_path, "cluster", "mi300x-pollara", 'gpu = "mi300x"', 'gpu = "mi999x"')
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    assert "mi999x" in str(err.value) and all(name in str(err.value) for name in GPUS)


def test_unknown_cluster_name_lists_known_names():
    with pytest.raises(ConfigError) as err:
        load_cluster("dgx-gb300")
    assert all(name in str(err.value) for name in CLUSTERS)


def test_missing_profile_path():
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster("/nonexistent/cluster.toml")


@pytest.mark.parametrize("name", GPUS)
def test_peak_flops_of_unknown_dtype_is_a_config_error(name):
    gpu = load_gpu(name)
    with pytest.raises(ConfigError) as err:
        gpu.peak_flops("int4")
    assert "int4" in str(err.value) and "bf16" in str(err.value)


def test_peak_flops_converts_tflops_to_si():
    gpu = load_gpu("mi300x")
    assert gpu.peak_flops("bf16") == pytest.approx(1307.4e12)
    assert gpu.hbm_bytes == 192 * 2**30 - 16 * 2**20  # the vendor's "192 GB" is binary (ROCm's spec table: GiB), less the driver's 16 MiB
    assert gpu.hbm_Bps == pytest.approx(5325e9)


def test_hbm_capacity_is_binary_less_the_driver_reserve(tmp_path):
    """An H100 80GB holds 80 GiB, of which NVML reports 81,559 MiB: 85.52 GB a program can use,
    not the 80e9 bytes a decimal reading of the spec sheet gives."""
    h100 = load_gpu("h100")
    assert h100.hbm_bytes == 81559 * 2**20
    assert h100.hbm_bytes / 1e9 == pytest.approx(85.52, abs=0.01)
    assert load_gpu("h200").hbm_bytes == 143771 * 2**20
    assert load_gpu("mi300x").hbm_bytes == 206_141_652_992  # rocm-smi's VRAM total: 192 GiB less 16 MiB
    from perfsim.system.kernel_tables import table_provenance
    rows = {name: (status, text) for name, status, text in table_provenance(h100)}
    assert rows["hbm_capacity"][0] == "measured" and "81,559 MiB" in rows["hbm_capacity"][1]
    # MI300X's reserve is read off a device total; the other AMD GPUs borrow it, and say so
    statuses = {name: dict((n, s) for n, s, _ in table_provenance(load_gpu(name)))["hbm_capacity"]
                for name in ("mi300x", "mi325x", "mi355x")}
    assert statuses == {"mi300x": "measured", "mi325x": "assumed", "mi355x": "assumed"}
    path = write_variant(tmp_path, "gpu", "h100", "hbm_reserved_MiB = 361.0", "hbm_reserved_MiB = 90000.0")
    with pytest.raises(ConfigError, match="hbm_reserved_MiB"):
        load_gpu(path)


# ---- reference numbers (specs_peak.csv, the public source of the profiles) ---------------


def _spec_rows() -> dict:
    if not CALIBRATION_DIR.is_dir():
        pytest.skip(f"calibration data not found at {CALIBRATION_DIR}")
    with open(CALIBRATION_DIR / "specs_peak.csv", newline="") as handle:
        return {(row["gpu"], row["metric"]): row["value"] for row in csv.DictReader(handle)}


# (profile, csv gpu, csv metric, profile value getter, factor from csv unit to profile unit)
SPEC_CHECKS = [
    ("mi300x", "MI300X", "BF16_matrix_dense_peak", lambda g: g.peak_tflops["bf16"], 1.0),
    ("mi300x", "MI300X", "HBM3_capacity", lambda g: g.hbm_capacity_GB, 1.0),
    ("mi325x", "MI325X", "BF16_matrix_dense_peak", lambda g: g.peak_tflops["bf16"], 1.0),
    ("mi325x", "MI325X", "HBM3E_capacity", lambda g: g.hbm_capacity_GB, 1.0),
    ("mi325x", "MI325X", "HBM_peak_bandwidth", lambda g: g.hbm_bw_GBps, 1000.0),
    ("mi355x", "MI355X", "FP16_BF16_matrix_dense_peak", lambda g: g.peak_tflops["bf16"], 1000.0),
    ("mi355x", "MI355X", "HBM3E_capacity", lambda g: g.hbm_capacity_GB, 1.0),
    ("mi355x", "MI355X", "HBM_peak_bandwidth", lambda g: g.hbm_bw_GBps, 1000.0),
    ("h100", "H100 SXM5 80GB", "FP16_BF16_tensor_dense", lambda g: g.peak_tflops["bf16"], 1.0),
    ("h100", "H100 SXM5 80GB", "HBM3_capacity", lambda g: g.hbm_capacity_GB, 1.0),
    ("h100", "H100 SXM5 80GB", "HBM_peak_bandwidth", lambda g: g.hbm_bw_GBps, 1000.0),
    ("h200", "H200 SXM 141GB", "HBM3E_capacity", lambda g: g.hbm_capacity_GB, 1.0),
    ("h200", "H200 SXM 141GB", "HBM_peak_bandwidth", lambda g: g.hbm_bw_GBps, 1000.0),
]


@pytest.mark.parametrize("profile,csv_gpu,metric,get,factor", SPEC_CHECKS, ids=[f"{c[0]}-{c[2]}" for c in SPEC_CHECKS])
def test_profile_matches_specs_peak_csv(profile, csv_gpu, metric, get, factor):
    """Profile peaks equal specs_peak.csv (vendor spec, exact up to the csv's printed digits)."""
    rows = _spec_rows()
    assert get(load_gpu(profile)) == pytest.approx(float(rows[(csv_gpu, metric)]) * factor, rel=1e-9)


def test_mi300x_bf16_peak_and_hbm_match_specs_peak_csv():
    rows = _spec_rows()
    gpu = load_gpu("mi300x")
    assert float(rows[("MI300X", "BF16_matrix_dense_peak")]) == 1307.4 == gpu.peak_tflops["bf16"]
    assert float(rows[("MI300X", "HBM3_capacity")]) == 192.0 == gpu.hbm_capacity_GB


def test_h200_has_h100_compute():
    h100, h200 = load_gpu("h100"), load_gpu("h200")
    assert h200.peak_tflops == h100.peak_tflops
    assert h200.num_compute_units == h100.num_compute_units
    assert h200.hbm_bw_GBps > h100.hbm_bw_GBps


def test_mi300x_pollara_is_zaya1s_1024_gpus():
    cluster = load_cluster("mi300x-pollara")
    assert cluster.num_nodes == 128
    assert cluster.num_gpus == 1024
    assert cluster.fabric.nics_per_node == cluster.gpus_per_node


def test_nvlink_node_bandwidth():
    """H100 NVSwitch: 18 links x 20.6 GB/s usable (NCCL SM90_NVLINK_BW) for any number of peers."""
    node = load_node("h100-8")
    assert node.gpu_bw_Bps(1) == node.gpu_bw_Bps(7) == pytest.approx(18 * 20.6e9)
    assert node.links_per_gpu * node.link_bw_raw_GBps == pytest.approx(450.0)  # 900 GB/s bidirectional


def test_xgmi_node_bandwidth_grows_with_peers():
    node = load_node("mi300x-8")
    assert node.gpu_bw_Bps(1) == pytest.approx(46.8e9)
    assert node.gpu_bw_Bps(7) == pytest.approx(7 * 46.8e9)
    assert node.gpu_bw_Bps(9) == node.gpu_bw_Bps(7)
