"""Software-stack profiles (system.stacks): strict loading, ``ideal`` = perfsim without a
stack, and each stack parameter moving the step the way its physics says, identically in
the engine and the closed form (both price ``graph.block_passes``)."""

import dataclasses
import json
import math
import tomllib

import pytest

import perfsim.api as api
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.stacks import FUSIBLE, IDEAL, STACK_DIR, StackSpec, list_stacks, load_stack

MOE = dict(model="deepseek-v2-lite", cluster="mi300x-pollara", nodes=2, tp=1, ep=8, mbs=1, gbs=32, seq=4096,
           recompute="full")
DENSE = dict(model="llama3.1-8b", cluster="mi300x-pollara", nodes=1, tp=2, pp=2, mbs=1, gbs=32, seq=4096,
             recompute="selective")
TABLES = ("launch", "moe", "fusion", "overlap", "fp8", "kernels", "memory")


def step(estimator="analytic", stack=None, **case) -> api.Report:
    knobs = {**case, **({"stack": stack} if stack is not None else {})}
    return api.simulate(estimator=estimator, check_memory=False, **knobs)


def test_the_five_stacks_ship_and_every_table_has_a_source():
    assert set(list_stacks()) >= {"ideal", "megatron-primus", "maxtext", "torchtitan", "nemo"}
    for name in list_stacks():
        spec = load_stack(name)
        assert spec.name == name
        for table in TABLES:
            assert getattr(spec, table).source.strip(), f"{name}.{table} has no source"


def test_ideal_profile_adds_nothing_to_lowering():
    spec = load_stack("ideal")
    strip = dict(name="x", description="", source="")
    bare = {t: dataclasses.replace(getattr(spec, t), source="assumed") for t in TABLES}
    assert dataclasses.replace(spec, **strip, **bare) == dataclasses.replace(IDEAL, **strip)


@pytest.mark.parametrize("case", [MOE, DENSE], ids=["moe", "dense"])
@pytest.mark.parametrize("estimator", ["des", "analytic"])
def test_ideal_reproduces_the_stackless_numbers_exactly(case, estimator):
    before, ideal = step(estimator, None, **case), step(estimator, "ideal", **case)
    assert ideal.step_time_s == before.step_time_s
    assert ideal.breakdown == before.breakdown
    assert ideal.peak_memory_bytes == before.peak_memory_bytes
    assert ideal.stack == "ideal" and before.stack == "ideal"


@pytest.mark.parametrize("stack", ["megatron-primus", "maxtext", "torchtitan"])
def test_engine_and_closed_form_agree_under_a_stack(stack):
    des, cf = step("des", stack, **MOE), step("analytic", stack, **MOE)
    assert des.stack == cf.stack == stack
    assert cf.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
    assert cf.breakdown["framework"] == pytest.approx(des.breakdown["framework"], rel=1e-9)


def test_host_syncs_cost_what_the_profile_says_per_moe_layer_pass():
    model = api.load_model(MOE["model"])
    spec = load_stack("megatron-primus")
    r = step("analytic", spec, **MOE)
    moe_layers = model.num_layers - model.num_dense_layers
    passes = 2  # forward and backward (the full recompute's re-run counts as "recompute")
    microbatches = MOE["gbs"] // (MOE["mbs"] * 16)
    expected = moe_layers * passes * microbatches * spec.moe.host_syncs_per_layer * spec.moe.host_sync_us * 1e-6
    assert r.breakdown["host_sync"] == pytest.approx(expected, rel=1e-9)
    assert "host_sync" not in step("analytic", "maxtext", **MOE).breakdown  # XLA: no device->host sync


def test_layer_overhead_and_kernel_gaps_raise_the_step_monotonically():
    base = load_stack("ideal")
    times = []
    for overhead, gap in ((0.0, 0.0), (20.0, 0.0), (20.0, 2.0), (80.0, 2.0)):
        spec = base.with_values(**{"launch.layer_overhead_us": overhead, "launch.kernel_gap_us": gap})
        times.append(step("analytic", spec, **DENSE).step_time_s)
    assert times[0] < times[1] < times[2] < times[3]


@pytest.mark.parametrize("kernel, category", [("rmsnorm", "norm"), ("swiglu", "activation"), ("loss", "loss")])
def test_an_unfused_kernel_costs_extra_hbm_passes(kernel, category):
    fused = step("analytic", "ideal", **DENSE)
    rest = tuple(k for k in FUSIBLE if k != kernel)
    unfused = step("analytic", load_stack("ideal").with_values(**{"fusion.fused": rest}), **DENSE)
    assert unfused.breakdown[category] > fused.breakdown[category]
    assert unfused.step_time_s > fused.step_time_s


def test_unfused_rope_adds_its_own_kernel():
    spec = load_stack("ideal").with_values(**{"fusion.fused": ("rmsnorm", "swiglu", "loss")})
    assert "rope" not in step("analytic", "ideal", **DENSE).breakdown
    assert step("analytic", spec, **DENSE).breakdown["rope"] > 0


