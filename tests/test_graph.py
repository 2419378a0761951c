"""Lowering: the op graph is a well-formed per-stage program for every plan family."""

import dataclasses
from collections import Counter

import pytest
from conftest import PLANS, lower

from perfsim.lowering.graph import build_graph
from perfsim.lowering.ops import Coll, OpKind, Stream
from perfsim.plan.schedules import BWD, FWD


@pytest.mark.parametrize("case", PLANS)
def test_ids_dense_and_deps_point_backwards(case):
    graph = lower(case)
    assert [op.op_id for op in graph.ops] == list(range(len(graph.ops)))
    for op in graph.ops:
        assert all(0 <= d < op.op_id for d in op.deps), op


@pytest.mark.parametrize("case", PLANS)
def test_every_stage_runs_every_microbatch_both_ways(case):
    graph = lower(case)
    plan = graph.plan
    for stage in range(plan.pp):
        seen = {(o.phase, o.microbatch) for o in graph.ops if o.stage == stage and o.stream is Stream.COMPUTE}
        for mb in range(plan.num_microbatches):
            assert (FWD, mb) in seen and (BWD, mb) in seen


@pytest.mark.parametrize("case", PLANS)
def test_one_optimizer_step_per_stage(case):
    graph = lower(case)
    steps = Counter(o.stage for o in graph.ops if o.kind is OpKind.OPTIMIZER)
    assert steps == {s: 1 for s in range(graph.plan.pp)}


@pytest.mark.parametrize("case", PLANS)
def test_layers_run_forward_once_per_microbatch(case):
    graph = lower(case)
    plan, layers = graph.plan, graph.model.num_layers
    norms = Counter(o.layer for o in graph.ops if o.name == "attn_norm" and o.phase == FWD)
    assert norms == {l: plan.num_microbatches for l in range(layers)}


def test_p2p_sends_match_pipeline_boundaries():
    graph = lower("pp4-vpp2")
    plan = graph.plan
    sends = [o for o in graph.ops if o.kind is OpKind.P2P]
    boundaries = plan.pp * plan.vpp - 1
    assert len(sends) == 2 * boundaries * plan.num_microbatches
    assert all(o.stream is Stream.PP_COMM and o.collective.group == "pp" for o in sends)


def test_no_p2p_without_pipeline():
    assert not [o for o in lower("pp1").ops if o.kind is OpKind.P2P]


def colls(graph, group: str) -> Counter:
    return Counter(o.collective.coll for o in graph.ops if o.collective and o.collective.group == group)


def test_tp_sequence_parallel_uses_ag_rs():
    c = colls(lower("tp2-sp"), "tp")
    assert c[Coll.ALL_GATHER] and c[Coll.REDUCE_SCATTER] and not c[Coll.ALL_REDUCE]


def test_tp_without_sp_uses_all_reduce():
    c = colls(lower("tp2-nosp"), "tp")
    assert c[Coll.ALL_REDUCE] and not c[Coll.ALL_GATHER]


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_ring_attention_passes_kv_blocks(cp):
    """Ring attention: per layer and pass, cp attention blocks and cp-1 p2p KV hops on the
    cp stream, each hop starting with a block and the next block waiting for it;
    backward hops carry KV and dKV (twice the bytes)."""
    from conftest import tiny_dense

    from perfsim.lowering.graph import build_graph
    from perfsim.plan.parallel import ParallelPlan

    graph = build_graph(tiny_dense(), ParallelPlan(cp=cp, gbs=2, seq=4096))
    hops = [o for o in graph.ops if o.collective and o.collective.group == "cp"]
    assert {o.collective.coll for o in hops} == {Coll.SEND_RECV}
    assert {o.kind for o in hops} == {OpKind.P2P}
    passes = graph.model.num_layers * graph.plan.num_microbatches
    fwd = [o for o in hops if o.phase == FWD]
    bwd = [o for o in hops if o.phase == BWD]
    assert len(fwd) == len(bwd) == (cp - 1) * passes
    assert bwd[0].collective.size_bytes == pytest.approx(2 * fwd[0].collective.size_bytes)
    blocks = [o for o in graph.ops if o.kind is OpKind.ATTENTION and o.phase == FWD]
    assert len(blocks) == cp * passes
    by_id = {o.op_id: o for o in graph.ops}
    joins = [o for o in blocks if any(by_id[d].stream.value == "cp_comm" for d in o.deps)]
    assert len(joins) == (cp - 1) * passes


def test_ep_all_to_all_dispatch_and_combine():
    graph = lower("moe-ep4")
    a2a = [o for o in graph.ops if o.collective and o.collective.group == "ep"]
    assert {o.collective.coll for o in a2a} == {Coll.ALL_TO_ALL}
    per_pass = graph.model.num_layers * 2  # dispatch + combine per MoE layer
    assert len(a2a) == 2 * per_pass * graph.plan.num_microbatches


