"""MoE routing: tokens per expert from a seeded distribution, experts placed on EP ranks.

The busiest expert-parallel rank sets the MoE layer time (synchronized execution), so
the graph uses that rank's per-expert token counts; all-to-all sizes follow the routing.

Each MoE layer has its own router, so a random distribution (zipf's hot-expert positions,
dirichlet's shares) is drawn once per layer, from ``seed``, ``seed + 1``, ... (``layer_draws``):
the step pays every layer's own busiest rank, so what prices a layer is the mean over the
layers' draws of the busiest rank's tokens (``slowest_expert_rank``, ``imbalance``), not one
draw's, and a rank's memory holds its own share in every layer (``held_imbalance``). A
uniform routing or a measured histogram is the same in every layer.
"""

import csv
import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from perfsim.errors import ConfigError
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.specio import json_depth, read_text


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
    speed_aware: bool = False  # hottest experts on the fastest EP ranks (ViBE)
    # with a capacity factor: every expert computes its full capacity, padded (dense
    # dispatch: GShard/Switch, MaxText "capacity", Megatron --moe-pad-expert-input-to-capacity)
    # instead of only the tokens routed to it (dropless / drop-only)
    pad_to_capacity: bool = False
    # each token's top-k experts one block of consecutive expert ids starting at a multiple of
    # k, as a benchmark's balanced gate routes (NeMo AutoModel's FakeBalancedGate: token t ->
    # experts t*k ... t*k + k - 1, mod E): every expert gets the same load (the uniform
    # shares), and a dispatch implementation reaches only the ranks holding the block
    # (cost.dispatch.blocked_reach) where a random top-k reaches about k of them
    topk_block: bool = False

    def __post_init__(self):
        try:
            object.__setattr__(self, "distribution", Distribution(self.distribution))
        except ValueError:
            choices = ", ".join(d.value for d in Distribution)
            raise ConfigError(f"routing.distribution must be one of {choices}, got {self.distribution!r}") from None
        self._check_types()
        if self.skew < 0:
            raise ConfigError(f"routing.skew must be >= 0, got {self.skew!r}")
        if self.concentration <= 0:
            raise ConfigError(f"routing.concentration must be > 0, got {self.concentration!r}")
        if any(x < 0 for x in self.histogram):
            raise ConfigError(f"routing.histogram must be non-negative, got {list(self.histogram)}")
        if self.distribution is Distribution.HISTOGRAM and not sum(self.histogram) > 0:
            raise ConfigError("routing.histogram: a histogram distribution needs positive counts")
        if self.placement and self.speed_aware:
            raise ConfigError("routing.placement: give a placement or ask for speed_aware, not both")
        if self.topk_block and self.distribution is not Distribution.UNIFORM:
            raise ConfigError(f"routing.topk_block: a blocked routing gives every expert the same load; "
                              f"not beside a {self.distribution.value} distribution")


    @property
    def skewed(self) -> bool:
        """Whether the routing loads the experts unevenly or places them off the contiguous
        default: anything but the uniform default (a blocked routing is balanced)."""
        return dataclasses.replace(self, topk_block=False) != RoutingSpec()

    def _check_types(self) -> None:
        """Finite numbers and integer seeds/ranks (a NaN skew would route NaN tokens)."""
        for key in ("skew", "concentration"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
                raise ConfigError(f"routing.{key} must be a finite number, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"routing.seed must be an integer >= 0, got {self.seed!r}")
        for key in ("histogram", "placement"):
            value = getattr(self, key)
            if not isinstance(value, tuple | list):
                raise ConfigError(f"routing.{key} must be a tuple, got {value!r}")
        if any(isinstance(x, bool) or not isinstance(x, int | float) or not np.isfinite(x) for x in self.histogram):
            raise ConfigError(f"routing.histogram must hold finite numbers, got {list(self.histogram)[:8]}")
        if any(isinstance(r, bool) or not isinstance(r, int) for r in self.placement):
            raise ConfigError(f"routing.placement must hold integer EP ranks, got {list(self.placement)[:8]}")


UNIFORM = RoutingSpec()



def routing_label(spec: RoutingSpec) -> str:
    """The routing as the command line names it: ``uniform``, ``blocked``, ``zipf:S``,
    ``dirichlet:A`` or ``histogram`` (a skewed one with its seed)."""
    kind = spec.distribution
    if kind is Distribution.UNIFORM:
        return "blocked" if spec.topk_block else "uniform"
    if kind is Distribution.HISTOGRAM:
        return "histogram"
    value = spec.skew if kind is Distribution.ZIPF else spec.concentration
    return f"{kind.value}:{value:g} (seed {spec.seed})"


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


def load_histogram(path: str | Path) -> tuple[float, ...]:
    """Tokens (or shares) per expert from a measured histogram: JSON (a list of numbers,
    or an object with a ``tokens_per_expert`` list) or CSV (one number per row, or a
    ``tokens`` column). One ConfigError line naming the file on any problem."""
    path = Path(path)
    text = read_text(path, "routing histogram")
    if json_depth(text) > 2:
        raise ConfigError(f"routing.histogram: {str(path)!r} nests deeper than a list of numbers")
    try:
        values = _parse_histogram(text, path.suffix.lower())
        counts = tuple(float(v) for v in values)
    except (ValueError, TypeError, KeyError, json.JSONDecodeError, csv.Error) as exc:
        raise ConfigError(f"routing.histogram: {str(path)!r} is not a list of tokens per expert ({exc})") from None
    if not counts or any(not np.isfinite(c) or c < 0 for c in counts) or not sum(counts) > 0:
        raise ConfigError(f"routing.histogram: {str(path)!r} needs non-negative counts with a positive sum")
    return counts


MAX_ROUTING_PARAM = 1e6  # Zipf exponent / Dirichlet alpha: far past where the shares stop changing


def routing_fields(text: str, where: str, folder: Path | None = None, skew: float = 1.0,
                   concentration: float = 1.0) -> dict:
    """RoutingSpec fields of ``uniform``, ``blocked`` (uniform loads, each token's top-k one
    block of expert ids: ``RoutingSpec.topk_block``), ``zipf[:S]``, ``dirichlet[:A]`` or a
    histogram file (relative to ``folder``); ``skew`` / ``concentration``: the defaults
    without ``:S`` / ``:A``. One ConfigError line naming ``where`` on a bad value."""
    kind, _, arg = text.strip().partition(":")
    if kind == "blocked":
        if arg:
            raise ConfigError(f"{where}: {text!r}: blocked takes no parameter")
        return dict(distribution="uniform", topk_block=True)
    if kind not in ("uniform", "zipf", "dirichlet"):
        path = Path(text.strip())
        try:
            return dict(distribution="histogram", histogram=load_histogram(folder / path if folder else path))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    fields = dict(distribution=kind, skew=skew, concentration=concentration)
    if not arg:
        return fields
    if kind == "uniform":
        raise ConfigError(f"{where}: {text!r}: uniform takes no parameter")
    try:
        value = float(arg)
    except ValueError:
        value = math.nan
    low_ok = value > 0 if kind == "dirichlet" else value >= 0
    if not (math.isfinite(value) and low_ok and value <= MAX_ROUTING_PARAM):
        bound = "(0" if kind == "dirichlet" else "[0"
        raise ConfigError(f"{where}: {arg!r} in {text!r} must be a finite number in {bound}, {MAX_ROUTING_PARAM:g}]")
    fields["skew" if kind == "zipf" else "concentration"] = value
    return fields


def _parse_histogram(text: str, suffix: str) -> list:
    if suffix == ".json" or text.lstrip().startswith(("[", "{")):
        data = json.loads(text)
        return data["tokens_per_expert"] if isinstance(data, dict) else data
    rows = [r for r in csv.reader(text.splitlines()) if r and r[0].strip()]
    if rows and not _is_number(rows[0][-1]):
        header = [c.strip() for c in rows[0]]
        column = header.index("tokens") if "tokens" in header else len(header) - 1
        return [r[column] for r in rows[1:]]
    return [r[-1] for r in rows]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def speed_aware_placement(tokens: np.ndarray, speeds: tuple[float, ...]) -> np.ndarray:
    """Hottest expert first onto the EP rank with free slots that would finish it
    soonest ((load + tokens) / speed): greedy LPT on uniform machines (Graham'69)."""
    ep = len(speeds)
    slots = np.full(ep, len(tokens) // ep)
    load, ranks = np.zeros(ep), np.zeros(len(tokens), dtype=np.int64)
    for e in np.argsort(-tokens, kind="stable"):
        finish = [(load[r] + tokens[e]) / speeds[r] if slots[r] else np.inf for r in range(ep)]
        r = int(np.argmin(finish))
        ranks[e], load[r], slots[r] = r, load[r] + tokens[e], slots[r] - 1
    return ranks


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
    return _expert_tokens(model, plan.ep, routed, spec)


def _expert_tokens(model: ModelSpec, ep: int, routed: int, spec: RoutingSpec) -> np.ndarray:
    tokens = split_tokens(expert_shares(spec, model.num_experts), routed * ep)
    if model.capacity_factor > 0:
        tokens = np.minimum(tokens, _capacity(model, ep, routed))
    return tokens


def rank_tokens(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec,
                speeds: tuple[float, ...] | None = None) -> list[np.ndarray]:
    """Per EP rank: the token count of each of its local experts, in one layer's draw
    (``spec`` as given; ``layer_draws`` gives each layer's)."""
    tokens = expert_tokens(model, plan, routed, spec)
    ranks = _ranks(model, plan.ep, spec, tokens, speeds)
    return [tokens[ranks == r] for r in range(plan.ep)]


def _ranks(model: ModelSpec, ep: int, spec: RoutingSpec, tokens: np.ndarray,
           speeds: tuple[float, ...] | None) -> np.ndarray:
    """EP rank of each expert: the hottest on the fastest ranks (``speed_aware``), else ``placement``."""
    if spec.speed_aware:
        return speed_aware_placement(tokens, speeds or (1.0,) * ep)
    return placement(spec, model.num_experts, ep)


def layer_draws(model: ModelSpec, spec: RoutingSpec) -> tuple[RoutingSpec, ...]:
    """The routing of each MoE layer: a random distribution (zipf, dirichlet) draws once per
    layer, seeds ``seed`` to ``seed + layers - 1`` (each layer's router sends its hot experts'
    tokens to other ranks); uniform routing and a measured histogram are every layer's."""
    if spec.distribution in (Distribution.ZIPF, Distribution.DIRICHLET) and model.num_moe_layers > 1:
        return tuple(dataclasses.replace(spec, seed=spec.seed + i) for i in range(model.num_moe_layers))
    return (spec,)


@functools.lru_cache(maxsize=1 << 12)  # one table per (model, ep, routing): lowering and memory both read it
def _draws(model: ModelSpec, ep: int, routed: int, spec: RoutingSpec,
           speeds: tuple[float, ...] | None) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """Per layer draw (``layer_draws``) over ``ep`` ranks (all of a plan it reads): the tokens
    each EP rank receives ([draw, rank]), the token counts of the local experts of the rank
    that finishes last (the most tokens per unit of speed, the lowest rank on a tie), and
    that rank's index."""
    rate = np.asarray(speeds or (1.0,) * ep, dtype=float)
    loads, last_rows, last = [], [], []
    for draw in layer_draws(model, spec):
        tokens = _expert_tokens(model, ep, routed, draw)
        ranks = _ranks(model, ep, draw, tokens, speeds)
        load = np.bincount(ranks, weights=tokens, minlength=ep).astype(float)
        r = int(np.argmax(load / rate))
        loads.append(load)
        last_rows.append(tokens[ranks == r])
        last.append(r)
    out = (np.array(loads), *last_rows, np.array(last))
    for a in out:  # cached: shared by every caller, read only
        a.setflags(write=False)
    return out[0], out[1:-1], out[-1]


def slowest_expert_rank(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec = UNIFORM,
                        speeds: tuple[float, ...] | None = None) -> tuple[tuple[int, ...], float]:
    """(token count of each local expert, relative speed) of the EP rank that finishes
    last, as the mean over the layers' draws (``layer_draws``): each layer's last rank, its
    experts' counts sorted from the hottest, averaged position by position (rounded to
    their mean total), and the speed that keeps the mean time (mean tokens over the mean of
    tokens / speed). With one draw: that draw's rank and its experts in placement order."""
    rate = np.asarray(speeds or (1.0,) * plan.ep, dtype=float)
    _, rows, last = _draws(model, plan.ep, routed, spec, speeds)
    if len(rows) == 1:
        return tuple(int(x) for x in rows[0]), float(rate[last[0]])
    mean = np.mean([np.sort(row)[::-1] for row in rows], axis=0)
    total = float(mean.sum())
    if total <= 0:
        return tuple(0 for _ in mean), 1.0
    tokens = split_tokens(mean / total, int(round(total)))
    if np.all(rate[last] == rate[last[0]]):  # one speed (no GPU variability): that speed, exactly
        return tuple(int(x) for x in tokens), float(rate[last[0]])
    time = float(np.mean([row.sum() / rate[r] for row, r in zip(rows, last)]))
    return tuple(int(x) for x in tokens), total / time


def expert_capacity(model: ModelSpec, plan: ParallelPlan, routed: int) -> int:
    """Tokens one expert can take per microbatch: capacity_factor x the balanced share."""
    return _capacity(model, plan.ep, routed)


def _capacity(model: ModelSpec, ep: int, routed: int) -> int:
    return int(np.ceil(model.capacity_factor * routed * ep / model.num_experts))


def rank_expert_loads(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec = UNIFORM) -> tuple[int, ...]:
    """Token count of each local expert on the busiest EP rank (``slowest_expert_rank``)."""
    return slowest_expert_rank(model, plan, routed, spec)[0]


def _max_over_mean(loads: np.ndarray) -> np.ndarray:
    means = loads.mean(axis=-1)
    return np.where(means > 0, loads.max(axis=-1) / np.where(means > 0, means, 1.0), 1.0)


def layer_imbalance(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec,
                    speeds: tuple[float, ...] | None = None) -> float:
    """max / mean tokens per EP rank in one layer's draw (``spec`` as given)."""
    loads = np.array([t.sum() for t in rank_tokens(model, plan, routed, spec, speeds)], dtype=float)
    return float(_max_over_mean(loads))


def imbalance(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec,
              speeds: tuple[float, ...] | None = None) -> float:
    """max / mean tokens per EP rank (1.0 = perfectly balanced): each layer waits for its own
    busiest rank, so the mean over the layers' draws of each draw's max / mean."""
    return float(np.mean(_max_over_mean(_draws(model, plan.ep, routed, spec, speeds)[0])))


def held_imbalance(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> float:
    """max / mean over EP ranks of the tokens a rank's experts hold summed over the layers'
    draws: what the busiest rank's memory keeps (a rank hot in one layer is cool in
    another); with one draw, ``imbalance``."""
    return float(_max_over_mean(_draws(model, plan.ep, routed, spec, None)[0].mean(axis=0)))


def dropped_fraction(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec) -> float:
    """Share of routed tokens dropped by the capacity factor (mean over the layers' draws)."""
    kept = _draws(model, plan.ep, routed, spec, None)[0].sum(axis=1).mean()
    return float(1.0 - kept / (routed * plan.ep))


def pair_bytes(model: ModelSpec, plan: ParallelPlan, routed: int, spec: RoutingSpec, token_bytes: float) -> np.ndarray:
    """all_to_allv matrix [src, dst] of dispatch bytes in one layer's draw (``spec`` as
    given): every source rank routes with the same expert shares, so rank r receives its
    experts' share from each source."""
    per_rank = np.array([t.sum() for t in rank_tokens(model, plan, routed, spec)], dtype=float)
    shares = per_rank / max(per_rank.sum(), 1.0)
    return np.outer(np.full(plan.ep, routed), shares) * token_bytes
