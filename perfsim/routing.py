"""MoE routing: tokens per expert from a seeded distribution, experts placed on EP ranks.

The busiest expert-parallel rank sets the MoE layer time (synchronized execution), so
the graph uses that rank's per-expert token counts; all-to-all sizes follow the routing.
"""

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from perfsim.errors import ConfigError
from perfsim.model import ModelSpec
from perfsim.parallel import ParallelPlan


class Distribution(StrEnum):
    UNIFORM = "uniform"
    ZIPF = "zipf"  # p_i ~ 1 / rank_i^skew, hot experts at seeded positions
    DIRICHLET = "dirichlet"  # p ~ Dirichlet(concentration), seeded
    HISTOGRAM = "histogram"  # measured tokens (or shares) per expert


@dataclass(frozen=True, kw_only=True)
class RoutingSpec:
    distribution: Distribution = Distribution.UNIFORM
    skew: float = 1.0
    concentration: float = 1.0
    histogram: tuple[float, ...] = ()
    seed: int = 0
    placement: tuple[int, ...] = ()  # EP rank of each expert; contiguous blocks when empty

    def __post_init__(self):
        try:
            object.__setattr__(self, "distribution", Distribution(self.distribution))
        except ValueError:
            choices = ", ".join(d.value for d in Distribution)
            raise ConfigError(f"routing.distribution must be one of {choices}, got {self.distribution!r}") from None
        if self.skew < 0:
            raise ConfigError(f"routing.skew must be >= 0, got {self.skew!r}")
        if self.concentration <= 0:
            raise ConfigError(f"routing.concentration must be > 0, got {self.concentration!r}")
        if any(x < 0 for x in self.histogram):
            raise ConfigError(f"routing.histogram must be non-negative, got {list(self.histogram)}")
        if self.distribution is Distribution.HISTOGRAM and not sum(self.histogram) > 0:
            raise ConfigError("routing.histogram: a histogram distribution needs positive counts")


UNIFORM = RoutingSpec()


def expert_shares(spec: RoutingSpec, num_experts: int) -> np.ndarray:
    """Probability that a routed token goes to each expert (sums to 1)."""
    rng = np.random.default_rng(spec.seed)
    if spec.distribution is Distribution.UNIFORM:
        return np.full(num_experts, 1.0 / num_experts)
    if spec.distribution is Distribution.ZIPF:
        weights = 1.0 / np.arange(1, num_experts + 1) ** spec.skew
        weights = weights[rng.permutation(num_experts)]
    elif spec.distribution is Distribution.DIRICHLET:
        weights = rng.dirichlet(np.full(num_experts, spec.concentration))
    else:
        if len(spec.histogram) != num_experts:
            raise ConfigError(f"routing.histogram has {len(spec.histogram)} entries, the model has {num_experts} experts")
        weights = np.asarray(spec.histogram, dtype=float)
    return weights / weights.sum()


def split_tokens(shares: np.ndarray, total: int) -> np.ndarray:
    """Integer token counts proportional to ``shares`` summing to ``total`` (largest remainder)."""
    exact = shares * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def placement(spec: RoutingSpec, num_experts: int, ep: int) -> np.ndarray:
    """EP rank of each expert; every rank must hold num_experts/ep experts."""
    if not spec.placement:
        return np.arange(num_experts) // (num_experts // ep)
    ranks = np.asarray(spec.placement)
    if len(ranks) != num_experts or ranks.min() < 0 or ranks.max() >= ep:
        raise ConfigError(f"routing.placement must give a rank in [0, {ep}) for each of {num_experts} experts")
    if np.any(np.bincount(ranks, minlength=ep) != num_experts // ep):
        raise ConfigError(f"routing.placement must put {num_experts // ep} experts on each EP rank")
    return ranks


def expert_tokens(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> np.ndarray:
    """Tokens each expert processes in one microbatch of the EP group, after capacity drops."""
    tokens = split_tokens(expert_shares(spec, model.num_experts), routed * plan.ep)
    if model.capacity_factor > 0:
        capacity = int(np.ceil(model.capacity_factor * routed * plan.ep / model.num_experts))
        tokens = np.minimum(tokens, capacity)
    return tokens


def rank_tokens(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> list[np.ndarray]:
    """Per EP rank: the token count of each of its local experts."""
    tokens = expert_tokens(model, plan, routed, spec)
    ranks = placement(spec, model.num_experts, plan.ep)
    return [tokens[ranks == r] for r in range(plan.ep)]


def rank_expert_loads(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec = UNIFORM) -> tuple[int, ...]:
    """Token count of each local expert on the busiest EP rank."""
    per_rank = rank_tokens(model, plan, routed, spec)
    busiest = max(range(plan.ep), key=lambda r: (int(per_rank[r].sum()), -r))
    return tuple(int(x) for x in per_rank[busiest])


def imbalance(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> float:
    """max / mean tokens per EP rank (1.0 = perfectly balanced)."""
    loads = np.array([t.sum() for t in rank_tokens(model, plan, routed, spec)], dtype=float)
    return float(loads.max() / loads.mean()) if loads.mean() > 0 else 1.0


def dropped_fraction(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> float:
    """Share of routed tokens dropped by the capacity factor."""
    kept = expert_tokens(model, plan, routed, spec).sum()
    return 1.0 - kept / (routed * plan.ep)


def pair_bytes(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec, token_bytes: float) -> np.ndarray:
    """all_to_allv matrix [src, dst] of dispatch bytes: every source rank routes with the
    same expert shares, so rank r receives its experts' share from each source."""
    per_rank = np.array([t.sum() for t in rank_tokens(model, plan, routed, spec)], dtype=float)
    shares = per_rank / max(per_rank.sum(), 1.0)
    return np.outer(np.full(plan.ep, routed), shares) * token_bytes
