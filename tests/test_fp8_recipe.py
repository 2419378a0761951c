"""The FP8 scaling recipe as a plan input (``plan.fp8_recipe``: delayed or current, over
the stack's ``[fp8] delayed_scaling``) and FP8 linear layers keeping their quantized inputs
for the backward (``[fp8] saves_fp8_inputs``, Transformer Engine stacks)."""

import csv
import dataclasses
import json

import pytest
from conftest import plan_page

import perfsim.api as api
from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.errors import ConfigError
from perfsim.lowering.layers import LayerBuilder
from perfsim.lowering.memory import layer_activation_bytes
from perfsim.plan.megatron import from_mapping
from perfsim.plan.parallel import ParallelPlan
from perfsim.search import search
from perfsim.system.stacks import load_stack

CASE = dict(model="llama3.1-8b", cluster="h100-ib", nodes=1, tp=1, mbs=1, gbs=16, seq=4096, dtype="fp8")


def _casts(stack, recipe=""):
    model = api.load_model("llama3.1-8b")
    plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=stack, fp8_recipe=recipe)
    b = LayerBuilder(model, plan)
    return {s.name: s.bytes for s in b.attention_forward() + b.mlp_forward() if s.category == "fp8_cast"}


def test_the_plans_recipe_overrides_the_stacks_both_ways():
    """nemo defaults to delayed scaling (no amax pass); ``current`` adds one before every
    cast, and ``delayed`` takes it away from a current-scaling stack; the casts themselves
    do not change."""
    assert load_stack("nemo").fp8.delayed_scaling and not load_stack("ideal").fp8.delayed_scaling
    nemo, nemo_current = _casts("nemo"), _casts("nemo", "current")
    assert not any(k.endswith("_fp8_amax") for k in nemo)
    assert any(k.endswith("_fp8_amax") for k in nemo_current)
    assert {k: v for k, v in nemo_current.items() if k.endswith("_fp8_cast")} == nemo
    ideal, ideal_delayed = _casts("ideal"), _casts("ideal", "delayed")
    assert any(k.endswith("_fp8_amax") for k in ideal) and not any(k.endswith("_fp8_amax") for k in ideal_delayed)
    assert _casts("ideal", "current") == ideal and _casts("nemo", "delayed") == nemo


@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_current_scaling_is_slower_than_delayed_by_its_amax_passes(estimator):
    def t(recipe):
        return api.simulate(estimator=estimator, check_memory=False, stack="nemo", fp8_recipe=recipe,
                            **CASE).step_time_s
    delayed, current = t("delayed"), t("current")
    assert delayed == pytest.approx(t(""), rel=1e-12)  # nemo's own recipe is delayed
    assert 1.0 < current / delayed < 1.2


@pytest.mark.parametrize("knobs, field", [
    (dict(dtype="bf16", fp8_recipe="current"), "needs dtype fp8"),
    (dict(dtype="fp8", fp8_recipe="mxfp8"), "must be one of delayed, current"),
])
def test_a_bad_recipe_names_the_field(knobs, field):
    with pytest.raises(ConfigError, match=f"plan.fp8_recipe.*{field}|{field}"):
        ParallelPlan(mbs=1, gbs=1, seq=4096, **knobs)


def test_cli_fp8_recipe_flag_prices_and_reports_it(capsys):
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--gpus", "8", "--gbs", "16",
            "--seq", "4096", "--dtype", "fp8", "--stack", "nemo", "--engine", "analytic", "--json"]
    assert main(args) == 0
    delayed = capsys.readouterr().out
    assert main(args + ["--fp8-recipe", "current"]) == 0
    current = capsys.readouterr().out
    import json
    d, c = json.loads(delayed), json.loads(current)
    assert c["plan"]["fp8_recipe"] == "current" and d["plan"]["fp8_recipe"] == ""
    assert c["step_time_s"] > d["step_time_s"]