def test_capacity_dispatch_computes_the_padding_dropless_does_not():
    model = dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=2.0)
    case = {**MOE, "model": model}
    pad = load_stack("ideal").with_values(**{"moe.dispatch": "capacity"})
    dropless = load_stack("ideal").with_values(**{"moe.dispatch": "dropless"})
    assert step("analytic", pad, **case).breakdown["experts"] > step("analytic", dropless, **case).breakdown["experts"]


def test_padded_exchange_carries_every_capacity_slot():
    """Padded to capacity, the all-to-all moves the static [experts, capacity, hidden]
    buffer: its time grows with the capacity factor; dropless, it carries the routed tokens
    whatever the factor."""
    def a2a(dispatch: str, factor: float) -> float:
        model = dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=factor)
        spec = load_stack("ideal").with_values(**{"moe.dispatch": dispatch})
        return step("analytic", spec, **{**MOE, "model": model}).comm_by_collective["ep_a2a/all_to_all"]["total_s"]

    assert a2a("capacity", 4.0) > 2.5 * a2a("capacity", 1.25)
    assert a2a("dropless", 4.0) == pytest.approx(a2a("dropless", 1.25))
    assert a2a("capacity", 1.25) > a2a("dropless", 1.25)


def test_maxtext_waits_for_its_fsdp_gathers_in_both_estimators():
    """MaxText's profile hides neither the FSDP weight gathers nor the gradient reduction
    (the Kimi-K2 sweep's step grows linearly from one sequence): under ZeRO-3 the gathers
    are exposed, and the step is longer than with them prefetched."""
    case = {**MOE, "zero": 3}
    mx = load_stack("maxtext")
    ahead = mx.with_values(**{"overlap.param_gather": True})
    for estimator in ("analytic", "des"):
        wait, hidden = step(estimator, mx, **case), step(estimator, ahead, **case)
        gathers = wait.comm_by_collective["dp_param_gather/all_gather"]
        assert gathers["exposed_s"] == pytest.approx(gathers["total_s"], rel=0.05)
        assert wait.step_time_s > hidden.step_time_s


def test_maxtext_and_megatron_differ_by_dispatch_path_and_syncs():
    # dropless (no capacity factor): Megatron-Core's alltoall dispatcher syncs the split sizes to
    # the host once per layer, MaxText's static XLA program never does
    dropless = {**MOE, "model": dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=0.0)}
    mx0, mg0 = step("des", "maxtext", **dropless), step("des", "megatron-primus", **dropless)
    assert mg0.breakdown.get("host_sync", 0) > 0 == mx0.breakdown.get("host_sync", 0)
    # capacity factor 2: maxtext's batched einsums compute twice the routed tokens at the dense
    # price; Megatron-Core drops and pads (static split sizes: no sync) and its grouped kernels
    # compute the padded capacity at their measured speed
    padded = {**MOE, "model": dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=2.0)}
    tuned = load_stack("maxtext").with_values(**{"moe.padded_speed": 1.0, "kernels.speed": 1.0})  # the path alone, at tuned speed
    mx, mg = step("des", tuned, **padded), step("des", "megatron-primus", **padded)
    assert mx.breakdown["moe_dispatch"] > 0 == mg.breakdown.get("moe_dispatch", 0)  # maxtext's one-hot einsums
    assert mg.breakdown["experts"] > 1.5 * mg0.breakdown["experts"]  # megatron computes its padding
    assert mg.breakdown.get("host_sync", 0) == 0


def test_fp8_recipe_cast_factor_scales_the_casts():
    case = {**DENSE, "dtype": "fp8"}
    heavy = load_stack("ideal").with_values(**{"fp8.cast_bytes_factor": 2.0})
    assert step("analytic", heavy, **case).breakdown["fp8_cast"] > step("analytic", "ideal", **case).breakdown["fp8_cast"]


def test_expert_speed_of_the_dispatch_path_stretches_only_the_routed_experts():
    model = dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=1.25)
    case = {**MOE, "model": model}
    base = load_stack("maxtext").with_values(**{"moe.padded_speed": 1.0, "moe.dropless_speed": 1.0})
    fast = step("analytic", base, **case)
    slow = step("analytic", base.with_values(**{"moe.padded_speed": 0.5}), **case)
    assert slow.breakdown["experts"] == pytest.approx(2 * fast.breakdown["experts"], rel=1e-6)
    assert slow.breakdown["attention_proj"] == pytest.approx(fast.breakdown["attention_proj"], rel=1e-9)
    # the dropless speed does not touch a padded run, and sets a dropless one
    assert step("analytic", base.with_values(**{"moe.dropless_speed": 0.5}), **case).step_time_s == fast.step_time_s
    dropless = {**MOE, "model": dataclasses.replace(model, capacity_factor=0.0)}
    a = step("analytic", base, **dropless)
    b = step("analytic", base.with_values(**{"moe.dropless_speed": 0.5}), **dropless)
    assert b.breakdown["experts"] == pytest.approx(2 * a.breakdown["experts"], rel=1e-6)


