"""perfsim: predict LLM training step time on GPU clusters before you rent them."""

from perfsim.api import (
    collective,
    estimate,
    load_cluster,
    load_model,
    make_plan,
    simulate,
)
from perfsim.calibration.calibrate import calibrate
from perfsim.design.checkpoint import list_storage, load_storage, reshard
from perfsim.design.goodput import FailureModel, plan_goodput, simulate_failures
from perfsim.design.moe_width import sweep as moe_width_sweep
from perfsim.search import SearchResult, search
from perfsim.design.sizing import Workload, efficiency_grid, sizing_table
from perfsim.errors import ConfigError, InfeasiblePlan, PerfsimError
from perfsim.calibration.validate import validate

__all__ = [
    "ConfigError",
    "FailureModel",
    "InfeasiblePlan",
    "PerfsimError",
    "SearchResult",
    "Workload",
    "calibrate",
    "collective",
    "efficiency_grid",
    "estimate",
    "list_storage",
    "load_cluster",
    "load_model",
    "load_storage",
    "make_plan",
    "moe_width_sweep",
    "plan_goodput",
    "reshard",
    "search",
    "simulate",
    "simulate_failures",
    "sizing_table",
    "validate",
]
__version__ = "0.1.0"