def test_cli_recipe_without_fp8_is_one_line_exit_2(capsys):
    code = main(["simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--gpus", "8", "--gbs", "16",
                 "--seq", "4096", "--fp8-recipe", "current"])
    err = capsys.readouterr().err
    assert code == 2 and "fp8_recipe" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_megatron_fp8_recipe_flag_maps_to_the_plan():
    assert from_mapping({"fp8_format": "hybrid", "fp8_recipe": "tensorwise"}).knobs["fp8_recipe"] == "current"
    assert from_mapping({"fp8_format": "hybrid", "fp8_recipe": "delayed"}).knobs["fp8_recipe"] == "delayed"
    block = from_mapping({"fp8_format": "hybrid", "fp8_recipe": "blockwise"})
    assert "fp8_recipe" not in block.knobs and "fp8_recipe" in dict(block.not_modelled)
    bf16 = from_mapping({"bf16": True, "fp8_recipe": "tensorwise"})  # no FP8: the recipe does nothing
    assert "fp8_recipe" not in bf16.knobs and "fp8_recipe" in bf16.ignored


def _runs_csv(path, column: str, values: tuple[str, str]):
    """Two one-node H100 FP8 runs differing only in ``column``."""
    with open(path, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["id", "source_id", "source", "stack", "model", "cluster", "nodes", "mbs", "gbs", "seq", "dtype",
                    column, "metric", "measured"])
        for run, value in zip("ab", values):
            w.writerow([run, "s", "u", "nemo", "llama3.1-8b", "h100-ib", "1", "1", "16", "4096", "fp8", value,
                        "tokens_per_s_per_gpu", "1000"])
    return path


def test_runs_csv_takes_an_fp8_recipe_column(tmp_path):
    a, b = read_runs(_runs_csv(tmp_path / "runs.csv", "fp8_recipe", ("current", "")))
    assert dict(a.knobs)["fp8_recipe"] == "current" and "fp8_recipe" not in dict(b.knobs)


def test_search_carries_the_recipe_into_every_plan():
    common = dict(gpus=[8], gbs=16, seq=4096, dtype="fp8", stack="nemo", top=1, confirm=0,
                  fixed={"tp": [1], "pp": [1], "cp": [1]})
    delayed = search("llama3.1-8b", "h100-ib", **common)
    current = search("llama3.1-8b", "h100-ib", plan_knobs={"fp8_recipe": "current"}, **common)
    assert current.rows[0].plan["fp8_recipe"] == "current"
    assert current.rows[0].step_time_s > delayed.rows[0].step_time_s
    with pytest.raises(ConfigError, match="fp8_recipe"):
        search("llama3.1-8b", "h100-ib", **{**common, "dtype": "bf16"}, plan_knobs={"fp8_recipe": "current"})


# ---- FP8 inputs kept for the backward --------------------------------------------------------


def test_te_stacks_keep_fp8_linear_inputs_in_one_byte():
    """Under FP8 a Transformer Engine stack keeps the QKV, up- and down-projection inputs at
    1 B each instead of 2, and the output projection an FP8 copy of its input (1 B) beside the
    attention's BF16 output, which under BF16 is the one tensor both keep; BF16 plans and
    stacks that keep BF16 inputs are unchanged."""
    model = api.load_model("llama3.1-8b")
    assert load_stack("nemo").fp8.saves_fp8_inputs and load_stack("megatron-primus").fp8.saves_fp8_inputs
    assert not load_stack("ideal").fp8.saves_fp8_inputs

    def acts(stack, dtype):
        plan = ParallelPlan(tp=2, dp=1, mbs=1, gbs=1, seq=4096, dtype=dtype, stack=stack)
        return layer_activation_bytes(model, plan, 0)

    h, w, v = model.hidden_size, model.ffn_hidden_size, model.v_width
    fp8_values = 4096 * (h + h + w) / 2  # tokens x (QKV in, up in, down in) / tp, 1 B less each
    fp8_copy = 4096 * v / 2  # the output projection's FP8 input, 1 B each
    assert acts("nemo", "fp8") == pytest.approx(acts("ideal", "fp8") - fp8_values + fp8_copy)
    assert acts("nemo", "bf16") == acts("ideal", "bf16") == acts("ideal", "fp8")


