"""Tokens per expert on the most loaded expert-parallel rank.

Balanced routing: each EP rank receives the tokens it sent (``routed``), spread evenly
over its ``num_experts / ep`` local experts.
"""

from perfsim.model import ModelSpec
from perfsim.parallel import ParallelPlan


def rank_expert_loads(model: ModelSpec, plan: ParallelPlan, routed: int) -> tuple[int, ...]:
    """Token count of each local expert on the busiest EP rank."""
    local = model.num_experts // plan.ep
    base, extra = divmod(routed, local)
    return tuple(base + (1 if i < extra else 0) for i in range(local))
