"""perfsim calibrate across nodes (issue 15): multi-node tables fit the fabric's NIC
ramp and hop latency, dispatch tables the MoE implementations, with provenance."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from perfsim.calibration import fabric_fit
from perfsim.calibration.calibrate import calibrate
from perfsim.calibration.readers_multinode import read_collective_table, read_dispatch_table
from perfsim.errors import ConfigError
from perfsim.system.hardware import load_cluster

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "validation" / "data" / "multinode" / "collectives_multinode.csv"
FIT = "hisohara_AAC14_MI355X_2node_Pollara_ANP_allreduce"
CHECK = "rccl_pr2078_AINIC_internal_plugin_2node_allreduce"


def no_ramp(name: str):
    c = load_cluster(name)
    fab = dataclasses.replace(c.fabric, message_kbytes=(), message_efficiency=(), message_source="")
    return dataclasses.replace(c, fabric=fab)


def series(name):
    return next(s for s in read_collective_table(TABLE) if s.series == name)


def test_reader_records_forced_algorithms_and_geometry():
    ring = series("hisohara_AAC11_MI325X_8node_bnxt_allreduce_ring")
    assert (ring.algorithm, ring.num_ranks, ring.num_nodes, ring.launch) == ("ring", 64, 8, "mpi")
    big = series("nccl_tests_issue322_H100_1024rank_roce_allreduce_ring_ll128")
    assert (big.algorithm, big.protocol) == ("ring", "ll128")
    assert len(series(FIT).rows) == 31
    assert {p.phase for p in read_dispatch_table(TABLE)} == {"dispatch", "combine"}
    with pytest.raises(ConfigError, match="series"):
        read_collective_table(TABLE, series="no-such-series")


def test_a_series_on_part_of_each_node_keeps_its_ranks_per_node(tmp_path):
    """2 nodes x 2 GPUs are 2 ranks a node across 2 nodes (not 4 on one node's rails), and
    2 nodes x 1 GPU one rank a node: the shape the collective is priced on."""
    header = "series,gpu,nic,n_nodes,n_ranks,collective,size_bytes,time_us,algbw_GBps,busbw_GBps,in_place,software,launch_mode,source_url,note"
    rows = [f"s{n}x{r},MI355X,ionic,{n},{r},all_reduce,1048576,100,,,0,RCCL,mpi,u," for n, r in ((2, 4), (2, 2), (1, 4), (2, 16))]
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    shapes = {s.series: s.points()[0].shape for s in read_collective_table(path)}
    assert [(sh.size, sh.per_node, sh.num_nodes) for sh in shapes.values()] == [(4, 2, 2), (2, 1, 2), (4, 4, 1), (16, 8, 2)]


def test_calibrate_fits_the_fabric_from_a_multinode_table(tmp_path):
    base = no_ramp("mi355x-pollara")
    out = tmp_path / "cal.toml"
    result = calibrate(base, collective_tables=[TABLE], series=[FIT], out=out)
    fit = next(f for f in result.fits if f.name == "fabric")
    assert fit.num_points == 31 and fit.mape_after < 0.5 * fit.mape_before and fit.mape_after < 6.0
    assert "fit.fabric" in result.cluster.provenance
    assert "calibrated by perfsim calibrate" in result.cluster.fabric.message_source
    loaded = load_cluster(out)
    assert loaded.fabric == result.cluster.fabric and loaded.collectives == result.cluster.collectives
    # checked on a series it was not fitted to (AINIC PR #2078, >= 2 GB rows)
    check = series(CHECK).points()
    assert fabric_fit.mape(check, loaded) < 5.0 < fabric_fit.mape(check, base)


def test_calibrate_finds_the_ring_step_floor_of_a_long_ring(tmp_path):
    """From a profile without a floor, the 1,024-rank ring's five rows (1 GB and 2 GB
    taking the same ~20 ms) give back the ring step floor and the IB ramp together; the
    2-node Pollara sweep (default tuner: no protocol forced) leaves the Pollara profile's floors
    as they were: the profile-wide one is RCCL's network post overhead beneath the protocols'
    own, and those are fitted only from runs that forced their protocol."""
    h100 = load_cluster("h100-ib")
    base = dataclasses.replace(h100, collectives=dataclasses.replace(h100.collectives, ring_step_floor_us=0.0))
    result = calibrate(base, collective_tables=[TABLE], series=["nccl_tests_issue322_H100_1024rank_roce_allreduce_ring_ll128"],
                       out=tmp_path / "h100.toml")
    fit = next(f for f in result.fits if f.name == "fabric")
    assert fit.mape_before > 15.0 and fit.mape_after < 3.0
    assert result.cluster.collectives.ring_step_floor_us == pytest.approx(h100.collectives.ring_step_floor_us, rel=0.05)
    assert "ring_step_floor_us" in fit.detail
    given = no_ramp("mi355x-pollara")
    pollara = calibrate(given, collective_tables=[TABLE], series=[FIT], out=tmp_path / "p.toml")
    assert pollara.cluster.collectives.ring_step_floor_us == given.collectives.ring_step_floor_us
    assert pollara.cluster.collectives.protocols == given.collectives.protocols
    assert "ring_step_floor_us" not in next(f for f in pollara.fits if f.name == "fabric").detail


def test_calibrate_fits_a_protocols_own_ring_step_floor_from_its_forced_rings(tmp_path):
    """Forced 2-node LL128 / Simple rings (ylerman-dn/amd-dev, RCCL 2.28.3) take the same time
    per step from 1 MB to 32 MB: from a profile whose protocol floors are set low, calibrate
    gives back the floors the shipped profile carries (fitted on the same rows by
    validation/fit_fabric.py), says it fitted them, and leaves the profile-wide floor (RCCL's
    network post overhead, beneath them) where it was."""
    shipped = load_cluster("mi355x-pollara-rccl227")
    tune = shipped.collectives
    low = {n: dataclasses.replace(p, ring_step_floor_us=1.0) if p.ring_step_floor_us is not None else p
           for n, p in tune.protocols.items()}
    start = dataclasses.replace(shipped, collectives=dataclasses.replace(tune, protocols=low))
    names = [f"ylerman_amddev_MI355X_2node_pollara_allreduce_ring_{p}" for p in ("ll128", "simple")]
    result = calibrate(start, collective_tables=[TABLE], series=names, out=tmp_path / "floors.toml")
    fit = next(f for f in result.fits if f.name == "fabric")
    assert "protocols.ll128.ring_step_floor_us" in fit.detail and "protocols.simple.ring_step_floor_us" in fit.detail
    assert fit.mape_after < fit.mape_before
    fitted = result.cluster.collectives
    for name in ("ll128", "simple"):
        assert fitted.protocols[name].ring_step_floor_us == pytest.approx(tune.protocols[name].ring_step_floor_us, rel=0.25)
    assert fitted.ring_step_floor_us == tune.ring_step_floor_us
    assert load_cluster(tmp_path / "floors.toml").collectives.protocols["simple"].ring_step_floor_us == \
        fitted.protocols["simple"].ring_step_floor_us
    # a floor paces rings only: a run that forced the tree does not free it, nor does a default-tuner sweep
    tree = series("ylerman_amddev_MI355X_3node_pollara_allreduce_tree_ll128").points()
    assert fabric_fit.free_floors(shipped, tree) == () and fabric_fit.free_floors(shipped, series(FIT).points()) == ()
    ring = series(names[0]).points()
    assert fabric_fit.free_floors(shipped, ring) == ("ll128",) and fabric_fit.free_floors(shipped, ring, False) == ()


def test_calibrate_fits_dispatch_efficiencies(tmp_path):
    base = load_cluster("mi300x-pollara")
    result = calibrate(base, dispatch_tables=[TABLE], out=tmp_path / "d.toml")
    names = [f.name for f in result.fits]
    assert names == ["dispatch.mori"]
    mori = result.cluster.dispatch["mori"]
    assert 0.3 < mori.rdma_efficiency <= 1.0 and 0.5 < mori.intra_efficiency <= 1.0
    assert "calibrated by perfsim calibrate" in mori.source


def test_cli_calibrate_unknown_series_is_one_line_exit_2(tmp_path):
    cmd = [sys.executable, "-m", "perfsim", "calibrate", "--collective-csv", str(TABLE), "--series", "nope",
           "--out", str(tmp_path / "x.toml")]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "nope" in out.stderr


def _single_process_copy(src: Path, dst: Path, extra_us: float) -> Path:
    """The MI300X mpi sweep re-rendered as a -g 8 single-process run with ``extra_us`` more
    per call (synthetic: there is no public single-process sweep outside the held-out set)."""
    out = []
    for line in src.read_text().splitlines():
        if line.lstrip("# ").startswith("nThread"):
            line = line.replace("nGpus 1", "nGpus 8")
        elif line.strip() and not line.startswith("#"):
            tok = line.split()
            tok[5] = f"{float(tok[5]) + extra_us:.2f}"
            tok[9] = f"{float(tok[9]) + extra_us:.2f}"
            line = "  ".join(tok)
        out.append(line)
    dst.write_text("\n".join(out) + "\n")
    return dst


def test_calibrate_reads_launch_floors_from_single_process_and_graph_logs(tmp_path):
    data = ROOT / "validation" / "data" / "multinode"
    nograph = data / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
    single = _single_process_copy(nograph, tmp_path / "g8.log", 40.0)
    result = calibrate("mi300x-pollara", rccl_logs=[single, data / "mi300x_1node_8gpu_mpi_hipgraph_amdblog.log"],
                       out=tmp_path / "l.toml")
    tune = result.cluster.collectives
    assert tune.single_process_latency_us == pytest.approx(40.0, abs=3.0)
    assert tune.graph_saving_us == pytest.approx(load_cluster("mi300x-pollara").collectives.graph_saving_us, abs=0.5)
    # the captured log's 16 B rows run the ring (~16 us), its 32 B rows the one-shot kernel (~6 us)
    assert 16 < tune.graph_direct_min_bytes <= 32
    assert [f.name for f in result.fits] == ["launch"]
    assert tune.launch_latency_us == load_cluster("mi300x-pollara").collectives.launch_latency_us  # not refit


def test_a_fabric_fit_never_returns_worse_than_the_profile_it_was_given():
    """From the shipped profile (already fitted to this series) the fit may find nothing
    better: it returns the profile itself rather than a ramp whose unmoved knots were
    filled from their neighbours (which had priced AAC14 5.2% -> 6.7%)."""
    cluster = load_cluster("mi355x-pollara").with_nodes(128)
    fit = fabric_fit.fit_fabric(series(FIT).points(), cluster, fit_floor=False)
    assert fit.mape_after <= fit.mape_before + 1e-9
    if not fit.fitted:
        assert fit.cluster == cluster


def _form_at_the_profile(points, cluster):
    """collective_fit's vectorised form of ``points`` at ``cluster``'s own values, checked equal
    to collective_fit.predict point by point; (problem, protocol index, allowed algorithms)."""
    import numpy as np

    from perfsim.calibration import collective_fit as cf

    problem = cf._Problem(points=points, basis=cf._basis(points, cluster), protocols=list(cluster.collectives.protocols),
                          measured=np.array([p.time_s for p in points]))
    proto, allowed = problem.masks(cluster)
    vectorised = problem.times(cf._theta(cluster.collectives, problem.protocols), proto, allowed)
    assert vectorised == pytest.approx([cf.predict(p, cluster) for p in points], rel=1e-9)
    return problem, proto, allowed


def test_the_intra_node_fit_prices_every_point_as_collective_cost_does():
    """perfsim calibrate's intra-node fit decomposes each point once into steps, bandwidth and a
    fixed per-call latency (collective_fit._basis) and evaluates that form: at the profile's own
    values it must give collective_cost's time, all-to-all included, whose implementation
    latency (dispatch.rccl latency_us) had been counted as intra- and inter-node steps, so a
    single-node alltoall sweep freed the network hop and priced each call 6.7 us x (1 + hop) off."""
    from perfsim.calibration import collective_fit as cf

    table = {s.series: s for s in read_collective_table(TABLE)}
    cluster = load_cluster("mi355x-pollara-rccl227")
    points = [p for name in ("ylerman_amddev_MI355X_1node_alltoall", "ylerman_amddev_MI355X_1node_allgather",
                             "ylerman_amddev_MI355X_1node_allreduce") for p in table[name].points()]
    problem, proto, allowed = _form_at_the_profile(points, cluster)
    _, _, used = cf._bounds(problem, cf._theta(cluster.collectives, problem.protocols), proto, allowed)[1:]
    assert not used[-1]  # one node: no network hop to fit
    a2a = [p for p in points if p.coll.value == "all_to_all"]
    fitted = cf.fit_collectives(a2a, cluster, fit_windows=False).fitted
    assert "intra_step" in fitted and not any(n.endswith("bw_efficiency") or n == "inter_step" for n in fitted)


def test_forced_runs_are_fitted_and_validated_on_the_path_they_ran():
    """A single-node run that forced RCCL's algorithm and protocol (NCCL_ALGO / NCCL_PROTO) is
    priced on that path by the intra-node fit's form and by validate's predict, not on the
    selector's pick (which the form had used for every point, so a forced sweep fitted the
    default path's parameters). Multi-node points go to fabric_fit, which prices them the same
    way (accuracy_fabric's forced rows)."""
    import numpy as np

    from perfsim.calibration import collective_fit as cf
    from perfsim.cost.collectives import collective_cost

    table = {s.series: s for s in read_collective_table(TABLE)}
    cluster = load_cluster("mi355x-pollara-rccl227")
    one_node = table["ylerman_amddev_MI355X_1node_allreduce"].points()
    points = [dataclasses.replace(p, algorithm=algo, protocol=proto)
              for algo, proto in (("ring", "simple"), ("ring", "ll"), ("direct", "ll128")) for p in one_node]
    _form_at_the_profile(points, cluster)
    forced = np.array([cf.predict(p, cluster) for p in points])
    picked = np.array([collective_cost(p.coll, p.size_bytes, p.shape, cf.cluster_for(cluster, p.shape)).time_s
                       for p in points])
    assert np.mean(np.abs(forced / picked - 1)) > 0.2  # the forced paths are not the selector's


def test_cli_validate_prices_a_log_on_the_path_it_forced(tmp_path):
    log = ROOT / "validation" / "data" / "calibration" / "rccl-tests" / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
    text = log.read_text().replace("#\n#  ", "host0:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n#\n#  ", 1)
    forced = tmp_path / "ring.log"
    forced.write_text(text)
    run = lambda *args: subprocess.run([sys.executable, "-m", "perfsim", "validate", "--json", *args],
                                       capture_output=True, text=True, timeout=120)
    import json

    default, ring = (json.loads(run("--rccl-log", str(f)).stdout) for f in (log, forced))
    assert any("forced ring" in n for n in ring["notes"]) and not default["notes"]
    by_size = {p["x"]: p["predicted_us"] for p in default["points"]}
    assert any(abs(p["predicted_us"] / by_size[p["x"]] - 1) > 0.05 for p in ring["points"])  # the one-shot sizes
    told = json.loads(run("--rccl-log", str(log), "--algo", "ring").stdout)
    assert [p["predicted_us"] for p in told["points"]] == [p["predicted_us"] for p in ring["points"]]
    bad = run("--rccl-log", str(log), "--algo", "rings")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == ["perfsim: error: algorithm: 'rings' is not one of ring, tree, direct, "
                                               "hierarchical, nvls, nvls_tree"]
    nvls = run("--rccl-log", str(log), "--algo", "nvls")  # NVLS needs an NVSwitch node: not an MI300X's
    assert nvls.returncode == 2 and nvls.stdout == "" and len(nvls.stderr.strip().splitlines()) == 1
    assert str(log) in nvls.stderr and "the run forced nvls, which perfsim cannot price on mi300x-pollara" in nvls.stderr


def test_cli_validate_prices_multinode_tables_as_the_fabric_accuracy_does():
    """`perfsim validate --collective-csv` (the counterpart of calibrate's): each series on the
    path and launch it ran, its MAPE the figure docs/accuracy.md reports for it."""
    import json

    from validation import accuracy_fabric

    names = ["alibaba_readme_MI355X_2node_pollara_allreduce", accuracy_fabric.forced_series(3, "tree", "ll128")]
    run = lambda *args: subprocess.run([sys.executable, "-m", "perfsim", "validate", *args],
                                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    done = run("--cluster", "mi355x-pollara-rccl227", "--collective-csv", str(TABLE), "--series", names[0],
               "--series", names[1], "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["mape_by_category_pct"]
    for name in names:
        (category, mape), = [(c, m) for c, m in got.items() if c.startswith(name + " (")]
        rows = accuracy_fabric.errors(accuracy_fabric.series_points(name), "mi355x-pollara-rccl227")
        assert mape == pytest.approx(accuracy_fabric.mape(rows), rel=1e-9)
    assert "tree / ll128 forced" in next(c for c in got if c.startswith(names[1]))
    bad = run("--collective-csv", str(TABLE), "--series", "no-such-series")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "no-such-series" in bad.stderr
    lone = run("--series", names[0], "--rccl-log", str(ROOT / "validation" / "data" / "multinode"
                                                       / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"))
    assert lone.returncode == 2 and "--collective-csv" in lone.stderr


def test_calibrate_fits_the_simple_protocols_step_cost_over_whole_nodes(tmp_path):
    """NCCL's Simple ring across whole H100 nodes pays a cost per step (h100-ib's
    protocols.simple.ring_step_cost_us, fitted by validation/fit_fabric.py on Voltage Park's
    4-node series): from a profile whose cost is set low, calibrate on that sweep raises it,
    with the ramp (the two trade: a 4-node sweep from 1 MB to 8 GB pins neither alone, and
    the joint fit lands above the value fitted with the ramp held), and says so; a sweep over part of
    each node (whose rings pay no such cost) or a forced-LL128 series does not free it, and
    fit_cost=False holds it."""
    shipped = load_cluster("h100-ib")
    tune = shipped.collectives
    low = {**tune.protocols, "simple": dataclasses.replace(tune.protocols["simple"], ring_step_cost_us=1.0)}
    start = dataclasses.replace(shipped, collectives=dataclasses.replace(tune, protocols=low))
    name = "voltagepark_H100_4node_allreduce"
    result = calibrate(start, collective_tables=[TABLE], series=[name], out=tmp_path / "ib.toml")
    fit = next(f for f in result.fits if f.name == "fabric")
    assert "protocols.simple.ring_step_cost_us" in fit.detail and fit.mape_after < fit.mape_before
    cost = result.cluster.collectives.protocols["simple"].ring_step_cost_us
    assert 8.0 < cost < 25.0
    assert load_cluster(tmp_path / "ib.toml").collectives.protocols["simple"].ring_step_cost_us == cost
    assert "ring_step_cost_us refit" in result.cluster.collectives.source
    part = series("xxrjun_cluster01_H100_10node_4gpn_all_reduce").points()
    assert fabric_fit.free_step_costs(start, part) == ()
    forced = series("nccl_tests_issue322_H100_1024rank_roce_allreduce_ring_ll128").points()
    assert fabric_fit.free_step_costs(start, forced) == ()
    assert fabric_fit.free_step_costs(start, series(name).points()) == ("simple",)
    assert fabric_fit.free_step_costs(start, series(name).points(), fit_cost=False) == ()
    assert fabric_fit.free_step_costs(load_cluster("mi355x-pollara"), series(FIT).points()) == ()
