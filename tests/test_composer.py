"""The composer stack (MosaicML Composer + llm-foundry: FSDP1 FULL_SHARD, eager) and its
published MPT runs (two sources of one README): learned positions (no rope pass), per-pass gathers with a reduce-scatter
every microbatch, FP32 sharded master, BF16 logits and gradient at the fused loss, every run
predicted to fit as it ran."""

import dataclasses
from pathlib import Path

import pytest

from perfsim import api
from perfsim.design.runs import predict, read_runs
from perfsim.plan.sharding import shard_degrees, stage_rank_params
from perfsim.system.stacks import load_stack

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "validation" / "runs" / "published.csv"
PLAN = dict(zero=3, mbs=2, gbs=32, seq=2048, recompute="none")


def _estimate(model, stack="composer", **knobs):
    model = api.load_model(model) if isinstance(model, str) else model
    return api.estimate(model, "h100-ib", nodes=1, stack=load_stack(stack), check_memory=False, **(PLAN | knobs))


def test_learned_positions_price_no_rope_pass_where_a_rotary_twin_pays_one():
    mpt = api.load_model("mpt-1b")
    assert not mpt.rotary and not mpt.gated_mlp and mpt.tied_embeddings
    assert not load_stack("composer").fused("rope")  # the stack would run a rope kernel unfused
    rotary = dataclasses.replace(mpt, rotary=True)
    plain, twin = _estimate(mpt), _estimate(rotary)
    assert twin.step_time_s > plain.step_time_s
    assert twin.breakdown.get("rope", 0.0) > 0.0 and plain.breakdown.get("rope", 0.0) == 0.0


def test_composer_gathers_per_pass_reduces_every_microbatch_and_keeps_an_fp32_sharded_master():
    stack = load_stack("composer")
    plan = api.make_plan(8, stack=stack, **PLAN)
    assert not plan.keeps_weights_gathered and plan.grad_syncs == plan.num_microbatches == 2
    report = _estimate("mpt-1b")
    assert report.plan["zero3_gather"] == "per-pass"
    model = api.load_model("mpt-1b")
    dense, _ = stage_rank_params(model, plan, 0)
    shard = shard_degrees(plan)[0]
    held = report.memory[0]
    # FSDP1's FP32 flat-parameter shard is the master: 4 B master + 8 B Adam moments per
    # sharded parameter, no BF16 shard beside it (the BF16 copy exists only gathered)
    assert held["optimizer_bytes"] == pytest.approx(12 * dense / shard)
    assert held["weights_bytes"] == 0.0
    # flash-attn's fused cross entropy keeps the BF16 logits and writes a BF16 gradient
    assert held["logits_bytes"] == pytest.approx(4 * 2 * 2048 * model.vocab_size)
    assert _estimate("mpt-1b", stack="torchtitan").memory[0]["logits_bytes"] == pytest.approx(3 * held["logits_bytes"])


def test_the_mpt_rows_are_two_sources_under_composer_and_fit_as_they_ran():
    cases = [c for c in read_runs(RUNS) if c.stack == "composer"]
    by_source = {}
    for c in cases:
        by_source.setdefault(c.source_id, []).append(c)
    # two measurement campaigns of one README: the 8-64 GPU table and the later >= 128 GPU one
    assert {k: len(v) for k, v in by_source.items()} == {
        "llm-foundry-mpt-benchmarks-h100": 52, "llm-foundry-mpt-benchmarks-h100-large": 18}
    assert {c.model for c in cases} == {f"mpt-{s}" for s in ("760m", "1b", "3b", "7b", "13b", "30b", "70b")}
    large = by_source["llm-foundry-mpt-benchmarks-h100-large"]
    assert {c.nodes for c in large} == {16, 32, 64}
    # SHARD_GRAD_OP (MPT-1B / 3B) as ZeRO-2, FULL_SHARD as ZeRO-3
    assert {c.model for c in large if dict(c.knobs)["zero"] == 2} == {"mpt-1b", "mpt-3b"}
    for case in cases:
        result = predict(case)
        assert result.fits, (case.id, result.peak_memory_bytes / 1e9)


def test_composer_ships_an_nvidia_speed_fitted_to_its_runs_and_amd_at_the_prior():
    stack = load_stack("composer")
    assert stack.kernels.speed == 1.0
    assert 0.5 < stack.kernels.speed_nvidia < 0.9
    assert "fitted by perfsim calibrate" in stack.kernels.source
