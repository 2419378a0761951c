"""Gradient clipping by global norm in the optimizer phase (issue 14, what real steps
contain): a norm + in-place scale pass over the rank's fp32 gradient shard and (ZeRO) a
scalar all-reduce over the data-parallel ranks, before the Adam step; on by default (Megatron
--clip-grad 1.0), off with --no-clip-grad / --clip-grad 0; priced alike by both estimators."""

import pytest

import perfsim
from perfsim.cli import main
from perfsim.lowering.graph import build_graph
from perfsim.plan.megatron import from_mapping
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.sharding import CLIP_TRAFFIC_BYTES, local_optimizer_params

MODEL = perfsim.load_model("llama3.1-8b")


def _ops(plan):
    return {op.name: op for op in build_graph(MODEL, plan).ops if op.phase == "optimizer"}


def test_clip_steps_sit_before_the_optimizer_step():
    plan = ParallelPlan(tp=2, dp=4, zero=1, gbs=8, seq=2048)
    ops = _ops(plan)
    clip, norm, adam = ops["grad_clip"], ops["grad_norm_ar"], ops["optimizer_step"]
    assert clip.bytes == pytest.approx(local_optimizer_params(MODEL, plan, 0) * CLIP_TRAFFIC_BYTES)
    assert norm.collective.group == "dp_cp" and norm.collective.size_bytes == 4
    assert clip.op_id in norm.deps and norm.op_id in adam.deps
    assert "grad_clip" not in _ops(ParallelPlan(tp=2, dp=4, zero=1, gbs=8, seq=2048, clip_grad=False))
    assert "grad_norm_ar" not in _ops(ParallelPlan(tp=8, gbs=8, seq=2048))  # one data-parallel rank: nothing to sum
    # without ZeRO every rank holds the all-reduced gradients: the norm needs no data-parallel sum
    assert "grad_norm_ar" not in _ops(ParallelPlan(tp=2, dp=4, zero=0, gbs=8, seq=2048))
    assert "grad_clip" in _ops(ParallelPlan(tp=2, dp=4, zero=0, gbs=8, seq=2048))


@pytest.mark.parametrize("estimator", ["estimate", "simulate"])
def test_clipping_costs_time_in_both_estimators(estimator):
    run = getattr(perfsim, estimator)
    knobs = dict(gpus=16, tp=2, dp=8, zero=1, gbs=16, seq=2048)
    on, off = run(MODEL, "mi300x-pollara", **knobs), run(MODEL, "mi300x-pollara", clip_grad=False, **knobs)
    extra = on.step_time_s - off.step_time_s
    assert extra > 0
    # about the HBM time of 12 B per local parameter plus a latency-bound all-reduce: well under 1% here
    assert extra < 0.01 * off.step_time_s


def test_estimators_agree_on_the_clip():
    knobs = dict(gpus=16, tp=2, dp=8, zero=1, gbs=16, seq=2048)
    extra = [getattr(perfsim, e)(MODEL, "h100-ib", **knobs).step_time_s
             - getattr(perfsim, e)(MODEL, "h100-ib", clip_grad=False, **knobs).step_time_s
             for e in ("estimate", "simulate")]
    assert extra[0] == pytest.approx(extra[1], rel=0.05)


def test_megatron_clip_grad_and_cli_switch(capsys):
    assert from_mapping({"clip_grad": "0.0"}).knobs["clip_grad"] is False
    assert from_mapping({"clip_grad": "1.0"}).knobs["clip_grad"] is True
    assert "clip_grad" not in from_mapping({}).knobs  # perfsim's default: on, as Megatron's
    args = ["simulate", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "8", "--seq", "2048", "--engine", "analytic"]
    assert main(args + ["--no-clip-grad"]) == 0
    assert "clip_grad=False" in capsys.readouterr().out
    with pytest.raises(perfsim.ConfigError, match="plan.clip_grad must be true or false"):
        ParallelPlan(gbs=8, seq=2048, clip_grad="no")