def test_moe_layers_keep_each_routed_copys_expert_inputs_in_fp8():
    model = api.load_model("qwen3-30b-a3b")
    plan = dict(tp=1, dp=8, ep=8, mbs=1, gbs=8, seq=4096, dtype="fp8")
    te, bf = (layer_activation_bytes(model, ParallelPlan(stack=s, **plan), 0) for s in ("nemo", "ideal"))
    h, w = model.hidden_size, model.expert_ffn_hidden_size
    # 1 B less for the QKV input, each routed copy's up / down inputs and the shared experts';
    # 1 B more for the output projection's FP8 copy of the attention output; and 2 B for each
    # routed copy's hidden-width BF16 copy that ideal's probabilities keep (nemo's weigh them in
    # the activation: stack.memory.routed_probs_copy)
    expected = 4096 * (h + model.top_k * (h + w) + model.shared_ffn_hidden_size - model.v_width)
    expected += 4096 * model.top_k * h * 2
    assert bf - te == pytest.approx(expected)


def test_fp8_inputs_lower_the_activations_in_the_search_memory_model_too():
    """The search's memoised memory model keys the kept inputs' dtype: a BF16 and an FP8
    plan that share every other field get their own (exact) peaks from one model; FP8 keeps
    fewer activation bytes and more weight bytes (the FP8 weight copies)."""
    from perfsim.estimators.fastmem import MemoryModel
    from perfsim.lowering.memory import plan_memory

    model = api.load_model("llama3.1-70b")
    fast = MemoryModel(model)
    peaks = {}
    for dtype in ("bf16", "fp8"):
        plan = ParallelPlan(tp=4, pp=4, vpp=5, dp=2, mbs=1, gbs=64, seq=8192, dtype=dtype, stack="nemo",
                            schedule="interleaved")
        peaks[dtype] = fast.peak(plan)[0]
        assert peaks[dtype] == pytest.approx(max(m.total_bytes for m in plan_memory(model, plan)))
        peaks[dtype] = plan_memory(model, plan)[0]
    assert peaks["fp8"].activations_bytes < peaks["bf16"].activations_bytes
    assert peaks["fp8"].weights_bytes > peaks["bf16"].weights_bytes


# ---- the planner --------------------------------------------------------------------------


def test_planner_fp8_recipe_selector_reaches_the_plan_and_the_search():
    """The Plan page's "FP8 recipe" (enabled under fp8; default the stack's) sets
    plan.fp8_recipe, moves the step under a delayed-scaling stack, and the Search page
    carries it into every plan; back under BF16 no plan carries it."""
    at, planner_inputs = plan_page(
        {"model": "llama3.1-8b", "cluster": "h100-ib", "nodes": 1, "estimator": "analytic", "stack": "nemo",
         "knobs": {"dtype": "bf16", "gbs": 16, "dp": 8}})
    assert not at.exception and not at.error
    box = at.selectbox(key="w.fp8_recipe")
    assert box.label == "FP8 recipe" and box.disabled and box.value == ""
    at.selectbox(key="w.dtype").set_value("fp8").run()
    assert not at.selectbox(key="w.fp8_recipe").disabled
    before = planner_inputs.simulate(at.session_state["inputs"])
    at.selectbox(key="w.fp8_recipe").set_value("current").run()
    assert not at.exception and not at.error
    state = at.session_state["inputs"]
    after = planner_inputs.simulate(state)
    assert after.plan["fp8_recipe"] == "current" and before.plan["fp8_recipe"] == ""
    assert after.step_time_s > before.step_time_s
    assert planner_inputs.search_switches(state, planner_inputs.model_spec(state))["fp8_recipe"] == "current"
    at.selectbox(key="w.dtype").set_value("bf16").run()
    state = at.session_state["inputs"]
    assert planner_inputs.simulate(state).plan["fp8_recipe"] == ""
    assert "fp8_recipe" not in planner_inputs.search_switches(state, planner_inputs.model_spec(state))


