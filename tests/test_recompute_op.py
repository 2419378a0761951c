"""torchtitan's per-op selective checkpointing (``--recompute op``): per dense layer the matmul
outputs are kept except every other one (counted in call order wq wk wv wo w1 w3 w2), with the
attention output and the TP reduce-scatters'; the rest is recomputed. Priced in both
estimators from the same chains; memory keeps those outputs; MoE / MLA models are refused."""

import pytest

from perfsim import api
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.lowering.graph import block_passes
from perfsim.lowering.layers import LayerBuilder, op_linears
from perfsim.lowering.memory import layer_activation_bytes
from perfsim.lowering.ops import OpKind
from perfsim.search.space import build_space
from perfsim.plan.parallel import Recompute

KNOBS = dict(model="llama3.1-8b", cluster="h100-ib", nodes=1, mbs=2, gbs=16, seq=8192, zero=3, check_memory=False)


def test_the_policy_keeps_every_other_matmul_in_torchtitans_call_order():
    model = api.load_model("llama3.1-8b")
    assert [(name, kept) for _, name, _, kept in op_linears(model)] == [
        ("wq", True), ("wk", False), ("wv", True), ("wo", False), ("w1", True), ("w3", False), ("w2", True)]


@pytest.mark.parametrize("tp", [1, 8])
def test_recomputed_gemms_are_wk_wo_and_w3_and_the_attention_core_is_kept(tp):
    model = api.load_model("llama3.1-8b")
    plan = api.make_plan(8, mbs=2, gbs=16, seq=8192, zero=3, tp=tp, recompute="op")
    _, bwd, _ = block_passes(LayerBuilder(model, plan), plan, 3)
    redo = [s for s in bwd if s.name.endswith("_recompute")]
    assert not any(s.kind is OpKind.ATTENTION for s in redo)
    tokens, h = 2 * 8192, model.hidden_size
    kv, ffn = model.num_kv_heads * model.head_dim, model.ffn_hidden_size
    flops = sum(s.flops for s in redo if s.kind is OpKind.GEMM)
    assert flops == pytest.approx(2 * tokens * h * (kv + h + ffn) / tp, rel=1e-3)
    comms = [s.collective.coll.value for s in redo if s.collective is not None]
    assert comms == (["all_gather", "all_gather"] if tp > 1 else [])  # reduce-scatter outputs are kept
    assert {s.name for s in redo if s.kind is OpKind.ELEMENTWISE} >= {"attn_norm_recompute", "mlp_norm_recompute",
                                                                      "mlp_act_recompute"}


def test_op_keeps_the_kept_outputs_and_costs_between_none_and_full():
    model = api.load_model("llama3.1-8b")
    plan = api.make_plan(8, mbs=2, gbs=16, seq=8192, zero=3, recompute="op")
    h, q, kv, ffn = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim, model.ffn_hidden_size
    assert layer_activation_bytes(model, plan, 3) == pytest.approx(2 * 8192 * (h + q + q + kv + ffn + h) * 2)
    step = {r: api.simulate(recompute=r, **KNOBS) for r in ("none", "op", "full")}
    assert step["none"].step_time_s < step["op"].step_time_s < step["full"].step_time_s
    assert step["full"].peak_memory_bytes < step["op"].peak_memory_bytes < step["none"].peak_memory_bytes


def test_both_estimators_price_op_alike():
    a, d = (api.simulate(recompute="op", estimator=e, stack="torchtitan", **KNOBS) for e in ("analytic", "des"))
    assert a.step_time_s == pytest.approx(d.step_time_s, rel=1e-3)
    assert a.peak_memory_bytes == pytest.approx(d.peak_memory_bytes, rel=1e-9)


@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v2-lite"])
def test_op_is_refused_for_moe_and_mla_models(model, capsys):
    with pytest.raises(ConfigError, match="recompute 'op'"):
        api.simulate(model=model, cluster="h100-ib", nodes=1, mbs=1, gbs=8, seq=4096, zero=3, recompute="op",
                     check_memory=False)
    code = main(["simulate", "--model", model, "--cluster", "h100-ib", "--nodes", "1", "--gbs", "8", "--seq", "4096",
                 "--zero", "3", "--recompute", "op", "--engine", "analytic"])
    err = capsys.readouterr().err
    assert code == 2 and "recompute 'op'" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_search_tries_op_only_where_asked():
    model = api.load_model("llama3.1-8b")
    assert Recompute.OP not in build_space(model, 8).recompute
    assert build_space(model, 8, fixed={"recompute": ["op", "full"]}).recompute == (Recompute.OP, Recompute.FULL)


def test_cli_simulate_recompute_op(capsys):
    code = main(["simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--nodes", "1", "--gbs", "8", "--mbs", "1",
                 "--seq", "8192", "--zero", "3", "--recompute", "op", "--stack", "torchtitan", "--engine", "analytic"])
    out = capsys.readouterr().out
    assert code == 0 and "recompute=op" in out


def test_auto_and_search_walk_one_ladder_that_drops_op_where_it_is_not_modelled():
    """``recompute='auto'`` and ``perfsim search`` read the same ladder: the stack's settings
    less per-op checkpointing on MoE or MLA models (``recompute_ladder``)."""
    from perfsim.plan.parallel import recompute_ladder
    from perfsim.system.stacks import load_stack

    torchtitan = load_stack("torchtitan").recompute
    assert "op" in torchtitan.auto
    dense, moe, mla = (api.load_model(m) for m in ("llama3.1-8b", "qwen3-30b-a3b", "deepseek-v2-lite"))
    assert recompute_ladder(torchtitan.auto, dense) == torchtitan.auto
    for model in (moe, mla):
        assert recompute_ladder(torchtitan.auto, model) == tuple(v for v in torchtitan.auto if v != "op")
    space = build_space(moe, 8, stack=load_stack("torchtitan"))
    assert Recompute.OP not in space.recompute and Recompute.FULL in space.recompute
    assert Recompute.OP in build_space(dense, 8, stack=load_stack("torchtitan")).recompute
