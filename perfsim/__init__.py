"""perfsim: predict LLM training step time on GPU clusters before you rent them."""

from perfsim.api import (
    collective,
    estimate,
    load_cluster,
    load_model,
    make_plan,
    simulate,
)
from perfsim.errors import ConfigError, InfeasiblePlan, PerfsimError

__all__ = [
    "ConfigError",
    "InfeasiblePlan",
    "PerfsimError",
    "collective",
    "estimate",
    "load_cluster",
    "load_model",
    "make_plan",
    "simulate",
]
__version__ = "0.1.0"
