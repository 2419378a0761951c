"""Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers): the first
and last stage hold a set number of layers, the others split the rest evenly; both
estimators, the memory model and the CLI follow."""

import dataclasses
import json

import pytest

import perfsim
from perfsim import api
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.lowering.graph import build_graph
from perfsim.lowering.memory import plan_memory
from perfsim.plan.parallel import ParallelPlan, check_plan
from perfsim.plan.sharding import stage_layer_ids

MODEL = perfsim.load_model("llama3.1-8b")  # 32 layers
KNOBS = dict(gbs=64, seq=4096, tp=2, pp=4)


def plan(**extra):
    return perfsim.make_plan(32, **KNOBS, **extra)


def test_layers_per_stage():
    assert [len(stage_layer_ids(MODEL, plan(), s)) for s in range(4)] == [8, 8, 8, 8]
    uneven = plan(first_stage_layers=5, last_stage_layers=9)
    ids = [stage_layer_ids(MODEL, uneven, s) for s in range(4)]
    assert [len(i) for i in ids] == [5, 9, 9, 9] and sum(ids, []) == list(range(32))
    graph = build_graph(MODEL, uneven, 1)
    assert {op.layer for op in graph.ops if op.stage == 0 and op.layer >= 0} == set(range(5))


def test_both_estimators_agree_and_the_heavier_stage_sets_the_pace():
    even, heavy = plan(), plan(first_stage_layers=4, last_stage_layers=4)  # middle stages hold 12
    for p in (even, heavy):
        closed = perfsim.estimate(MODEL, "mi300x-pollara", p, gpus=32, check_memory=False)
        engine = perfsim.simulate(MODEL, "mi300x-pollara", p, gpus=32, check_memory=False)
        assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.03)
    slow = perfsim.simulate(MODEL, "mi300x-pollara", heavy, gpus=32, check_memory=False)
    fast = perfsim.simulate(MODEL, "mi300x-pollara", even, gpus=32, check_memory=False)
    assert slow.step_time_s > fast.step_time_s and slow.critical_stage in (1, 2)


def test_memory_follows_the_layers():
    light_first = plan_memory(MODEL, plan(first_stage_layers=2, last_stage_layers=10))
    even = plan_memory(MODEL, plan())
    assert light_first[0].weights_bytes < even[0].weights_bytes


@pytest.mark.parametrize("extra, match", [
    (dict(first_stage_layers=7, last_stage_layers=6), "split the remaining 19"),
    (dict(first_stage_layers=40), "remaining -8"),
])
def test_impossible_splits_name_the_fields(extra, match):
    with pytest.raises(ConfigError, match=match):
        perfsim.estimate(MODEL, "mi300x-pollara", plan(**extra), gpus=32)


def test_needs_a_pipeline_and_an_interleaved_or_v_schedule_under_vpp():
    with pytest.raises(ConfigError, match="first_stage_layers"):
        perfsim.make_plan(8, gbs=8, seq=1024, first_stage_layers=4)
    for schedule in ("gpipe", "zb-h1"):  # their chunked orders assume even chunks
        with pytest.raises(ConfigError, match="interleaved or a V-shape"):
            perfsim.make_plan(8, gbs=8, seq=1024, pp=2, vpp=2, last_stage_layers=4, schedule=schedule)
    assert perfsim.make_plan(8, gbs=8, seq=1024, pp=2, vpp=2, last_stage_layers=4).last_stage_layers == 4


# ---- uneven virtual stages under the interleaved schedule (Megatron --decoder-first/last-
# pipeline-num-layers, or --account-for-embedding/loss-in-pipeline-split, with a virtual pipeline)


def test_interleaved_first_and_last_virtual_stages_hold_their_counts():
    """Chunk-major round robin: virtual stage c*pp + s on stage s; the first virtual stage
    (stage 0, chunk 0) and the last (stage pp-1, chunk vpp-1) hold the set counts."""
    from perfsim.plan.schedules import stage_layers

    uneven = perfsim.make_plan(32, gbs=64, seq=4096, tp=2, pp=4, vpp=3, first_stage_layers=1, last_stage_layers=1)
    chunks = [[len(stage_layers(32, 4, 3, s, c, 1, 1, uneven.schedule)) for c in range(3)] for s in range(4)]
    assert chunks == [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 1]]
    ids = sorted(sum((stage_layer_ids(MODEL, uneven, s) for s in range(4)), []))
    assert ids == list(range(32))


