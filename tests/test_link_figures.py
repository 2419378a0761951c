"""Report.links from the two estimators: the closed form counts every collective the
engine puts on a link, pipeline sends included (they cross the NIC when stages sit on
different nodes), so a link's busy time agrees between them."""

import pytest

import perfsim

PLAN = dict(nodes=4, tp=2, pp=2, ep=4, dp=8, zero=1, mbs=1, gbs=64, seq=4096)


def test_link_busy_agrees_with_pipeline_sends_across_nodes():
    des = perfsim.simulate("mixtral-8x7b", "mi300x-pollara", **PLAN)
    closed = perfsim.estimate("mixtral-8x7b", "mi300x-pollara", **PLAN)
    assert des.comm_by_collective["pp_p2p/send_recv"]["links"]["nic"] > 0  # the sends cross the NIC
    for link in ("nic", "xgmi"):
        assert closed.links[link]["busy_s"] == pytest.approx(des.links[link]["busy_s"], rel=0.01), link
    assert "nic" in closed.comm_by_collective["pp_p2p/send_recv"]["links"]


@pytest.mark.parametrize("estimate", [perfsim.simulate, perfsim.estimate], ids=["engine", "closed_form"])
def test_utilization_is_busy_over_the_step(estimate):
    """Also where the engine extends two short runs to the step's microbatches (a share of
    the step is recomputed from the extended busy and step times, not extended itself)."""
    r = estimate("llama3.1-8b", "mi300x-pollara", nodes=2, tp=8, gbs=16, seq=4096)
    assert r.links["nic"]["busy_s"] > 0
    for v in r.links.values():
        assert v["utilization"] == pytest.approx(v["busy_s"] / r.step_time_s)


def test_nvidia_reports_name_the_intra_node_link_nvlink():
    nv = perfsim.estimate("llama3.1-8b", "h100-ib", nodes=2, tp=8, gbs=16, seq=4096)
    amd = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=2, tp=8, gbs=16, seq=4096)
    assert set(nv.links) == {"nic", "nvlink"} and set(amd.links) == {"nic", "xgmi"}
    assert any("nvlink" in e.get("links", {}) for e in nv.comm_by_collective.values())
    assert not any("xgmi" in e.get("links", {}) for e in nv.comm_by_collective.values())
