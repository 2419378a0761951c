"""Megatron-Core's --recompute-modules (plan.recompute_modules): what selective recompute
re-runs, priced in memory (lowering.memory) and in time (lowering.layers.recompute_steps),
the same in both estimators, from the API, the CLI, a Megatron command line, a runs CSV and
the planner."""

import json
from dataclasses import replace
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.errors import ConfigError
from perfsim.lowering.layers import LayerBuilder, recompute_steps
from perfsim.lowering.memory import layer_activation_bytes
from perfsim.lowering.steps import ACT_BYTES, FP8_BYTES
from perfsim.plan.megatron import from_args
from perfsim.plan.parallel import DEFAULT_RECOMPUTE_MODULES, ParallelPlan

ROOT = Path(__file__).resolve().parent.parent
MOE = "olmoe-1b-7b"  # 64 experts, top-8, every layer MoE
KNOBS = dict(tp=1, pp=1, ep=8, gbs=32, seq=4096, mbs=1, stack="megatron-primus")


def _plan(model, **kw):
    return ParallelPlan(**{"dp": 8, "gbs": 32, "seq": 4096, "mbs": 1, **kw})


def test_each_module_drops_the_tensors_it_reruns_from_what_a_layer_keeps():
    model = perfsim.load_model(MOE)
    tokens, h, w, k = 4096, model.hidden_size, model.expert_ffn_hidden_size, model.top_k
    base = layer_activation_bytes(model, _plan(model, ep=8, recompute="selective"), 1)
    assert base == layer_activation_bytes(model, _plan(model, ep=8), 1)  # BF16 core_attn: flash keeps its output
    act = layer_activation_bytes(model, _plan(model, ep=8, recompute="selective", recompute_modules=("moe_act",)), 1)
    assert base - act == pytest.approx(tokens * k * w * ACT_BYTES)  # the routed experts' activation output
    norm = layer_activation_bytes(model, _plan(model, ep=8, recompute="selective", recompute_modules=("layernorm",)), 1)
    assert base - norm == pytest.approx(tokens * h * ACT_BYTES)  # the MoE layer's pre-MLP norm output
    both = layer_activation_bytes(model, _plan(model, ep=8, recompute="selective",
                                                recompute_modules=("layernorm", "moe_act")), 1)
    assert base - both == pytest.approx((base - act) + (base - norm))
    whole = layer_activation_bytes(model, _plan(model, ep=8, recompute="selective", recompute_modules=("moe",)), 1)
    assert whole < both  # the whole MoE part: its permuted tokens, up and activation outputs too
    # under FP8 (a stack keeping FP8 linear inputs) the activation output is the down projection's FP8 input
    # (under current scaling: Megatron-Core refuses moe_act and layernorm recompute beside delayed scaling)
    fp8 = _plan(model, ep=8, recompute="selective", dtype="fp8", stack="nemo", fp8_recipe="current")
    fp8_act = _plan(model, ep=8, recompute="selective", recompute_modules=("core_attn", "moe_act"), dtype="fp8",
                    stack="nemo", fp8_recipe="current")
    assert layer_activation_bytes(model, fp8, 1) - layer_activation_bytes(model, fp8_act, 1) == \
        pytest.approx(tokens * k * w * FP8_BYTES)


def test_mlp_reruns_a_dense_layers_mlp_and_layernorm_nothing_fused():
    model = perfsim.load_model("llama3.1-8b")
    plan = _plan(model, recompute="selective")
    base = layer_activation_bytes(model, plan, 0)
    mlp = layer_activation_bytes(model, _plan(model, recompute="selective", recompute_modules=("mlp",)), 0)
    h, w = model.hidden_size, model.ffn_hidden_size
    assert base - mlp == pytest.approx(4096 * (h + 3 * w) * ACT_BYTES)  # norm out, gate+up out, activation out
    # a dense layer's norms are fused into the linear after them (Transformer Engine): nothing to re-run
    norm = layer_activation_bytes(model, _plan(model, recompute="selective", recompute_modules=("layernorm",)), 0)
    assert norm == base


