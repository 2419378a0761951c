"""Fabric fidelity across nodes (issue 15): NIC ramp, NVSwitch/NVLS, launch mode and
graph capture, ring latency at scale, and the figures of validation/accuracy_fabric.py
kept from regressing (fit series in-sample, the other series as checks)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from perfsim import api, units
from perfsim.calibration import fabric_fit
from perfsim.cost import collectives
from perfsim.cost.collectives import collective_cost
from perfsim.cost.phases import message_efficiency
from perfsim.errors import ConfigError
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape
from perfsim.system.hardware import load_cluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from validation import accuracy_fabric  # noqa: E402

SIZES = [1 << k for k in range(20, 34)]  # 1 MB .. 8 GB


def shape(n: int, per: int = 8) -> GroupShape:
    return GroupShape(size=n, per_node=min(per, n), num_nodes=-(-n // per))


def test_h200_node_all_reduce_reaches_nvls_class_bus_bandwidth():
    """NVSwitch port bandwidth (18 links) and NVLS: beyond a ring's 18 x 20.6 GB/s bound."""
    ring_bound = load_cluster("h200-ib").node.gpu_bw_Bps(7) / 1e9
    row = api.collective("all_reduce", 1 << 30, 8, "h200-ib")
    assert row["algorithm"] == "nvls"
    assert row["busbw_GBps"] > 1.15 * ring_bound
    ring = api.collective("all_reduce", 1 << 30, 8, "h200-ib", algorithm="ring")
    assert ring["busbw_GBps"] < ring_bound  # the ring now sees the switch port, not 7 links
    assert ring["busbw_GBps"] > 0.8 * ring_bound


def test_h200_two_nodes_never_beat_one_node():
    for size in SIZES:
        one = api.collective("all_reduce", size, 8, "h200-ib")["time_us"]
        two = api.collective("all_reduce", size, 16, "h200-ib")["time_us"]
        assert two >= one, size


