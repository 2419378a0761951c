"""Megatron-Core's --moe-shared-expert-overlap (plan.shared_expert_overlap): the shared experts
on their own stream beside the dispatch and combine all-to-alls, in both passes, priced alike by
both estimators, from the API, the CLI, a Megatron command line, a runs CSV, the search and
the planner."""

import json

import pytest

import perfsim
from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.errors import ConfigError
from perfsim.lowering.graph import block_passes
from perfsim.lowering.layers import LayerBuilder
from perfsim.plan.megatron import from_args

MODEL = "deepseek-v2-lite"  # 64 routed experts + 2 shared, layer 0 dense
KNOBS = dict(tp=2, ep=8, gbs=64, seq=4096, stack="megatron-primus", check_memory=False)


def _chain(steps):
    return [(s.name, bool(dict(s.meta).get("offchain")), bool(dict(s.meta).get("join"))) for s in steps]


def test_the_shared_mlp_runs_beside_the_dispatch_and_the_combine_in_both_passes():
    model = perfsim.load_model(MODEL)
    plan = perfsim.make_plan(16, tp=2, ep=8, gbs=64, seq=4096, stack="megatron-primus", shared_expert_overlap=True)
    fwd, bwd, _ = block_passes(LayerBuilder(model, plan), plan, 1)
    names = [n for n, _, _ in _chain(fwd)]
    at = names.index("dispatch_a2a")
    assert _chain(fwd)[at:at + 6] == [("dispatch_a2a", True, False), ("shared_ag", False, False),
                                      ("shared_up", False, False), ("shared_act", False, False),
                                      ("dispatch_a2a_wait", False, True), ("local_sort", False, False)]
    at = names.index("combine_a2a")
    assert _chain(fwd)[at:at + 5] == [("combine_a2a", True, False), ("shared_down", False, False),
                                      ("shared_rs", False, False), ("combine_a2a_wait", False, True),
                                      ("unpermute", False, False)]
    names = [n for n, _, _ in _chain(bwd)]
    at = names.index("combine_a2a_bwd")  # the down projection's gradients beside the combine's
    assert _chain(bwd)[at - 1:at + 4] == [("unpermute_bwd", False, False), ("combine_a2a_bwd", True, False),
                                          ("shared_rs_bwd", False, False), ("shared_down_bwd", False, False),
                                          ("combine_a2a_bwd_wait", False, True)]
    at = names.index("dispatch_a2a_bwd")
    assert _chain(bwd)[at:at + 5] == [("dispatch_a2a_bwd", True, False), ("shared_act_bwd", False, False),
                                      ("shared_up_bwd", False, False), ("shared_ag_bwd", False, False),
                                      ("dispatch_a2a_bwd_wait", False, True)]
    plain = perfsim.make_plan(16, tp=2, ep=8, gbs=64, seq=4096, stack="megatron-primus")
    pf, pb, _ = block_passes(LayerBuilder(model, plain), plain, 1)
    assert sorted(s.name for s in pf) == sorted(n for n in [s.name for s in fwd] if not n.endswith("_wait"))
    assert sorted(s.name for s in pb) == sorted(n for n in [s.name for s in bwd] if not n.endswith("_wait"))
    dense = block_passes(LayerBuilder(model, plan), plan, 0)  # a dense layer: nothing to overlap
    assert [s.name for s in dense[0]] == [s.name for s in block_passes(LayerBuilder(model, plain), plain, 0)[0]]


@pytest.mark.parametrize("tp_comm_overlap", [False, True])
def test_both_estimators_price_it_alike(tp_comm_overlap):
    """Alike in both estimators; without TP-comm overlap it hides exchange time. With it, the
    shared MLP's TP gather and scatter leave the TP-comm overlap for the shared stream (as
    Megatron-Core runs them under this flag), so the two together need not gain."""
    knobs = dict(KNOBS, tp_comm_overlap=tp_comm_overlap)
    off = [perfsim.simulate(MODEL, "mi300x-pollara", nodes=2, estimator=e, **knobs) for e in ("analytic", "des")]
    on = [perfsim.simulate(MODEL, "mi300x-pollara", nodes=2, estimator=e, shared_expert_overlap=True, **knobs)
          for e in ("analytic", "des")]
    assert on[0].step_time_s == pytest.approx(on[1].step_time_s, rel=0.01)
    assert on[0].plan["shared_expert_overlap"] is True
    plan = perfsim.make_plan(16, tp=2, ep=8, gbs=64, seq=4096, shared_expert_overlap=True)
    assert "shared-expert-overlap" in plan.describe()
    if not tp_comm_overlap:
        assert on[0].step_time_s < off[0].step_time_s and on[1].step_time_s < off[1].step_time_s
        assert on[0].breakdown["ep_a2a"] < off[0].breakdown["ep_a2a"]  # the exchange now hidden in part


def test_without_expert_parallelism_it_changes_nothing():
    knobs = dict(KNOBS, ep=1, nodes=2)
    off = perfsim.estimate(MODEL, "mi300x-pollara", **knobs)
    on = perfsim.estimate(MODEL, "mi300x-pollara", shared_expert_overlap=True, **knobs)
    assert on.step_time_s == off.step_time_s


