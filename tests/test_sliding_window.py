"""Sliding-window attention (ModelSpec.sliding_window / full_attention_every: GPT-OSS's
alternating 128-token windows): a windowed layer's attention core does the band's work, both
estimators price it as a block of its own, and the closed form follows the engine."""

import dataclasses

import pytest

from perfsim import api
from perfsim.errors import ConfigError
from perfsim.lowering.layers import LayerBuilder
from perfsim.plan.parallel import ParallelPlan

GPT_OSS = api.load_model("gpt-oss-120b")
FULL = dataclasses.replace(GPT_OSS, sliding_window=0, full_attention_every=0)


def _core(model, layer: int, seq: int):
    plan = ParallelPlan(ep=8, dp=8, gbs=8, seq=seq)
    steps = LayerBuilder(model, plan).layer_forward(layer)
    return next(s for s in steps if s.name == "attn_core")


@pytest.mark.parametrize("seq", [4096, 8192])
def test_a_windowed_layer_attends_over_its_band_and_a_full_layer_over_half_the_sequence(seq):
    windowed, full = _core(GPT_OSS, 0, seq), _core(GPT_OSS, 1, seq)
    window = GPT_OSS.sliding_window
    assert GPT_OSS.attention_window(0) == window and GPT_OSS.attention_window(1) == 0
    # keys per query: W - W^2 / 2S under the window (its ramp at the sequence start), S / 2 causal
    assert windowed.flops / full.flops == pytest.approx((window - window ** 2 / (2 * seq)) / (seq / 2))
    assert dict(windowed.meta)["seq"] == window and dict(full.meta)["seq"] == seq
    assert full.flops == pytest.approx(_core(FULL, 0, seq).flops)  # a full layer is unchanged
    # a window at least as long as the sequence is full causal attention
    wide = dataclasses.replace(GPT_OSS, sliding_window=seq)
    assert _core(wide, 0, seq).flops == pytest.approx(full.flops)


def test_an_mtp_layer_attends_like_the_models_last_layer():
    last = GPT_OSS.num_layers - 1
    assert GPT_OSS.attention_window(GPT_OSS.num_layers) == GPT_OSS.attention_window(last) == 0
    every = dataclasses.replace(GPT_OSS, full_attention_every=0)  # every layer windowed
    assert every.attention_window(every.num_layers) == every.attention_window(0) == 128


PLANS = [dict(pp=4, ep=8, gbs=64, recompute="full"),
         dict(pp=3, vpp=3, ep=8, gbs=48, schedule="interleaved"),  # stages of 4 layers, 2 windowed each
         dict(pp=4, vpp=3, ep=8, gbs=64, schedule="interleaved"),  # chunks of 3: stages differ in windowed count
         dict(ep=8, zero=3, mbs=2, gbs=64, cp=2, seq=8192)]


@pytest.mark.parametrize("knobs", PLANS)
def test_closed_form_follows_the_engine_on_alternating_windows(knobs):
    knobs = {"mbs": 1, "seq": 4096, **knobs}
    gpus = knobs.get("pp", 1) * 8 * (2 if "cp" in knobs else 1) * (2 if knobs.get("pp") == 4 else 1)
    a, d = (api.simulate(GPT_OSS, "h100-ib", gpus=gpus, estimator=e, check_memory=False, **knobs)
            for e in ("analytic", "des"))
    assert a.step_time_s == pytest.approx(d.step_time_s, rel=0.04)
    assert a.breakdown["attention_core"] == pytest.approx(d.breakdown["attention_core"], rel=0.01)


def test_windows_shorten_the_step_by_their_attention_alone():
    knobs = dict(ep=8, mbs=1, gbs=64, seq=8192, check_memory=False)
    windowed, full = (api.simulate(m, "h100-ib", gpus=8, estimator="analytic", **knobs) for m in (GPT_OSS, FULL))
    saved = full.step_time_s - windowed.step_time_s
    attention = full.breakdown["attention_core"] - windowed.breakdown["attention_core"]
    assert 0 < saved and attention > 0.3 * full.breakdown["attention_core"]
    assert saved == pytest.approx(attention, rel=0.02)
    assert windowed.peak_memory_bytes == pytest.approx(full.peak_memory_bytes)  # flash attention keeps the same


@pytest.mark.parametrize("fields, match", [
    (dict(sliding_window=-1), r"model.sliding_window must be a non-negative integer \(0 = none\), got -1"),
    (dict(sliding_window=0, full_attention_every=2), r"model.full_attention_every \(2\) needs a sliding_window > 0"),
    (dict(full_attention_every=1.5), r"model.full_attention_every must be a non-negative integer"),
    (dict(sliding_window=True), r"model.sliding_window must be a non-negative integer"),
])
def test_bad_window_fields_name_themselves(fields, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(GPT_OSS, **fields)


def test_model_flops_count_the_band_on_windowed_layers():
    """The MFU numerator counts a windowed layer's attention over its band (causal_keys), as
    the step prices it; a model without windows is unchanged."""
    from perfsim.model.spec import causal_keys

    seq = 4096
    width = GPT_OSS.q_width + GPT_OSS.v_width
    half = GPT_OSS.num_layers // 2  # every other layer windowed
    saved = 6 * half * (seq / 2 - causal_keys(seq, GPT_OSS.sliding_window)) * width
    assert FULL.model_flops_per_token(seq) - GPT_OSS.model_flops_per_token(seq) == pytest.approx(saved)
    assert causal_keys(seq, 0) == causal_keys(seq, seq) == causal_keys(seq, 2 * seq) == seq / 2
