"""The MoE dispatch implementation as a plan knob (issue 15): ``plan.dispatch`` prices a
training step's dispatch/combine all-to-all in both estimators, the CLI and search take
it, and bad values fail with one line naming the field."""

import pytest

import perfsim
from perfsim.cli import main
from perfsim.cost.dispatch import implementations
from perfsim.errors import ConfigError
from perfsim.plan.parallel import ParallelPlan
from perfsim.search import search
from perfsim.search.space import build_space, knob_values
from perfsim.system.hardware import load_cluster

A2A = "ep_a2a/all_to_all"


def a2a_by_ep(estimator: str, impl: str, cluster: str = "mi300x-pollara", **knobs) -> list[float]:
    run = getattr(perfsim, estimator)
    out = []
    for ep in (8, 16, 32, 64):
        r = run("deepseek-v3", cluster, gpus=64, tp=1, pp=1, ep=ep, dp=64, gbs=64, seq=4096, mbs=1,
                check_memory=False, dispatch=impl, **knobs)
        out.append(r.comm_by_collective[A2A]["total_s"])
    return out


@pytest.mark.parametrize("estimator", ["estimate", "simulate"])
@pytest.mark.parametrize("impl", ["alltoall", "mori"])
def test_ep_across_nodes_grows_with_nodes_spanned_with_overlapped_gradients(estimator, impl):
    """64-GPU DeepSeek-V3 with EP over 1, 2, 4, 8 nodes and gradient reduction overlapped
    (the default): the step's all-to-all grows with the nodes EP spans, in both estimators
    and under both the library all-to-all and MORI's per-node dedup."""
    a2a = a2a_by_ep(estimator, impl)
    assert a2a == sorted(a2a)
    assert a2a[1] > 1.5 * a2a[0]  # leaving the node: xGMI -> NIC


@pytest.mark.parametrize("estimator", ["estimate", "simulate"])
def test_dedup_dispatch_costs_less_across_nodes_than_the_library_all_to_all(estimator):
    """MORI sends a token once per remote node (not once per remote expert copy) at its
    fitted RDMA efficiency: cheaper than RCCL's all-to-all once EP leaves the node."""
    lib = a2a_by_ep(estimator, "alltoall", overlap_grad_reduce=False)
    mori = a2a_by_ep(estimator, "mori", overlap_grad_reduce=False)
    assert all(m < a for m, a in zip(mori[1:], lib[1:]))
    # the profile's rccl table is the library's default: naming it changes nothing
    assert a2a_by_ep(estimator, "rccl", overlap_grad_reduce=False) == pytest.approx(lib)


def test_estimators_agree_on_the_dispatch_without_contention():
    for impl in ("mori", "alltoall"):
        closed = a2a_by_ep("estimate", impl, overlap_grad_reduce=False)
        engine = a2a_by_ep("simulate", impl, overlap_grad_reduce=False)
        assert closed == pytest.approx(engine, rel=1e-6)


def test_deepep_kernels_on_nvidia():
    normal = a2a_by_ep("estimate", "deepep", "h100-ib", overlap_grad_reduce=False)
    low_latency = a2a_by_ep("estimate", "deepep-ll", "h100-ib", overlap_grad_reduce=False)
    assert normal == sorted(normal)
    # the low-latency kernels send every (token, expert) copy: more NIC bytes than per-node dedup
    assert all(ll > n for ll, n in zip(low_latency[1:], normal[1:]))


def test_the_dispatch_changes_only_the_all_to_all():
    base = perfsim.estimate("deepseek-v3", "mi300x-pollara", gpus=64, ep=16, gbs=64, seq=4096, check_memory=False)
    mori = perfsim.estimate("deepseek-v3", "mi300x-pollara", gpus=64, ep=16, gbs=64, seq=4096, check_memory=False,
                            dispatch="mori")
    for key in base.comm_by_collective:
        if key != A2A:
            assert mori.comm_by_collective[key]["total_s"] == pytest.approx(base.comm_by_collective[key]["total_s"])
    assert mori.comm_by_collective[A2A]["total_s"] < base.comm_by_collective[A2A]["total_s"]
    assert mori.plan["dispatch"] == "mori" and "dispatch-mori" in ParallelPlan(gbs=8, seq=8, dispatch="mori").describe()


def test_bad_dispatch_values_name_the_field():
    with pytest.raises(ConfigError, match="plan.dispatch"):
        ParallelPlan(gbs=8, seq=8, dispatch="Not A Name")
    with pytest.raises(ConfigError, match=r"plan.dispatch: 'mori' is not a dispatch implementation of h100-ib"):
        perfsim.estimate("deepseek-v2-lite", "h100-ib", gpus=16, ep=16, gbs=16, seq=1024, check_memory=False,
                         dispatch="mori")
    assert implementations(load_cluster("h100-ib")) == ("alltoall", "deepep", "deepep-ll")


def test_cli_dispatch_flag(capsys):
    args = ["simulate", "--model", "deepseek-v2-lite", "--gpus", "16", "--ep", "16", "--gbs", "16", "--seq", "1024",
            "--engine", "analytic", "--allow-oom", "--json"]
    assert main(args + ["--dispatch", "mori"]) == 0
    assert '"dispatch": "mori"' in capsys.readouterr().out
    assert main(args + ["--cluster", "h100-ib", "--dispatch", "mori"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "plan.dispatch" in err[0] and "'mori'" in err[0]


def test_search_tries_the_dispatch_only_where_there_is_expert_parallelism():
    from perfsim import load_model

    model = load_model("deepseek-v2-lite")
    space = build_space(model, 8, fixed={"dispatch": ["alltoall", "mori"]})
    assert space.dispatch == ("alltoall", "mori")
    assert knob_values(space, ParallelPlan(gbs=16, seq=1024, dp=16, ep=16))[2] == ("alltoall", "mori")
    assert knob_values(space, ParallelPlan(gbs=16, seq=1024, dp=16, ep=1))[2] == ("alltoall",)
    assert knob_values(build_space(model, 8), ParallelPlan(gbs=16, seq=1024, dp=16, ep=16))[2] == ("alltoall",)
    with pytest.raises(ConfigError, match="fixed.dispatch"):
        build_space(model, 8, fixed={"dispatch": [3]})
    result = search(model, "mi300x-pollara", gpus=16, gbs=16, seq=1024, top=50, confirm=0, workers=1,
                    fixed={"tp": 1, "pp": 1, "ep": 16, "zero": 1, "mbs": 1, "dispatch": ["alltoall", "mori"]})
    found = {r.plan["dispatch"]: r.step_time_s for r in result.rows}
    assert set(found) == {"alltoall", "mori"} and found["mori"] < found["alltoall"]
    with pytest.raises(ConfigError, match="plan.dispatch"):
        search(model, "h100-ib", gpus=16, gbs=16, seq=1024, confirm=0, workers=1, fixed={"dispatch": ["mori"]})