def test_kernel_speed_stretches_compute_not_communication():
    slow = load_stack("ideal").with_values(**{"kernels.speed": 0.5})
    fast, half = step("analytic", "ideal", **MOE), step("analytic", slow, **MOE)
    for category in ("attention_proj", "experts", "norm", "lm_head"):
        assert half.breakdown[category] == pytest.approx(2 * fast.breakdown[category], rel=1e-9)
    assert half.comm_by_collective.keys() == fast.comm_by_collective.keys()
    for key, value in fast.comm_by_collective.items():
        assert half.comm_by_collective[key]["total_s"] == pytest.approx(value["total_s"], rel=1e-9)


def test_overlap_policy_sets_plan_defaults_under_explicit_knobs():
    assert load_stack("nemo").overlap.tp_comm is True
    assert step("analytic", "nemo", **DENSE).plan["tp_comm_overlap"] is True
    assert step("analytic", "nemo", **DENSE, tp_comm_overlap=False).plan["tp_comm_overlap"] is False


def test_plan_dict_round_trips_with_its_stack():
    plan = api.make_plan(8, tp=2, gbs=16, seq=4096, stack="maxtext")
    assert plan.to_dict()["stack"] == "maxtext"
    assert ParallelPlan(**plan.to_dict()) == plan


@pytest.mark.parametrize("text, field", [
    ('name = "x"\n[launch]\nkernel_gap_us = 1\nbogus = 2\n', "bogus"),
    ('name = "x"\n[launch]\nlayer_overhead_us = -5\n', "layer_overhead_us"),
    ('name = "x"\n[moe]\ndispatch = "sideways"\n', "dispatch"),
    ('name = "x"\n[moe]\nhost_syncs_per_layer = 1.5\n', "host_syncs_per_layer"),
    ('name = "x"\n[moe]\nmask_einsum = "yes"\n', "mask_einsum"),
    ('name = "x"\n[fp8]\nweights_cast_once = 1\n', "weights_cast_once"),
    ('name = "x"\n[fp8]\nnorm_fused_cast = "on"\n', "norm_fused_cast"),
    ('name = "x"\n[fp8]\ndelayed_scaling = 0\n', "delayed_scaling"),
    ('name = "x"\n[fp8]\nbackward_split_accumulator = "yes"\n', "backward_split_accumulator"),
    ('name = "x"\n[data]\nhost_s_per_mtoken = -1\n', "host_s_per_mtoken"),
    ('name = "x"\n[data]\nloader = "grain"\n', "loader"),
    ('name = "x"\n[fusion]\nfused = ["layernorm"]\n', "layernorm"),
    ('name = "x"\n[overlap]\ntp_comm = "yes"\n', "tp_comm"),
    ('name = "x"\n[overlap]\ntp_comm_share = 1.5\n', "tp_comm_share must be in"),
    ('name = "x"\n[overlap]\ntp_comm_share = true\n', "tp_comm_share"),
    ('name = "x"\n[overlap]\ntp_summed_dgrad = "no"\n', "tp_summed_dgrad"),
    ('name = "x"\n[fp8]\namax_fused = 1\n', "amax_fused"),
    ('name = "x"\ncolour = "red"\n', "colour"),
    ('name = "x"\n[memory]\nweight_bytes = -2\n', "weight_bytes"),
    ('name = "x"\n[memory]\nfragmentation = 1.5\n', "fragmentation"),
])
def test_strict_loading_names_the_bad_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field):
        load_stack(path)


