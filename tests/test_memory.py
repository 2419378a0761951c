"""Per-rank memory: hand-computed weights/grads/optimizer bytes, activations against
Korthikanti'22, in-flight microbatches per schedule, and OOM as an InfeasiblePlan."""

import re

import pytest
from conftest import tiny_dense, tiny_moe

from perfsim import InfeasiblePlan, api, simulate
from perfsim.lowering.memory import in_flight_microbatches, layer_activation_bytes, plan_memory
from perfsim.plan.parallel import ParallelPlan

# tiny-dense by hand: h=1024, 16 heads x 64, 4 kv heads, gated ffn 4096, vocab 32000, 8 layers
#   attention  q,o: 2 x 1024*1024 + k,v: 2 x 1024*256      =  2,621,440
#   mlp        3 x 1024*4096                               = 12,582,912
#   norms      2 x 1024                                    =      2,048
#   8 layers                                               = 121,651,200
#   embedding + untied head 2 x 32000*1024                 =  65,536,000
#   tp=2 rank: (121,651,200 + 65,536,000) / 2 + final norm 1,024 = 93,594,624
RANK_PARAMS = 93_594_624
DP = 4


def breakdown(zero: int):
    (mem,) = plan_memory(tiny_dense(), ParallelPlan(tp=2, dp=DP, zero=zero, gbs=8, seq=1024))
    return mem


def test_hand_count_matches_model():
    assert tiny_dense().total_params() == 121_651_200 + 65_536_000 + 1024


@pytest.mark.parametrize(
    "zero, weights, grads, optimizer",
    [  # bf16 weights 2 B, fp32 main grads 4 B, fp32 master + Adam m, v 12 B (Rajbhandari'20)
        (0, RANK_PARAMS * 2, RANK_PARAMS * 4, RANK_PARAMS * 12),
        (1, RANK_PARAMS * 2, RANK_PARAMS * 4, RANK_PARAMS * 12 / DP),
        (2, RANK_PARAMS * 2, RANK_PARAMS * 4 / DP, RANK_PARAMS * 12 / DP),
        (3, RANK_PARAMS * 2 / DP, RANK_PARAMS * 4 / DP, RANK_PARAMS * 12 / DP),
    ],
)
def test_states_by_zero_stage(zero, weights, grads, optimizer):
    mem = breakdown(zero)
    assert mem.weights_bytes == weights
    assert mem.gradients_bytes == grads
    assert mem.optimizer_bytes == optimizer


def test_logits_on_last_stage_only():
    # fp32 logits and their gradient: 2 x 1024 tokens x 32000/2 vocab shard x 4 B
    assert breakdown(1).logits_bytes == 2 * 1024 * 16000 * 4
    first, last = plan_memory(tiny_dense(), ParallelPlan(pp=2, gbs=4, seq=1024))
    assert first.logits_bytes == 0 and last.logits_bytes > 0


@pytest.mark.parametrize("zero", [2, 3])
def test_total_is_sum_of_parts(zero):
    mem = breakdown(zero)
    parts = (mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes + mem.activations_bytes + mem.logits_bytes
             + mem.fragmentation_bytes + mem.zero_buffers_bytes)
    assert mem.zero_buffers_bytes > 0
    assert mem.total_bytes == parts and mem.as_dict()["total_bytes"] == parts


# one tiny-dense layer on a tp=2 rank: (2,621,440 + 12,582,912 + 2,048) / 2 = 7,603,200 parameters,
# gathered in bf16 (2 B) and reduce-scattered in bf16 (2 B): 15,206,400 B each way
LAYER_BYTES = 15_206_400
# the embedding + untied LM head + final norm on one stage, FSDP2's root group, gathered through the
# pass: (2 x 32,000 x 1,024) / 2 + 1,024 = 32,769,024 parameters, 65,538,048 B; the largest gradient unit
ENDS_BYTES = 65_538_048