@pytest.mark.parametrize("modules", [("core_attn",), ("layernorm", "moe_act"), ("moe",)])
def test_both_estimators_price_the_rerun_alike_and_it_costs_time(modules):
    knobs = dict(KNOBS, recompute="selective", recompute_modules=modules)
    none = perfsim.simulate(MOE, "mi300x-pollara", nodes=1, estimator="analytic", check_memory=False, **KNOBS)
    got = [perfsim.simulate(MOE, "mi300x-pollara", nodes=1, estimator=e, check_memory=False, **knobs)
           for e in ("analytic", "des")]
    assert got[0].step_time_s == pytest.approx(got[1].step_time_s, rel=0.03)
    assert got[0].step_time_s > none.step_time_s
    assert got[0].breakdown["recompute"] > 0
    if modules == ("moe",):  # the whole MoE part re-runs its dispatch and combine too
        assert got[0].comm_by_collective["ep_a2a/all_to_all"]["count"] > \
            none.comm_by_collective["ep_a2a/all_to_all"]["count"]
    assert tuple(got[0].plan["recompute_modules"]) == modules


def test_modules_lower_the_peak_and_auto_keeps_them_unused_where_none_fits():
    knobs = dict(KNOBS, recompute="selective")
    core = perfsim.estimate(MOE, "mi300x-pollara", nodes=1, check_memory=False, **knobs)
    act = perfsim.estimate(MOE, "mi300x-pollara", nodes=1, check_memory=False, recompute_modules=("moe_act",),
                           **knobs)
    assert act.peak_memory_bytes < core.peak_memory_bytes
    auto = perfsim.estimate(MOE, "mi300x-pollara", nodes=1, check_memory=False,
                            **dict(KNOBS, recompute="auto", recompute_modules=("moe_act",)))
    assert auto.plan["recompute"] == "none"  # it fits without any: the modules apply to selective only
    assert tuple(auto.plan["recompute_modules"]) == DEFAULT_RECOMPUTE_MODULES


def test_a_plan_holds_a_module_list_only_beside_selective_recompute():
    """The plan itself refuses a module list at another level (so a ParallelPlan built by hand
    cannot carry one unused); auto checks the list and keeps it only where it settles on
    selective, and an unknown module is refused even where auto settles on none."""
    for level in ("none", "op", "full"):
        with pytest.raises(ConfigError, match=f"needs recompute selective or auto .*got recompute {level}"):
            ParallelPlan(gbs=8, seq=1024, recompute=level, recompute_modules=("mlp",))
    assert ParallelPlan(gbs=8, seq=1024, recompute="selective", recompute_modules=("mlp",)).selective_modules == ("mlp",)
    with pytest.raises(ConfigError, match="'attention' is not one of"):
        perfsim.estimate(MOE, "mi300x-pollara", nodes=1, check_memory=False,
                         **dict(KNOBS, recompute="auto", recompute_modules=("attention",)))
    tight = perfsim.load_cluster("mi300x-pollara", nodes=1)
    tight = replace(tight, gpu=replace(tight.gpu, hbm_capacity_GB=1))  # nothing fits: auto settles on full
    full = perfsim.estimate(MOE, tight, check_memory=False,
                            **dict(KNOBS, recompute="auto", recompute_modules=("moe_act",)))
    assert full.plan["recompute"] == "full" and tuple(full.plan["recompute_modules"]) == DEFAULT_RECOMPUTE_MODULES