# ---- FP8 primary weights (plan.fp8_params) --------------------------------------------------


def test_fp8_params_halve_the_weights_and_their_zero3_gathers():
    from perfsim.lowering.memory import plan_memory
    from perfsim.plan.sharding import layer_param_bytes

    model = api.load_model("llama3.1-8b")
    plan = ParallelPlan(tp=1, dp=8, zero=3, mbs=1, gbs=16, seq=4096, dtype="fp8", stack="nemo")
    fp8w = dataclasses.replace(plan, fp8_params=True)
    assert layer_param_bytes(model, fp8w, 0) == tuple(b / 2 for b in layer_param_bytes(model, plan, 0))
    (m,), (f,) = plan_memory(model, plan), plan_memory(model, fp8w)
    assert f.weights_bytes == pytest.approx(m.weights_bytes / 2)
    assert f.optimizer_bytes == m.optimizer_bytes  # the FP32 master and Adam moments stay
    knobs = dict(CASE, zero=3, stack="nemo")
    for estimator in ("analytic", "des"):
        bf = api.simulate(estimator=estimator, check_memory=False, fp8_params=False, **knobs)
        f8 = api.simulate(estimator=estimator, check_memory=False, fp8_params=True, **knobs)
        assert f8.step_time_s < bf.step_time_s
        assert f8.plan["fp8_params"] is True
    a = api.simulate(estimator="analytic", check_memory=False, fp8_params=True, **knobs)
    d = api.simulate(estimator="des", check_memory=False, fp8_params=True, **knobs)
    assert a.step_time_s == pytest.approx(d.step_time_s, rel=0.01)


def test_fp8_params_cast_no_weight_and_transpose_it_once_a_step():
    model = api.load_model("llama3.1-8b")

    def cast_bytes(fp8_params):
        plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=4, seq=4096, dtype="fp8", stack="ideal", fp8_params=fp8_params)
        steps = LayerBuilder(model, plan).mlp_forward()
        return {s.name: s.bytes for s in steps if s.category == "fp8_cast"}

    plain, primary = cast_bytes(False), cast_bytes(True)
    h, w = model.hidden_size, model.ffn_hidden_size
    # the down projection's w x h weights: their amax read (2 B) and cast-transpose (2 + 1 + 1 B)
    # leave; a 2-byte transpose of the FP8 copy, spread over the step's 4 microbatches, comes in
    down = next(k for k in plain if k.startswith("mlp_down") and k.endswith("_fp8_cast"))
    amax = next(k for k in plain if k.startswith("mlp_down") and k.endswith("_fp8_amax"))
    assert plain[amax] - primary[amax] == pytest.approx(2 * w * h)
    assert plain[down] - primary[down] == pytest.approx(4 * w * h - 2 * w * h / 4)
    assert set(primary) == set(plain)


def test_fp8_params_needs_fp8_and_maps_from_megatron_and_the_cli(capsys):
    from perfsim.plan import megatron

    with pytest.raises(ConfigError, match="plan.fp8_params"):
        ParallelPlan(mbs=1, gbs=1, seq=4096, fp8_params=True)
    assert megatron.from_mapping({"fp8_format": "hybrid", "fp8_param_gather": True}).knobs["fp8_params"] is True
    bf16 = megatron.from_mapping({"bf16": True, "fp8_param_gather": True})
    assert "fp8_params" not in bf16.knobs and "fp8_param_gather" in bf16.ignored
    code = main(["search", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "16", "--seq", "1024", "--fp8-params"])
    err = capsys.readouterr().err
    assert code == 2 and "--fp8-params" in err and "Traceback" not in err


def test_runs_csv_and_search_take_fp8_params(tmp_path):
    (a,) = read_runs(_runs_csv(tmp_path / "ok.csv", "fp8_params", ("true", "false")))[:1]
    assert dict(a.knobs)["fp8_params"] is True
    with pytest.raises(ConfigError, match="runs.csv:3: fp8_params: expected true or false"):
        read_runs(_runs_csv(tmp_path / "runs.csv", "fp8_params", ("true", "maybe")))
    common = dict(gpus=[8], gbs=16, seq=4096, dtype="fp8", top=1, confirm=0, fixed={"tp": [1], "pp": [1], "cp": [1],
                                                                                 "zero": [3]})
    row = search("llama3.1-8b", "h100-ib", plan_knobs={"fp8_params": True}, **common).rows[0]
    assert row.plan["fp8_params"] is True