@pytest.mark.parametrize(
    "knobs, expected",
    [  # ZeRO-3 (FSDP): the root group, the layer computing + the one prefetched; the largest unit's
        # gradients + the reduce-scatter in flight
        (dict(zero=3), ENDS_BYTES + 2 * LAYER_BYTES + 2 * ENDS_BYTES),
        (dict(zero=3, overlap_param_gather=False, overlap_grad_reduce=False), ENDS_BYTES + LAYER_BYTES + ENDS_BYTES),
        (dict(zero=3, dp=1), 0.0),  # nothing sharded, nothing gathered
        # ZeRO-2: two gradient buckets of 80 MB (the stage's 8 layers hold 121.65 MB of them)
        (dict(zero=2), 2 * 80_000_000),
        # a bucket never exceeds the gradients: 8 layers' and the embedding / LM head / final norm's
        (dict(zero=2, grad_bucket_bytes=10**9), 2 * (8 * LAYER_BYTES + ENDS_BYTES)),
        (dict(zero=1), 0.0),  # reduced in place in the full gradient buffer
    ],
)
def test_zero_working_buffers_by_hand(knobs, expected):
    knobs = {"tp": 2, "dp": DP, "gbs": 8, "seq": 1024, **knobs}
    knobs["gbs"] = 2 * knobs["dp"]
    (mem,) = plan_memory(tiny_dense(), ParallelPlan(**knobs))
    assert mem.zero_buffers_bytes == expected


def test_zero3_buffers_follow_the_stage_s_ends_and_largest_layer():
    # pp 2: stage 0 holds 4 layers and the embedding (32,000 x 1,024 / 2 = 16,384,000 parameters,
    # 32,768,000 B), the last stage 4 layers, the LM head and the final norm (32,768,000 + 1,024 x 2 B)
    first, last = plan_memory(tiny_dense(), ParallelPlan(tp=2, pp=2, dp=DP, zero=3, gbs=8, seq=1024))
    assert first.zero_buffers_bytes == 32_768_000 + 2 * LAYER_BYTES + 2 * 32_768_000
    assert last.zero_buffers_bytes == 32_770_048 + 2 * LAYER_BYTES + 2 * 32_770_048
    # a model whose layers outweigh its vocabulary (1,024 x 1,024 x 2 / 2 + 1,024 = 1,049,600 parameters at
    # the ends): the layer sets the gradient buffers
    wide = tiny_dense(vocab_size=1024)
    (mem,) = plan_memory(wide, ParallelPlan(tp=2, dp=DP, zero=3, gbs=8, seq=1024))
    assert mem.zero_buffers_bytes == 2_099_200 + 2 * LAYER_BYTES + 2 * LAYER_BYTES


def test_zero3_buffers_follow_the_largest_layer_and_the_expert_shards():
    # an MoE layer's experts are gathered over the expert data-parallel group: with ep = dp they are not
    # sharded (edp 1), so only the dense part of a layer is gathered; the largest layer sets the buffer
    moe = tiny_moe(vocab_size=1024)  # a small vocabulary: the layers outweigh the embedding and head
    sharded = plan_memory(moe, ParallelPlan(dp=8, ep=1, zero=3, gbs=8, seq=1024))[0].zero_buffers_bytes
    whole = plan_memory(moe, ParallelPlan(dp=8, ep=8, zero=3, gbs=8, seq=1024))[0].zero_buffers_bytes
    assert sharded > 4 * whole > 0


def test_fragmentation_is_a_share_of_transient_bytes():
    from perfsim.lowering.memory import FRAGMENTATION

    mem = breakdown(2)
    assert mem.fragmentation_bytes == pytest.approx(FRAGMENTATION * (mem.activations_bytes + mem.logits_bytes))


def test_activations_match_korthikanti_gpt_layer():
    """Korthikanti'22 Table 2, tensor + sequence parallel: 34*s*b*h/t bytes per layer
    (without the s^2 score terms, which flash attention does not keep). A GPT-style
    layer (MHA, 4h non-gated MLP) should land within 10 %."""
    model = tiny_dense(num_kv_heads=16, gated_mlp=False)
    s, b, h, t = 2048, 2, model.hidden_size, 4
    plan = ParallelPlan(tp=t, mbs=b, gbs=b, seq=s)
    assert layer_activation_bytes(model, plan, 0) == pytest.approx(34 * s * b * h / t, rel=0.10)