@pytest.mark.parametrize("kw, needle", [
    (dict(recompute="selective", recompute_modules=("attention",)), "'attention' is not one of"),
    (dict(recompute="selective", recompute_modules=("moe_act", "moe_act")), "names a module twice"),
    (dict(recompute="selective", recompute_modules=()), "non-empty"),
    (dict(recompute="selective", recompute_modules="moe_act"), "non-empty list"),
    (dict(recompute="full", recompute_modules=("moe_act",)), "needs recompute selective or auto"),
    (dict(recompute="selective", recompute_modules=("layernorm",), dtype="fp8"), "layernorm under FP8 delayed scaling"),
    (dict(recompute="auto", recompute_modules=("moe_act",), dtype="fp8", stack="nemo", fp8_recipe="delayed"),
     "moe_act under FP8 delayed scaling: Megatron-Core refuses it"),
])
def test_bad_modules_are_one_clear_error(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        perfsim.estimate(MOE, "mi300x-pollara", nodes=1, check_memory=False, **{**KNOBS, **kw})


@pytest.mark.parametrize("recompute", ["selective", "auto"])
def test_an_moe_module_on_a_dense_model_is_refused(recompute):
    with pytest.raises(ConfigError, match="moe_act needs an MoE model"):
        perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=1, check_memory=False, tp=1, gbs=8, seq=2048,
                         recompute=recompute, recompute_modules=("moe_act",))


