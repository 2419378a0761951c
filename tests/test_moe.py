"""MoE fidelity: routing inputs (histogram files, placements), skew raises expert and
all-to-all time monotonically, uniform routing equals the balanced result, imbalance
and its cost in the report, shared experts and dense-first layers."""

import json

import pytest
from conftest import tiny_moe

from perfsim import ConfigError, estimate, simulate
from perfsim.cli import main
from perfsim.lowering.graph import build_graph
from perfsim.lowering.ops import OpKind
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.routing import RoutingSpec, load_histogram, rank_tokens
from perfsim.plan.stragglers import VariabilitySpec

MOE = tiny_moe(num_experts=16, top_k=2)
KNOBS = dict(gpus=8, dp=8, ep=8, gbs=16, seq=2048)


def run(routing=None, estimator="analytic", **extra):
    return simulate(MOE, "mi300x-pollara", routing=routing, estimator=estimator, **{**KNOBS, **extra})


# ---- histogram files ---------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [
    ("h.json", "[1, 2, 3, 4]"),
    ("h.json", '{"tokens_per_expert": [1, 2, 3, 4]}'),
    ("h.csv", "1\n2\n3\n4\n"),
    ("h.csv", "expert,tokens\n0,1\n1,2\n2,3\n3,4\n"),
])
def test_histogram_file_formats(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert load_histogram(path) == (1.0, 2.0, 3.0, 4.0)


@pytest.mark.parametrize("text", ["[1, -2]", "[0, 0]", "[]", "expert,tokens\n0,x\n", "{\"other\": [1]}"])
def test_histogram_file_errors_are_one_line(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_histogram(path)
    assert "routing.histogram" in str(info.value) and "\n" not in str(info.value)


def test_histogram_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_histogram(tmp_path / "nope.csv")


def test_histogram_must_match_experts(tmp_path):
    routing = RoutingSpec(distribution="histogram", histogram=(1.0, 2.0))
    with pytest.raises(ConfigError, match="16 experts"):
        run(routing)


def test_cli_histogram_and_placement(tmp_path, capsys):
    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps([100] * 4 + [10] * 4))
    base = ["simulate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "4", "--gbs", "8", "--seq", "1024",
            "--engine", "analytic", "--json", "--allow-oom"]
    assert main(base + ["--routing-histogram", str(hist)]) == 0
    hot = json.loads(capsys.readouterr().out)
    assert main(base + ["--routing", str(hist), "--expert-placement", "0,1,2,3,0,1,2,3"]) == 0
    spread = json.loads(capsys.readouterr().out)
    assert hot["moe_imbalance"] > spread["moe_imbalance"] == pytest.approx(1.0)
    assert main(base + ["--expert-placement", "0,0,1"]) == 2
    assert "routing.placement" in capsys.readouterr().err
    assert main(base + ["--routing", "zipf:x"]) == 2


# ---- skew --------------------------------------------------------------------------------

@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_skew_raises_expert_and_a2a_time_monotonically(estimator):
    rows = []
    for skew in (0.0, 0.5, 1.0, 1.5, 2.0):
        r = run(RoutingSpec(distribution="zipf", skew=skew, seed=3), estimator)
        total = {k: v["total_s"] for k, v in r.comm_by_collective.items()}
        rows.append((r.moe_imbalance, r.breakdown["experts"], total["ep_a2a/all_to_all"], r.step_time_s))
    for column in zip(*rows):
        assert list(column) == sorted(column)
    assert rows[-1][0] > 1.5 and rows[-1][1] > rows[0][1] * 1.3


def test_uniform_routing_without_variability_equals_balanced():
    balanced = simulate(MOE, "mi300x-pollara", estimator="des", **KNOBS)
    explicit = run(RoutingSpec(distribution="uniform", seed=7), "des", variability=VariabilitySpec(cv=0.0, seed=5))
    assert explicit.step_time_s == balanced.step_time_s
    assert explicit.moe_imbalance == 1.0 and explicit.moe_imbalance_cost_s == 0.0 and explicit.straggler_cost_s == 0.0


def test_imbalance_cost_is_reported():
    r = run(RoutingSpec(distribution="zipf", skew=1.5, seed=1))
    assert r.moe_imbalance > 1.2
    assert r.moe_imbalance_cost_s > 0
    assert r.moe_imbalance_cost_s == pytest.approx(r.step_time_s - run().step_time_s, rel=1e-9)


def test_deterministic_for_a_seed():
    spec = RoutingSpec(distribution="dirichlet", concentration=0.3, seed=11)
    assert run(spec, "des").to_dict() == run(spec, "des").to_dict()
    assert run(spec).step_time_s != run(RoutingSpec(distribution="dirichlet", concentration=0.3, seed=12)).step_time_s


def test_user_placement_changes_the_busiest_rank():
    hist = (8.0, 8.0, 1.0, 1.0) * 4
    plan = ParallelPlan(dp=8, ep=8, gbs=16, seq=2048)
    hot, cold = [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]
    pairs_spread = [(h, c) for h, c in zip(hot, cold)]
    pairs_together = [tuple(hot[i:i + 2]) for i in (0, 2, 4, 6)] + [tuple(cold[i:i + 2]) for i in (0, 2, 4, 6)]

    def spec(pairs):
        ranks = [0] * 16
        for r, pair in enumerate(pairs):
            for e in pair:
                ranks[e] = r
        return RoutingSpec(distribution="histogram", histogram=hist, placement=tuple(ranks))

    together, spread = spec(pairs_together), spec(pairs_spread)
    loads = lambda spec: [int(t.sum()) for t in rank_tokens(MOE, plan, 4096, spec)]  # noqa: E731
    assert max(loads(together)) > max(loads(spread))


# ---- shared experts, dense-first layers ---------------------------------------------------

def test_shared_experts_and_dense_first_layers():
    model = tiny_moe(num_dense_layers=2, ffn_hidden_size=4096, num_shared_experts=1, shared_expert_ffn_hidden_size=1024)
    plan = ParallelPlan(dp=4, ep=4, gbs=4, seq=1024)
    graph = build_graph(model, plan)
    a2a_layers = {o.layer for o in graph.ops if o.collective and o.collective.group == "ep"}
    assert a2a_layers == set(range(2, model.num_layers))
    shared = {o.layer for o in graph.ops if o.category == "shared_expert"}
    assert shared == set(range(2, model.num_layers))
    dense_mlp = {o.layer for o in graph.ops if o.category == "mlp"}
    assert dense_mlp == {0, 1}
    # balanced routing: forward GEMM FLOPs per token = 2 x active matmul weights
    kinds = (OpKind.GEMM, OpKind.GROUPED_GEMM)
    fwd = sum(o.flops for o in graph.ops if o.kind in kinds and o.phase == "F")
    norms = model.num_layers * model.norm_params_per_layer() + model.hidden_size
    weights = model.active_params(include_embeddings=False) - norms + model.vocab_size * model.hidden_size
    assert fwd / (plan.num_microbatches * plan.seq) == pytest.approx(2 * weights, rel=1e-6)


@pytest.mark.parametrize("sp", [True, False])
def test_shared_experts_run_as_a_tensor_parallel_mlp(sp):
    """Megatron-Core's SharedExpertMLP is its MLP: column-parallel up, row-parallel down, so
    under TP each rank computes its share of the width for the whole sequence, behind the
    sequence-parallel all-gather and in front of the reduce-scatter (an all-reduce without
    sequence parallelism); per rank the FLOPs are the shared experts' over TP either way."""
    from perfsim.lowering.layers import LayerBuilder

    model = tiny_moe(num_shared_experts=1, shared_expert_ffn_hidden_size=1024)
    tp, tokens, h, w = 4, 2048, model.hidden_size, 1024
    plan = ParallelPlan(tp=tp, dp=2, ep=8, gbs=2, seq=tokens, sequence_parallel=sp)
    shared = [s for s in LayerBuilder(model, plan).moe_forward() if s.name.startswith("shared_")]
    gather, reduce = ("shared_ag", "shared_rs") if sp else (None, "shared_ar")
    assert [s.name for s in shared] == [n for n in (gather, "shared_up", "shared_act", "shared_down", reduce) if n]
    comms = [s for s in shared if s.collective is not None]
    assert all(s.collective.group == "tp" and s.collective.size_bytes == tokens * h * 2 for s in comms)
    gemms = {s.name: s.gemm for s in shared if s.gemm is not None}
    gate = 2 if model.gated_mlp else 1
    assert (gemms["shared_up"].m, gemms["shared_up"].n) == (tokens, gate * w // tp)
    assert (gemms["shared_down"].m, gemms["shared_down"].k) == (tokens, w // tp)
    assert sum(g.flops for g in gemms.values()) == pytest.approx(2 * tokens * h * (gate + 1) * w / tp)