def test_etp_collectives():
    c = colls(lower("moe-ep2-etp2"), "etp")
    assert c[Coll.ALL_GATHER] and c[Coll.REDUCE_SCATTER]


def dp_ops(graph, category):
    return [o for o in graph.ops if o.category == category]


def test_zero0_all_reduces_gradients():
    grads = dp_ops(lower("zero0"), "dp_grad_reduce")
    assert grads and {o.collective.coll for o in grads} == {Coll.ALL_REDUCE}
    assert not dp_ops(lower("zero0"), "dp_param_gather")


def _stage_weight_bytes(graph) -> float:
    """Bytes of every working weight a rank holds (layers, embedding, LM head, final norm)."""
    from perfsim.plan.sharding import embedding_rank_params, layer_rank_params

    layers = sum(sum(layer_rank_params(graph.model, graph.plan, l)) for l in range(graph.model.num_layers))
    return (layers + embedding_rank_params(graph.model, graph.plan, 0)) * graph.plan.param_bytes


def test_zero1_reduce_scatters_and_gathers_once():
    """ZeRO-1/2 gather the updated weights once per step: every layer's, the embedding's
    and the LM head's (tiny-dense's untied 32,000 x 1,024 tables dwarf its layers)."""
    for case in ("zero2", "zero1-nooverlap"):
        graph = lower(case)
        grads, gathers = dp_ops(graph, "dp_grad_reduce"), dp_ops(graph, "dp_param_gather")
        assert {o.collective.coll for o in grads} == {Coll.REDUCE_SCATTER}
        assert len(gathers) == graph.model.num_layers + 2  # once per step per block
        assert sum(o.collective.size_bytes for o in gathers) == pytest.approx(_stage_weight_bytes(graph))
        ends = [o for o in gathers if o.layer < 0]
        assert len(ends) == 2 and all(o.collective.size_bytes > 30_000 * 1024 * 2 for o in ends)


def test_zero3_gathers_every_pass():
    """ZeRO-3 per pass: each layer and the LM head before their forward and backward, the
    embedding before its forward only (its backward needs no weights)."""
    from perfsim.plan.sharding import end_block_params

    graph = lower("zero3")
    gathers = dp_ops(graph, "dp_param_gather")
    m = graph.plan.num_microbatches
    assert len(gathers) == (2 * graph.model.num_layers + 3) * m
    table = end_block_params(graph.model, graph.plan, "embedding") * graph.plan.param_bytes
    head = end_block_params(graph.model, graph.plan, "head") * graph.plan.param_bytes
    ends = sorted(o.collective.size_bytes for o in gathers if o.layer < 0)
    assert ends == pytest.approx(sorted([table] * m + [head] * 2 * m))
    backward = [o for o in gathers if o.phase == BWD and o.layer < 0]
    assert [o.collective.size_bytes for o in backward] == pytest.approx([head] * m)


def test_grad_reduce_bytes_sum_to_stage_gradients():
    """Bytes conserved: the buckets reduce every layer's gradients and the embedding / LM
    head / final norm's exactly once, those last (ready when the backward ends)."""
    from perfsim.plan.sharding import REDUCE_GRAD_BYTES, embedding_rank_params, layer_rank_params

    graph = lower("zero2")  # ZeRO-2 without a pipeline: each of the 2 microbatches reduces its own
    ops = dp_ops(graph, "dp_grad_reduce")
    layers = sum(sum(layer_rank_params(graph.model, graph.plan, l)) for l in range(graph.model.num_layers))
    ends = embedding_rank_params(graph.model, graph.plan, 0)
    assert ends > 0.1 * layers  # tiny-dense: 32,000 x 1,024 embedding and head beside 8 small layers
    assert graph.plan.grad_syncs == graph.plan.num_microbatches == 2
    for mb in range(2):
        mine = [o for o in ops if o.microbatch == mb]
        assert sum(o.collective.size_bytes for o in mine) == pytest.approx((layers + ends) * REDUCE_GRAD_BYTES)
        assert mine[-1].collective.size_bytes >= ends * REDUCE_GRAD_BYTES  # in the bucket flushed at the end
    once = build_graph(graph.model, dataclasses.replace(graph.plan, zero=1))  # ZeRO-1: once, after the last
    ops = dp_ops(once, "dp_grad_reduce")
    assert {o.microbatch for o in ops} == {1}
    assert sum(o.collective.size_bytes for o in ops) == pytest.approx((layers + ends) * REDUCE_GRAD_BYTES)


