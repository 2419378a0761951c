"""Multi-token prediction (plan.mtp_layers, Megatron --mtp-num-layers) and Megatron's custom
pipeline layout (plan.pipeline_layout, --pipeline-model-parallel-layout): both estimators,
the memory model, Megatron's flags, the CLI, the runs CSV and the planner."""

import dataclasses
import json

import pytest

import perfsim
from perfsim import api
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.lowering.graph import build_graph
from perfsim.lowering.memory import plan_memory
from perfsim.plan import layout, megatron
from perfsim.plan.parallel import ParallelPlan, check_plan
from perfsim.plan.sharding import chunk_layers, layer_params, stage_layer_ids

LITE = api.load_model("deepseek-v2-lite")  # 27 layers, the first dense, the rest MoE
DSV3_LAYOUT = "Et|(tt|)*30mL"  # Megatron-Bridge's DeepSeek-V3 layout at PP 8 VP 4


def lite(estimator: str, **knobs):
    base = dict(model="deepseek-v2-lite", cluster="mi300x-pollara", nodes=3, tp=1, pp=3, ep=8, gbs=48, mbs=1, seq=4096,
                check_memory=False, estimator=estimator)
    return api.simulate(**{**base, **knobs})


def test_the_layout_string_expands_as_megatron_documents_it():
    stages = layout.parse(DSV3_LAYOUT)
    assert len(stages) == 32 and stages[0] == "Et" and stages[-1] == "mL" and set(stages[1:-1]) == {"tt"}
    assert layout.stage_counts(DSV3_LAYOUT) == (1,) + (2,) * 30 + (1,)
    # Megatron's user-guide example: commas are cosmetic, x*N repeats a symbol, an empty stage is legal
    assert layout.parse("Et*3|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert layout.parse("E||t|L") == ("E", "", "t", "L")


@pytest.mark.parametrize("bad, match", [
    ("Et|tx|L", "unknown symbol 'x'"),
    ("t|Et|L", "the embedding E must appear once, first in the first stage"),
    ("Et|L|t", "the loss L must appear once, last in the last stage"),
    ("Em|tL", "every MTP layer m must come after every decoder layer t"),
    ("E(t|)*3L*", "not part of a repeat"),
    ("E(t|)*999999L", "repeat count 999,999"),
    ("E((((t)*99999)*99999)*99999)L", "expands to more than 1,000,000 symbols"),  # nested repeats: refused unexpanded
    ("Et*99999" + "t*99999" * 11 + "L", "expands to more than 1,000,000 symbols"),
    ("", "must be a layout string"),
])
def test_a_bad_layout_is_one_clear_error(bad, match):
    with pytest.raises(ConfigError, match="plan.pipeline_layout") as err:
        layout.parse(bad)
    assert match in str(err.value)


def test_the_plan_checks_the_layout_against_pp_vpp_the_mtp_layers_and_the_model():
    plan = ParallelPlan(tp=2, pp=8, vpp=4, dp=64, ep=64, gbs=8192, seq=4096, schedule="interleaved", mtp_layers=1,
                        pipeline_layout=DSV3_LAYOUT)
    check_plan(plan, api.load_model("deepseek-v3"), 1024)
    with pytest.raises(ConfigError, match=r"has 32 stages; pp\*vpp = 8\*2 = 16 .*set vpp 4"):
        dataclasses.replace(plan, vpp=2)
    with pytest.raises(ConfigError, match="places 1 MTP layer"):
        dataclasses.replace(plan, mtp_layers=0)
    with pytest.raises(ConfigError, match="both set|all set"):
        dataclasses.replace(plan, account_for_loss=True)
    with pytest.raises(ConfigError, match="plan.pipeline_layout must be a layout string"):
        dataclasses.replace(plan, pipeline_layout=["Et", "L"])
    with pytest.raises(ConfigError, match="places 61 decoder layers t; the model has 27"):
        check_plan(plan, LITE, 1024)
    with pytest.raises(ConfigError, match=r"plan.mtp_layers \(1,000,000\) must be at most the model's layers \(27\)"):
        api.simulate(LITE, "mi300x-pollara", nodes=3, pp=3, ep=8, gbs=48, seq=4096, mtp_layers=10**6,
                     estimator="analytic", check_memory=False)


def test_mtp_layers_follow_the_decoder_layers_on_the_last_virtual_stage():
    plan = ParallelPlan(pp=3, dp=8, ep=8, gbs=48, seq=4096, mtp_layers=1)
    ids = [stage_layer_ids(LITE, plan, s) for s in range(3)]
    assert ids[0] == list(range(9)) and ids[1] == list(range(9, 18)) and ids[2] == list(range(18, 28))
    # an MTP layer: a layer like the model's last (MoE here) plus its projection and norms
    dense, expert = layer_params(LITE, 27)
    last_dense, last_expert = layer_params(LITE, 26)
    assert expert == last_expert and dense - last_dense == 2 * LITE.hidden_size ** 2 + 3 * LITE.hidden_size
    graph = build_graph(LITE, plan, 1)
    assert {op.stage for op in graph.ops if op.layer == 27} == {2}
    assert any(op.name == "mtp_eh_proj" and op.stage == 2 for op in graph.ops)
    heads = [op for op in graph.ops if op.name.endswith("lm_head")]
    assert {op.name for op in heads} == {"lm_head", "mtp1_lm_head"}  # one LM head more for the MTP depth
    from perfsim.plan.sharding import mtp_stages

    assert mtp_stages(LITE, plan) == {2} and mtp_stages(LITE, dataclasses.replace(plan, mtp_layers=0)) == set()
    laid = ParallelPlan(pp=2, vpp=3, dp=8, ep=8, gbs=32, seq=4096, schedule="interleaved", mtp_layers=1,
                        pipeline_layout="Et*4|t*5|t*5|t*5|t*8m|L")
    assert mtp_stages(LITE, laid) == {0}  # virtual stage 4 is stage 0's third chunk


def test_a_layout_places_the_mtp_layer_where_it_says():
    plan = ParallelPlan(pp=2, vpp=3, dp=8, ep=8, gbs=32, seq=4096, schedule="interleaved", mtp_layers=1,
                        pipeline_layout="Et*4|t*5|t*5|t*5|t*8m|L")
    held = {(s, c): list(chunk_layers(LITE, plan, s, c)) for s in range(2) for c in range(3)}
    # virtual stages in forward order: (0,0), (1,0), (0,1), (1,1), (0,2), (1,2)
    assert held[(0, 0)] == list(range(4)) and held[(1, 0)] == list(range(4, 9))
    assert held[(0, 2)] == list(range(19, 28)) and held[(1, 2)] == []  # the MTP layer (27) with the last decoder layers
    check_plan(plan, LITE, 16)
    closed = api.simulate(LITE, "mi300x-pollara", plan, gpus=16, estimator="analytic", check_memory=False)
    engine = api.simulate(LITE, "mi300x-pollara", plan, gpus=16, estimator="des", check_memory=False)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.01)