def test_planner_fp8_weights_choice_reaches_the_plan_and_the_search():
    """The Plan page's "FP8 weights": the stack's (default: nemo's primary weights on, the
    ideal stack's off), or on / off over it, in the plan priced and the search's switches."""
    at, planner_inputs = plan_page(
        {"model": "llama3.1-8b", "cluster": "h100-ib", "nodes": 1, "estimator": "analytic",
         "knobs": {"dtype": "fp8", "gbs": 16, "dp": 8, "zero": 3}})
    choice = at.selectbox(key="w.fp8_params")
    assert choice.label == "FP8 weights" and not choice.disabled and choice.value == "stack's"
    before = planner_inputs.simulate(at.session_state["inputs"])
    assert before.plan["fp8_params"] is False  # the ideal stack keeps BF16 working weights
    assert "fp8_params" not in planner_inputs.search_switches(at.session_state["inputs"],
                                                              planner_inputs.model_spec(at.session_state["inputs"]))
    choice.set_value("on").run()
    assert not at.exception and not at.error
    state = at.session_state["inputs"]
    after = planner_inputs.simulate(state)
    assert after.plan["fp8_params"] is True and after.peak_memory_bytes < before.peak_memory_bytes
    assert planner_inputs.search_switches(state, planner_inputs.model_spec(state))["fp8_params"] is True
    at.selectbox(key="w.stack").set_value("nemo").run()
    at.selectbox(key="w.fp8_params").set_value("off").run()
    assert not at.exception and not at.error
    state = at.session_state["inputs"]
    assert planner_inputs.simulate(state).plan["fp8_params"] is False  # over nemo's default
    assert planner_inputs.search_switches(state, planner_inputs.model_spec(state))["fp8_params"] is False
    at.selectbox(key="w.fp8_params").set_value("stack's").run()
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["fp8_params"] is True  # nemo's
    at.selectbox(key="w.dtype").set_value("bf16").run()
    assert not at.exception and not at.error
    assert at.selectbox(key="w.fp8_params").disabled
    assert planner_inputs.simulate(at.session_state["inputs"]).plan["fp8_params"] is False