def test_full_recompute_keeps_only_layer_inputs():
    model, plan = tiny_dense(), ParallelPlan(tp=2, mbs=2, gbs=2, seq=2048, recompute="full")
    assert layer_activation_bytes(model, plan, 0) == 2 * 2048 * 1024 * 2 / 2  # sbh x 2 B / tp


def test_cp_divides_activations():
    model = tiny_dense()
    one = layer_activation_bytes(model, ParallelPlan(gbs=1, seq=4096), 0)
    four = layer_activation_bytes(model, ParallelPlan(cp=4, gbs=1, seq=4096), 0)
    assert four == pytest.approx(one / 4)


def test_moe_layer_activations_grow_with_top_k():
    plan = ParallelPlan(gbs=1, seq=1024)
    assert layer_activation_bytes(tiny_moe(top_k=4), plan, 0) > layer_activation_bytes(tiny_moe(top_k=1), plan, 0)


@pytest.mark.parametrize("modules", [(), ("moe",)])
def test_routed_tokens_are_kept_twice_only_where_the_probabilities_weigh_a_copy(modules):
    """Megatron-Core weighs the routed tokens by the router's probabilities inside the experts'
    activation (weighted SwiGLU), which keeps only the up projection's output: each routed token
    is kept once, as the up projection's input. A stack that weighs them at the combine
    (MaxText's unpermute) keeps a hidden-width copy of each routed token more; recomputing the
    whole MoE part drops that copy with the rest."""
    from dataclasses import replace

    from perfsim.system.stacks import load_stack

    model = tiny_moe(top_k=2)
    megatron = load_stack("megatron-primus")
    assert not megatron.memory.routed_probs_copy and load_stack("maxtext").memory.routed_probs_copy
    copying = replace(megatron, memory=replace(megatron.memory, routed_probs_copy=True))
    knobs = dict(gbs=1, seq=1024, recompute="selective", recompute_modules=modules) if modules else dict(gbs=1, seq=1024)
    once = layer_activation_bytes(model, ParallelPlan(stack=megatron, **knobs), 0)
    twice = layer_activation_bytes(model, ParallelPlan(stack=copying, **knobs), 0)
    copy = 1024 * model.top_k * model.hidden_size * 2  # BF16, balanced routing
    assert twice - once == pytest.approx(0 if modules else copy)
    if modules:  # what the recompute drops is what the layer would have kept
        full = dict(gbs=1, seq=1024)
        assert (layer_activation_bytes(model, ParallelPlan(stack=copying, **full), 0) - twice
                == pytest.approx(layer_activation_bytes(model, ParallelPlan(stack=megatron, **full), 0) - once + copy))


@pytest.mark.parametrize(
    "knobs, stage, expected",
    [
        (dict(pp=4, gbs=16), 0, 4),  # 1F1B: pp - stage
        (dict(pp=4, gbs=16), 3, 1),
        (dict(pp=4, gbs=2), 0, 2),  # never more than the microbatches
        (dict(pp=4, gbs=16, schedule="gpipe"), 2, 16),  # GPipe keeps them all
        (dict(pp=4, vpp=2, gbs=16), 0, 4 * (1 + 3 / 8)),  # Narayanan'21 sec. 2.2
        # Megatron's interleaved warm-up on the last stage is (vpp - 1) * pp chunk forwards, then one
        # more before the first backward: 5 chunks of 2, where (pp - stage) scaling would say 1.375
        (dict(pp=4, vpp=2, gbs=16), 3, 5 / 2),
        (dict(pp=2, vpp=2, gbs=4), 1, 3 / 2),  # chunks 0, 0 then chunk 1: three chunks of two
    ],
)
def test_in_flight_microbatches(knobs, stage, expected):
    assert in_flight_microbatches(ParallelPlan(seq=1024, **knobs), stage) == pytest.approx(expected)


