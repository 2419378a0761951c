"""network: topology as data, equal paths, ECMP collisions, max-min fair sharing."""

import dataclasses

import pytest

from perfsim.system import network
from perfsim.system.hardware import FabricTopology, Multipath, Routing, load_cluster

CLUSTER = load_cluster("mi300x-pollara")


def fabric(**kw):
    return dataclasses.replace(CLUSTER, fabric=dataclasses.replace(CLUSTER.fabric, **kw))


def test_node_is_full_xgmi_mesh_with_one_nic_per_gpu():
    g = network.build_topology(CLUSTER, num_nodes=2)
    gpu = ("gpu", 0, 3)
    xgmi = [v for v in g.successors(gpu) if g.edges[gpu, v]["tier"] == network.XGMI]
    assert len(xgmi) == 7
    assert ("nic", 0, 3) in g.successors(gpu)
    assert g.edges[gpu, xgmi[0]]["capacity_Bps"] == CLUSTER.node.link_Bps


@pytest.mark.parametrize("topology", list(FabricTopology))
def test_every_topology_connects_nics_across_leaves(topology):
    import networkx as nx

    cl = fabric(topology=topology, nodes_per_leaf=2)
    g = network.build_topology(cl, num_nodes=4)
    assert nx.has_path(g, ("nic", 0, 0), ("nic", 3, 0))
    if topology is FabricTopology.RAILS_ONLY:  # rails never meet outside the node
        assert not nx.has_path(g.subgraph(n for n in g if n[0] != "gpu"), ("nic", 0, 0), ("nic", 3, 1))


def test_equal_paths_shrink_with_oversubscription():
    assert network.equal_paths(CLUSTER) == CLUSTER.fabric.nodes_per_leaf
    assert network.equal_paths(fabric(oversubscription=4.0)) == CLUSTER.fabric.nodes_per_leaf // 4


def test_ecmp_collisions_are_deterministic_and_at_least_one():
    a = network.ecmp_collision_factor(32, 64, seed=0)
    assert a == network.ecmp_collision_factor(32, 64, seed=0)
    assert a > 2.0
    assert network.ecmp_collision_factor(1, 64) == 1.0
    assert network.ecmp_collision_factor(100_000, 8) < 1.05  # many flows even out


def test_uplink_rate_spray_vs_hash_vs_oversubscription():
    spray = network.uplink_Bps(CLUSTER, 128, 0.5)
    assert spray == pytest.approx(CLUSTER.fabric.nic_Bps)
    single = fabric(routing=Routing.ECMP_HASH, multipath=Multipath.SINGLE, multipath_paths=1)
    assert network.uplink_Bps(single, 128, 0.5) < spray / 2
    assert network.uplink_Bps(fabric(oversubscription=4.0), 128, 0.5) == pytest.approx(spray / 2)


def test_out_of_order_multipath_removes_hash_collisions_at_a_reorder_cost():
    """UEC / Pollara multipath: each flow hashes as many sub-flows, so ECMP collisions
    even out; the reorder cost is the profile's reorder_efficiency."""
    single = fabric(routing=Routing.ECMP_HASH, multipath=Multipath.SINGLE, multipath_paths=1)
    multi = fabric(routing=Routing.ECMP_HASH, multipath=Multipath.OUT_OF_ORDER, multipath_paths=16)
    rates = [network.uplink_Bps(c, 128, 0.5) for c in (single, multi)]
    assert rates[1] > 2 * rates[0]
    assert rates[1] == pytest.approx(CLUSTER.fabric.nic_Bps)
    lossy = dataclasses.replace(multi, fabric=dataclasses.replace(multi.fabric, reorder_efficiency=0.9))
    assert network.uplink_Bps(lossy, 128, 0.5) == pytest.approx(0.9 * rates[1])
    one_flow = network.uplink_Bps(single, 128, 1 / 64)  # a lone flow never collides
    assert one_flow == pytest.approx(CLUSTER.fabric.nic_Bps)


def test_rank_ordered_rings_cross_a_leaf_once_per_leaf():
    assert network.neighbour_cross_fraction(CLUSTER, 64) == 0.0
    assert network.neighbour_cross_fraction(CLUSTER, 128) == pytest.approx(2 / 128)
    assert network.neighbour_cross_fraction(CLUSTER, 128) < network.cross_leaf_fraction(CLUSTER, 128)


def test_cross_leaf_fraction():
    assert network.cross_leaf_fraction(CLUSTER, 64) == 0.0
    assert 0.4 < network.cross_leaf_fraction(CLUSTER, 128) < 0.6


def test_max_min_rates():
    alone = network.max_min_rates({1: {"nic": 1.0}})
    assert alone == {1: 1.0}
    shared = network.max_min_rates({1: {"nic": 1.0}, 2: {"nic": 1.0}})
    assert shared == pytest.approx({1: 0.5, 2: 0.5})
    # flow 2 is limited elsewhere; flow 1 takes what is left of the shared link
    mixed = network.max_min_rates({1: {"nic": 1.0}, 2: {"nic": 0.5, "x": 1.0}, 3: {"x": 1.0}})
    assert mixed[2] == pytest.approx(0.5) and mixed[3] == pytest.approx(0.5)
    assert mixed[1] == pytest.approx(0.75)
    disjoint = network.max_min_rates({1: {"a": 0.3}, 2: {"b": 1.0}})
    assert disjoint == {1: 1.0, 2: 1.0}
