"""GPU-to-GPU speed variability: seeded per-GPU speeds, the slowest GPU sets the pace.

Power caps, thermals and silicon binning make identical GPUs run at different speeds
(ViBE; MI300X clocks drop under load differently per part). In synchronized training
every tensor-, context- and data-parallel collective waits for the slowest member, so
one pipeline stage runs at the speed of its slowest GPU; an MoE layer ends when the EP
rank with the most tokens per unit of speed ends (all-to-all synchronizes it).

Speeds are relative (1.0 = the profile's GPU), drawn once per GPU from a normal
distribution with standard deviation ``cv`` clipped at ``clip_sigma`` sigmas, seeded.
"""

from dataclasses import dataclass

import numpy as np

from perfsim.errors import ConfigError
from perfsim.plan.parallel import ParallelPlan

MIN_SPEED = 0.05  # a draw below this would be a failed GPU, not a slow one


@dataclass(frozen=True, kw_only=True)
class VariabilitySpec:
    cv: float = 0.0  # standard deviation of the relative GPU speed
    seed: int = 0
    clip_sigma: float = 3.0

    def __post_init__(self):
        if isinstance(self.cv, bool) or not isinstance(self.cv, int | float) or not 0 <= self.cv < 1:
            raise ConfigError(f"variability.cv must be in [0, 1), got {self.cv!r}")
        if not self.clip_sigma > 0:
            raise ConfigError(f"variability.clip_sigma must be > 0, got {self.clip_sigma!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"variability.seed must be an integer, got {self.seed!r}")


NONE = VariabilitySpec()


def gpu_speeds(num_gpus: int, spec: VariabilitySpec) -> np.ndarray:
    """Relative speed of every GPU (global rank order), seeded."""
    if spec.cv == 0:
        return np.ones(num_gpus)
    rng = np.random.default_rng([spec.seed, 0x57A6])  # own stream: independent of routing draws
    z = np.clip(rng.standard_normal(num_gpus), -spec.clip_sigma, spec.clip_sigma)
    return np.maximum(1.0 + spec.cv * z, MIN_SPEED)


def stage_slowdowns(plan: ParallelPlan, speeds: np.ndarray) -> list[float]:
    """Duration factor of each pipeline stage: 1 / its slowest GPU's speed (Megatron rank
    order puts pp outermost, so stage s holds a contiguous block of tp*cp*dp ranks)."""
    inner = plan.tp * plan.cp * plan.dp
    return [float(1.0 / speeds[s * inner:(s + 1) * inner].min()) for s in range(plan.pp)]


def ep_rank_speeds(plan: ParallelPlan, speeds: np.ndarray) -> tuple[float, ...]:
    """Speed of each EP rank index: the slowest GPU holding that index anywhere (expert
    layout: etp innermost, then ep, then edp within a stage's tp*cp*dp ranks)."""
    inner = plan.tp * plan.cp * plan.dp
    ep_index = (np.arange(speeds.size) % inner // plan.etp) % plan.ep
    return tuple(float(speeds[ep_index == e].min()) for e in range(plan.ep))