@pytest.mark.parametrize("model, extra, needle", [
    ("llama3.1-8b", dict(ep=1), "shared_expert_overlap needs an MoE model with shared experts; llama3.1-8b is dense"),
    ("olmoe-1b-7b", {}, "shared_expert_overlap needs a model with shared experts; olmoe-1b-7b has none"),
    (MODEL, dict(recompute="selective", recompute_modules=("shared_experts",)), "refuses it beside the shared_experts"),
    (MODEL, dict(tp=1, ep_comm_overlap=True), "beside ep_comm_overlap"),
])
def test_where_it_cannot_run_is_one_clear_error(model, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        perfsim.estimate(model, "mi300x-pollara", nodes=2, shared_expert_overlap=True, **{**KNOBS, **extra})


def test_cli_megatron_and_runs_csv_reach_the_plan(capsys, tmp_path):
    args = ["simulate", "--model", MODEL, "--nodes", "2", "--tp", "2", "--ep", "8", "--gbs", "64", "--seq", "4096",
            "--engine", "analytic", "--stack", "megatron-primus", "--shared-expert-overlap", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["shared_expert_overlap"] is True
    assert main([a if a != MODEL else "olmoe-1b-7b" for a in args[:-1]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shared_expert_overlap needs a model with shared experts" in err[0]
    assert main([a if a != MODEL else "llama3.1-8b" for a in args[:-1] if a not in ("--ep", "8")]) == 2
    assert "--shared-expert-overlap" in capsys.readouterr().err  # an MoE-only flag on a dense model
    got = from_args("pretrain_gpt.py --moe-shared-expert-overlap --expert-model-parallel-size 8")
    assert got.knobs["shared_expert_overlap"] is True and got.knobs["ep"] == 8
    # a Megatron command line naming it for a model without shared experts: ignored, as Megatron-Core does
    olmoe = ["simulate", "--model", "olmoe-1b-7b", "--nodes", "1", "--gbs", "32", "--seq", "4096", "--engine",
            "analytic", "--json", "--megatron-args", "--moe-shared-expert-overlap --expert-model-parallel-size 8"]
    assert main(olmoe) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["plan"]["shared_expert_overlap"] is False
    assert "ignored --moe-shared-expert-overlap: olmoe-1b-7b has no shared experts" in out.err
    header = "id,source_id,source,stack,model,cluster,nodes,tp,ep,mbs,gbs,seq,shared_expert_overlap,metric,measured"
    path = tmp_path / "runs.csv"
    path.write_text(header + f"\nR1,a,https://example.org,megatron-primus,{MODEL},mi300x-pollara,2,2,8,1,64,4096,"
                    "true,tokens_per_s_per_gpu,10000\n")
    (case,) = read_runs(path)
    assert dict(case.knobs)["shared_expert_overlap"] is True


def test_search_applies_it_to_every_plan_but_its_ep_overlap_variants(capsys):
    from perfsim.search import search

    common = dict(gpus=[16], gbs=64, seq=4096, top=50, confirm=0, executor="serial",
                  fixed={"tp": [1], "pp": [1], "cp": [1], "ep": [8], "ep_comm_overlap": (False, True)},
                  limits={"mbs": 1})
    got = search(MODEL, "mi300x-pollara", plan_knobs={"shared_expert_overlap": True}, **common)
    assert got.rows
    for row in got.rows:  # the EP-overlap variants drop it (plan validation refuses both)
        assert row.plan["shared_expert_overlap"] is (not row.plan["ep_comm_overlap"])
    argv = ["search", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--gpus", "16", "--gbs", "64",
            "--seq", "4096", "--shared-expert-overlap"]
    assert main(argv) == 2
    assert "--shared-expert-overlap: olmoe-1b-7b has no shared experts" in capsys.readouterr().err


def test_the_planner_offers_it_for_models_with_shared_experts_only():
    from conftest import plan_page

    at, planner_inputs = plan_page({"estimator": "analytic", "model": MODEL, "cluster": "mi300x-pollara", "nodes": 2,
                                    "knobs": {"tp": 2, "pp": 1, "dp": 0, "ep": 8, "gbs": 64, "seq": 4096}})
    at.toggle(key="w.shared_expert_overlap").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["shared_expert_overlap"] is True
    assert planner_inputs.simulate(inputs).plan["shared_expert_overlap"] is True
    assert planner_inputs.search_switches(inputs, perfsim.load_model(MODEL))["shared_expert_overlap"] is True
    at, _ = plan_page({"estimator": "analytic", "model": "olmoe-1b-7b", "cluster": "mi300x-pollara", "nodes": 1,
                       "knobs": {"tp": 1, "pp": 1, "dp": 0, "ep": 8, "gbs": 32, "seq": 4096},
                       "fidelity": {"shared_expert_overlap": True}})  # a stored choice the model cannot take
    assert not at.exception and not [t for t in at.toggle if t.key == "w.shared_expert_overlap"]
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["shared_expert_overlap"] is False
