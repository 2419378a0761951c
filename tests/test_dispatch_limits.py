"""Issue 15, MoE all-to-all from the routing up: group-limited (node-limited) routing bounds
the nodes a token reaches under per-node-dedup dispatch, and FP8 dispatch shrinks the
dispatch-direction payload (forward tokens and the gradients flowing back into the
experts) while the combine direction stays BF16."""

import dataclasses

import pytest

import perfsim
from perfsim.cli import main
from perfsim.cost.dispatch import DispatchLoad, dispatch_cost, expected_hits
from perfsim.errors import ConfigError
from perfsim.lowering.steps import ACT_BYTES, FP8_DISPATCH_BYTES
from perfsim.lowering.graph import build_graph
from perfsim.model.io import from_hf_config
from perfsim.plan.parallel import GroupShape, ParallelPlan
from perfsim.system.hardware import load_cluster

A2A = "ep_a2a/all_to_all"
DSV3 = perfsim.load_model("deepseek-v3")
FREE = dataclasses.replace(DSV3, expert_groups=0, topk_groups=0)


def _a2a(model, impl="deepep", cluster="h100-ib", estimator="estimate", ep=64, **knobs):
    run = getattr(perfsim, estimator)
    r = run(model, cluster, gpus=64, tp=1, pp=1, ep=ep, dp=64, zero=3, mbs=1, gbs=64, seq=4096,
            recompute="full", check_memory=False, dispatch=impl, overlap_grad_reduce=False, **knobs)
    return r.comm_by_collective[A2A]["total_s"]


def test_deepseek_presets_carry_their_group_limits():
    assert (DSV3.expert_groups, DSV3.topk_groups, DSV3.group_limited) == (8, 4, True)
    v2 = perfsim.load_model("deepseek-v2")
    assert (v2.expert_groups, v2.topk_groups) == (8, 3)
    assert not perfsim.load_model("deepseek-v2-lite").group_limited


@pytest.mark.parametrize("fields, word", [
    ({"expert_groups": 8}, "go together"),
    ({"expert_groups": 7, "topk_groups": 2}, "divide num_experts"),
    ({"expert_groups": 8, "topk_groups": 9}, "topk_groups must be in"),
    ({"expert_groups": 256, "topk_groups": 4}, "exceeds"),
    ({"expert_groups": -1, "topk_groups": 0}, "non-negative"),
])
def test_bad_group_limits_name_the_field(fields, word):
    with pytest.raises(ConfigError, match=word):
        dataclasses.replace(FREE, **fields)


def test_hf_import_reads_group_limits_only_for_group_limited_methods():
    base = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
            "vocab_size": 1000, "intermediate_size": 2048, "qk_nope_head_dim": 64, "kv_lora_rank": 128,
            "qk_rope_head_dim": 32, "v_head_dim": 64, "n_routed_experts": 64, "num_experts_per_tok": 4,
            "moe_intermediate_size": 256, "n_group": 8, "topk_group": 2}
    limited = from_hf_config(base | {"topk_method": "noaux_tc"}, "tiny")
    assert (limited.expert_groups, limited.topk_groups) == (8, 2)
    greedy = from_hf_config(base | {"topk_method": "greedy"}, "tiny")
    assert (greedy.expert_groups, greedy.topk_groups) == (0, 0)


def test_group_limit_bounds_the_nodes_a_token_reaches():
    """DeepSeek-V3 over 64 ranks on 8 nodes: one group per node, four groups per token,
    so a token reaches at most 4 nodes (expected: top-8 drawn from 4 x 32 experts)."""
    cluster = load_cluster("h100-ib")
    shape = GroupShape(size=64, per_node=8, num_nodes=8)
    load = dict(tokens=4096, token_bytes=7168 * 2, topk=8, num_experts=256)
    free = dispatch_cost(DispatchLoad(**load), shape, cluster, "deepep")
    limited = dispatch_cost(DispatchLoad(**load, expert_groups=8, topk_groups=4), shape, cluster, "deepep")
    assert limited.node_copies / (4096 * 7168 * 2) == pytest.approx(expected_hits(4, 32, 8))
    assert free.node_copies / (4096 * 7168 * 2) == pytest.approx(expected_hits(8, 32, 8))
    assert limited.wire_bytes < 0.75 * free.wire_bytes
    # two groups per node (EP 32 on 4 nodes): the chosen groups lie on fewer nodes than
    # free routing reaches, more than one
    shape4 = GroupShape(size=32, per_node=8, num_nodes=4)
    lim4 = dispatch_cost(DispatchLoad(**load, expert_groups=8, topk_groups=4), shape4, cluster, "deepep")
    free4 = dispatch_cost(DispatchLoad(**load), shape4, cluster, "deepep")
    assert 1 < lim4.node_copies / (4096 * 7168 * 2) < free4.node_copies / (4096 * 7168 * 2) <= 4


@pytest.mark.parametrize("estimator", ["estimate", "simulate"])
def test_node_limited_routing_makes_cross_node_dedup_dispatch_cheaper(estimator):
    limited, free = _a2a(DSV3, estimator=estimator), _a2a(FREE, estimator=estimator)
    assert limited < 0.85 * free
    # inside one node there is nothing to limit
    assert _a2a(DSV3, ep=8, estimator=estimator) == pytest.approx(_a2a(FREE, ep=8, estimator=estimator))


