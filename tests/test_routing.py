"""MoE routing: token conservation, determinism, skew monotonicity, placement, capacity."""

import dataclasses

import numpy as np
import pytest

from perfsim.errors import ConfigError
from perfsim.model.io import load_model
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.routing import (
    RoutingSpec,
    dropped_fraction,
    expert_shares,
    expert_tokens,
    held_imbalance,
    imbalance,
    layer_draws,
    layer_imbalance,
    pair_bytes,
    rank_expert_loads,
    slowest_expert_rank,
    split_tokens,
)

MODEL = load_model("mixtral-8x22b")
PLAN = ParallelPlan(dp=16, ep=8, gbs=256, seq=4096)
ROUTED = 8192


@pytest.mark.parametrize("spec", [
    RoutingSpec(),
    RoutingSpec(distribution="zipf", skew=1.2, seed=3),
    RoutingSpec(distribution="dirichlet", concentration=0.5, seed=1),
    RoutingSpec(distribution="histogram", histogram=(5, 1, 1, 1, 1, 1, 1, 1)),
])
def test_tokens_are_conserved_without_capacity(spec):
    assert expert_tokens(MODEL, PLAN, ROUTED, spec).sum() == ROUTED * PLAN.ep
    assert expert_shares(spec, MODEL.num_experts).sum() == pytest.approx(1.0)


def test_uniform_routing_is_balanced():
    assert rank_expert_loads(MODEL, PLAN, ROUTED) == (ROUTED,)
    assert imbalance(MODEL, PLAN, ROUTED, RoutingSpec()) == 1.0