@pytest.mark.parametrize("cluster", ["h100-ib", "mi300x-pollara"])
def test_interleaved_uneven_stages_agree_in_both_estimators(cluster):
    """Both estimators price uneven chunks alike; a 10-layer first chunk beside 2-layer ones
    paces the pipeline and is slower than 1-layer end chunks beside 3-layer ones."""
    knobs = dict(gbs=32, seq=2048, tp=1, pp=4, vpp=3, mbs=1, schedule="interleaved")
    times = {}
    for name, extra in (("ends", dict(first_stage_layers=1, last_stage_layers=1)),
                        ("heavy", dict(first_stage_layers=10))):
        plan = perfsim.make_plan(16, **knobs, **extra)
        closed = perfsim.estimate(MODEL, cluster, plan, gpus=16, check_memory=False)
        engine = perfsim.simulate(MODEL, cluster, plan, gpus=16, check_memory=False)
        assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.01)
        times[name] = closed.step_time_s
    assert times["heavy"] > times["ends"]


def test_megatron_accounting_of_embedding_and_loss_sets_the_end_virtual_stages():
    """Megatron's --account-for-embedding/loss-in-pipeline-split split layers + embedding +
    loss evenly, so the first and last virtual stages hold one layer fewer: Llama-3.1-405B's
    126 layers over PP 8 x VP 8 -> 1 + 62 x 2 + 1; with one slot per virtual stage the first
    and last hold none (the embedding alone, the loss alone)."""
    from perfsim.plan import megatron
    from perfsim.plan.sharding import chunk_layers

    plan = megatron.from_args("--pipeline-model-parallel-size 8 --virtual-pipeline-model-parallel-size 8 "
                              "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    knobs = plan.knobs_for(126)
    assert knobs["account_for_embedding"] and knobs["account_for_loss"] and "first_stage_layers" not in knobs
    assert not plan.not_modelled
    model = api.load_model("llama3.1-405b")
    parallel = ParallelPlan(tp=8, pp=8, vpp=8, dp=1, mbs=1, gbs=64, seq=4096, schedule="interleaved",
                            account_for_embedding=True, account_for_loss=True)
    counts = [len(chunk_layers(model, parallel, s, c)) for c in range(8) for s in range(8)]
    assert counts == [1] + [2] * 62 + [1]
    with pytest.raises(ConfigError, match="the model's 32 layers \\+ the embedding and loss \\(2\\) must split evenly"):
        check_plan(dataclasses.replace(parallel, tp=1, dp=8), api.load_model("llama3.1-8b"), 64)
    explicit = megatron.from_args("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
                                  "--account-for-loss-in-pipeline-split")
    assert "account_for_loss" not in explicit.knobs_for(32)
    assert "account_for_loss_in_pipeline_split" in dict(explicit.not_modelled)


def test_a_virtual_stage_may_hold_the_embedding_or_the_loss_alone_in_both_estimators():
    """Qwen3-30B-A3B's 48 layers + embedding + loss over PP 2 x VP 25: one slot each, so the
    first virtual stage holds only the embedding and the last only the loss (Megatron's
    account-for flags on a deep virtual pipeline, the ModelZoo's A2A plan); the closed form
    agrees with the engine, and the plan says so in its label."""
    from perfsim.plan.sharding import chunk_layers

    knobs = dict(model="qwen3-30b-a3b", cluster="h100-ib", nodes=2, tp=1, pp=2, vpp=25, ep=8, mbs=1, gbs=16, seq=2048,
                 schedule="interleaved", account_for_embedding=True, account_for_loss=True, check_memory=False)
    closed, engine = api.simulate(estimator="analytic", **knobs), api.simulate(estimator="des", **knobs)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.01)
    plan = ParallelPlan(tp=1, pp=2, vpp=25, dp=8, ep=8, mbs=1, gbs=16, seq=2048, schedule="interleaved",
                        account_for_embedding=True, account_for_loss=True)
    model = api.load_model("qwen3-30b-a3b")
    assert len(chunk_layers(model, plan, 0, 0)) == 0 and len(chunk_layers(model, plan, 1, 24)) == 0
    assert sum(len(chunk_layers(model, plan, s, c)) for s in range(2) for c in range(25)) == 48
    assert "account-embedding+loss" in plan.describe()
    for bad, match in ((dict(first_stage_layers=1), "both set the pipeline split"),
                       (dict(pp=1, vpp=1, dp=16), "need pp > 1")):
        with pytest.raises(ConfigError, match=match):
            dataclasses.replace(plan, **bad)


def test_cli_flags(capsys):
    assert main(["simulate", "--model", "llama3.1-8b", "--gpus", "32", "--tp", "2", "--pp", "4", "--gbs", "64",
                 "--seq", "4096", "--first-stage-layers", "6", "--last-stage-layers", "6", "--engine", "analytic"]) == 0
    assert "first_stage_layers=6 last_stage_layers=6" in capsys.readouterr().out