def test_a_stack_file_by_path_loads_like_a_name(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_bytes((STACK_DIR / "maxtext.toml").read_bytes())
    assert load_stack(path) == load_stack("maxtext")
    assert tomllib.loads(path.read_text())["name"] == "maxtext"


def test_cli_stack_flag_reports_the_stack(capsys):
    args = ("simulate --model deepseek-v2-lite --nodes 2 --ep 8 --gbs 32 --seq 4096 --recompute full "
            "--engine analytic --json --stack megatron-primus").split()
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"] == "megatron-primus" and out["plan"]["stack"] == "megatron-primus"
    assert out["breakdown"]["host_sync"] > 0


def test_cli_unknown_stack_is_one_line_exit_2(capsys):
    args = "simulate --model llama3.1-8b --nodes 1 --gbs 8 --seq 4096 --stack nope".split()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stack" in err[0] and "nope" in err[0]


def test_stack_spec_is_hashable_and_frozen():
    spec = load_stack("megatron-primus")
    assert hash(spec) == hash(load_stack("megatron-primus"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    assert isinstance(spec, StackSpec)


def test_an_explicit_plan_can_be_priced_under_a_stack():
    plan = api.make_plan(16, ep=8, mbs=1, gbs=32, seq=4096, recompute="full")
    base = api.estimate(MOE["model"], MOE["cluster"], plan, nodes=2)
    under = api.estimate(MOE["model"], MOE["cluster"], plan, nodes=2, stack="megatron-primus")
    assert base.stack == "ideal" and under.stack == "megatron-primus"
    assert under.step_time_s > base.step_time_s
    assert under.plan["overlap_grad_reduce"] == plan.overlap_grad_reduce  # an explicit plan keeps its knobs
    with pytest.raises(ConfigError, match="either"):
        api.estimate(MOE["model"], MOE["cluster"], plan, nodes=2, stack="maxtext", tp=2)


def test_search_runs_every_plan_under_the_stack():
    from perfsim.search import search

    args = dict(gpus=16, gbs=32, seq=4096, fixed={"tp": 1, "pp": 1, "zero": 1, "ep": (1, 8)}, top=3, confirm=1)
    ideal = search(MOE["model"], MOE["cluster"], **args)
    mg = search(MOE["model"], MOE["cluster"], stack="megatron-primus", **args)
    assert all(row.plan["stack"] == "megatron-primus" for row in mg.rows)
    assert all(row.plan["stack"] == "ideal" for row in ideal.rows)
    assert mg.rows[0].step_time_s > ideal.rows[0].step_time_s  # host syncs and framework time on every plan
    assert "stack-megatron-primus" in ParallelPlan(**mg.rows[0].plan).describe()


def _moe_steps(stack, capacity_factor):
    from perfsim.lowering.layers import LayerBuilder

    model = dataclasses.replace(api.load_model("deepseek-v2-lite"), capacity_factor=capacity_factor)
    plan = ParallelPlan(tp=1, dp=8, ep=8, mbs=2, gbs=16, seq=4096, stack=load_stack(stack))
    return model, LayerBuilder(model, plan).moe_forward()


def test_mask_einsum_capacity_path_prices_the_one_hot_dispatch_and_combine_gemms():
    """MaxText's capacity path (dense_matmul) dispatches BSM,BSEC->EBCM and combines
    EBCM,BSEC->BSM over one-hot masks: two dense GEMMs of S x (E x C) x hidden per
    sequence, C = ceil(S x top_k / E) x capacity factor, in place of the permute kernels;
    their work grows with the capacity factor. Other stacks keep the permutes."""
    model, steps = _moe_steps("maxtext", 2.0)
    by_name = {s.name: s for s in steps}
    slots = model.num_experts * int(math.ceil(4096 * model.top_k / model.num_experts) * 2.0)
    for name in ("dispatch_einsum", "combine_einsum"):
        assert by_name[name].category == "moe_dispatch"
        assert by_name[name].flops == pytest.approx(2 * 2 * slots * 4096 * model.hidden_size)  # 2 sequences
    assert "permute" not in by_name and "local_sort" not in by_name
    _, half = _moe_steps("maxtext", 1.0)
    assert next(s for s in half if s.name == "dispatch_einsum").flops < by_name["dispatch_einsum"].flops / 1.9
    for stack, cf in (("maxtext", 0.0), ("megatron-primus", 2.0), ("ideal", 2.0)):
        names = {s.name for s in _moe_steps(stack, cf)[1]}
        assert "permute" in names and "dispatch_einsum" not in names, stack


def test_dispatch_mask_takes_no_gradient_the_combine_mask_does():
    from perfsim.lowering.layers import _backward_step

    _, steps = _moe_steps("maxtext", 1.25)
    dispatch, combine = (next(s for s in steps if s.name == n) for n in ("dispatch_einsum", "combine_einsum"))
    assert _backward_step(dispatch).flops == dispatch.flops and dict(_backward_step(dispatch).meta)["grad"] == "dgrad"
    assert _backward_step(combine).flops == 2 * combine.flops
    report = step("des", "maxtext", **{**MOE, "model": dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=1.25)})
    closed = step("analytic", "maxtext", **{**MOE, "model": dataclasses.replace(api.load_model(MOE["model"]), capacity_factor=1.25)})
    assert report.breakdown["moe_dispatch"] > 0
    assert closed.step_time_s == pytest.approx(report.step_time_s, rel=0.05)


def test_mask_einsum_experts_run_as_a_batched_dense_gemm_not_the_grouped_kernel():
    """EBCM,EMH->EBCH is one batched dense GEMM over the padded capacity: priced at the
    dense GEMM table's efficiency even where the GPU has a grouped-kernel table (MI300X);
    the dropless path keeps the grouped kernel."""
    from perfsim.cost.kernels import compute_time
    from perfsim.lowering.graph import build_graph
    from perfsim.system.hardware import load_gpu

    gpu = load_gpu("mi300x")
    bare = dataclasses.replace(gpu, grouped_gemm={})
    _, steps = _moe_steps("maxtext", 1.25)
    up = next(s for s in steps if s.name == "expert_up")
    assert dict(up.meta).get("batched") is True
    model = dataclasses.replace(api.load_model("deepseek-v2-lite"), capacity_factor=1.25)
    plan = ParallelPlan(tp=1, dp=8, ep=8, mbs=2, gbs=16, seq=4096, stack=load_stack("maxtext"))
    op = next(o for o in build_graph(model, plan).ops if o.name == "expert_up")
    assert compute_time(op, gpu, "bf16") == pytest.approx(compute_time(op, bare, "bf16"), rel=1e-9)
    grouped = dataclasses.replace(op, meta={k: v for k, v in op.meta.items() if k != "batched"})
    assert abs(compute_time(grouped, gpu, "bf16") / compute_time(op, gpu, "bf16") - 1) > 1e-3  # the grouped kernel's price
    _, dropless = _moe_steps("maxtext", 0.0)
    assert "batched" not in dict(next(s for s in dropless if s.name == "expert_up").meta)


def test_te_stacks_cast_each_fp8_weight_once_per_step():
    """Transformer Engine caches the FP8 copy of each weight over a step's microbatches
    (is_first_microbatch): under megatron-primus the weight casts are paid once per step,
    so more microbatches cost less cast time per microbatch; ideal (perfsim's default)
    casts them every microbatch, as before."""
    case = {**DENSE, "dtype": "fp8", "pp": 1, "tp": 1}
    few, many = {**case, "gbs": 8}, {**case, "gbs": 64}

    def casts_per_mb(stack, knobs):
        report = step("analytic", stack, **knobs)
        return report.breakdown["fp8_cast"] / (knobs["gbs"] // 8)  # 8 GPUs, mbs 1: microbatches per rank

    assert load_stack("megatron-primus").fp8.weights_cast_once and not load_stack("ideal").fp8.weights_cast_once
    assert casts_per_mb("megatron-primus", many) < 0.8 * casts_per_mb("megatron-primus", few)
    assert casts_per_mb("ideal", many) == pytest.approx(casts_per_mb("ideal", few), rel=1e-6)


def test_te_stacks_write_norm_fed_gemm_inputs_in_fp8_from_the_norm():
    """TELayerNormColumnParallelLinear: the norm in front of the QKV and MLP-up GEMMs
    writes their FP8 input, so under megatron-primus those inputs take no cast pass; the
    attention output projection and the MLP down projection keep theirs."""
    from perfsim.lowering.layers import LayerBuilder

    model = api.load_model("llama3.1-8b")

    def cast_bytes(stack):
        plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=load_stack(stack))
        b = LayerBuilder(model, plan)
        return {s.name: s.bytes for s in b.attention_forward() + b.mlp_forward() if s.category == "fp8_cast"}

    te, ideal = cast_bytes("megatron-primus"), cast_bytes("ideal")
    ideal = {k: v for k, v in ideal.items() if not k.endswith("_fp8_amax")}  # delayed scaling: no amax pass
    assert te.keys() == ideal.keys()
    h, tokens = model.hidden_size, 4096
    widths = {"qkv": model.q_width + 2 * model.num_kv_heads * model.head_dim, "mlp_up": 2 * model.ffn_hidden_size}
    for name in te:
        gemm = name.rsplit("_fp8_", 1)[0]
        if gemm in widths:  # the norm-fed inputs: only the weight [h, width] is cast
            share = widths[gemm] / (tokens + widths[gemm])
            assert te[name] == pytest.approx(share * ideal[name], rel=1e-9), name
        else:
            assert te[name] == pytest.approx(ideal[name]), name  # one microbatch: the same weight cast too


def test_delayed_scaling_stacks_cast_without_an_amax_pass():
    """Delayed scaling (Megatron-LM's default --fp8-recipe; megatron-primus and nemo) reads
    each scale from earlier steps' amax history: the cast kernel records the amax as it
    casts, so the amax pass that current scaling (ideal, torchtitan) runs first is gone and
    the cast-transpose itself is unchanged."""
    from perfsim.lowering.layers import LayerBuilder

    model = api.load_model("llama3.1-8b")

    def casts(stack):
        plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=stack)
        b = LayerBuilder(model, plan)
        return {s.name: s.bytes for s in b.attention_forward() + b.mlp_forward() if s.category == "fp8_cast"}

    for name in ("megatron-primus", "nemo"):
        assert load_stack(name).fp8.delayed_scaling
    assert not load_stack("ideal").fp8.delayed_scaling and not load_stack("torchtitan").fp8.delayed_scaling
    current = load_stack("ideal")
    delayed = dataclasses.replace(current, fp8=dataclasses.replace(current.fp8, delayed_scaling=True))
    with_amax, without = casts(current), casts(delayed)
    assert any(k.endswith("_fp8_amax") for k in with_amax) and not any(k.endswith("_fp8_amax") for k in without)
    assert without == {k: v for k, v in with_amax.items() if k.endswith("_fp8_cast")}


def test_a_compiled_stack_fuses_the_activation_and_gradient_amax_into_their_producers():
    """fp8.amax_fused (torchtitan: torchao's float8 model of torch.compile, amax of activations
    and output gradients fused into the op that produced them): a GEMM's amax pass reads only
    its weights (k x n, BF16) and the backward runs no amax kernel; the casts themselves are
    current scaling's."""
    from perfsim.lowering.layers import LayerBuilder, backward
    from perfsim.lowering.steps import ACT_BYTES

    model = api.load_model("llama3.1-8b")
    assert load_stack("torchtitan").fp8.amax_fused and not load_stack("ideal").fp8.amax_fused
    current = load_stack("ideal")
    fused = dataclasses.replace(current, fp8=dataclasses.replace(current.fp8, amax_fused=True))

    def steps(stack):
        plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=stack)
        b = LayerBuilder(model, plan)
        fwd = b.attention_forward() + b.mlp_forward()
        return ({s.name: s.bytes for s in fwd if s.category == "fp8_cast"},
                {s.name: s.bytes for s in backward(fwd) if s.category == "fp8_cast"},
                {s.name: s.gemm for s in fwd if s.gemm is not None})

    (plain_fwd, plain_bwd, gemms), (fused_fwd, fused_bwd, _) = steps(current), steps(fused)
    for name, gemm in gemms.items():
        assert fused_fwd[f"{name}_fp8_amax"] == pytest.approx(gemm.k * gemm.n * ACT_BYTES), name
        assert fused_fwd[f"{name}_fp8_amax"] < plain_fwd[f"{name}_fp8_amax"]
        assert fused_fwd[f"{name}_fp8_cast"] == plain_fwd[f"{name}_fp8_cast"]
        assert f"{name}_fp8_amax_bwd" not in fused_bwd and plain_bwd[f"{name}_fp8_amax_bwd"] > 0  # no kernel
        assert fused_bwd[f"{name}_fp8_cast_bwd"] == plain_bwd[f"{name}_fp8_cast_bwd"]
    # FP8 primary weights cast no weight: no amax pass at all
    plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=fused, fp8_params=True)
    b = LayerBuilder(model, plan)
    fwd = b.attention_forward() + b.mlp_forward()
    assert not [s.name for s in fwd + backward(fwd) if "fp8_amax" in s.name]


