"""Peak memory per GPU for plan search: ``memory.plan_memory``'s worst stage, memoized.

``memory.stage_memory`` is called for real, but its result is split in two parts that
depend on few plan fields: model states (weights, gradients, optimizer, ZeRO buffers: tp, ep, etp, pp,
vpp, the ZeRO shard degrees and stage, the stack's memory policy; ZeRO-2/3's overlap flags and bucket size) and transient memory (everything else:
activations, logits, fragmentation: tp, cp, mbs, seq, recompute, sp, pp, vpp, schedule,
microbatches, the stack's memory policy, FP8 inputs kept in FP8; ep, etp and the stack's MoE dispatch path,
for the routed experts' tokens; the expert-parallel overlap's extra forward; and, where the
gradients reuse transient memory (``memory.gradients_apart``), the states' key too). Plans that share both keys cost two look-ups (microseconds instead of
~0.5 ms); agreement with ``plan_memory`` is tested on sampled plans.
"""

from perfsim.lowering.memory import gradients_apart, stage_memory
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan
from perfsim.plan.routing import UNIFORM, RoutingSpec
from perfsim.plan.schedules import layout_key


def states_key(plan: ParallelPlan) -> tuple:
    return (plan.tp, plan.ep, plan.etp, plan.dp * plan.cp, plan.edp, plan.step_zero, *layout_key(plan), plan.stack.memory,
            plan.fp8_params, plan.dtype == "fp8" and plan.stack.fp8.weights_cast_once,  # memory.fp8_weight_cache
            plan.step_zero >= 2 and (plan.overlap_param_gather, plan.overlap_grad_reduce, plan.grad_bucket_bytes))


def transient_key(plan: ParallelPlan, states: tuple) -> tuple:
    """``states``: the plan's ``states_key``, part of this key where the gradients reuse transient memory."""
    return (plan.tp, plan.cp, plan.mbs, plan.seq, plan.recompute, plan.selective_modules, plan.sequence_parallel,
            plan.pp, plan.vpp,
            plan.schedule, plan.flush_microbatches, plan.first_stage_layers, plan.last_stage_layers, plan.accounted,
            plan.mtp_layers, plan.pipeline_layout,
            plan.recompute_layers,
            plan.stack.memory, plan.keeps_fp8_inputs,
            plan.ep, plan.etp, plan.stack.moe.dispatch,  # the routed experts' share (memory.routed_share)
            plan.overlaps_ep_comm,  # its merged steady steps (memory.held_activation_bytes)
            gradients_apart(plan) and states)  # the gradients reuse transient memory (memory.reused_bytes)


class MemoryModel:
    """Memoized ``memory.stage_memory`` totals for many plans of one model."""

    def __init__(self, model: ModelSpec, routing: RoutingSpec = UNIFORM):
        self.model, self.routing = model, routing
        self._states: dict[tuple, tuple[float, ...]] = {}
        self._transient: dict[tuple, tuple[float, ...]] = {}

    def _fill(self, plan: ParallelPlan, skey: tuple, tkey: tuple) -> None:
        stages = [stage_memory(self.model, plan, s, self.routing) for s in range(plan.pp)]
        states = tuple(m.states_bytes for m in stages)
        self._states.setdefault(skey, states)
        self._transient.setdefault(tkey, tuple(m.total_bytes - s for m, s in zip(stages, states)))

    def stage_totals(self, plan: ParallelPlan) -> list[float]:
        skey = states_key(plan)
        tkey = transient_key(plan, skey)
        states, transient = self._states.get(skey), self._transient.get(tkey)
        if states is None or transient is None:
            self._fill(plan, skey, tkey)
            states, transient = self._states[skey], self._transient[tkey]
        return [a + b for a, b in zip(states, transient)]

    def peak(self, plan: ParallelPlan) -> tuple[float, int]:
        """(peak bytes per GPU, the first stage that needs them)."""
        totals = self.stage_totals(plan)
        best = max(totals)
        return best, totals.index(best)