def test_mtp_costs_time_and_memory_on_its_stage_in_both_estimators():
    base = {e: lite(e) for e in ("analytic", "des")}
    mtp = {e: lite(e, mtp_layers=1) for e in ("analytic", "des")}
    for r in (base, mtp):
        assert r["analytic"].step_time_s == pytest.approx(r["des"].step_time_s, rel=0.01)
    assert mtp["des"].step_time_s > 1.05 * base["des"].step_time_s  # the last stage sets the pace
    plan = ParallelPlan(pp=3, dp=8, ep=8, gbs=48, seq=4096)
    before, after = plan_memory(LITE, plan), plan_memory(LITE, dataclasses.replace(plan, mtp_layers=1))
    assert after[0].total_bytes == pytest.approx(before[0].total_bytes)  # the first stage holds no MTP
    assert after[2].weights_bytes > before[2].weights_bytes  # the MTP layer and its embedding copy
    assert after[2].logits_bytes == pytest.approx(2 * before[2].logits_bytes)
    assert after[2].activations_bytes > before[2].activations_bytes


def _syncs(model, plan):
    """{stage: bytes} of the embedding-group gradient all-reduces in the step's graph."""
    graph = build_graph(model, plan, num_microbatches=plan.pp)
    return {op.stage: op.collective.size_bytes for op in graph.ops if op.category == "embedding_grad_sync"}