def test_oom_raises_infeasible_plan_with_numbers(mi300x):
    with pytest.raises(InfeasiblePlan) as info:
        simulate("llama3.1-70b", mi300x, nodes=1, dp=8, gbs=8, seq=4096, zero=0)
    message = str(info.value)
    assert "out of memory" in message
    assert re.search(r"needs [\d.]+ [GT]B per GPU", message)
    assert "has 206.14 GB (191.98 GiB usable of 192)" in message  # the vendor's 192 GB is GiB, less 16 MiB
    assert "\n" not in message
    assert message.endswith("recompute='auto' (--recompute auto) picks the least recompute that fits")
    # auto recompute cannot save 70B of unsharded optimizer state: the hint then names what can
    with pytest.raises(InfeasiblePlan, match="does not fit with full recompute: try more tp / pp, a higher zero stage"):
        simulate("llama3.1-70b", mi300x, nodes=1, dp=8, gbs=8, seq=4096, zero=0, recompute="auto")
    # FP8 with BF16 working weights: the hint names FP8 primary weights too, not when they are on
    with pytest.raises(InfeasiblePlan, match=r"picks the least recompute that fits; FP8 primary weights \(fp8_params"):
        simulate("llama3.1-70b", mi300x, nodes=1, dp=8, gbs=8, seq=4096, zero=0, dtype="fp8")
    with pytest.raises(InfeasiblePlan) as info:
        simulate("llama3.1-70b", mi300x, nodes=1, dp=8, gbs=8, seq=4096, zero=0, dtype="fp8", fp8_params=True)
    assert "FP8 primary weights" not in str(info.value)


def test_oom_can_be_reported_instead(mi300x):
    r = simulate("llama3.1-70b", mi300x, nodes=1, dp=8, gbs=8, seq=4096, zero=0, check_memory=False)
    assert not r.fits and r.warnings and "out of memory" in r.warnings[0]
    assert r.peak_memory_bytes > r.memory_capacity_bytes


def test_zaya1_32k_needs_context_parallelism(mi300x):
    """A 32K-token ZAYA1 sequence without cp needs more memory per rank than with cp=8."""
    knobs = dict(nodes=8, mbs=1, gbs=64, seq=32768, zero=1, estimator="analytic", check_memory=False)
    no_cp = simulate("zaya1-base", mi300x, cp=1, dp=64, **knobs)
    cp8 = simulate("zaya1-base", mi300x, cp=8, dp=8, **knobs)
    assert no_cp.peak_memory_bytes > cp8.peak_memory_bytes
    act = lambda r: max(m["activations_bytes"] for m in r.memory)  # noqa: E731
    assert act(no_cp) == pytest.approx(8 * act(cp8))


def test_stack_memory_policy_sets_bytes_per_parameter_and_per_logit():
    """MaxText (base.yml: FP32 params, FP32 grads, FP32 Adam moments; FP32 logits + BF16
    gradient; XLA's planned buffers) against perfsim's Megatron-style default."""
    from perfsim.system.stacks import load_stack

    plan = ParallelPlan(tp=2, dp=DP, zero=1, gbs=8, seq=1024, stack=load_stack("maxtext"))
    (mem,) = plan_memory(tiny_dense(), plan)
    assert mem.weights_bytes == RANK_PARAMS * 4
    assert mem.gradients_bytes == RANK_PARAMS * 4
    assert mem.optimizer_bytes == RANK_PARAMS * 8 / DP
    assert mem.logits_bytes == 1024 * 16000 * 6
    assert mem.fragmentation_bytes == 0.0
    ideal = ParallelPlan(tp=2, dp=DP, zero=1, gbs=8, seq=1024, stack=load_stack("ideal"))
    assert plan_memory(tiny_dense(), ideal) == [breakdown(1)]