def test_fp8_backward_casts_the_output_gradient_whatever_the_forward_fused():
    """Each FP8 GEMM's backward casts its output gradient [tokens, n] (read BF16, write the
    FP8 values and their transpose) for dgrad and wgrad, under every stack; a norm-written
    FP8 input adds the transpose the norm did not write (read + write one FP8 copy). The
    weights' transposes came with their forward cast, so the backward casts no weight."""
    from perfsim.lowering.layers import LayerBuilder, backward
    from perfsim.lowering.steps import ACT_BYTES, FP8_BYTES

    model = api.load_model("llama3.1-8b")
    tokens, h = 4096, model.hidden_size
    widths = {"qkv": model.q_width + 2 * model.num_kv_heads * model.head_dim, "attn_out": h,
              "mlp_up": 2 * model.ffn_hidden_size, "mlp_down": h}
    inputs = {"qkv": h, "attn_out": model.q_width, "mlp_up": h, "mlp_down": model.ffn_hidden_size}
    for stack in ("ideal", "megatron-primus"):
        plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=load_stack(stack))
        b = LayerBuilder(model, plan)
        bwd = {s.name: s.bytes for s in backward(b.attention_forward() + b.mlp_forward())
               if s.category == "fp8_cast" and s.name.endswith("_fp8_cast_bwd")}
        fused = load_stack(stack).fp8.norm_fused_cast
        for gemm, n in widths.items():
            expected = tokens * n * (ACT_BYTES + 2 * FP8_BYTES)
            if fused and gemm in ("qkv", "mlp_up"):
                expected += 2 * FP8_BYTES * tokens * inputs[gemm]
            assert bwd[f"{gemm}_fp8_cast_bwd"] == pytest.approx(expected), (stack, gemm)


