"""The automodel stack (NeMo AutoModel: FSDP2 + Transformer Engine + DeepEP) and its published
runs: BF16 state with no FP32 master, weights gathered once a step, no gradient clipping on
the page's runs, every run predicted to fit as it ran."""

from pathlib import Path

import pytest
from conftest import edited_runs

from perfsim import api
from perfsim.design.runs import predict, read_runs
from perfsim.errors import ConfigError
from perfsim.plan.sharding import shard_degrees, stage_rank_params
from perfsim.system.stacks import load_stack

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "validation" / "runs" / "published.csv"
PLAN = dict(ep=8, zero=3, mbs=1, gbs=64, seq=4096, recompute="full", dispatch="deepep")


def _estimate(stack: str, **knobs):
    return api.estimate(api.load_model("qwen3-30b-a3b"), "h100-ib", nodes=1, stack=load_stack(stack),
                        check_memory=False, **(PLAN | knobs))


def test_automodel_holds_bf16_weights_gradients_and_moments_with_weights_gathered_once():
    report = _estimate("automodel")
    plan = api.make_plan(8, stack=load_stack("automodel"), **PLAN)
    assert plan.keeps_weights_gathered and plan.step_zero == 1  # once a step, even without a pipeline
    assert report.plan["zero3_gather"] == "once"
    model = api.load_model("qwen3-30b-a3b")
    dense, expert = stage_rank_params(model, plan, 0)
    d_shard, e_shard = shard_degrees(plan)
    held = report.memory[0]
    # 2 B gathered weights and 2 B gradients per parameter on the rank, 4 B of Adam moments
    # (torch.optim.Adam in the BF16 parameter's dtype) per parameter of its shard, no master
    assert held["weights_bytes"] == pytest.approx(2 * (dense + expert))
    assert held["gradients_bytes"] == pytest.approx(2 * (dense + expert))
    assert held["optimizer_bytes"] == pytest.approx(4 * (dense / d_shard + expert / e_shard))
    assert held["zero_buffers_bytes"] == 0.0
    # nemo's Megatron-style state (FP32 master and moments, 12 B per sharded parameter) is heavier
    nemo = _estimate("nemo").memory[0]
    assert nemo["optimizer_bytes"] == pytest.approx(3 * held["optimizer_bytes"])


def test_automodel_loss_is_unfused_and_its_bf16_logits_take_six_bytes():
    auto, nemo = _estimate("automodel"), _estimate("nemo")
    assert "loss" not in load_stack("automodel").fusion.fused and "loss" in load_stack("nemo").fusion.fused
    logits = 4096 * api.load_model("qwen3-30b-a3b").vocab_size
    assert auto.memory[0]["logits_bytes"] == pytest.approx(6 * logits)
    assert auto.breakdown["loss"] > nemo.breakdown["loss"]  # extra HBM passes of the unfused loss


def test_the_automodel_rows_run_blocked_routing_without_clipping_and_fit_as_they_ran():
    cases = [c for c in read_runs(RUNS) if c.stack == "automodel"]
    assert len(cases) == 6 and {c.source_id for c in cases} == {"nemo-automodel-perf-summary-2510"}
    for case in cases:
        knobs = dict(case.knobs)
        assert knobs["clip_grad"] is False and case.routing.topk_block and knobs["dispatch"] == "deepep"
        result = predict(case)
        assert result.fits, (case.id, result.peak_memory_bytes / 1e9)
    flushes = {c.id: dict(c.knobs).get("pipeline_flushes", 1) for c in cases}
    assert flushes["AM2510-DSV3-1024-H100"] == 4 and flushes["AM2510-KIMI-256-H100"] == 2


def test_clip_grad_column_reaches_the_plan_and_a_bad_value_names_it(tmp_path):
    on, off = _estimate("automodel", clip_grad=True), _estimate("automodel", clip_grad=False)
    assert on.breakdown["optimizer"] > off.breakdown["optimizer"]  # the norm pass over the gradients
    path = edited_runs(RUNS, tmp_path / "runs.csv", "AM2510-Q30B-8-H100", clip_grad="sometimes")
    with pytest.raises(ConfigError, match="clip_grad: expected true or false, got 'sometimes'"):
        read_runs(path)