def test_fast_memory_model_keys_on_the_stack_memory_policy():
    from perfsim.estimators.fastmem import MemoryModel
    from perfsim.system.stacks import load_stack

    fast = MemoryModel(tiny_dense())
    plain = ParallelPlan(tp=2, dp=DP, zero=1, gbs=8, seq=1024)
    xla = ParallelPlan(tp=2, dp=DP, zero=1, gbs=8, seq=1024, stack=load_stack("maxtext"))
    for plan in (plain, xla):
        assert fast.peak(plan)[0] == pytest.approx(max(m.total_bytes for m in plan_memory(tiny_dense(), plan)))
    assert fast.peak(plain)[0] != fast.peak(xla)[0]


def test_routed_experts_hold_their_padded_capacity_or_the_busiest_ranks_tokens():
    """The routed experts keep what the lowering computes on: the padded capacity under a
    capacity-padded dispatch, the busiest EP rank's tokens under skewed dropless routing."""
    from perfsim.lowering.memory import routed_share
    from perfsim.plan.routing import RoutingSpec

    moe = tiny_moe(capacity_factor=1.25)
    plan = ParallelPlan(dp=8, ep=8, gbs=8, seq=1024)
    padded = RoutingSpec(pad_to_capacity=True)
    # 1024 tokens x top-2 = 2,048 copies; capacity ceil(1.25 x 2,048 x 8 / 8) = 2,560 for the rank's one expert
    assert routed_share(moe, plan) == 1.0 and routed_share(moe, plan, padded) == 2560 / 2048
    (even,), (pad,) = plan_memory(moe, plan), plan_memory(moe, plan, padded)
    # per MoE layer and token: top-2 x (permuted in 1,024 + gated up 2 x 2,048 + act out 2,048) = 16,384 values
    assert pad.activations_bytes - even.activations_bytes == 0.25 * 16_384 * 1024 * 2 * 8  # bf16, 8 layers
    skewed = RoutingSpec(distribution="zipf", skew=1.2)
    share = routed_share(moe, plan, skewed)
    (hot,) = plan_memory(moe, plan, skewed)
    assert share > 1.2 and hot.activations_bytes - even.activations_bytes == pytest.approx((share - 1) * 16_384 * 1024 * 2 * 8)
    # the report and recompute='auto' see it (the padded plan needs more memory, reported per stage)
    knobs = dict(gpus=8, ep=8, gbs=8, seq=1024, estimator="analytic")
    a = simulate(moe, "mi300x-pollara", **knobs)
    b = simulate(moe, "mi300x-pollara", routing=padded, **knobs)
    assert b.memory[0]["activations_bytes"] - a.memory[0]["activations_bytes"] == pytest.approx(0.25 * 16_384 * 1024 * 2 * 8)