def _fp8_gemm_times(stack: str, gpu: str) -> dict[str, float]:
    """Forward and backward times of one layer's FP8 GEMMs (Llama-3.1-8B, 4096 tokens) under ``stack`` on ``gpu``."""
    from perfsim.cost.kernels import compute_time
    from perfsim.estimators.analytic import _ops
    from perfsim.lowering.layers import LayerBuilder, backward
    from perfsim.lowering.ops import OpKind
    from perfsim.system.hardware import load_gpu

    plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=load_stack(stack))
    b = LayerBuilder(api.load_model("llama3.1-8b"), plan)
    fwd = b.attention_forward() + b.mlp_forward()
    g = load_gpu(gpu)
    return {op.name: compute_time(op, g, "fp8") for op in _ops(fwd + backward(fwd), 0) if op.kind is OpKind.GEMM}


def test_te_backward_fp8_gemms_run_at_the_split_accumulator_speed_on_hopper():
    """Transformer Engine runs dgrad and wgrad with a split accumulator and the forward GEMM
    with the fast one (_2X_ACC_DGRAD / _2X_ACC_WGRAD = True, _2X_ACC_FPROP = False): on
    H100 the backward FP8 GEMMs take 1 / fp8_split_accumulator_speed longer than under a
    stack without it, the forward ones are unchanged; on MI300X (FP32 accumulators) nothing moves."""
    from perfsim.system.hardware import load_gpu

    speed = load_gpu("h100").fp8_split_accumulator_speed
    assert 0 < speed < 1 and load_gpu("mi300x").fp8_split_accumulator_speed == 1.0
    assert load_stack("nemo").fp8.backward_split_accumulator and not load_stack("ideal").fp8.backward_split_accumulator
    nemo = load_stack("nemo")
    fast = dataclasses.replace(nemo, fp8=dataclasses.replace(nemo.fp8, backward_split_accumulator=False))
    split, plain = _fp8_gemm_times("nemo", "h100"), _fp8_gemm_times(fast, "h100")
    assert split.keys() == plain.keys()
    backward_names = [n for n in split if n.endswith(("_bwd", "_wgrad"))]
    assert backward_names and len(backward_names) < len(split)
    for name in split:
        ratio = 1 / speed if name in backward_names else 1.0
        assert split[name] == pytest.approx(plain[name] * ratio, rel=1e-9), name
    assert _fp8_gemm_times("nemo", "mi300x") == pytest.approx(_fp8_gemm_times(fast, "mi300x"), rel=1e-12)