# ---- recompute by layer count (Megatron --recompute-method block --recompute-num-layers N) ----


def test_recompute_only_the_first_layers_of_each_stage():
    from perfsim.plan.parallel import Recompute
    from perfsim.plan.sharding import recomputes

    p = plan(recompute="full", recompute_layers=2)
    assert [recomputes(MODEL, p, layer) for layer in range(10)] == [Recompute.FULL] * 2 + [Recompute.NONE] * 6 + \
        [Recompute.FULL] * 2
    runs = {n: perfsim.simulate(MODEL, "mi300x-pollara", plan(recompute="full", recompute_layers=n), gpus=32,
                                check_memory=False) for n in (1, 2, 8)}
    full = perfsim.simulate(MODEL, "mi300x-pollara", plan(recompute="full"), gpus=32, check_memory=False)
    assert runs[1].step_time_s < runs[2].step_time_s < runs[8].step_time_s == pytest.approx(full.step_time_s)
    assert runs[1].peak_memory_bytes > runs[2].peak_memory_bytes > runs[8].peak_memory_bytes
    for n, r in runs.items():
        closed = perfsim.estimate(MODEL, "mi300x-pollara", plan(recompute="full", recompute_layers=n), gpus=32,
                                  check_memory=False)
        assert closed.step_time_s == pytest.approx(r.step_time_s, rel=0.01)
        assert closed.breakdown["recompute"] == pytest.approx(r.breakdown["recompute"], rel=1e-6)


def test_recompute_layers_needs_a_recompute():
    with pytest.raises(ConfigError, match="recompute_layers"):
        plan(recompute_layers=2)


def test_an_even_split_that_does_not_divide_points_at_the_uneven_one():
    # Llama 3.1 405B's 126 layers over 4 stages: 30 on the ends and 33 between fits, as the hint says
    with pytest.raises(ConfigError, match=r"must divide the model's layers \(126\); first_stage_layers / last_stage_layers"):
        perfsim.simulate("llama3.1-405b", "h100-ib", nodes=4, tp=8, pp=4, gbs=16, seq=8192, estimator="analytic",
                         check_memory=False)
    r = perfsim.simulate("llama3.1-405b", "h100-ib", nodes=4, tp=8, pp=4, gbs=16, seq=8192, estimator="analytic",
                         check_memory=False, first_stage_layers=30, last_stage_layers=30)
    assert r.step_time_s > 0 and r.plan["first_stage_layers"] == 30


def test_account_for_flags_from_the_cli_the_runs_csv_and_the_planner(tmp_path, capsys):
    """--account-for-embedding / --account-for-loss reach the plan; a runs CSV states them;
    the planner's toggles price the plan with them."""
    argv = ["simulate", "--model", "qwen3-30b-a3b", "--cluster", "h100-ib", "--nodes", "2", "--pp", "2", "--vpp", "25",
            "--schedule", "interleaved", "--ep", "8", "--gbs", "16", "--seq", "2048", "--engine", "analytic", "--json"]
    assert main(argv + ["--account-for-embedding", "--account-for-loss"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["account_for_embedding"] is True and report["plan"]["account_for_loss"] is True
    assert main(argv) == 2  # 48 layers over 50 virtual stages: refused, one line
    assert "plan.pp*vpp (2*25) must divide the model's layers (48)" in capsys.readouterr().err
    from perfsim.design.runs import read_runs

    path = tmp_path / "runs.csv"
    path.write_text("id,source_id,source,stack,model,cluster,nodes,pp,vpp,schedule,ep,mbs,gbs,seq,account_for_embedding,"
                    "account_for_loss,metric,measured\nr1,s,x,ideal,qwen3-30b-a3b,h100-ib,2,2,25,interleaved,8,1,16,2048,"
                    "true,true,step_time_s,1.0\n")
    knobs = dict(read_runs(path)[0].knobs)
    assert knobs["account_for_embedding"] is True and knobs["account_for_loss"] is True


def test_planner_toggles_reach_the_plan():
    from conftest import plan_page

    at, planner_inputs = plan_page({"estimator": "analytic", "model": "qwen3-30b-a3b", "cluster": "h100-ib", "nodes": 2,
                                    "knobs": {"pp": 2, "vpp": 25, "dp": 0, "ep": 8, "gbs": 16, "seq": 2048,
                                              "schedule": "interleaved"}})
    at.toggle(key="w.account_for_embedding").set_value(True).run()
    at.toggle(key="w.account_for_loss").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["account_for_embedding"] and inputs["fidelity"]["account_for_loss"]
    plan = planner_inputs.simulate(inputs).plan
    assert plan["account_for_embedding"] is True and plan["account_for_loss"] is True