def test_cli_takes_a_comma_list_and_says_what_auto_chose(capsys):
    args = ["simulate", "--model", MOE, "--nodes", "1", "--ep", "8", "--gbs", "32", "--seq", "4096", "--engine",
            "analytic", "--stack", "megatron-primus", "--recompute", "selective", "--recompute-modules",
            "moe_act,layernorm", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["recompute_modules"] == ["layernorm", "moe_act"]
    assert main(args[:-1] + ["--recompute-modules", "moe_act,,"]) == 2
    assert "--recompute-modules" in capsys.readouterr().err


def test_a_megatron_command_line_with_several_modules_reaches_the_plan():
    got = from_args("pretrain_gpt.py --recompute-granularity selective --recompute-modules layernorm moe_act "
                    "mla_up_proj gdn --expert-model-parallel-size 8")
    assert got.knobs["recompute_modules"] == ("layernorm", "moe_act", "mla_up_proj") and got.knobs["ep"] == 8
    assert [why for _, why in got.not_modelled if "module" in why] == [
        "module gdn is not modelled (perfsim re-runs core_attn, mla_up_proj, layernorm, moe_act, "
        "shared_experts, mlp, moe)"]
    # a name no Megatron-Core release accepts is refused, as Megatron-Core refuses it (a typo, not a note)
    with pytest.raises(ConfigError, match=r"--recompute-modules: 'core_atn' is not a Megatron-Core recompute module"):
        from_args("pretrain_gpt.py --recompute-granularity selective --recompute-modules core_atn")


def test_a_runs_csv_names_the_modules_as_megatron_writes_them(tmp_path):
    header = "id,source_id,source,stack,model,cluster,nodes,ep,mbs,gbs,seq,recompute,recompute_modules,metric,measured"
    path = tmp_path / "runs.csv"
    path.write_text(header + f"\nR1,a,https://example.org,megatron-primus,{MOE},mi300x-pollara,1,8,1,32,4096,selective,"
                    "layernorm moe_act,tokens_per_s_per_gpu,10000\n")
    (case,) = read_runs(path)
    assert dict(case.knobs)["recompute_modules"] == ("layernorm", "moe_act")


def test_the_planner_passes_the_modules_only_beside_selective_or_auto():
    sys.path.insert(0, str(ROOT / "app"))
    import inputs as planner_inputs

    inputs = planner_inputs.normalize({"model": MOE, "nodes": 1, "estimator": "analytic", "stack": "megatron-primus",
                                       "knobs": {"tp": 1, "pp": 1, "ep": 8, "dp": 0, "gbs": 32, "seq": 4096,
                                                 "recompute": "selective"},
                                       "fidelity": {"recompute_modules": ["moe_act"]}})
    got = planner_inputs.simulate(inputs)
    assert list(got.plan["recompute_modules"]) == ["moe_act"]
    inputs["knobs"]["recompute"] = "full"  # the page keeps the choice but does not pass it
    assert list(planner_inputs.simulate(inputs).plan["recompute_modules"]) == ["core_attn"]


def test_a_primus_yaml_list_of_modules_reaches_the_plan():
    from perfsim.plan.megatron import from_mapping

    got = from_mapping({"recompute_granularity": "selective", "recompute_modules": ["moe_act", "shared_experts"]})
    assert got.knobs["recompute_modules"] == ("moe_act", "shared_experts")
    assert not got.not_modelled


def test_mla_up_proj_drops_the_queries_keys_and_values_and_reruns_the_up_projections(tmp_path):
    """Megatron-Core's mla_up_proj: the up projections' outputs (the attention's q, k, v) are
    discarded after the attention and rebuilt from the kept latents, with the rope, in front of
    its backward; with or without a query latent (DeepSeek-V3 / V2-Lite)."""
    unfused = tmp_path / "unfused-rope.toml"  # a stack running the rope as its own kernel
    unfused.write_text('base = "megatron-primus"\n[fusion]\nfused = ["rmsnorm", "swiglu", "loss"]\n'
                       'source = "test: rope unfused"\n')
    for name, up in (("deepseek-v3", ("q_up", "kv_up")), ("deepseek-v2-lite", ("q", "kv_up"))):
        model = perfsim.load_model(name)
        plan = _plan(model, ep=8, tp=2, dp=4, recompute="selective", stack=str(unfused))
        mla = _plan(model, ep=8, tp=2, dp=4, recompute="selective", recompute_modules=("mla_up_proj",),
                    stack=str(unfused))
        width = sum(lin.out_features for lin in model.attention_linears() if lin.name in up)
        for layer in (0, model.num_layers - 1):  # a dense layer and an MoE layer alike
            assert layer_activation_bytes(model, plan, layer) - layer_activation_bytes(model, mla, layer) == \
                pytest.approx(4096 * width / 2 * ACT_BYTES)
        forward = LayerBuilder(model, mla).attention_forward()
        names = [s.name for s in recompute_steps(forward, mla.recompute, model, mla.recompute_modules)]
        assert names == [f"{n}_recompute" for n in (*up, "rope")]  # no attention core: not named
    fp8 = _plan(model, ep=8, recompute="selective", recompute_modules=("mla_up_proj",), dtype="fp8", stack="nemo",
                fp8_recipe="current")
    names = [s.name for s in recompute_steps(LayerBuilder(model, fp8).attention_forward(), fp8.recompute, model,
                                             fp8.recompute_modules)]
    assert names[:3] == ["q_fp8_amax_recompute", "q_fp8_cast_recompute", "q_recompute"]  # the rerun casts again


def test_shared_experts_drop_their_outputs_and_rerun_alone_or_inside_moe():
    model = perfsim.load_model("deepseek-v2-lite")
    layer = model.num_layers - 1
    base = _plan(model, ep=8, recompute="selective")
    shared = _plan(model, ep=8, recompute="selective", recompute_modules=("shared_experts",))
    sw = model.shared_ffn_hidden_size
    assert layer_activation_bytes(model, base, layer) - layer_activation_bytes(model, shared, layer) == \
        pytest.approx(4096 * 3 * sw * ACT_BYTES)  # gate + up outputs, activation output
    assert layer_activation_bytes(model, base, 0) == layer_activation_bytes(model, shared, 0)  # a dense layer has none
    moe = _plan(model, ep=8, recompute="selective", recompute_modules=("moe",))
    both = _plan(model, ep=8, recompute="selective", recompute_modules=("shared_experts", "moe"))
    assert layer_activation_bytes(model, both, layer) == layer_activation_bytes(model, moe, layer)  # counted once
    forward = LayerBuilder(model, shared).moe_forward()
    assert [s.name for s in recompute_steps(forward, shared.recompute, model, shared.recompute_modules)] == \
        ["shared_up_recompute", "shared_act_recompute", "shared_down_recompute"]
    tp2 = _plan(model, ep=8, tp=2, dp=4, recompute="selective", recompute_modules=("shared_experts",))
    forward = LayerBuilder(model, tp2).moe_forward()  # under TP, its sequence-parallel gather and scatter too
    assert [s.name for s in recompute_steps(forward, tp2.recompute, model, tp2.recompute_modules)] == \
        ["shared_ag_recompute", "shared_up_recompute", "shared_act_recompute", "shared_down_recompute",
         "shared_rs_recompute"]
    assert len(recompute_steps(forward, both.recompute, model, both.recompute_modules)) == \
        len(recompute_steps(forward, moe.recompute, model, moe.recompute_modules))  # each step re-run once


@pytest.mark.parametrize("modules", [("mla_up_proj",), ("shared_experts",), ("mla_up_proj", "shared_experts")])
def test_the_mla_and_shared_modules_cost_time_in_both_estimators_and_lower_the_peak(modules):
    knobs = dict(KNOBS, recompute="selective")
    core = perfsim.simulate("deepseek-v2-lite", "mi300x-pollara", nodes=1, estimator="analytic", check_memory=False,
                            **knobs)
    got = [perfsim.simulate("deepseek-v2-lite", "mi300x-pollara", nodes=1, estimator=e, check_memory=False,
                            recompute_modules=modules, **knobs) for e in ("analytic", "des")]
    assert got[0].step_time_s == pytest.approx(got[1].step_time_s, rel=0.03)
    assert got[0].breakdown["recompute"] > 0
    assert got[0].peak_memory_bytes < core.peak_memory_bytes
    assert tuple(got[0].plan["recompute_modules"]) == modules


def test_fp8_recompute_of_a_dense_mlp_casts_its_inputs_again():
    model = perfsim.load_model("llama3.1-8b")
    plan = _plan(model, recompute="selective", recompute_modules=("mlp",), dtype="fp8", stack="megatron-primus")
    names = [s.name for s in recompute_steps(LayerBuilder(model, plan).mlp_forward(), plan.recompute, model,
                                             plan.recompute_modules)]
    assert "mlp_up_fp8_cast_recompute" in names and "mlp_down_fp8_cast_recompute" in names


@pytest.mark.parametrize("model, modules, needle", [
    ("llama3.1-8b", ("mla_up_proj",), "mla_up_proj needs multi-latent attention; llama3.1-8b has gqa attention"),
    (MOE, ("shared_experts",), f"shared_experts needs a model with shared experts; {MOE} has none"),
    ("llama3.1-8b", ("shared_experts",), "shared_experts needs an MoE model; llama3.1-8b is dense"),
])
def test_a_module_the_model_lacks_is_one_clear_error(model, modules, needle, capsys):
    ep = "8" if model == MOE else "1"
    with pytest.raises(ConfigError, match=needle):
        perfsim.estimate(model, "mi300x-pollara", nodes=1, check_memory=False, tp=1, ep=int(ep), gbs=32, seq=2048,
                         recompute="selective", recompute_modules=modules)
    args = ["simulate", "--model", model, "--engine", "analytic", "--nodes", "1", "--tp", "1", "--ep", ep,
            "--gbs", "32", "--seq", "2048",
            "--recompute", "auto", "--recompute-modules", ",".join(modules)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_the_planner_offers_mla_up_proj_and_shared_experts_and_prices_them():
    from conftest import plan_page

    at, planner_inputs = plan_page({"estimator": "analytic", "model": "deepseek-v2-lite", "cluster": "mi300x-pollara",
                                    "nodes": 1, "knobs": {"tp": 1, "pp": 1, "dp": 0, "ep": 8, "gbs": 32, "seq": 4096,
                                                          "recompute": "selective"}})
    box = at.multiselect(key="w.recompute_modules")
    assert {"mla_up_proj", "shared_experts"} <= set(box.options)
    box.set_value(["mla_up_proj", "shared_experts"]).run()
    assert not at.exception, [e.value for e in at.exception]
    inputs = at.session_state["inputs"]
    assert inputs["fidelity"]["recompute_modules"] == ["mla_up_proj", "shared_experts"]
    got = planner_inputs.simulate(inputs)
    assert tuple(got.plan["recompute_modules"]) == ("mla_up_proj", "shared_experts") and got.breakdown["recompute"] > 0