def test_the_embedding_copy_gradients_are_all_reduced_between_its_stages():
    """Megatron-Core's finalize_model_grads all-reduces the word-embedding gradients over its
    embedding group (a first-stage rank and its last-stage peer) where another stage holds a
    copy of the table: the MTP layers' embedding, or a head tied to the embedding; after the
    data-parallel reduction, before the clip and the optimizer, in both estimators."""
    plan = ParallelPlan(pp=3, dp=8, ep=8, gbs=48, seq=4096, mtp_layers=1)
    table = LITE.vocab_size * LITE.hidden_size * 2  # BF16 gradients, tp 1
    assert _syncs(LITE, plan) == {0: pytest.approx(table), 2: pytest.approx(table)}  # not the middle stage
    assert _syncs(LITE, dataclasses.replace(plan, mtp_layers=0)) == {}  # untied, no MTP: no copy to sync
    assert _syncs(LITE, dataclasses.replace(plan, tp=2, dp=4)) == {0: pytest.approx(table / 2),
                                                                     2: pytest.approx(table / 2)}
    tied = dataclasses.replace(api.load_model("llama3.1-8b"), tied_embeddings=True)
    dense = ParallelPlan(pp=4, dp=2, gbs=16, seq=4096)
    assert set(_syncs(tied, dense)) == {0, 3}
    assert _syncs(tied, dataclasses.replace(dense, pp=1, dp=8)) == {}  # one stage holds the one table
    assert _syncs(tied, dataclasses.replace(dense, pp=2, dp=4, vpp=2, schedule="zbv")) == {}  # head on stage 0
    graph = build_graph(LITE, plan, num_microbatches=3)
    chain = [op.name for op in graph.ops if op.stage == 0 and op.category in ("embedding_grad_sync", "optimizer")]
    assert chain[0] == "embedding_grad_ar" and chain[-1] == "optimizer_step"
    timed = {e: lite(e, mtp_layers=1) for e in ("analytic", "des")}
    assert timed["analytic"].step_time_s == pytest.approx(timed["des"].step_time_s, rel=0.01)
    assert timed["des"].breakdown["embedding_grad_sync"] > 0


def test_a_layout_that_matches_the_account_for_split_prices_the_same_step():
    """Megatron's account-for-embedding split of 27 layers over 2 x 2 virtual stages (7 slots
    each, the first a layer short) written as a layout: the same plan, the same step."""
    knobs = dict(nodes=2, pp=2, vpp=2, gbs=32, schedule="interleaved")
    accounted = lite("analytic", account_for_embedding=True, **knobs)
    laid_out = lite("analytic", pipeline_layout="Et*6|(t*7|)*2t*7L", **knobs)
    assert laid_out.step_time_s == pytest.approx(accounted.step_time_s, rel=1e-9)
    assert laid_out.peak_memory_bytes == pytest.approx(accounted.peak_memory_bytes, rel=1e-9)


def test_megatron_flags_map_onto_the_plan():
    plan = megatron.from_mapping({"pipeline_model_parallel_size": "8", "tensor_model_parallel_size": "2",
                                  "mtp_num_layers": "1", "pipeline_model_parallel_layout": DSV3_LAYOUT,
                                  "mtp_loss_scaling_factor": "0.1"})
    knobs = plan.knobs_for(61)
    assert knobs["mtp_layers"] == 1 and knobs["pipeline_layout"] == DSV3_LAYOUT and knobs["vpp"] == 4
    assert "mtp_loss_scaling_factor" in plan.ignored
    assert "mtp_layers" not in megatron.from_mapping({"mtp_num_layers": "0"}).knobs
    with pytest.raises(ConfigError, match="32 stages do not split over --pipeline-model-parallel-size 3"):
        megatron.from_mapping({"pipeline_model_parallel_size": "3", "pipeline_model_parallel_layout": DSV3_LAYOUT})


