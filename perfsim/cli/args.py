"""Argument types for the ``perfsim`` parsers: every number finite, in its domain and
bounded where work scales with it. A bad value becomes argparse's one-line error
``argument --tp: must be an integer >= 1, got '0'`` (exit 2, no traceback)."""

import argparse
import math

from perfsim.errors import ConfigError
from perfsim.plan.parallel import split_recompute_modules
from perfsim.units import parse_size

# Bounds on what one command may ask for: past them the work (or the memory) a command
# would spend grows without a useful answer. They are input limits, not hardware numbers.
MAX_GPUS = 1 << 20  # a million GPUs: ten times the largest cluster the README targets (100k)
MAX_NODES = MAX_GPUS
MAX_GBS = 1 << 24  # sequences per step
MAX_SEQ = 1 << 24  # tokens per sequence
MAX_SEED = (1 << 63) - 1
MAX_BYTES = float(1 << 50)  # 1 PiB: the largest collective or bucket a command sizes
MAX_RUNS = 100_000  # Monte-Carlo runs
MAX_DAYS = 3650.0  # a ten-year run
MAX_SECONDS = 10 * 365 * 86400.0  # ten years, for restart and interval times
MAX_HOURS = MAX_SECONDS / 3600


def integer(lo: int = 1, hi: int = MAX_GPUS):
    """An int in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float = 0.0, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False):
    """A finite float in [lo, hi] (``lo_open``/``hi_open``: the bound itself excluded)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        low_ok = value > lo if lo_open else value >= lo
        high_ok = value < hi if hi_open else value <= hi
        if not (math.isfinite(value) and low_ok and high_ok):
            left, right = "(" if lo_open else "[", ")" if hi_open or math.isinf(hi) else "]"
            raise argparse.ArgumentTypeError(f"must be a finite number in {left}{lo:g}, {hi:g}{right}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def size(lo: float = 0.0, hi: float = MAX_BYTES):
    """A byte size ('8', '128M', '1G') in [lo, hi]."""
    def parse(text: str) -> float:
        try:
            value = parse_size(text, "size")
        except ValueError as exc:  # ConfigError is a ValueError
            raise argparse.ArgumentTypeError(f"must be a size in bytes (e.g. 8, 128M, 1G), got {text!r}") from exc
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"must be a size in [{lo:g}, {hi:g}] bytes, got {text!r}")
        return value

    parse.__name__ = "size"
    return parse


def recompute_modules(text: str) -> tuple[str, ...]:
    """--recompute-modules: a comma-separated list (checked against the known modules by the plan)."""
    names = split_recompute_modules(text)
    if not text.strip() or not all(names):
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of modules, got {text!r}")
    return names


POSITIVE = integer(1, MAX_GPUS)
GPUS = integer(1, MAX_GPUS)
NODES = integer(1, MAX_NODES)
GBS = integer(1, MAX_GBS)
SEQ = integer(1, MAX_SEQ)
SEED = integer(0, MAX_SEED)
ZERO = integer(0, 3)
FRACTION_BELOW_ONE = number(0.0, 1.0, hi_open=True)  # [0, 1)


# plan switches set by a flag (attribute, ParallelPlan field, value when given): simulate and search
SWITCH_FLAGS = (("no_overlap", "overlap_grad_reduce", False), ("no_param_prefetch", "overlap_param_gather", False),
                ("no_clip_grad", "clip_grad", False), ("dispatch_fp8", "dispatch_fp8", True),
                ("real_data", "real_data", True), ("fp8_params", "fp8_params", True),
                ("no_fp8_params", "fp8_params", False), ("no_tp_comm_overlap", "tp_comm_overlap", False),
                ("ep_comm_overlap", "ep_comm_overlap", True), ("shared_expert_overlap", "shared_expert_overlap", True))


def switch_knobs(args) -> dict:
    """The plan switches the given flags set (the others stay at the stack's defaults)."""
    return {field: value for flag, field, value in SWITCH_FLAGS if getattr(args, flag, False)}


def given(args, flags: dict[str, str]) -> list[str]:
    """The options of ``flags`` (option -> argparse dest) the command line set; a 0 counts."""
    return [flag for flag, dest in flags.items()
            if not ((value := getattr(args, dest)) is None or value is False or value == [])]


def refuse_given(args, flags: dict[str, str], why: str) -> None:
    """One line (exit 2) for an option the chosen mode would otherwise silently ignore."""
    named = given(args, flags)
    if named:
        raise ConfigError(f"{named[0]}: {why}")

