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