def test_cli_h200_sweep_runs_and_reports_nvls_inside_a_node():
    cmd = [sys.executable, "-m", "perfsim", "collective", "--op", "all_reduce", "--gpus", "16", "--cluster", "h200-ib",
           "-b", "1M", "-e", "8G"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 14
    inside = subprocess.run(cmd[:7] + ["8"] + cmd[8:], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "nvls/" in inside.stdout


def test_nic_ramp_is_monotone_and_mid_size_two_node_busbw_rises_with_size():
    fab = load_cluster("mi355x-pollara").fabric
    effs = [message_efficiency(fab, 2.0 ** k) for k in range(6, 34)]
    assert effs == sorted(effs) and effs[0] < 0.05 < 0.85 < effs[-1]
    busbw = [api.collective("all_reduce", s, 16, "mi355x-pollara")["busbw_GBps"] for s in SIZES]
    assert busbw == sorted(busbw)
    # mid sizes are far from line rate across nodes (the 2-node sweeps show ~24 GB/s at 1 MB)
    assert busbw[0] < 0.15 * busbw[-1]


def test_graph_capture_and_single_process_launch_move_the_latency_floor():
    cluster = load_cluster("mi300x-pollara")
    tune = dataclasses.replace(cluster.collectives, single_process_latency_us=40.0)
    sp = dataclasses.replace(cluster, collectives=tune)
    s = shape(8)
    mpi = collective_cost(Coll.ALL_REDUCE, 1024, s, cluster).time_s
    graph = collective_cost(Coll.ALL_REDUCE, 1024, s, cluster, graph=True).time_s
    single = collective_cost(Coll.ALL_REDUCE, 1024, s, sp, launch="single-process").time_s
    assert mpi - graph == pytest.approx(cluster.collectives.graph_saving_us * 1e-6)
    assert single - mpi == pytest.approx(40e-6)
    big = 1 << 30  # the floor is a per-call cost: it does not scale with bytes
    assert (collective_cost(Coll.ALL_REDUCE, big, s, cluster).time_s
            - collective_cost(Coll.ALL_REDUCE, big, s, cluster, graph=True).time_s) == pytest.approx(mpi - graph)
    with pytest.raises(ConfigError, match="launch"):
        collective_cost(Coll.ALL_REDUCE, 1024, s, cluster, launch="srun")


def test_cli_bad_launch_is_one_line_exit_2():
    out = subprocess.run([sys.executable, "-m", "perfsim", "collective", "--op", "all_reduce", "--gpus", "8",
                          "--launch", "srun"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "--launch" in out.stderr


def test_ring_latency_grows_with_ranks_and_hierarchical_serves_zero_at_scale():
    cluster = load_cluster("mi300x-pollara")
    small = 1 << 20
    ring = [collective_cost(Coll.REDUCE_SCATTER, small, shape(n), cluster, algorithm="ring").latency_s
            for n in (64, 256, 1024)]
    assert ring == sorted(ring) and ring[-1] > 3 * ring[0]
    hier = collective_cost(Coll.REDUCE_SCATTER, small, shape(1024), cluster, algorithm="hierarchical")
    assert hier.time_s < collective_cost(Coll.REDUCE_SCATTER, small, shape(1024), cluster, algorithm="ring").time_s
    # RCCL has no such kernel (its tuner runs ring / tree): the profile's selector leaves it out
    # unless the profile says the library has one
    assert not cluster.collectives.hierarchical
    assert collective_cost(Coll.REDUCE_SCATTER, small, shape(1024), cluster).algorithm == "ring"
    allowed = dataclasses.replace(cluster, collectives=dataclasses.replace(cluster.collectives, hierarchical=True))
    assert collective_cost(Coll.REDUCE_SCATTER, small, shape(1024), allowed).algorithm == "hierarchical"


def test_amd_rings_across_nodes_pay_rccls_network_post_overhead_per_step():
    """RCCL's tuner prices every step of a ring that spans nodes at least its network post
    overhead (getNetOverhead: 2 us on an AMD host): a 4 KB reduce_scatter over 16 ranks on
    two nodes takes its 15 steps at >= 2 us each, where inside one node it does not."""
    cluster = load_cluster("mi355x-pollara")
    assert cluster.collectives.ring_step_floor_us == 2.0
    two = collective_cost(Coll.REDUCE_SCATTER, 4096, GroupShape(size=16, per_node=8, num_nodes=2), cluster)
    assert two.algorithm == "ring" and two.latency_s >= 15 * 2e-6
    one = collective_cost(Coll.REDUCE_SCATTER, 4096, GroupShape(size=8, per_node=8, num_nodes=1), cluster)
    slowest = max(p.latency_us for p in cluster.collectives.protocols.values())
    assert one.latency_s < 7 * 2e-6 + units.us_to_s(cluster.collectives.launch_latency_us + slowest)


@pytest.mark.parametrize("series, large_max, small_max", [
    ("ylerman_amddev_MI355X_2node_pollara_allreduce", 5.0, 11.0),
    # 11.0 until session 51: RCCL runs its direct all-gather at 2-4 MB on 2 nodes (the source's
    # SUMMARY), which perfsim has no kernel for across nodes; the ring it prices there now pays
    # the LL128 step floor RCCL's rings do (fitted on the forced all_reduce rings), +74% / +26%
    ("ylerman_amddev_MI355X_2node_pollara_allgather", 16.0, 5.0),
    ("ylerman_amddev_MI355X_3node_pollara_allgather", 18.0, 11.0),
    ("ylerman_amddev_MI355X_2node_pollara_reducescatter", 13.5, 16.0),
    ("ylerman_amddev_MI355X_3node_pollara_reducescatter", 12.5, 35.0),
    ("ylerman_amddev_MI355X_2node_pollara_alltoall", 7.0, 15.0),
    ("ylerman_amddev_MI355X_3node_pollara_alltoall", 7.0, 32.0),
])
def test_newer_rccl_check_series_stay_within_their_figures(series, large_max, small_max):
    """The RCCL 2.28 source (ylerman-dn/amd-dev) default-tuner series no parameter was fitted
    to: the Pollara ramp, hop and RCCL all-to-all were fitted to the RCCL 2.27 alibaba README
    sweeps, the protocol step floors to the same cluster's forced 2-node all_reduce rings."""
    assert _mape(series, accuracy_fabric.LARGE) <= large_max
    assert _mape(series, 0, accuracy_fabric.LARGE) <= small_max


def test_rccl_picks_its_all_gather_and_reduce_scatter_protocols_by_one_ranks_share():
    """RCCL's llProtoRanges give all_gather and reduce_scatter windows of their own, compared
    with one rank's share of the buffer: on 2 x 8 MI355X the source's tuner log runs
    reduce_scatter RING/LL to 1 MB, RING/LL128 from 2 MB to 128 MB and RING/SIMPLE from 256 MB,
    where the all-reduce's windows (LL to 256 KB, LL128 to 67 MB) would switch earlier."""
    cluster = load_cluster("mi355x-pollara-rccl227")
    two = GroupShape(size=16, per_node=8, num_nodes=2)
    picks = {s: collective_cost(Coll.REDUCE_SCATTER, s, two, cluster).protocol for s in (1 << 20, 2 << 20, 128 << 20, 256 << 20)}
    assert picks == {1 << 20: "ll", 2 << 20: "ll128", 128 << 20: "ll128", 256 << 20: "simple"}
    assert collective_cost(Coll.ALL_REDUCE, 1 << 20, two, cluster).protocol == "ll128"  # its own windows
    three = GroupShape(size=24, per_node=8, num_nodes=3)  # 24 shares: the windows scale with the ranks
    assert collective_cost(Coll.ALL_GATHER, 192 << 20, three, cluster).protocol == "ll128"
    assert collective_cost(Coll.ALL_GATHER, 200 << 20, three, cluster).protocol == "simple"
    assert collective_cost(Coll.ALL_GATHER, 128 << 20, two, cluster, protocol="simple").protocol == "simple"  # forced
    tune = cluster.collectives
    with pytest.raises(ConfigError, match="protocol_windows.*'all_to_all'"):
        dataclasses.replace(tune, protocol_windows={"all_to_all": {"ll": 1.0}})
    with pytest.raises(ConfigError, match="protocol_windows.all_gather: 'll64'"):
        dataclasses.replace(tune, protocol_windows={"all_gather": {"ll64": 1.0}})
    with pytest.raises(ConfigError, match="protocol_windows.all_gather.ll must be > 0"):
        dataclasses.replace(tune, protocol_windows={"all_gather": {"ll": 0.0}})


def test_rccl_ring_steps_take_their_protocols_floor_across_nodes():
    """RCCL's LL128 and Simple rings across MI355X nodes take about the same time per step
    from 1 MB to 32 MB (the forced 2-node rings the floors are fitted to): the time grows with
    the steps, 30 on 2 nodes and 46 on 3, not with the bytes; below the full channel count's
    size the floor shrinks with the size, never under the profile-wide one; inside a node
    nothing is paced; a profile without protocol floors keeps its one floor."""
    cluster = load_cluster("mi355x-pollara-rccl227")
    tune = cluster.collectives
    ll128, simple = tune.protocols["ll128"], tune.protocols["simple"]
    assert ll128.ring_step_floor_us > tune.ring_step_floor_us and simple.ring_step_floor_us > ll128.ring_step_floor_us

    def ring(size, nodes, proto):
        shape = GroupShape(size=8 * nodes, per_node=8, num_nodes=nodes)
        return collective_cost(Coll.ALL_REDUCE, size, shape, cluster, protocol=proto, algorithm="ring").time_s

    for proto in ("ll128", "simple"):
        floor = tune.protocols[proto].ring_step_floor_us * 1e-6
        assert ring(4 << 20, 2, proto) >= 30 * floor and ring(4 << 20, 3, proto) >= 46 * floor
        assert ring(8 << 20, 2, proto) == pytest.approx(ring(4 << 20, 2, proto), rel=0.02)  # the plateau
    half = collectives.step_floor_us(cluster, ll128, tune.ring_floor_full_bytes / 2)
    assert half == pytest.approx(max(tune.ring_step_floor_us, ll128.ring_step_floor_us / 2))
    assert collectives.step_floor_us(cluster, ll128, 1.0) == tune.ring_step_floor_us
    one = GroupShape(size=8, per_node=8, num_nodes=1)
    assert collectives.paced_s("ring", Coll.ALL_REDUCE, one, cluster, simple, 8 << 20) == 0.0
    h100 = load_cluster("h100-ib")
    assert all(p.ring_step_floor_us is None for p in h100.collectives.protocols.values())
    assert collectives.step_floor_us(h100, h100.collectives.protocols["ll128"], 1.0) == h100.collectives.ring_step_floor_us
    with pytest.raises(ConfigError, match="protocol.ring_step_floor_us"):
        dataclasses.replace(ll128, ring_step_floor_us=-1.0)
    with pytest.raises(ConfigError, match="ring_floor_full_bytes"):
        dataclasses.replace(tune, ring_floor_full_bytes=-1.0)


def test_ring_step_floor_paces_a_ring_across_nodes_until_the_bytes_hide_it():
    """h100-ib's ring_step_floor_us (fitted on the 1,024-rank ring's latency-bound rows):
    a flat ring across nodes takes at least 2(n-1) steps at the floor, so 1 GB and 2 GB
    cost the same at 1,024 ranks (as measured: 19.4 and 20.2 ms) while large buffers stay
    bandwidth-bound; the floor never touches a ring inside one node, and at 1,024 ranks
    the selector leaves the paced ring for the hierarchical reduce-scatter ZeRO wants."""
    h100 = load_cluster("h100-ib")
    floor = h100.collectives.ring_step_floor_us
    assert floor > 0
    no_floor = dataclasses.replace(h100, collectives=dataclasses.replace(h100.collectives, ring_step_floor_us=0.0))
    ring = {s: collective_cost(Coll.ALL_REDUCE, s, shape(1024), h100, protocol="ll128", algorithm="ring").time_s
            for s in (1 << 30, 2 << 30, 16 << 30)}
    assert ring[1 << 30] == pytest.approx(ring[2 << 30])
    assert ring[1 << 30] >= 2 * 1023 * floor * 1e-6
    unpaced = collective_cost(Coll.ALL_REDUCE, 16 << 30, shape(1024), no_floor, protocol="ll128", algorithm="ring")
    assert ring[16 << 30] == pytest.approx(unpaced.time_s)
    inside = [collective_cost(Coll.ALL_REDUCE, 1 << 20, shape(8), c, algorithm="ring").time_s for c in (h100, no_floor)]
    assert inside[0] == inside[1]
    rs = collective_cost(Coll.REDUCE_SCATTER, 1 << 30, shape(1024), h100)
    assert rs.algorithm == "hierarchical"
    assert rs.time_s < collective_cost(Coll.REDUCE_SCATTER, 1 << 30, shape(1024), h100, algorithm="ring").time_s
    with pytest.raises(ConfigError, match="ring_step_floor_us"):
        dataclasses.replace(h100.collectives, ring_step_floor_us=-1.0)


def test_nvls_only_on_switch_nodes_with_nvls():
    with pytest.raises(ConfigError):
        collective_cost(Coll.ALL_REDUCE, 1 << 26, shape(8), load_cluster("mi300x-pollara"), algorithm="nvls")
    assert collective_cost(Coll.ALL_REDUCE, 1 << 26, shape(8), load_cluster("h100-ib"), algorithm="nvls").time_s > 0


def test_nvls_tree_runs_two_h100_nodes_past_the_rings_nic_bound_and_halves_beyond():
    """NCCL's NVLSTree (NVLS in the node, a tree across): at two nodes each NIC carries S / 8
    each way, so large all-reduces beat the ring's NIC bound (what nccl-tests #309's 2-node
    H100 runs show, 466-469 GB/s), yet never beat one node's NVLS; beyond two nodes a tree's
    interior nodes carry two children (NCCL halves its network bandwidth), so the ring is as
    good; an MI300X node (xGMI, no NVLS) never runs it."""
    cluster = load_cluster("h100-ib")
    size = 8 << 30
    two = collective_cost(Coll.ALL_REDUCE, size, shape(16), cluster)
    ring = collective_cost(Coll.ALL_REDUCE, size, shape(16), cluster, algorithm="ring")
    one = collective_cost(Coll.ALL_REDUCE, size, shape(8), cluster)
    assert two.algorithm == "nvls_tree" and two.time_s < 0.85 * ring.time_s and two.time_s >= one.time_s
    four_tree = collective_cost(Coll.ALL_REDUCE, size, shape(32), cluster, algorithm="nvls_tree")
    four_ring = collective_cost(Coll.ALL_REDUCE, size, shape(32), cluster, algorithm="ring")
    assert four_tree.demand["nic"] == pytest.approx(2 * two.demand["nic"], rel=1e-9)
    assert four_tree.time_s > two.time_s and four_ring.time_s <= four_tree.time_s
    with pytest.raises(ConfigError):
        collective_cost(Coll.ALL_REDUCE, size, shape(16), load_cluster("mi300x-pollara"), algorithm="nvls_tree")
    assert collective_cost(Coll.ALL_GATHER, size, shape(16), cluster).algorithm != "nvls_tree"
    assert _mape("nccltests309_qoofyk_H100_2node_cx7ib_allreduce", accuracy_fabric.LARGE) <= 10.0 * 1.05


def test_a_log_that_forced_nvls_tree_is_priced_on_it():
    from perfsim.calibration.readers import forced_path

    assert forced_path("NVLSTree", "all_reduce", "ALGO") == ("nvls_tree", "")


# ---- held-out figures (validation/accuracy_fabric.py) kept from regressing ---------------

def _mape(series, lo=0.0, hi=float("inf")):
    case = next(c for c in accuracy_fabric.CASES if c.series == series)
    rows = accuracy_fabric.errors(accuracy_fabric.series_points(series, case.in_place), case.profile)
    return accuracy_fabric.mape(rows, lo, hi)


@pytest.mark.parametrize("series, large_max", [
    ("rccl_pr2078_AINIC_internal_plugin_2node_allreduce", 3.0),
    ("hisohara_AAC11_MI325X_2node_bnxt_allreduce_ring", 4.0),
    ("hisohara_AAC11_MI325X_8node_bnxt_allreduce_ring", 4.0),
    # SHARP's in-network reduction is not modelled: the ring's price came within 2% while the IB ring
    # was priced 11-14% fast; with NCCL's per-step cost on the Simple ring (session 52) SHARP's
    # measured calls run 16% faster than the ring, as an in-network reduction should
    ("coreweave_H100_64gpu_sharp_allreduce", 16.5),
    ("nccltests_issue290_H100_1node_nvls_allreduce", 4.5),  # NVLS, checked on a second source (3.5% blind)
    ("nccl_issue1047_H100_1node_reducescatter_ring", 2.0),  # the NVSwitch ring, reduce_scatter (0.7% blind)
    ("ocigpuqs_mi355x_MI355X_1node_allreduce", 3.0),  # the fitted MI355X xGMI (1.4%; 6.7% on the assumed value)
    ("ocigpuqs_pollara_MI355X_1node_allreduce", 3.0),
    # NVLSTree, priced blind on it (3.2%; 28.3% on ring / tree); 6.2% once the Simple protocol's
    # per-chunk cost (fitted on Voltage Park's 4-node H100 ring, session 52) reached the tree too
    ("argonne_oci_H200_2node_allreduce", 6.5),
    ("twinanda_runai_nebius_H200_2node_allreduce", 6.0),  # the same (5.1%; 25.7%)
    # RCCL 2.26.6 with its internal plugin on the profile fitted with the ANP plugin (10.5%), one GPU a node (6.9%),
    # and RCCL's all-to-all share inside the node, fitted on ylerman's RCCL 2.28.3 run (15.2% blind, >= 64 MB)
    ("ahalperin_amddev_MI355X_2node_8gpu_allreduce", 11.5),
    ("ahalperin_amddev_MI355X_2node_1gpu_allreduce", 7.5),
    ("ahalperin_amddev_MI355X_1node_8gpu_alltoall", 7.5),
    ("ahalperin_amddev_MI355X_1node_4gpu_alltoall", 3.5),
    # one H100 node's NVSwitch, whole and half (xxrjun/nccl-tests-cluster, NCCL 2.28.7, blind: 1.0-7.0%)
    ("xxrjun_H100_1node_8gpu_allreduce", 4.0),
    ("xxrjun_H100_1node_4gpu_allreduce", 2.0),
    ("xxrjun_H100_1node_4gpu_reducescatter", 8.0),
])
def test_check_series_stay_within_their_figures(series, large_max):
    """Series no parameter was fitted to (>= 1 MB rows only: that is what they hold)."""
    assert _mape(series, accuracy_fabric.LARGE) <= large_max


def test_fit_series_in_sample():
    pollara = "hisohara_AAC14_MI355X_2node_Pollara_ANP_allreduce"
    assert _mape(pollara, accuracy_fabric.LARGE) <= 5.0
    assert _mape(pollara, 0, accuracy_fabric.LARGE) <= 7.0
    newer = "alibaba_readme_MI355X_2node_pollara_allreduce"  # mi355x-pollara-rccl227
    assert _mape(newer, accuracy_fabric.LARGE) <= 3.5
    assert _mape(newer, 0, accuracy_fabric.LARGE) <= 4.5
    assert _mape("alibaba_readme_MI355X_2node_pollara_alltoall", accuracy_fabric.LARGE) <= 7.0
    assert _mape("nccl_tests_issue322_H100_1024rank_roce_allreduce_ring_ll128", 4 << 30) <= 3.0
    assert _mape("nccl_tests_issue322_H100_1024rank_roce_allreduce_ring_ll128", 0, 4 << 30) <= 4.0  # the paced rows
    nvls = accuracy_fabric.nvls_rows()
    assert accuracy_fabric.mape(nvls, accuracy_fabric.LARGE) <= 8.0


def test_forced_paths_are_read_as_forced_and_priced_on_the_same_path():
    """amd-dev's NCCL_ALGO / NCCL_PROTO runs: each series carries its algorithm and protocol,
    and each point is priced on that path, not on the selector's pick (at 4 MB on 2 nodes
    perfsim's selector runs tree / LL128; forced ring / Simple prices differently)."""
    for nodes, algo, proto in accuracy_fabric.FORCED:
        points = accuracy_fabric.series_points(accuracy_fabric.forced_series(nodes, algo, proto))
        assert {(p.algorithm, p.protocol) for p in points} == {(algo, proto)}
        assert {p.shape.num_nodes for p in points} == {nodes} and len(points) >= 16
    ring = next(p for p in accuracy_fabric.series_points(accuracy_fabric.forced_series(2, "ring", "simple"))
                if p.size_bytes == 4 << 20)
    cluster = load_cluster(accuracy_fabric.FORCED_PROFILE)
    picked = collective_cost(Coll.ALL_REDUCE, ring.size_bytes, ring.shape, cluster)
    assert (picked.algorithm, picked.protocol) == ("tree", "ll128")
    assert fabric_fit.predict(ring, cluster) != pytest.approx(picked.time_s, rel=0.05)


def test_forced_paths_the_selector_runs_stay_within_their_figures():
    """The forced paths perfsim's selector runs on 2 nodes (tree / LL128 from 512 KB to 16 MB,
    ring / Simple from 128 MB) keep their figures; the table says where it runs each path."""
    rows = {(n, a, p): (errs, where) for n, a, p, errs, where in accuracy_fabric.forced_rows()}
    errs, where = rows[(2, "tree", "ll128")]
    assert accuracy_fabric.mape(errs, accuracy_fabric.LARGE) <= 10.0 and accuracy_fabric.mape(errs) <= 10.0
    assert where == "512 KB-16 MB"
    errs, where = rows[(2, "ring", "simple")]
    assert accuracy_fabric.mape(errs, 128 << 20) <= 5.0 and where == "128 MB-512 MB"
    assert rows[(2, "tree", "simple")][1] == "-"
    text = "\n".join(accuracy_fabric.forced_lines())
    assert text.count("\n| 2 |") == 6 and text.count("\n| 3 |") == 6


def test_section_is_markdown_naming_fit_and_check():
    text = accuracy_fabric.section()
    assert text.startswith("## Fabric")
    assert "| fit |" in text and "| check |" in text


def test_mi325x_two_node_ring_beats_one_node_as_measured():
    """The exception the measured data allows: hisohara AAC11 MI325X, NCCL_ALGO=Ring, 4-16 GB:
    16 ranks over 2 nodes (8 NICs + xGMI) finish before 8 ranks inside one node (xGMI only)."""
    one = series_rows("hisohara_AAC11_MI325X_1node_bnxt_allreduce_ring")
    two = series_rows("hisohara_AAC11_MI325X_2node_bnxt_allreduce_ring")
    for (size, t1), (_, t2) in zip(one, two):
        assert t2 < t1  # measured
        p1 = api.collective("all_reduce", size, 8, "mi325x-pollara", algorithm="ring")["time_us"]
        p2 = api.collective("all_reduce", size, 16, "mi325x-pollara", algorithm="ring")["time_us"]
        assert p2 < p1  # predicted


def series_rows(name):
    return [(int(p.size_bytes), p.time_s) for p in accuracy_fabric.series_points(name)]


def test_graph_capture_widens_the_one_shot_window_below_1_kib():
    """Captured, RCCL runs the one-shot kernel from 32 B (the hipGraph log: ~6 us at 32-512 B
    against ~16 us for the 16 B ring); uncaptured, from direct_min_bytes (1 KiB). A profile
    without a captured edge keeps the uncaptured window under capture too."""
    import dataclasses

    cluster = load_cluster("mi300x-pollara")
    s = GroupShape(size=8, per_node=8, num_nodes=1)
    tune = cluster.collectives
    assert tune.graph_direct_min_bytes is not None and tune.graph_direct_min_bytes < tune.direct_min_bytes
    for size in (64, 256, 512):
        assert collective_cost(Coll.ALL_REDUCE, size, s, cluster, graph=True).algorithm == "direct"
        assert collective_cost(Coll.ALL_REDUCE, size, s, cluster).algorithm != "direct"
    assert collective_cost(Coll.ALL_REDUCE, 8, s, cluster, graph=True).algorithm != "direct"
    plain = dataclasses.replace(cluster, collectives=dataclasses.replace(tune, graph_direct_min_bytes=None))
    assert collective_cost(Coll.ALL_REDUCE, 256, s, plain, graph=True).algorithm != "direct"
    with pytest.raises(ConfigError, match="graph_direct_min_bytes"):
        dataclasses.replace(tune, graph_direct_min_bytes=-1.0)


@pytest.mark.parametrize("value", ["[]", '"64"', "true"])
def test_an_optional_profile_number_of_the_wrong_type_is_one_line(tmp_path, value):
    """An optional number (``X | None``) given as a list, string or boolean in a profile is
    refused naming the key (TOML has no null: a present key must be the number)."""
    from perfsim.system.hardware import PROFILE_DIR

    text = (PROFILE_DIR / "clusters" / "mi300x-pollara.toml").read_text()
    assert "graph_direct_min_bytes = " in text
    lines = [f"graph_direct_min_bytes = {value}" if line.startswith("graph_direct_min_bytes = ") else line
             for line in text.splitlines()]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"graph_direct_min_bytes: expected a number"):
        load_cluster(str(path))


# ---- session 42: the tree's own network hop, the IB ramp below 64 MB, the Voltage Park series ----

def test_voltage_park_four_node_h100_series_stays_within_its_figures():
    """The one NVIDIA multi-node series with small and mid sizes (4 x 8 H100, IB, NCCL's
    default tuner). Blind on the flat IB ramp and the ring's hop it was 33.1% / 42.8% off
    (>= 1 MB / below); the tree hop and the borrowed ramp were set with it in view."""
    series = "voltagepark_H100_4node_allreduce"
    assert _mape(series, 0, accuracy_fabric.LARGE) <= 12.0
    assert _mape(series, accuracy_fabric.LARGE) <= 9.5  # 13.1% before the Simple step cost was fitted on it
    gather = "voltagepark_H100_4node_allgather"  # priced after the all_reduce series set the hop and ramp
    assert _mape(gather, 0, accuracy_fabric.LARGE) <= 38.0
    assert _mape(gather, accuracy_fabric.LARGE) <= 19.0  # 23.7% before


def test_tree_network_step_takes_its_own_hop_latency():
    """A tree across nodes prices its network steps at tree_inter_step_latency_us (NCCL's
    hwLat[NET][TREE]), a ring at inter_step_latency_us; None falls back to the ring's."""
    ib = load_cluster("h100-ib")
    assert ib.collectives.tree_inter_step_us == 5.0 and ib.collectives.inter_step_latency_us == 2.7
    four = GroupShape(size=32, per_node=8, num_nodes=4)
    tree = collective_cost(Coll.ALL_REDUCE, 8, four, ib, algorithm="tree")
    same = dataclasses.replace(ib, collectives=dataclasses.replace(ib.collectives, tree_inter_step_latency_us=None))
    ring_hop = collective_cost(Coll.ALL_REDUCE, 8, four, same, algorithm="tree")
    # 2 x log2(4) network steps, each 2.3 us longer
    assert tree.latency_s - ring_hop.latency_s == pytest.approx(4 * 2.3e-6, rel=1e-6)
    ring = collective_cost(Coll.ALL_REDUCE, 8, four, ib, algorithm="ring")
    assert ring.latency_s == pytest.approx(collective_cost(Coll.ALL_REDUCE, 8, four, same, algorithm="ring").latency_s)
    assert load_cluster("mi355x-pollara").collectives.tree_inter_step_latency_us is None  # the fitted ring hop


def test_a_tree_beyond_two_nodes_loads_each_nic_as_ncclss_trees_do():
    """NCCL's two trees (its binary tree and the mirror or shift of it) move half the buffer
    each, and a node's NIC carries that half once per link it has in a tree: two links on
    two nodes, three on three (both trees are chains there: 0-2-1 and its shift), four from
    four nodes on (a node with two children in one tree is a leaf of the other); so the
    bandwidth-bound time of a forced tree all_reduce grows 1.5x from 2 to 3 nodes and 2x to 4,
    the ring's does not, and a broadcast tree follows the same rule."""
    cluster = load_cluster("mi355x-pollara")
    assert [collectives.tree_nic_share(m) for m in (1, 2, 3, 4, 5, 8, 128, 1000)] == [1.0, 1.0, 1.5, 2, 2, 2, 2, 2]
    assert collectives._btree(3, 0) == (-1, (2,)) and collectives._btree(3, 2) == (0, (1,))
    assert collectives._btree(4, 2) == (0, (1, 3))  # two children: node 2 of 4
    size = 8 << 30

    def nic_bytes(coll, nodes):
        shape = GroupShape(size=8 * nodes, per_node=8, num_nodes=nodes)
        return sum(ph.inter_bytes for ph in collectives.tree(coll, size, shape, cluster))

    assert nic_bytes(Coll.ALL_REDUCE, 3) == 1.5 * nic_bytes(Coll.ALL_REDUCE, 2)
    assert nic_bytes(Coll.ALL_REDUCE, 4) == 2 * nic_bytes(Coll.ALL_REDUCE, 2)
    assert nic_bytes(Coll.BROADCAST, 4) == 2 * nic_bytes(Coll.BROADCAST, 2)
    two, four = (collective_cost(Coll.ALL_REDUCE, size, GroupShape(size=8 * m, per_node=8, num_nodes=m), cluster,
                                 algorithm="tree", protocol="simple") for m in (2, 4))
    assert four.inter_s == pytest.approx(2 * two.inter_s, rel=0.01)
    rings = [collective_cost(Coll.ALL_REDUCE, size, GroupShape(size=8 * m, per_node=8, num_nodes=m), cluster,
                             algorithm="ring", protocol="simple").time_s for m in (2, 4)]
    assert rings[1] < 1.1 * rings[0]


def test_inside_one_mi355x_node_small_all_reduces_run_rcclss_tree_not_a_one_shot_kernel():
    """Both public logs that print RCCL's choice inside one MI355X node (RCCL 2.28.3 and
    2.26.6) run TREE/LL up to 256 KB, not a one-shot kernel: the gfx950 profiles have no
    direct window (a ring over the node's chain, the same 2 (n - 1) steps), so a 64 KB
    all_reduce costs at least its 14 intra-node steps; MI300X keeps the window fitted to
    its hipGraph / no-graph logs."""
    shape = GroupShape(size=8, per_node=8, num_nodes=1)
    for name in ("mi355x-pollara", "mi355x-pollara-rccl227", "mi350x-pollara"):
        cluster = load_cluster(name)
        tune = cluster.collectives
        assert tune.direct_min_bytes == tune.direct_max_bytes == 0.0
        cost = collective_cost(Coll.ALL_REDUCE, 64 << 10, shape, cluster)
        assert cost.algorithm == "ring" and cost.latency_s >= 14 * units.us_to_s(tune.intra_step_latency_us)
    mi300x = load_cluster("mi300x-pollara")
    assert collective_cost(Coll.ALL_REDUCE, 64 << 10, shape, mi300x).algorithm == "direct"


def test_all_gather_runs_rcclss_direct_path_inside_one_mi355x_node():
    """RCCL runs all_gather on its Direct path at every size below 16 MB inside one MI355X
    node (ylerman-dn/amd-dev's tuner log): the gfx950 profiles give all_gather a direct window
    of its own (to 8 MiB) while all_reduce has none; the window is inside a node only, other
    collectives keep their rings, and a bad window is refused by name."""
    cluster = load_cluster("mi355x-pollara-rccl227")
    one = GroupShape(size=8, per_node=8, num_nodes=1)
    assert cluster.collectives.direct_windows == {"all_gather": 8 << 20}
    picks = {s: collective_cost(Coll.ALL_GATHER, s, one, cluster).algorithm for s in (4 << 10, 8 << 20, 16 << 20)}
    assert picks == {4 << 10: "direct", 8 << 20: "direct", 16 << 20: "ring"}
    assert collective_cost(Coll.REDUCE_SCATTER, 1 << 20, one, cluster).algorithm == "ring"
    two = GroupShape(size=16, per_node=8, num_nodes=2)
    assert collective_cost(Coll.ALL_GATHER, 1 << 20, two, cluster).algorithm == "ring"
    direct = collective_cost(Coll.ALL_GATHER, 4 << 20, one, cluster)
    ring = collective_cost(Coll.ALL_GATHER, 4 << 20, one, cluster, algorithm="ring")
    assert direct.time_s < ring.time_s
    tune = cluster.collectives
    with pytest.raises(ConfigError, match="direct_windows: 'all_reduce'"):
        dataclasses.replace(tune, direct_windows={"all_reduce": 1.0})
    with pytest.raises(ConfigError, match="direct_windows.all_gather must be > 0"):
        dataclasses.replace(tune, direct_windows={"all_gather": 0.0})


def test_negative_tree_hop_is_refused():
    ib = load_cluster("h100-ib")
    with pytest.raises(ConfigError, match="tree_inter_step_latency_us"):
        dataclasses.replace(ib.collectives, tree_inter_step_latency_us=-1.0)


def test_ib_ramp_below_its_measured_knot_follows_the_measured_rdma_ramp():
    """Below IB's one measured knot (64 MB) the ramp is the shape of the Pollara ramp as fitted
    to AAC14 (validation/fit_fabric.py IB_RAMP_DONOR_*) scaled to that knot (borrowed_ramp), not flat: a 64 KB NIC message is far from
    line rate, and the 64 MB knot is unchanged."""
    from validation import fit_fabric

    ib, pollara = load_cluster("h100-ib").fabric, fit_fabric.ib_ramp_donor()
    assert message_efficiency(ib, 64 << 20) == pytest.approx(0.9323)
    assert message_efficiency(ib, 64 << 10) < 0.1
    own = dataclasses.replace(ib, message_kbytes=ib.message_kbytes[-1:], message_efficiency=ib.message_efficiency[-1:])
    kbytes, eff = fit_fabric.borrowed_ramp(pollara, own)
    assert kbytes == ib.message_kbytes and eff == pytest.approx(ib.message_efficiency, abs=1e-4)
    assert load_cluster("h200-ib").fabric.message_efficiency == ib.message_efficiency


def test_low_latency_dispatch_is_not_priced_on_the_collective_ramp():
    """DeepEP's low-latency kernels write each expert copy from the GPU: the fabric's
    per-message ramp (an RCCL/NCCL collective's) does not slow them; the library
    all-to-all still pays it."""
    from perfsim.cost import dispatch

    ib = load_cluster("h100-ib")
    flat = dataclasses.replace(ib, fabric=dataclasses.replace(ib.fabric, message_kbytes=(1.0,), message_efficiency=(1.0,)))
    load = dispatch.DispatchLoad(tokens=128, token_bytes=7168, topk=8, num_experts=256)
    shape16 = GroupShape(size=16, per_node=8, num_nodes=2)
    assert dispatch.dispatch_cost(load, shape16, ib, "deepep-ll").time_s == pytest.approx(
        dispatch.dispatch_cost(load, shape16, flat, "deepep-ll").time_s)


def test_refitting_the_ring_hop_moves_the_profiles_tree_hop_in_ratio():
    """calibrate's fabric fit sets the network hop; a profile with its own tree hop keeps the
    tree / ring ratio it ships (NCCL's 5.0 / 2.7), and one without keeps none."""
    import numpy as np

    from perfsim.calibration import fabric_fit

    ib = load_cluster("h100-ib")
    k = len(fabric_fit.KNOTS_KB)
    theta = np.concatenate([np.full(k, 0.9), [5.4, 0.0]])
    fitted = fabric_fit.with_params(ib, theta, "test").collectives
    assert fitted.inter_step_latency_us == 5.4 and fitted.tree_inter_step_latency_us == pytest.approx(10.0)
    pollara = fabric_fit.with_params(load_cluster("mi355x-pollara"), theta, "test").collectives
    assert pollara.tree_inter_step_latency_us is None and pollara.tree_inter_step_us == 5.4


def test_a_fabric_fit_never_ends_worse_than_the_profile_it_was_given():
    """The fit also starts from the profile's own ramp, hop and floor, so calibrating on a
    series the profile already prices well cannot make it worse (on Voltage Park's 4-node H100
    series from h100-ib it had gone 12.1% -> 15.3% MAPE before that start was added)."""
    from perfsim.calibration import fabric_fit

    points = accuracy_fabric.series_points("voltagepark_H100_4node_allreduce")
    fit = fabric_fit.fit_fabric(points, load_cluster("h100-ib"))
    assert fit.mape_after <= fit.mape_before + 1e-9
    assert fit.cluster.collectives.tree_inter_step_latency_us / fit.cluster.collectives.inter_step_latency_us == \
        pytest.approx(5.0 / 2.7, rel=1e-3)


# ---- session 43: RCCL's own algorithm set, its network post overhead, the newer RCCL's ramp ----

@pytest.mark.parametrize("value", ['"no"', "1", "[]"])
def test_a_hierarchical_flag_that_is_not_a_boolean_is_one_line_exit_2(tmp_path, value):
    from perfsim.system.hardware import PROFILE_DIR

    text = (PROFILE_DIR / "clusters" / "mi355x-pollara.toml").read_text()
    assert "\nhierarchical = false\n" in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace("\nhierarchical = false\n", f"\nhierarchical = {value}\n"))
    with pytest.raises(ConfigError, match="hierarchical"):
        load_cluster(str(path))
    out = subprocess.run([sys.executable, "-m", "perfsim", "collective", "--op", "reduce_scatter", "--gpus", "16",
                          "--cluster", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "hierarchical" in out.stderr


def test_forcing_the_hierarchical_algorithm_still_prices_it_where_the_selector_leaves_it_out():
    cluster = load_cluster("mi355x-pollara")
    s = GroupShape(size=64, per_node=8, num_nodes=8)
    forced = collective_cost(Coll.ALL_GATHER, 1 << 20, s, cluster, algorithm="hierarchical")
    assert forced.algorithm == "hierarchical"
    assert collective_cost(Coll.ALL_GATHER, 1 << 20, s, cluster).algorithm == "ring"
    row = api.collective("all_gather", 1 << 20, 64, "mi355x-pollara", algorithm="hierarchical")
    assert row["time_us"] == pytest.approx(forced.time_s * 1e6, rel=1e-6)


def test_rccl_all_to_all_reaches_the_nic_at_large_sizes():
    """The alibaba README's 2-node alltoall reaches 97% of the 400 Gb/s line rate at 16 GB
    (busbw 91 GB/s); the RCCL all-to-all is priced there, not at the acceptance floor's half
    (on the newer RCCL's profile; the RCCL 2.26 profile's ramp tops out 7% lower)."""
    row = api.collective("all_to_all", 16 << 30, 16, "mi355x-pollara-rccl227")
    assert row["busbw_GBps"] == pytest.approx(91.1, rel=0.05)
    older = api.collective("all_to_all", 16 << 30, 16, "mi355x-pollara")
    assert older["busbw_GBps"] == pytest.approx(row["busbw_GBps"] * 0.8989 / 0.9644, rel=0.01)


def test_the_newer_rccl_profile_differs_from_its_base_only_in_its_ramp_and_hop():
    base, newer = load_cluster("mi355x-pollara"), load_cluster("mi355x-pollara-rccl227")
    assert newer.name == "mi355x-pollara-rccl227" and newer.gpu == base.gpu and newer.node == base.node
    assert newer.fabric.message_efficiency != base.fabric.message_efficiency
    assert dataclasses.replace(newer.fabric, message_efficiency=base.fabric.message_efficiency,
                               message_source=base.fabric.message_source, source=base.fabric.source) == base.fabric
    assert dataclasses.replace(newer.collectives, inter_step_latency_us=base.collectives.inter_step_latency_us,
                               source=base.collectives.source) == base.collectives
    # mid sizes: the newer RCCL's 2-node all_reduce is faster (as both its sources measured)
    assert (api.collective("all_reduce", 8 << 20, 16, newer)["time_us"]
            < 0.8 * api.collective("all_reduce", 8 << 20, 16, base)["time_us"])


def test_mi355x_usable_xgmi_is_the_fit_and_prices_another_source_within_its_figure():
    """The MI355X node's usable xGMI bandwidth is fit_xgmi's value on amd-dev's bandwidth-bound
    single-node rows (RCCL 2.28), and it prices the OCI single-node 8-16 GB all_reduce (another
    source, RCCL 2.26.6) within 3%; the assumed 56.2 GB/s priced it 6-7% slow."""
    from validation import fit_fabric

    node = load_cluster("mi355x-pollara").node
    bw, _, fit_after, _, check_after = fit_fabric.fit_xgmi()
    assert node.link_bw_GBps == pytest.approx(bw, abs=0.01)
    assert load_cluster("mi350x-pollara").node.link_bw_GBps == node.link_bw_GBps  # the same links, carried
    assert fit_after < 3 and check_after < 3
    oci = [p for name in fit_fabric.XGMI_CHECKS for p in accuracy_fabric.series_points(name)]
    slow = fit_fabric.with_link_bw(load_cluster("mi355x-pollara"), 56.2)
    assert all(collective_cost(p.coll, p.size_bytes, p.shape, slow).time_s > 1.05 * p.time_s for p in oci)
    assert node.link_bw_GBps < node.link_bw_raw_GBps


def test_a_fit_that_reaches_one_knot_keeps_the_profiles_other_knots():
    """A series whose message sizes reach only the top knot (the 1,024-rank IB ring's 4-16 GB
    rows) refits that knot and leaves the profile's others as they were: they hold values
    fitted to other data (fabric_fit's start at the profile keeps unmoved knots; before session
    44 they were refilled from the fitted knot, flattening a measured ramp)."""
    from perfsim.calibration import fabric_fit
    from validation import fit_fabric

    cluster = load_cluster("h100-ib").with_nodes(128)
    points = [p for p in accuracy_fabric.series_points(fit_fabric.IB_FIT) if p.size_bytes >= fit_fabric.IB_MIN_BYTES]
    fit = fabric_fit.fit_fabric(points, cluster, min_knot_kb=fit_fabric.IB_MIN_KNOT_KB, fit_hop=False, fit_floor=False)
    own = [message_efficiency(cluster.fabric, kb * units.KB) for kb in fabric_fit.KNOTS_KB]
    new = fit.cluster.fabric.message_efficiency
    assert list(new[:-1]) == pytest.approx(own[:-1], abs=1e-4)
    assert new[0] < 0.01 < 0.9 < new[-1]  # a ramp, not flat at the top knot's value
    assert fit.mape_after <= fit.mape_before + 1e-9


def test_a_collective_over_part_of_a_node_reaches_less_of_each_link():
    """MI355X's node profile: a ring over 2 or 4 of the node's GPUs reaches about 0.74-0.76 of the
    usable link bandwidth the whole node reaches (fitted to a single-node 2- and 4-GPU sweep);
    a 1 GB all_reduce over 2 GPUs moves S over one link, so it takes S / (0.7386 x 60.81 GB/s)
    plus its latency; over all 8 the link bandwidth is the fitted one."""
    cluster = load_cluster("mi355x-pollara")
    node = cluster.node
    assert node.group_gpus == (2, 4, 8) and node.group_link_efficiency[-1] == 1.0
    assert node.group_link_Bps(8) == node.link_Bps and node.group_link_Bps(2) == pytest.approx(0.7386 * node.link_Bps)
    assert node.group_link_Bps(3) == pytest.approx((0.7386 + 0.7558) / 2 * node.link_Bps)
    two = collective_cost(Coll.ALL_REDUCE, 1 << 30, GroupShape(size=2, per_node=2, num_nodes=1), cluster)
    simple = cluster.collectives.protocols["simple"].bw_efficiency
    assert two.time_s == pytest.approx((1 << 30) / (node.group_link_Bps(2) * simple), rel=0.02)
    plain = dataclasses.replace(cluster, node=dataclasses.replace(node, group_gpus=(), group_link_efficiency=(),
                                                                  group_nics=()))
    assert collective_cost(Coll.ALL_REDUCE, 1 << 30, GroupShape(size=2, per_node=2, num_nodes=1), plain).time_s \
        == pytest.approx(two.time_s * 0.7386, rel=0.02)
    whole = GroupShape(size=8, per_node=8, num_nodes=1)
    assert collective_cost(Coll.ALL_REDUCE, 1 << 30, whole, cluster).time_s == collective_cost(
        Coll.ALL_REDUCE, 1 << 30, whole, plain).time_s
    assert load_cluster("mi300x-pollara").node.group_gpus == ()  # no MI300X measurement of part of a node
    # every pair at once (all-to-all, one-shot): the full link, as the same groups' alltoalls measure it
    pair = GroupShape(size=4, per_node=4, num_nodes=1)
    assert collective_cost(Coll.ALL_TO_ALL, 1 << 30, pair, cluster).time_s == collective_cost(
        Coll.ALL_TO_ALL, 1 << 30, pair, plain).time_s


def test_the_group_link_fit_reproduces_the_shipped_values():
    from validation import fit_fabric

    effs, mapes, before, after = fit_fabric.fit_group_links()
    node = load_cluster("mi355x-pollara").node
    assert [*effs.values(), 1.0] == list(node.group_link_efficiency) and [*effs, 8] == list(node.group_gpus)
    assert all(b < a for a, b in mapes.values()) and after < before
    eff, before, after, chk_before, chk_after = fit_fabric.fit_alltoall_intra()
    assert eff == load_cluster("mi355x-pollara").dispatch["rccl"].intra_efficiency == \
        load_cluster("mi355x-pollara-rccl227").dispatch["rccl"].intra_efficiency == \
        load_cluster("mi350x-pollara").dispatch["rccl"].intra_efficiency
    assert after < before and chk_after < chk_before  # fitted on one source, checked on another


def test_a_ring_over_two_gpus_of_each_mi355x_node_crosses_on_one_nic():
    """RCCL's rings over 2 GPUs of each MI355X node leave and enter the node on one NIC (read from
    Ahalperin/amd-dev's debug logs; 48 GB/s bus bandwidth on that source and on MIT ORCD's run):
    the NIC carries the whole ring share, where one NIC per GPU halved it; 4 and 8 GPUs a node and
    1 keep one NIC per GPU; a node profile without the table (MI300X) keeps one per GPU."""
    cluster = load_cluster("mi355x-pollara")
    node = cluster.node
    assert [node.ring_nics(g) for g in (1, 2, 3, 4, 8)] == [1, 1, 3, 4, 8]
    plain = dataclasses.replace(cluster, node=dataclasses.replace(node, group_nics=()))
    two = GroupShape(size=4, per_node=2, num_nodes=2)
    for coll in (Coll.ALL_REDUCE, Coll.ALL_GATHER, Coll.REDUCE_SCATTER):
        ring_one = collectives.ring(coll, 1 << 30, two, cluster)[0]
        ring_two = collectives.ring(coll, 1 << 30, two, plain)[0]
        assert ring_one.inter_bytes == pytest.approx(2 * ring_two.inter_bytes)
    tree_one, tree_two = (collectives.tree(Coll.ALL_REDUCE, 1 << 30, two, c)[0] for c in (cluster, plain))
    assert tree_one.inter_bytes == pytest.approx(2 * tree_two.inter_bytes)
    big = collective_cost(Coll.ALL_REDUCE, 8 << 30, two, cluster)
    busbw = 8 * (1 << 30) / big.time_s * 2 * 3 / 4 / 1e9
    assert 40 < busbw < 52  # one 400G NIC's worth (measured 48.7 GB/s on ORCD's run, 48 on Ahalperin's)
    assert collective_cost(Coll.ALL_REDUCE, 8 << 30, two, plain).time_s < 0.6 * big.time_s
    four = GroupShape(size=8, per_node=4, num_nodes=2)
    assert collective_cost(Coll.ALL_REDUCE, 1 << 30, four, cluster).time_s == collective_cost(
        Coll.ALL_REDUCE, 1 << 30, four, plain).time_s
    assert load_cluster("mi300x-pollara").node.ring_nics(2) == 2  # no MI300X measurement
    from perfsim.system.hardware import cluster_provenance
    rows = {table: status for table, status, _ in cluster_provenance(cluster)}
    assert rows["node.group_nics"] == "measured" and "node.group_nics" not in {
        t for t, _, _ in cluster_provenance(load_cluster("mi300x-pollara"))}


@pytest.mark.parametrize("cells, message", [
    (dict(group_nics=[1, 4]), "one value per group_gpus entry"),
    (dict(group_nics=[3, 4, 8]), "between 1 and the group's GPU count"),
    (dict(group_nics=[0, 4, 8]), "between 1 and the group's GPU count"),
    (dict(group_gpus=[2, 4], group_link_efficiency=[0.7]), "must have the same length"),
    (dict(group_gpus=[4, 2], group_link_efficiency=[0.7, 0.8]), "increasing GPU counts >= 2"),
    (dict(group_gpus=[1], group_link_efficiency=[0.7]), "increasing GPU counts >= 2"),
    (dict(group_gpus=[2], group_link_efficiency=[1.5]), "group_link_efficiency must be in (0, 1]"),
])
def test_a_bad_group_link_table_is_one_clear_error(cells, message):
    node = load_cluster("mi355x-pollara").node
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        dataclasses.replace(node, **{k: tuple(v) for k, v in cells.items()})


# ---- session 52: NCCL's Simple protocol pays a cost per ring step across whole nodes ----

def _simple_cost(cluster, cost_us):
    return cluster.with_protocol("simple", ring_step_cost_us=cost_us)


def test_simple_ring_pays_its_step_cost_per_loop_across_whole_nodes():
    """h100-ib's Simple protocol (fitted on Voltage Park's 4-node ring): each of a ring's
    2(n-1) steps pays ring_step_cost_us once per loop of ring_loop_bytes a rank a step, on
    top of the bytes: a 4-node all_reduce below one loop (256 MB: 8 MB a step) pays the
    same as at one full loop (1 GB), and 8 GB (eight loops) eight times that; LL128, one
    node, part of each node and a profile without the cost pay nothing."""
    ib = load_cluster("h100-ib")
    simple = ib.collectives.protocols["simple"]
    assert simple.ring_step_cost_us > 0 and simple.ring_loop_bytes == 32 << 20
    free = _simple_cost(ib, 0.0)
    four = shape(32)

    def extra(size, grp=four, proto="simple", cluster=ib, algo="ring"):
        kw = dict(protocol=proto, algorithm=algo)
        return (collective_cost(Coll.ALL_REDUCE, size, grp, cluster, **kw).time_s
                - collective_cost(Coll.ALL_REDUCE, size, grp, _simple_cost(cluster, 0.0), **kw).time_s)

    step = simple.ring_step_cost_us * 1e-6
    assert extra(256 << 20) == pytest.approx(62 * step, rel=1e-6)
    assert extra(1 << 30) == pytest.approx(62 * step, rel=1e-6)
    assert extra(8 << 30) == pytest.approx(8 * 62 * step, rel=1e-6)
    assert extra(1 << 30, proto="ll128") == 0.0
    assert extra(1 << 30, grp=shape(8)) == 0.0
    assert extra(1 << 30, grp=GroupShape(size=16, per_node=4, num_nodes=4)) == 0.0
    assert extra(1 << 30, cluster=load_cluster("mi355x-pollara")) == 0.0
    # a tree pays it once per chunk its busiest node's NICs move: NVLSTree on 4 nodes, 2 S of them
    nvls = extra(8 << 30, algo="nvls_tree")
    assert nvls == pytest.approx(step * 2 * (8 << 30) / simple.ring_loop_bytes, rel=1e-6)
    # the measured 4-node rings: 256 MB takes longer per byte than 512 MB and 1 GB (one loop of
    # smaller chunks), which the cost reproduces and a bandwidth factor alone cannot
    assert collective_cost(Coll.ALL_REDUCE, 8 << 30, four, ib).algorithm == "ring"
    per_byte = {s: collective_cost(Coll.ALL_REDUCE, s, four, ib, algorithm="ring").time_s / s for s in (256 << 20, 1 << 30)}
    assert per_byte[256 << 20] > 1.05 * per_byte[1 << 30]
    assert collective_cost(Coll.ALL_REDUCE, 1 << 30, four, free).time_s < collective_cost(Coll.ALL_REDUCE, 1 << 30, four, ib).time_s


def test_a_step_cost_without_loop_bytes_or_negative_is_refused(tmp_path):
    simple = load_cluster("h100-ib").collectives.protocols["simple"]
    with pytest.raises(ConfigError, match="ring_loop_bytes"):
        dataclasses.replace(simple, ring_loop_bytes=0.0)
    with pytest.raises(ConfigError, match="ring_step_cost_us"):
        dataclasses.replace(simple, ring_step_cost_us=-1.0)
    from perfsim.system.hardware import PROFILE_DIR

    text = (PROFILE_DIR / "clusters" / "h100-ib.toml").read_text()
    assert "\nring_loop_bytes = 33554432.0\n" in text
    for bad in ("-1.0", '"big"', "nan"):
        path = tmp_path / "bad.toml"
        path.write_text(text.replace("\nring_loop_bytes = 33554432.0\n", f"\nring_loop_bytes = {bad}\n"))
        out = subprocess.run([sys.executable, "-m", "perfsim", "collective", "--op", "all_reduce", "--gpus", "32",
                              "--cluster", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "ring_loop_bytes" in out.stderr


@pytest.mark.parametrize("series, large_max", [
    # blind checks of the Simple step cost (fitted on Voltage Park's rows): before -> after it
    ("nccltests309_gjaion_H100_2node_ib_allreduce", 10.0),  # 12.1 -> 9.5
    ("nccltests309_gjaion_H100_4node_ib_allreduce", 18.0),  # 23.2 -> 17.3
    ("nccltests309_gjaion_H100_8node_ib_allreduce", 18.5),  # 23.2 -> 17.7
    ("nccltests309_qoofyk_H100_2node_cx7ib_allreduce", 8.0),  # 9.9 -> 7.5
    ("xxrjun_cluster01_H100_10node_8gpn_all_reduce", 13.5),  # 19.5 -> 13.1
    ("xxrjun_cluster01_H100_10node_4gpn_all_reduce", 9.0),  # part of each node: unchanged (8.7)
])
def test_ib_series_with_the_simple_step_cost(series, large_max):
    assert _mape(series, accuracy_fabric.LARGE) <= large_max