def _stage0(stack="nemo", dtype="fp8", **knobs):
    from perfsim.lowering.memory import stage_memory
    from perfsim.plan.sharding import layer_rank_params, stage_rank_params

    model = api.load_model("llama3.1-8b")
    plan = ParallelPlan(**{**dict(tp=2, pp=2, dp=2, mbs=1, gbs=8, seq=4096, dtype=dtype, stack=stack), **knobs})
    layers = sum(sum(layer_rank_params(model, plan, l)) for l in range(model.num_layers // 2))  # stage 0's
    return stage_memory(model, plan, 0).weights_bytes, sum(stage_rank_params(model, plan, 0)), layers


def test_a_stack_casting_weights_once_keeps_their_fp8_copies():
    """Transformer Engine's weight workspaces (nemo casts each weight once a step): every
    linear weight of the stage's layers in FP8, rowwise and transposed (2 B); under FP8
    primary weights only the transpose (1 B beside the 1 B weight); none in BF16, on a
    stack that casts every microbatch, or under per-pass ZeRO-3 (Megatron-FSDP keeps no
    transpose cache). The embedding and LM head stay BF16."""
    weights, params, layers = _stage0(zero=1)
    assert 0 < layers < params
    assert weights == pytest.approx(2 * params + 2 * layers)
    weights, params, layers = _stage0(zero=1, fp8_params=True)
    assert weights == pytest.approx(params + layers)
    weights, params, layers = _stage0(stack="ideal", zero=1, fp8_params=True)  # the transpose the step reuses
    assert weights == pytest.approx(params + layers)
    for knobs in (dict(stack="ideal"), dict(dtype="bf16"), dict(zero=3)):
        weights, params, _ = _stage0(**knobs)
        shards = 2 if knobs.get("zero") == 3 else 1  # ZeRO-3 shards the BF16 weights over dp = 2
        assert weights == pytest.approx(2 * params / shards)


def test_nemo_keeps_fp8_primary_weights_unless_told_otherwise(capsys):
    """NeMo's FP8 recipes keep FP8 primary weights (Megatron fp8_param_gather): the nemo
    stack's ``[fp8] primary_weights`` is the plan's default under dtype fp8 only; the user's
    --no-fp8-params / fp8_params=False wins; stacks without it keep BF16 working weights."""
    knobs = dict(CASE, gbs=16, check_memory=False, estimator="analytic")
    assert load_stack("nemo").fp8.primary_weights is True and load_stack("ideal").fp8.primary_weights is None
    assert api.simulate(stack="nemo", **knobs).plan["fp8_params"] is True
    assert api.simulate(stack="nemo", fp8_params=False, **knobs).plan["fp8_params"] is False
    assert api.simulate(stack="megatron-primus", **knobs).plan["fp8_params"] is False
    assert api.simulate(stack="nemo", **{**knobs, "dtype": "bf16"}).plan["fp8_params"] is False  # no error either
    base = ["simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--gpus", "8", "--gbs", "16",
            "--seq", "4096", "--dtype", "fp8", "--stack", "nemo", "--engine", "analytic", "--json", "--recompute", "auto"]
    for flags, expected in (([], True), (["--no-fp8-params"], False)):
        assert main(base + flags) == 0
        assert json.loads(capsys.readouterr().out)["plan"]["fp8_params"] is expected
    assert main(base + ["--fp8-params", "--no-fp8-params"]) == 2
    assert "--no-fp8-params: not allowed with argument --fp8-params" in capsys.readouterr().err
    common = dict(gpus=[8], gbs=16, seq=4096, dtype="fp8", stack="nemo", top=3, confirm=0,
                  fixed={"tp": [1], "pp": [1], "cp": [1]})
    found = search("llama3.1-8b", "h100-ib", **common)
    assert found.rows and all(r.plan["fp8_params"] is True for r in found.rows)
    off = search("llama3.1-8b", "h100-ib", plan_knobs={"fp8_params": False}, **common)
    assert off.rows and all(r.plan["fp8_params"] is False for r in off.rows)


def test_fp8_weight_copies_follow_the_step_not_the_closed_forms_cache():
    """FP8 primary weights' transposes are spread over a step's microbatches on every stack,
    so the closed form's block templates key on the microbatch count there too: a plan's
    answer does not depend on the plan priced before it (it did: +1.8% after a smaller batch)."""
    from perfsim.estimators import analytic

    cluster = api.load_cluster("h100-ib", gpus=8)
    knobs = dict(tp=1, dp=8, zero=1, mbs=1, seq=4096, dtype="fp8", fp8_params=True, check_memory=False)
    analytic._CACHE.clear()
    fresh = api.estimate("llama3.1-8b", cluster, gbs=64, **knobs).step_time_s
    analytic._CACHE.clear()
    api.estimate("llama3.1-8b", cluster, gbs=8, **knobs)
    assert api.estimate("llama3.1-8b", cluster, gbs=64, **knobs).step_time_s == pytest.approx(fresh, rel=1e-12)


def test_per_pass_zero3_casts_its_gathered_weights_every_microbatch():
    """A cast-once stack reuses a weight's FP8 copy over the step's microbatches, except under
    per-pass ZeRO-3, whose weights are gathered (and cast) pass by pass; ZeRO-3 kept gathered
    (``zero3_gather once``) casts once a step like ZeRO-1."""
    model = api.load_model("llama3.1-8b")

    def weight_cast_bytes(**knobs):
        plan = ParallelPlan(**{**dict(tp=1, dp=2, mbs=1, gbs=8, seq=4096, dtype="fp8", stack="nemo"), **knobs})
        b = LayerBuilder(model, plan)
        return sum(s.bytes for s in b.mlp_forward() if s.category == "fp8_cast")

    zero1, per_pass, once = (weight_cast_bytes(zero=1), weight_cast_bytes(zero=3),
                             weight_cast_bytes(zero=3, zero3_gather="once"))
    assert per_pass > zero1 == pytest.approx(once)
    primary = [weight_cast_bytes(zero=z, fp8_params=True) for z in (1, 3)]
    assert primary[1] > primary[0]  # FP8 primary weights: the transpose every microbatch under per-pass ZeRO-3


# ---- FP8 grouped GEMMs: per-expert counts padded to the kernels' alignment ------------------


def _moe_steps(stack, dtype="fp8", capacity_factor=None):
    model = api.load_model("qwen3-30b-a3b")
    if capacity_factor is not None:
        model = dataclasses.replace(model, capacity_factor=capacity_factor)
    plan = ParallelPlan(tp=1, dp=8, ep=8, mbs=1, gbs=8, seq=4096, dtype=dtype, stack=stack)
    builder = LayerBuilder(model, plan)
    return model, builder, {s.name: s for s in builder.moe_forward()}


def test_te_grouped_gemms_pad_dropless_counts_under_fp8():
    """Megatron-Core's TEGroupedMLP pads each expert's token count to a multiple of 16 under FP8
    (fp8_padding / fp8_unpadding): on the dropless path a copy of the received tokens in front
    of the first expert GEMM and one of the output after the last, the same again in the
    backward; none under BF16 or on a stack whose kernels take any split."""
    from perfsim.lowering.layers import backward

    model, builder, steps = _moe_steps(load_stack("nemo"))
    assert load_stack("nemo").fp8.grouped_pad_align == 16 and load_stack("ideal").fp8.grouped_pad_align == 0
    received = builder.local_tokens * model.top_k  # uniform routing: every token copy lands once
    copy = 2 * received * model.hidden_size * 2
    names = list(steps)
    assert names.index("fp8_pad") < names.index("expert_up") < names.index("expert_down") < names.index("fp8_unpad")
    assert steps["fp8_pad"].bytes == steps["fp8_unpad"].bytes == pytest.approx(copy)
    back = {s.name: s for s in backward(list(steps.values()))}
    assert back["fp8_pad_bwd"].bytes == back["fp8_unpad_bwd"].bytes == pytest.approx(copy)
    assert "fp8_pad" not in _moe_steps(load_stack("nemo"), dtype="bf16")[2]
    assert "fp8_pad" not in _moe_steps(load_stack("ideal"))[2]
    slower = api.estimate("qwen3-30b-a3b", "h100-ib", nodes=1, ep=8, gbs=64, seq=4096, dtype="fp8", stack="nemo",
                          recompute="full", check_memory=False)
    aligned = api.estimate("qwen3-30b-a3b", "h100-ib", nodes=1, ep=8, gbs=64, seq=4096, dtype="fp8", recompute="full",
                           stack=load_stack("nemo").with_values(**{"fp8.grouped_pad_align": 0}), check_memory=False)
    assert slower.breakdown["moe_permute"] > aligned.breakdown["moe_permute"]
    assert slower.step_time_s > aligned.step_time_s


def test_a_padded_capacity_is_copied_only_when_it_is_not_aligned():
    # capacity factor 1.0: 4096 tokens x 8 / 128 experts = 256 per expert, a multiple of 16
    assert "fp8_pad" not in _moe_steps(load_stack("nemo"), capacity_factor=1.0)[2]
    # 1.1: ceil(256 x 1.1) = 282 per expert, not a multiple of 16
    assert "fp8_pad" in _moe_steps(load_stack("nemo"), capacity_factor=1.1)[2]


def test_a_bad_pad_alignment_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="fp8.grouped_pad_align"):
        load_stack("nemo").with_values(**{"fp8.grouped_pad_align": -1})