def test_a_fully_recomputed_layer_holds_its_rerun_forward_while_its_backward_runs():
    """Full recompute stores each layer's input, and while a layer's backward runs its rerun
    forward's saved tensors are held too (PyTorch's activation checkpointing): one layer's
    activations as without recompute less its stored input, for one microbatch; selective
    recompute holds the attention core it reruns. A stack whose compiler schedules the rerun
    to fit (maxtext: XLA) adds none (a bad switch: test_a_stacks_memory_switches_take_true_or_false)."""
    from dataclasses import replace

    from perfsim.plan.parallel import Recompute
    from perfsim.system.stacks import load_stack

    model = tiny_dense()
    full = ParallelPlan(tp=2, dp=DP, gbs=8, seq=1024, recompute=Recompute.FULL)
    none = replace(full, recompute=Recompute.NONE)
    (mem,) = plan_memory(model, full)
    inputs = sum(layer_activation_bytes(model, full, layer) for layer in range(model.num_layers))
    one_layer = layer_activation_bytes(model, none, 0) - layer_activation_bytes(model, full, 0)
    assert one_layer > 10 * layer_activation_bytes(model, full, 0)  # a layer's tensors, not just its input
    assert mem.activations_bytes == pytest.approx(inputs * in_flight_microbatches(full, 0) + one_layer)
    # under BF16 the attention's output is the output projection's input, kept either way:
    # selective recompute keeps what none does (flash attention keeps no score matrix)
    assert layer_activation_bytes(model, replace(none, recompute=Recompute.SELECTIVE), 0) == \
        layer_activation_bytes(model, none, 0)
    # under FP8 on a Transformer Engine stack the projection keeps an FP8 copy: the rerun
    # attention core's BF16 output is what selective recompute drops
    none = replace(none, dtype="fp8", stack=load_stack("nemo"))
    selective = replace(none, recompute=Recompute.SELECTIVE)
    (sel,) = plan_memory(model, selective)
    stored = sum(layer_activation_bytes(model, selective, layer) for layer in range(model.num_layers))
    rerun = layer_activation_bytes(model, none, 0) - layer_activation_bytes(model, selective, 0)
    assert rerun == pytest.approx(1024 * model.v_width / 2 * 2)  # tokens x v / tp, BF16
    assert 0 < rerun < one_layer / 5  # the attention core only
    assert sel.activations_bytes == pytest.approx(stored * in_flight_microbatches(selective, 0) + rerun)
    assert mem.activations_bytes < sel.activations_bytes  # still far below keeping every layer
    xla = replace(full, stack=load_stack("maxtext"))
    (compiled,) = plan_memory(model, xla)
    assert compiled.activations_bytes == pytest.approx(inputs * in_flight_microbatches(xla, 0))