def test_same_seed_same_routing_other_seed_differs():
    a = expert_tokens(MODEL, PLAN, ROUTED, RoutingSpec(distribution="dirichlet", seed=7))
    b = expert_tokens(MODEL, PLAN, ROUTED, RoutingSpec(distribution="dirichlet", seed=7))
    c = expert_tokens(MODEL, PLAN, ROUTED, RoutingSpec(distribution="dirichlet", seed=8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_imbalance_rises_with_zipf_skew():
    values = [imbalance(MODEL, PLAN, ROUTED, RoutingSpec(distribution="zipf", skew=s)) for s in (0.0, 0.5, 1.0, 2.0)]
    assert values[0] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(values, values[1:]))


def test_split_tokens_largest_remainder():
    counts = split_tokens(np.array([0.5, 0.25, 0.25]), 7)
    assert counts.sum() == 7 and counts.tolist() in ([4, 2, 1], [3, 2, 2], [4, 1, 2])


def test_placement_moves_hot_experts():
    plan = ParallelPlan(dp=16, ep=4, gbs=256, seq=4096)
    hist = (10, 10, 1, 1, 1, 1, 1, 1)
    contiguous = RoutingSpec(distribution="histogram", histogram=hist)
    spread = dataclasses.replace(contiguous, placement=(0, 1, 0, 1, 2, 2, 3, 3))
    assert imbalance(MODEL, plan, ROUTED, spread) < imbalance(MODEL, plan, ROUTED, contiguous)


def test_bad_placement_and_histogram_are_config_errors():
    with pytest.raises(ConfigError, match="placement"):
        rank_expert_loads(MODEL, PLAN, ROUTED, RoutingSpec(placement=(0,) * 8))
    with pytest.raises(ConfigError, match="histogram has 3 entries"):
        expert_shares(RoutingSpec(distribution="histogram", histogram=(1, 2, 3)), 8)
    with pytest.raises(ConfigError, match="distribution"):
        RoutingSpec(distribution="pareto")
    with pytest.raises(ConfigError, match="skew"):
        RoutingSpec(distribution="zipf", skew=-1)


def test_capacity_factor_drops_tokens_only_when_skewed():
    capped = dataclasses.replace(MODEL, capacity_factor=1.25)
    assert dropped_fraction(capped, PLAN, ROUTED, RoutingSpec()) == 0.0
    skewed = RoutingSpec(distribution="zipf", skew=1.5)
    assert dropped_fraction(capped, PLAN, ROUTED, skewed) > 0.2
    cap = np.ceil(1.25 * ROUTED * PLAN.ep / MODEL.num_experts)
    assert expert_tokens(capped, PLAN, ROUTED, skewed).max() <= cap


def test_all_to_allv_bytes_follow_routing():
    skewed = RoutingSpec(distribution="zipf", skew=1.0)
    matrix = pair_bytes(MODEL, PLAN, ROUTED, skewed, token_bytes=2 * MODEL.hidden_size)
    assert matrix.sum() == pytest.approx(ROUTED * PLAN.ep * 2 * MODEL.hidden_size)
    assert matrix.sum(axis=1) == pytest.approx(np.full(PLAN.ep, ROUTED * 2 * MODEL.hidden_size))
    received = matrix.sum(axis=0)
    assert received.max() / received.mean() == pytest.approx(layer_imbalance(MODEL, PLAN, ROUTED, skewed))


# ---- each MoE layer draws its own routing ----------------------------------------------

DSV3 = load_model("deepseek-v3")  # 256 experts: 32 a rank under EP 8, 58 MoE layers
DSV3_PLAN = ParallelPlan(dp=64, ep=8, gbs=64, seq=4096)


def test_each_moe_layer_draws_its_own_random_routing():
    spec = RoutingSpec(distribution="dirichlet", seed=5)
    draws = layer_draws(DSV3, spec)
    assert len(draws) == DSV3.num_moe_layers == 58
    assert [d.seed for d in draws] == list(range(5, 5 + 58))
    assert layer_draws(DSV3, RoutingSpec(distribution="zipf", skew=1.0))[1].seed == 1
    hist = RoutingSpec(distribution="histogram", histogram=tuple(range(1, 257)))
    assert layer_draws(DSV3, hist) == (hist,) and layer_draws(DSV3, RoutingSpec()) == (RoutingSpec(),)


def test_imbalance_is_the_mean_over_layers_of_each_busiest_rank_and_steady_across_seeds():
    spec = RoutingSpec(distribution="dirichlet")
    per_layer = [layer_imbalance(DSV3, DSV3_PLAN, ROUTED, d) for d in layer_draws(DSV3, spec)]
    assert imbalance(DSV3, DSV3_PLAN, ROUTED, spec) == pytest.approx(np.mean(per_layer))
    # one layer's draw moves with the seed; the step's mean over 58 layers hardly does
    single = [layer_imbalance(DSV3, DSV3_PLAN, ROUTED, RoutingSpec(distribution="dirichlet", seed=s)) for s in range(0, 100, 20)]
    step = [imbalance(DSV3, DSV3_PLAN, ROUTED, RoutingSpec(distribution="dirichlet", seed=s)) for s in range(0, 100, 20)]
    assert max(single) / min(single) > 1.1
    assert max(step) / min(step) < 1.03


def test_the_slowest_rank_is_the_layers_mean_hottest_first():
    spec = RoutingSpec(distribution="zipf", skew=1.0)
    tokens, speed = slowest_expert_rank(DSV3, DSV3_PLAN, ROUTED, spec)
    assert speed == 1.0  # no GPU variability: exactly the one speed
    assert len(tokens) == 32 and list(tokens) == sorted(tokens, reverse=True)
    mean_busiest = np.mean([layer_imbalance(DSV3, DSV3_PLAN, ROUTED, d) for d in layer_draws(DSV3, spec)]) * ROUTED
    assert sum(tokens) == pytest.approx(mean_busiest, abs=1)
    # GPU speeds: the representative rank keeps the mean time of each layer's last rank
    speeds = tuple(1.0 - 0.05 * (r % 2) for r in range(8))
    tokens, speed = slowest_expert_rank(DSV3, DSV3_PLAN, ROUTED, spec, speeds)
    assert 0.95 <= speed <= 1.0


def test_a_ranks_memory_holds_its_share_over_all_layers():
    spec = RoutingSpec(distribution="dirichlet")
    held, waits = held_imbalance(DSV3, DSV3_PLAN, ROUTED, spec), imbalance(DSV3, DSV3_PLAN, ROUTED, spec)
    assert 1.0 < held < waits  # the hottest rank changes from layer to layer
    hist = RoutingSpec(distribution="histogram", histogram=tuple(range(1, 257)))
    assert held_imbalance(DSV3, DSV3_PLAN, ROUTED, hist) == pytest.approx(imbalance(DSV3, DSV3_PLAN, ROUTED, hist))


# ---- routing in a simulated step -------------------------------------------------------

import perfsim  # noqa: E402
from perfsim.cli import main  # noqa: E402

STEP = dict(nodes=1, pp=2, ep=4, gbs=16, seq=2048)


def _step(spec, estimator="des"):
    return perfsim.simulate("mixtral-8x7b", "mi300x-pollara", estimator=estimator, routing=spec, **STEP)


def _a2a(report):
    return report.breakdown.get("ep_a2a", 0.0) + report.overlapped_comm_s.get("ep_a2a", 0.0)


@pytest.mark.parametrize("estimator", ["des", "analytic"])
def test_skew_raises_expert_time_and_all_to_all_monotonically(estimator):
    reports = [_step(RoutingSpec(distribution="zipf", skew=s), estimator) for s in (0.0, 0.5, 1.0, 1.5)]
    experts = [r.breakdown["experts"] for r in reports]
    a2a = [_a2a(r) for r in reports]
    assert all(b > a for a, b in zip(experts, experts[1:]))
    assert all(b > a for a, b in zip(a2a, a2a[1:]))
    assert "imbalance" in reports[-1].warnings[0]


def test_uniform_routing_equals_the_balanced_default():
    assert _step(None).to_dict() == _step(RoutingSpec()).to_dict()


def test_cli_routing_flags(capsys):
    args = ["simulate", "--model", "mixtral-8x7b", "--nodes", "1", "--pp", "2", "--ep", "4", "--gbs", "16",
            "--seq", "2048", "--routing", "zipf", "--routing-skew", "1.2", "--seed", "3", "--json"]
    assert main(args) == 0
    assert "imbalance" in capsys.readouterr().out


# ---- a blocked routing (a benchmark's balanced gate) ------------------------------------

from perfsim.cost.dispatch import DispatchLoad, blocked_reach, dispatch_cost  # noqa: E402
from perfsim.plan.parallel import group_shape  # noqa: E402
from perfsim.plan.routing import routing_fields  # noqa: E402
from perfsim.system.hardware import load_cluster  # noqa: E402

BLOCKED = RoutingSpec(topk_block=True)


def test_a_blocked_token_reaches_the_ranks_of_its_block():
    """NeMo AutoModel's FakeBalancedGate sends token t to experts t*k ... t*k + k - 1 (mod E):
    (nodes, ranks) reached, averaged over the blocks' starting points."""
    assert blocked_reach(128, 8, 16, 8) == (1.0, 1.0)  # Qwen3-30B-A3B at EP8: one rank
    assert blocked_reach(256, 8, 4, 8) == (1.0, 2.0)  # DeepSeek-V3 at EP64: two ranks of one node
    assert blocked_reach(60, 4, 6, 1) == pytest.approx((4 / 3, 4 / 3))  # blocks straddle every third boundary
    assert blocked_reach(64, 8, 1, 8) == (1.0, 8.0)  # one expert a rank: k ranks, one node


def test_a_blocked_routing_costs_a_dedup_dispatch_less_and_the_library_all_to_all_the_same():
    cluster, shape = load_cluster("h100-ib"), group_shape(64, 1, 8)
    load = dict(tokens=4096, token_bytes=7168 * 2, topk=8, num_experts=256)
    random, blocked = (dispatch_cost(DispatchLoad(**load, blocked=b), shape, cluster, "deepep") for b in (False, True))
    assert blocked.wire_bytes < 0.5 * random.wire_bytes and blocked.time_s < random.time_s
    qwen = load_model("qwen3-30b-a3b")
    plan = dict(nodes=1, ep=8, gbs=64, mbs=1, seq=2048, check_memory=False, estimator="analytic")
    a2a = {(d, b): perfsim.simulate(qwen, "h100-ib", dispatch=d, routing=BLOCKED if b else None, **plan)
           .breakdown["ep_a2a"] for d in ("deepep", "alltoall") for b in (False, True)}
    assert a2a[("deepep", True)] < 0.5 * a2a[("deepep", False)]
    assert a2a[("alltoall", True)] == pytest.approx(a2a[("alltoall", False)])  # one copy per (token, expert)


@pytest.mark.parametrize("estimator", ["des", "analytic"])
def test_a_blocked_routing_balances_the_experts(estimator):
    blocked, uniform = _step(BLOCKED, estimator), _step(RoutingSpec(), estimator)
    assert blocked.breakdown["experts"] == pytest.approx(uniform.breakdown["experts"])
    assert blocked.moe_imbalance == pytest.approx(1.0) and blocked.moe_imbalance_cost_s == 0.0


def test_blocked_parses_from_every_surface(tmp_path, capsys):
    assert routing_fields("blocked", "routing") == {"distribution": "uniform", "topk_block": True}
    with pytest.raises(ConfigError, match="routing: 'blocked:2': blocked takes no parameter"):
        routing_fields("blocked:2", "routing")
    with pytest.raises(ConfigError, match="routing.topk_block: .* not beside a zipf distribution"):
        RoutingSpec(distribution="zipf", topk_block=True)
    args = ["simulate", "--model", "mixtral-8x7b", "--cluster", "mi300x-pollara", "--nodes", "1", "--pp", "2",
            "--ep", "4", "--gbs", "16", "--seq", "2048", "--routing"]
    assert main(args + ["blocked"]) == 0
    capsys.readouterr()
    assert main(args + ["blocked:1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["perfsim: error: --routing: 'blocked:1': blocked takes "
                                                           "no parameter"]


def test_search_prices_every_plan_under_the_routing(capsys):
    base = ["search", "--model", "mixtral-8x7b", "--cluster", "mi300x-pollara", "--gpus", "8", "--gbs", "16",
            "--seq", "2048", "--tp", "1", "--pp", "1", "--ep", "8", "--mbs", "1", "--zero", "1", "--recompute", "full",
            "--json"]
    import json

    times = {}
    for routing in (None, "zipf:1.5"):
        assert main(base + (["--routing", routing] if routing else [])) == 0
        rows = json.loads(capsys.readouterr().out)
        times[routing] = rows[0]["step_time_s"]
    assert times["zipf:1.5"] > times[None]
    assert main(base[:-1] + ["--routing", "zipf:1.5", "--top", "1"]) == 0
    assert "; MoE routing zipf:1.5 (seed 0)" in capsys.readouterr().out.splitlines()[0]
    assert main(base + ["--routing", "zipf:x"]) == 2
    assert capsys.readouterr().err.strip().endswith("'x' in 'zipf:x' must be a finite number in [0, 1e+06]")
    dense = ["search", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--gpus", "8", "--gbs", "64", "--seq", "4096"]
    assert main(dense + ["--routing", "blocked"]) == 2
    assert capsys.readouterr().err.strip() == "perfsim: error: --routing: applies to MoE models; llama3.1-8b is dense"