def test_fp8_dispatch_needs_fp8_and_is_a_bool():
    with pytest.raises(ConfigError, match="dispatch_fp8.*dtype fp8"):
        ParallelPlan(ep=8, dp=8, gbs=8, seq=4096, dtype="bf16", dispatch_fp8=True)
    with pytest.raises(ConfigError, match="dispatch_fp8 must be true or false"):
        ParallelPlan(ep=8, dp=8, gbs=8, seq=4096, dtype="fp8", dispatch_fp8="yes")


def test_fp8_dispatch_payloads_in_the_graph():
    """The forward dispatch and the backward of the combine (gradients into the experts)
    carry FP8 + scales; the combine and the dispatch's backward carry BF16."""
    plan = ParallelPlan(ep=8, dp=8, gbs=8, mbs=1, seq=4096, dtype="fp8", dispatch_fp8=True)
    bf16 = dataclasses.replace(plan, dispatch_fp8=False)
    sizes = {}
    for key, p in (("fp8", plan), ("bf16", bf16)):
        graph = build_graph(FREE, p)
        layer = next(op.layer for op in graph.ops if op.name == "dispatch_a2a")
        ops = [op for op in graph.ops if op.collective is not None and op.collective.group == "ep"
               and op.microbatch == 0 and op.layer == layer]
        sizes[key] = {op.name: op.collective.size_bytes for op in ops}
    assert set(sizes["bf16"]) == {"dispatch_a2a", "combine_a2a", "dispatch_a2a_bwd", "combine_a2a_bwd"}
    ratio = FP8_DISPATCH_BYTES / ACT_BYTES
    for name, size in sizes["bf16"].items():
        narrow = name.startswith("dispatch_a2a") != name.endswith("_bwd")
        assert sizes["fp8"][name] == pytest.approx(size * (ratio if narrow else 1.0)), name


@pytest.mark.parametrize("impl", ["alltoall", "deepep"])
def test_fp8_dispatch_shortens_the_all_to_all(impl):
    bf16 = _a2a(FREE, impl=impl, dtype="fp8")
    fp8 = _a2a(FREE, impl=impl, dtype="fp8", dispatch_fp8=True)
    # half the all-to-all traffic shrinks to (1 + 1/32) / 2 of itself: about a quarter off
    assert 0.65 * bf16 < fp8 < 0.85 * bf16
    assert _a2a(FREE, impl=impl, dtype="fp8", dispatch_fp8=True, estimator="simulate") == pytest.approx(fp8, rel=0.02)


def test_cli_fp8_dispatch(capsys):
    args = ["simulate", "--model", "deepseek-v2-lite", "--cluster", "mi300x-pollara", "--gpus", "16", "--ep", "16",
            "--gbs", "16", "--seq", "2048", "--engine", "analytic"]
    assert main(args + ["--dtype", "fp8", "--dispatch-fp8"]) == 0
    assert "dispatch_fp8=True" in capsys.readouterr().out
    assert main(args + ["--dispatch-fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dispatch_fp8" in err[0]


def _names(model, **knobs) -> set[str]:
    plan = ParallelPlan(gbs=64, mbs=1, seq=2048, **knobs)
    return {op.name for op in build_graph(model, plan).ops}


def test_library_all_to_all_regroups_tokens_by_local_expert():
    """RCCL's all-to-all delivers tokens grouped by source rank: a rank holding several
    experts sorts them by expert after the dispatch and back before the combine (Megatron's
    sort_chunks_by_idxs); a dedicated dispatch kernel writes that layout itself, and a rank
    with one expert has nothing to regroup."""
    lite = perfsim.load_model("deepseek-v2-lite")  # 64 experts
    names = _names(lite, ep=8, dp=8)
    assert {"local_sort", "local_unsort", "local_sort_bwd", "local_unsort_bwd"} <= names
    assert "local_sort" not in _names(lite, ep=8, dp=8, dispatch="mori")
    assert "local_sort" not in _names(lite, ep=64, dp=64)
    assert "local_sort" not in _names(lite, dp=8)  # no expert parallelism


def test_local_regroup_moves_what_the_rank_received():
    lite = perfsim.load_model("deepseek-v2-lite")
    graph = build_graph(lite, ParallelPlan(gbs=16, mbs=1, seq=2048, ep=8, dp=8))
    a2a = next(op for op in graph.ops if op.name == "dispatch_a2a")
    sort = next(op for op in graph.ops if op.name == "local_sort" and op.layer == a2a.layer)
    assert sort.bytes == pytest.approx(2 * a2a.collective.size_bytes)
    with_sort = perfsim.estimate(lite, "mi300x-pollara", gpus=8, ep=8, gbs=16, seq=2048)
    mori = perfsim.estimate(lite, "mi300x-pollara", gpus=8, ep=8, gbs=16, seq=2048, dispatch="mori")
    assert with_sort.breakdown["moe_permute"] > 1.5 * mori.breakdown["moe_permute"]
