"""The steps a software stack (system.stacks) adds to a layer template: unfused kernels as
extra HBM passes, host syncs and framework time on the compute stream, the dispatch path,
the speed of the stack's kernels. A mixin of ``layers.LayerBuilder`` (it reads the
builder's model, plan, routing and token counts)."""

from dataclasses import replace

from perfsim import units
from perfsim.lowering.ops import Stream
from perfsim.lowering.steps import ACT_BYTES, Step, elementwise_step, host_step
from perfsim.system.stacks import Dispatch


class StackSteps:
    """Stack-derived steps of ``LayerBuilder`` (``self.stack`` is the plan's StackSpec)."""

    def _norms(self, name: str) -> list[Step]:
        """The residual-add + RMSNorm; unfused, the add and the norm's statistics pass are
        their own kernels: x is written and read back once more (2 more passes)."""
        steps = [self._norm(name)]
        if not self.stack.fused("rmsnorm"):
            extra = 2 * self.local_tokens * self.model.hidden_size * ACT_BYTES
            steps.append(elementwise_step(f"{name}_unfused", extra, "norm"))
        return steps

    def _unfused_act(self, name: str, tokens: float, width: int, meta: tuple = ()) -> list[Step]:
        """SwiGLU unfused: silu(gate) is written and read back before the multiply."""
        if not self.model.gated_mlp or self.stack.fused("swiglu"):
            return []
        return [replace(elementwise_step(f"{name}_unfused", 2 * tokens * width * ACT_BYTES, "activation"), meta=meta)]

    def _rope(self) -> list[Step]:
        """Rotary embedding as its own kernel: read and write q and k (fused: inside the
        attention kernel or the QKV epilogue, no pass; none where the model's positions are
        learned, ``ModelSpec.rotary`` False)."""
        if self.stack.fused("rope") or not self.model.rotary:
            return []
        return [elementwise_step("rope", 2 * self.tokens * (self.model.qk_width / self.plan.tp) * ACT_BYTES, "rope")]

    def _host_overhead(self, steps: list[Step]) -> list[Step]:
        """The stack's per-layer framework time plus its host gap per compute kernel."""
        host = self.stack.launch
        kernels = sum(1 for s in steps if s.stream is Stream.COMPUTE)
        seconds = units.us_to_s(host.layer_overhead_us + host.kernel_gap_us * kernels)
        return [host_step("framework_overhead", seconds, "framework")] if seconds > 0 else []

    def _moe_host_sync(self) -> list[Step]:
        """Device->host syncs of an MoE layer (token counts to the host for the split sizes).
        None on the padded path: every expert takes its full capacity, so the split sizes are
        static and known on the host (Megatron-Core MoEAlltoAllTokenDispatcher.preprocess
        returns before any device->host copy under drop-and-pad)."""
        moe = self.stack.moe
        if not moe.host_syncs_per_layer or moe.host_sync_us <= 0 or self._pads():
            return []
        return [host_step("moe_host_sync", units.us_to_s(moe.host_syncs_per_layer * moe.host_sync_us), "host_sync")]

    def _pads(self) -> bool:
        """Whether experts compute (and the exchange carries) their padded capacity: the
        stack's dispatch path, or the RoutingSpec's when the stack leaves it to routing,
        with a capacity factor to pad to."""
        path = self.stack.moe.dispatch
        pads = self.routing.pad_to_capacity if path is Dispatch.ROUTING else path is Dispatch.CAPACITY
        return pads and self.model.capacity_factor > 0

    def _expert_speed(self) -> float:
        """The stack's speed of the routed-expert kernels on this layer's dispatch path."""
        moe = self.stack.moe
        return moe.padded_speed if self._pads() else moe.dropless_speed

    def _kernel_speed(self, steps: list[Step]) -> list[Step]:
        """Compute steps run at the stack's kernel speed (1: the tuned kernels the tables
        hold); the routed-expert kernels also at the stack's speed for the dispatch path."""
        base = self.stack.kernels.speed
        expert = self._expert_speed() if self.model.is_moe else 1.0
        out = []
        for s in steps:
            speed = base * (expert if _routed_expert(s) else 1.0)
            if s.stream is Stream.COMPUTE and speed != 1.0:
                s = replace(s, meta=s.meta + (("kernel_speed", speed),))
            out.append(s)
        return out


def _routed_expert(step: Step) -> bool:
    """Kernels of the routed experts: token permute/unpermute, expert GEMMs and activation."""
    return step.category in ("experts", "moe_permute") or step.name.startswith("expert_")