def test_recompute_adds_forward_work_in_backward():
    def recompute_ops(case):
        return [o for o in lower(case).ops if o.name.endswith("_recompute")]

    selective, full = recompute_ops("recompute-selective"), recompute_ops("recompute-full")
    assert not recompute_ops("pp2-1f1b")
    assert selective and {o.kind for o in selective} == {OpKind.ATTENTION}
    assert len(full) > len(selective)
    assert all(o.phase == BWD for o in full)


def test_backward_gemms_do_twice_the_forward_flops():
    graph = lower("pp1")
    fwd = sum(o.flops for o in graph.ops if o.kind is OpKind.GEMM and o.phase == FWD)
    bwd = sum(o.flops for o in graph.ops if o.kind is OpKind.GEMM and o.phase == BWD)
    assert bwd == pytest.approx(2 * fwd)


def test_gemm_flops_match_model_matmul_params():
    """Forward GEMM FLOPs per token = 2 x matmul weights (layers + LM head)."""
    graph = lower("pp1")
    m, plan = graph.model, graph.plan
    fwd = sum(o.flops for o in graph.ops if o.kind is OpKind.GEMM and o.phase == FWD)
    tokens = plan.num_microbatches * plan.mbs * plan.seq
    weights = m.num_layers * (m.attention_params() + m.dense_mlp_params()) + m.vocab_size * m.hidden_size
    assert fwd / tokens == pytest.approx(2 * weights, rel=1e-6)


@pytest.mark.parametrize("case", ["moe-ep4", "moe-ep2-etp2"])
def test_moe_flops_match_active_params(case):
    """Balanced routing: per token, GEMM + grouped-GEMM FLOPs = 2 x active matmul weights."""
    graph = lower(case)
    m, plan = graph.model, graph.plan
    kinds = (OpKind.GEMM, OpKind.GROUPED_GEMM)
    fwd = sum(o.flops for o in graph.ops if o.kind in kinds and o.phase == FWD)
    tokens_per_rank = plan.num_microbatches * plan.mbs * plan.seq
    norms = m.num_layers * m.norm_params_per_layer() + m.hidden_size
    weights = m.active_params(include_embeddings=False) - norms + m.vocab_size * m.hidden_size
    # dense weights shard over tp; a rank's experts see etp x its tokens at 1/etp width
    assert fwd * plan.tp / tokens_per_rank == pytest.approx(2 * weights, rel=1e-6)


@pytest.mark.parametrize("mbs, cp", [(1, 1), (2, 1), (4, 2)])
def test_attention_flops_per_token_independent_of_mbs(mbs, cp):
    """Causal attention forward = s*(q_width+v_width) FLOPs per token per layer (the
    MFU formula's attention term / 3); queries never attend across samples."""
    from conftest import tiny_dense

    from perfsim.lowering.graph import build_graph
    from perfsim.plan.parallel import ParallelPlan

    model = tiny_dense()
    plan = ParallelPlan(mbs=mbs, cp=cp, gbs=4 * mbs, seq=2048)
    graph = build_graph(model, plan)
    fwd = sum(o.flops for o in graph.ops if o.kind is OpKind.ATTENTION and o.phase == FWD)
    tokens = plan.num_microbatches * plan.mbs * plan.seq / cp
    assert fwd / tokens == pytest.approx(model.num_layers * plan.seq * (model.q_width + model.v_width))


def test_qk_norm_models_pay_a_norm_pass_over_q_and_k_each_way():
    from dataclasses import replace

    from perfsim.lowering.graph import build_graph
    from perfsim.lowering.memory import layer_activation_bytes
    from perfsim.model.io import load_model
    from perfsim.plan.parallel import ParallelPlan

    base = replace(load_model("qwen3-30b-a3b"), qk_norm=False)
    with_norm = replace(base, qk_norm=True)
    plan = ParallelPlan(seq=1024, mbs=1, gbs=8, dp=8, ep=8)
    ops = {m.qk_norm: [o for o in build_graph(m, plan).ops if o.name.startswith("qk_norm")] for m in (base, with_norm)}
    assert not ops[False]
    width = base.q_width + base.num_kv_heads * base.head_dim  # q and k, read and written
    fwd = [o for o in ops[True] if not o.name.endswith("_bwd")]
    bwd = [o for o in ops[True] if o.name.endswith("_bwd")]
    assert len(fwd) == len(bwd) == base.num_layers * plan.num_microbatches
    assert {o.bytes for o in fwd} == {2 * 1024 * width * 2} and {o.bytes for o in bwd} == {4 * 1024 * width * 2}
    assert {o.category for o in ops[True]} == {"norm"}
    # the norms keep their inputs (q and k) for the backward
    grown = layer_activation_bytes(with_norm, plan, 0) - layer_activation_bytes(base, plan, 0)
    assert grown == 1024 * width * 2