def test_split_accumulator_slows_an_fp8_step_on_hopper_only_in_its_backward_gemms():
    """End to end: an FP8 Llama step on H100 under nemo is slower than the same stack with
    fast accumulation everywhere, by less than the whole GEMM time would give; a BF16 step
    does not move at all (the split accumulator is an FP8 matter)."""
    nemo = load_stack("nemo")
    fast = dataclasses.replace(nemo, fp8=dataclasses.replace(nemo.fp8, backward_split_accumulator=False))
    knobs = dict(nodes=1, tp=1, pp=1, mbs=1, gbs=8, seq=4096, estimator="analytic", check_memory=False)
    split = api.simulate("llama3.1-8b", "h100-ib", dtype="fp8", stack=nemo, **knobs)
    plain = api.simulate("llama3.1-8b", "h100-ib", dtype="fp8", stack=fast, **knobs)
    from perfsim.system.hardware import load_gpu

    stretch = 1 / load_gpu("h100").fp8_split_accumulator_speed - 1
    for k in ("mlp", "attention_proj"):  # dgrad + wgrad are about 2/3 of a linear layer's GEMM time
        extra = split.breakdown[k] - plain.breakdown[k]
        assert 0.5 * stretch * plain.breakdown[k] < extra < stretch * plain.breakdown[k], k
    assert split.breakdown["attention_core"] == pytest.approx(plain.breakdown["attention_core"])
    bf16 = [api.simulate("llama3.1-8b", "h100-ib", dtype="bf16", stack=s, **knobs).step_time_s for s in (nemo, fast)]
    assert bf16[0] == pytest.approx(bf16[1], rel=1e-12)


@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_real_data_adds_the_stacks_input_pipeline_time_per_step(estimator):
    """plan.real_data: the stack's [data] host_s_per_mtoken times the global batch's
    tokens per GPU (here 8 x 4096 over 8 GPUs), once per step, in both estimators and in
    the breakdown as `data`; synthetic data and a stack whose pipeline costs nothing add none."""
    stack = load_stack("maxtext").with_values(**{"data.host_s_per_mtoken": 100.0})
    knobs = dict(nodes=1, tp=1, pp=1, mbs=1, gbs=8, seq=4096, estimator=estimator, check_memory=False)
    synthetic = api.simulate("llama3.1-8b", "mi300x-pollara", stack=stack, **knobs)
    real = api.simulate("llama3.1-8b", "mi300x-pollara", stack=stack, real_data=True, **knobs)
    expected = 8 * 4096 / 8 / 1e6 * 100.0
    assert real.step_time_s - synthetic.step_time_s == pytest.approx(expected, rel=1e-6)
    assert real.breakdown["data"] == pytest.approx(expected, rel=1e-6) and "data" not in synthetic.breakdown
    free = api.simulate("llama3.1-8b", "mi300x-pollara", stack="ideal", real_data=True, **knobs)
    assert free.step_time_s == pytest.approx(
        api.simulate("llama3.1-8b", "mi300x-pollara", stack="ideal", **knobs).step_time_s, rel=1e-12)


def test_only_maxtext_ships_an_input_pipeline_cost():
    for name in list_stacks():
        rate = load_stack(name).data.host_s_per_mtoken
        assert (rate > 0) == (name == "maxtext"), name