def test_cli_flags_and_their_errors(capsys):
    argv = ["simulate", "--model", "deepseek-v2-lite", "--cluster", "mi300x-pollara", "--nodes", "4", "--pp", "4",
            "--ep", "8", "--gbs", "64", "--seq", "4096", "--engine", "analytic"]
    assert main(argv + ["--mtp-layers", "1", "--pipeline-layout", "Et*6|t*7|t*7|t*7mL", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["mtp_layers"] == 1 and report["plan"]["pipeline_layout"] == "Et*6|t*7|t*7|t*7mL"
    assert main(argv + ["--pipeline-layout", "Et*6|t*7|t*7|t*6L"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan.pipeline_layout" in err[0] and "places 26 decoder layers t; the model has 27" in err[0]
    assert main(argv + ["--pipeline-layout", "Et*6|t*7|t*7|t*7L*"]) == 2
    assert "not part of a repeat" in capsys.readouterr().err
    assert main(argv + ["--mtp-layers", "-1"]) == 2
    assert "--mtp-layers" in capsys.readouterr().err


def test_runs_csv_columns(tmp_path):
    from perfsim.design.runs import read_runs

    path = tmp_path / "runs.csv"
    path.write_text("id,source_id,source,stack,model,cluster,nodes,pp,vpp,schedule,ep,mbs,gbs,seq,mtp_layers,"
                    "pipeline_layout,metric,measured\nr1,s,x,ideal,deepseek-v2-lite,mi300x-pollara,2,2,2,interleaved,8,1,"
                    "32,4096,1,Et*6|t*7|t*7m|t*7L,step_time_s,1.0\n")
    knobs = dict(read_runs(path)[0].knobs)
    assert knobs["mtp_layers"] == 1 and knobs["pipeline_layout"] == "Et*6|t*7|t*7m|t*7L"


def test_planner_inputs_reach_the_plan():
    from conftest import plan_page

    at, planner_inputs = plan_page({"estimator": "analytic", "model": "deepseek-v2-lite", "cluster": "mi300x-pollara",
                                    "nodes": 4, "knobs": {"pp": 4, "dp": 0, "ep": 8, "gbs": 64, "seq": 4096}})
    at.number_input(key="w.mtp_layers").set_value(1).run()
    at.text_input(key="w.pipeline_layout").set_value("Et*6|t*7|t*7|t*7mL").run()
    assert not at.exception, [e.value for e in at.exception]
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["mtp_layers"] == 1 and inputs["fidelity"]["pipeline_layout"] == "Et*6|t*7|t*7|t*7mL"
    plan = planner_inputs.simulate(inputs).plan
    assert plan["mtp_layers"] == 1 and plan["pipeline_layout"] == "Et*6|t*7|t*7|t*7mL"


def test_search_prices_every_plan_with_the_mtp_layers(capsys):
    """`perfsim search --mtp-layers N` (plan_knobs mtp_layers): every plan carries them, and
    they cost time; a bad count is one line."""
    from perfsim.search import search

    common = dict(gpus=[24], gbs=48, seq=4096, top=1, confirm=0, executor="serial",
                  fixed={"tp": [1], "pp": [3], "cp": [1], "ep": [8]}, limits={"mbs": 1})
    plain = search("deepseek-v2-lite", "mi300x-pollara", **common)
    mtp = search("deepseek-v2-lite", "mi300x-pollara", plan_knobs={"mtp_layers": 1}, **common)
    assert mtp.rows[0].plan["mtp_layers"] == 1 and plain.rows[0].plan["mtp_layers"] == 0
    assert mtp.rows[0].step_time_s > plain.rows[0].step_time_s
    with pytest.raises(ConfigError, match="plan_knobs.mtp_layers: expected a whole number"):
        search("deepseek-v2-lite", "mi300x-pollara", plan_knobs={"mtp_layers": -1}, **common)
    argv = ["search", "--model", "deepseek-v2-lite", "--cluster", "mi300x-pollara", "--gpus", "24", "--gbs", "48",
            "--seq", "4096", "--tp", "1", "--pp", "3", "--ep", "8", "--cp", "1", "--top", "1", "--confirm", "0"]
    assert main(argv + ["--mtp-layers", "1"]) == 0
    assert "mtp1" in capsys.readouterr().out
    assert main(argv + ["--mtp-layers", "-2"]) == 2
    assert "--mtp-layers" in capsys.readouterr().err


def test_model_flops_count_the_mtp_layers_as_megatron_bridge_does():
    """An MTP layer's work is model work: a layer like the last, its 2h -> h projection and one
    more LM head. Megatron-Bridge's DeepSeek-V3 H100 row (validation/runs/published.csv,
    MB2509-DSV3-H100: 338 model TFLOPS/GPU at 1,297 tokens/s/GPU, one MTP layer, seq 4096)
    implies 260.6 GFLOPs per token; without the MTP layer the count is 250.5."""
    model = perfsim.load_model("deepseek-v3")
    assert model.model_flops_per_token(4096) == pytest.approx(250.46e9, rel=1e-3)
    assert model.model_flops_per_token(4096, mtp_layers=1) == pytest.approx(338e12 / 1297, rel=2e-3)
    knobs = dict(nodes=1, ep=8, gbs=32, seq=4096, check_memory=False)
    for mtp in (0, 1):
        r = perfsim.estimate("deepseek-v2-lite", "mi300x-pollara", mtp_layers=mtp, **knobs)
        per_token = r.tflops_per_gpu * 1e12 / r.tokens_per_s_per_gpu
        assert per_token == pytest.approx(perfsim.load_model("deepseek-v2-lite").model_flops_per_token(4096, mtp))