def test_fsdp2_shards_are_the_fp32_master_so_no_bf16_shard_is_kept():
    """torchtitan's FSDP2 keeps FP32 shards that are the optimizer's master and gathers a BF16
    copy only to compute: per-pass ZeRO-3 holds no weight shard beside the optimizer's bytes
    (16 B per parameter where Megatron-style keeps 18); weights kept gathered through the step
    are the BF16 copy of every parameter, as before."""
    from dataclasses import replace

    from perfsim.system.stacks import load_stack

    model = tiny_dense()
    megatron = ParallelPlan(tp=2, dp=DP, zero=3, gbs=8, seq=1024)
    titan = replace(megatron, stack=load_stack("torchtitan"))
    (m,), (t,) = plan_memory(model, megatron), plan_memory(model, titan)
    assert m.weights_bytes == pytest.approx(RANK_PARAMS / DP * 2) and t.weights_bytes == 0
    assert (t.gradients_bytes, t.optimizer_bytes) == (m.gradients_bytes, m.optimizer_bytes)
    per_param = (t.weights_bytes + t.gradients_bytes + t.optimizer_bytes) / (RANK_PARAMS / DP)
    assert per_param == pytest.approx(16) and (m.weights_bytes + m.gradients_bytes + m.optimizer_bytes) / (
        RANK_PARAMS / DP) == pytest.approx(18)
    gathered = replace(titan, pp=2, dp=DP // 2, zero3_gather="once")
    assert gathered.step_zero != 3
    (g, _) = plan_memory(model, gathered)
    (mg, _) = plan_memory(model, replace(gathered, stack=megatron.stack))
    assert g.weights_bytes == mg.weights_bytes > 0  # the gathered BF16 copy, either way


def test_a_bf16_dense_layer_keeps_the_tensors_megatron_keeps():
    """Per token, a BF16 dense layer without recompute keeps (Transformer Engine / Megatron-Core
    with flash attention, no dropout): the first norm's input and output (the QKV input), q / k / v,
    the attention output (which is also the output projection's input: one tensor), the second
    norm's input and output (the up projection's input), the up projection's output (the gated
    activation's input) and the activation's output (the down projection's input)."""
    model = api.load_model("llama3.1-8b")
    plan = ParallelPlan(tp=1, dp=8, mbs=1, gbs=8, seq=4096)
    h, w, v = model.hidden_size, model.ffn_hidden_size, model.v_width
    qkv = sum(lin.out_features for lin in model.attention_linears()[:-1])
    values = 2 * h + qkv + v + 2 * h + 2 * w + w
    assert layer_activation_bytes(model, plan, 0) == 4096 * values * 2


def test_a_compiled_step_of_one_microbatch_writes_its_gradients_where_activations_were():
    """XLA keeps no gradient buffer through MaxText's step: with one microbatch per step its
    backward writes each layer's gradients as it frees that layer's activations (and the
    logits before them), so the peak is the larger of the two, not their sum. With more
    microbatches the gradients accumulate beside the next microbatch's activations, and a
    stack with a gradient buffer (Megatron-Core's, FSDP2's) always holds both."""
    from dataclasses import replace

    from perfsim.estimators.fastmem import MemoryModel
    from perfsim.lowering.memory import gradients_apart
    from perfsim.system.stacks import load_stack

    model = tiny_dense()
    maxtext = load_stack("maxtext")
    for recompute in ("none", "full"):  # activations above the gradients, then below them
        one = ParallelPlan(tp=2, dp=DP, mbs=2, gbs=2 * DP, seq=1024, recompute=recompute, stack=maxtext)
        two = replace(one, gbs=4 * DP)
        assert gradients_apart(one) and not gradients_apart(two)
        (m1,), (m2,) = plan_memory(model, one), plan_memory(model, two)
        transient = m1.activations_bytes + m1.logits_bytes + m1.fragmentation_bytes
        assert (transient > m1.gradients_bytes) == (recompute == "none")
        assert m1.reused_bytes == pytest.approx(min(m1.gradients_bytes, transient)) and m1.reused_bytes > 0
        assert m1.total_bytes == pytest.approx(m1.weights_bytes + m1.optimizer_bytes + m1.zero_buffers_bytes
                                               + max(m1.gradients_bytes, transient))
        assert m2.reused_bytes == 0 and m2.total_bytes == pytest.approx(m1.total_bytes + m1.reused_bytes)
        megatron = replace(one, stack=load_stack("megatron-primus"))
        assert not gradients_apart(megatron) and plan_memory(model, megatron)[0].reused_bytes == 0
        for plan in (one, two, megatron):  # the search's memoised peak agrees
            assert MemoryModel(model).peak(plan)[0] == pytest.approx(plan_memory(model, plan)[0].total_bytes)


@pytest.mark.parametrize("dtype, gathered", [("bf16", 2), ("fp8", 1)])
def test_torchtitans_column_parallel_linears_keep_the_gathered_sequence(dtype, gathered):
    """torchtitan's tensor parallelism gathers each block's attention and feed-forward input to
    the whole sequence before the column-parallel linears (DTensor PrepareModuleInput +
    ColwiseParallel), whose matmuls keep that gathered input (in FP8 under torchao's float8
    tensor parallelism, which casts before it gathers); Megatron / Transformer Engine keep the
    sequence shard and gather it again in the backward. Without TP there is nothing gathered."""
    from dataclasses import replace

    from perfsim.system.stacks import load_stack

    model = tiny_dense()
    titan = load_stack("torchtitan")
    assert titan.memory.tp_gathered_inputs and not load_stack("megatron-primus").memory.tp_gathered_inputs
    shard = replace(titan, memory=replace(titan.memory, tp_gathered_inputs=False))
    for recompute in ("none", "full"):
        for tp in (1, 4):
            plan = ParallelPlan(tp=tp, dp=DP, gbs=DP, seq=1024, dtype=dtype, recompute=recompute, stack=titan)
            kept = layer_activation_bytes(model, plan, 0)
            other = layer_activation_bytes(model, replace(plan, stack=shard), 0)
            extra = 0 if tp == 1 or recompute == "full" else 1024 * 2 * model.hidden_size * (gathered - 2 / tp)
            assert kept - other == pytest.approx(extra)
    # a recomputed layer stores its input alone, but its rerun holds the gathered inputs again
    full = ParallelPlan(tp=4, dp=DP, gbs=DP, seq=1024, dtype=dtype, recompute="full", stack=titan)
    (gathers,), (shards,) = plan_memory(model, full), plan_memory(model, replace(full, stack=shard))
    assert gathers.activations_bytes - shards.activations_bytes == pytest.approx(1024 * 2 * model.hidden_size * (gathered - 2 / 4))


def test_torchtitans_eager_cross_entropy_holds_three_fp32_copies_of_the_logits():
    """torchtitan's loss is eager F.cross_entropy on the FP32-cast logits: the log_softmax
    backward holds its saved output, its incoming gradient and the input gradient at once
    (12 B a logit on the head stage), where Megatron-Core's fused vocab-parallel loss keeps
    the FP32 logits and their gradient (perfsim's default 8 B)."""
    from dataclasses import replace

    from perfsim.system.stacks import load_stack

    model = tiny_dense()
    plan = ParallelPlan(tp=2, dp=DP, zero=3, gbs=8, seq=1024)
    logits = plan.mbs * plan.seq * model.vocab_size / plan.tp
    (megatron,) = plan_memory(model, plan)
    (titan,) = plan_memory(model, replace(plan, stack=load_stack("torchtitan")))
    assert megatron.logits_bytes == pytest.approx(8 * logits)
    assert titan.logits_bytes == pytest.approx(12 * logits)


def test_interleaved_memory_walks_megatrons_order_with_each_chunk_weighing_its_layers():
    """Under the interleaved order a stage's peak is the schedule walked (each forward keeps
    its chunk's activations until that chunk's backward), the chunks weighed by the layers
    they hold: a virtual stage holding the embedding alone (Megatron's
    --account-for-embedding-in-pipeline-split) keeps no layer activations, however many of its
    forwards are in flight."""
    from dataclasses import replace

    from perfsim.lowering.memory import held_activation_bytes
    from perfsim.plan.schedules import schedule_order
    from perfsim.plan.sharding import chunk_layers

    model = tiny_dense()  # 8 layers
    plan = ParallelPlan(pp=3, vpp=3, dp=1, gbs=6, seq=1024, account_for_embedding=True)  # 1 + 8 slots over 9
    for stage in range(plan.pp):
        layers = [list(chunk_layers(model, plan, stage, c)) for c in range(plan.vpp)]
        stored = {l: layer_activation_bytes(model, plan, l) for c in layers for l in c}
        weights = [sum(stored[l] for l in c) for c in layers]
        held = peak = 0.0
        for phase, _, chunk in schedule_order(plan.schedule, plan.pp, plan.vpp, stage, plan.num_microbatches):
            held += weights[chunk] if phase == "F" else -weights[chunk]
            peak = max(peak, held)
        assert held_activation_bytes(model, plan, stage, stored) == pytest.approx(peak)
    assert list(chunk_layers(model, plan, 0, 0)) == []  # the embedding's virtual stage
    even = replace(plan, account_for_embedding=False, vpp=2, pp=2, gbs=4)
    (first, last) = (held_activation_bytes(model, even, s, {l: 1.0 for l in range(8)}) for s in (0, 1))
    # two layers a chunk: stage 0 warms up with chunks 0, 0, 1, 1 and one more forward (five chunks:
    # Narayanan's 2 x (1 + 1 / 4) microbatches of four layers), stage 1 with chunks 0, 0 and one more
    assert (first, last) == (pytest.approx(10.0), pytest.approx(6.0))


@pytest.mark.parametrize("field", ["recompute_working_set", "sharded_master", "gradient_buffer", "routed_probs_copy",
                                   "tp_gathered_inputs"])
@pytest.mark.parametrize("value", ['"no"', "1"])
def test_a_stacks_memory_switches_take_true_or_false(field, value, tmp_path, capsys):
    """A [memory] switch given anything but true / false is refused: one line naming the field
    and the value, exit 2."""
    from perfsim.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(f'name = "bad"\n[memory]\n{field} = {value}\n')
    assert main(["simulate", "--model", "mixtral-8x7b", "--nodes", "1", "--gbs", "8", "--seq", "2048",
                 "--stack", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f".memory.{field}: expected true or false" in err[0] and value.strip('"') in err[0]