def test_cli_real_data_flag_reports_the_input_pipeline(capsys):
    args = ["simulate", "--model", "llama3.1-8b", "--cluster", "mi300x-pollara", "--nodes", "1", "--gbs", "8",
            "--seq", "4096", "--stack", "maxtext", "--allow-oom"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--real-data"]) == 0
    real = capsys.readouterr().out
    assert "real_data=True" in real and " data " in real and " data " not in plain


def test_split_accumulator_also_slows_the_fp8_expert_gemms_backward_on_hopper():
    """The routed experts' grouped FP8 GEMMs take the same split accumulator in their
    dgrad / wgrad (Transformer Engine's grouped linear): 1 / speed longer on H100, their
    forward unchanged."""
    from perfsim.cost.kernels import compute_time
    from perfsim.estimators.analytic import _ops
    from perfsim.lowering.layers import LayerBuilder, backward
    from perfsim.lowering.ops import OpKind
    from perfsim.system.hardware import load_gpu

    nemo = load_stack("nemo")
    fast = dataclasses.replace(nemo, fp8=dataclasses.replace(nemo.fp8, backward_split_accumulator=False))
    gpu = load_gpu("h100")

    def times(stack):
        plan = ParallelPlan(tp=1, dp=1, ep=1, mbs=1, gbs=1, seq=4096, dtype="fp8", stack=stack)
        fwd = LayerBuilder(api.load_model("mixtral-8x7b"), plan).moe_forward()
        ops = _ops(fwd + backward(fwd), 0)
        return {op.name: compute_time(op, gpu, "fp8") for op in ops if op.kind is OpKind.GROUPED_GEMM}

    split, plain = times(nemo), times(fast)
    grads = [n for n in split if n.endswith(("_bwd", "_wgrad"))]
    assert grads and len(grads) < len(split)
    for name in split:
        ratio = 1 / gpu.fp8_split_accumulator_speed if name in grads else 1.0
        assert split[name] == pytest.approx(plain[name] * ratio, rel=1e-9), name


def test_a_stack_profile_may_be_based_on_another(tmp_path):
    """``base = "nemo"``: the file's tables override the base's key by key (one version family
    of a stack differs from another in a few values); a missing base, a loop or a bad value is
    one ConfigError line."""
    from perfsim.errors import ConfigError
    from perfsim.system.stacks import load_stack

    derived = tmp_path / "nemo-mine.toml"
    derived.write_text('base = "nemo"\nname = "nemo-mine"\n[moe]\ndropless_speed = 0.7\nsource = "mine"\n')
    spec, nemo = load_stack(derived), load_stack("nemo")
    assert spec.name == "nemo-mine" and spec.moe.dropless_speed == 0.7 and spec.moe.source == "mine"
    assert spec.moe.host_syncs_per_layer == nemo.moe.host_syncs_per_layer and spec.kernels == nemo.kernels
    # a base given as a path beside the derived file
    (tmp_path / "mid.toml").write_text('base = "nemo-mine.toml"\nname = "mid"\n[kernels]\nspeed_nvidia = 0.5\n')
    mid = load_stack(tmp_path / "mid.toml")
    assert mid.kernels.speed_nvidia == 0.5 and mid.moe.dropless_speed == 0.7 and mid.kernels.attention_nvidia == "cudnn"
    loop_a, loop_b = tmp_path / "a.toml", tmp_path / "b.toml"
    loop_a.write_text('base = "b.toml"\nname = "a"\n')
    loop_b.write_text('base = "a.toml"\nname = "b"\n')
    for path, match in ((loop_a, "loop or nest deeper"), (tmp_path / "c.toml", "unknown profile 'no-such'"),
                        (tmp_path / "d.toml", "base must be a stack profile name or path")):
        if path.name == "c.toml":
            path.write_text('base = "no-such"\nname = "c"\n')
        elif path.name == "d.toml":
            path.write_text('base = 3\nname = "d"\n')
        with pytest.raises(ConfigError, match=match):
            load_stack(path)
    shipped = load_stack("nemo-25.11")
    assert shipped.moe.dropless_speed < nemo.moe.dropless_speed and shipped.fp8 == nemo.fp8
    # a rewritten base loads again under the derived profile (its cache checks every file it read)
    import os

    base = tmp_path / "own-base.toml"
    base.write_text('name = "own-base"\n[kernels]\nspeed = 0.9\nsource = "assumed"\n')
    child = tmp_path / "child.toml"
    child.write_text('base = "own-base.toml"\nname = "child"\n')
    assert load_stack(child).kernels.speed == 0.9
    base.write_text('name = "own-base"\n[kernels]\nspeed = 0.8\nsource = "assumed"\n')
    os.utime(base, ns=(base.stat().st_atime_ns, base.stat().st_mtime_ns + 10**9))
    assert load_stack(child).kernels.speed == 0.8
