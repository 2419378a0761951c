"""The closed form against the engine on a seeded sample of valid plans.

The sample spans ZeRO 0-3 (ZeRO-3 gathering per pass or once), tp/pp/vpp/cp/ep/etp, every schedule, recompute, TP-comm
overlap, the expert-parallel all-to-all overlap, the shared-expert overlap, DP overlap on/off, MoE routing skew and
three clusters (MI300X, MI355X + Pollara, H100 + InfiniBand), on 8-64 GPUs. Models are published shapes cut to a few
layers (so the engine stays fast; GPT-OSS-20B's alternating sliding-window layers among them) plus the tests' tiny models. Used by
``tests/test_agreement.py`` (the bound) and ``validation/bench_estimators.py`` (the
distribution).
"""

import dataclasses
import random
from dataclasses import dataclass

import perfsim
from perfsim.errors import ConfigError
from perfsim.model.spec import ModelSpec
from perfsim.plan.parallel import ParallelPlan, Schedule, check_plan, ep_overlap_conflict
from perfsim.plan.routing import RoutingSpec
from perfsim.system.stacks import load_stack

CLUSTERS = ("mi300x-pollara", "mi355x-pollara", "h100-ib")
SHAPES = (  # (preset, layers kept)
    ("llama3.1-8b", 16), ("mixtral-8x7b", 8), ("olmoe-1b-7b", 16), ("qwen3-30b-a3b", 8), ("deepseek-v2-lite", 8),
    ("gpt-oss-20b", 8),  # alternating sliding-window layers
)
GPUS = (8, 16, 32, 64)


@dataclass(frozen=True)
class Case:
    model: ModelSpec
    cluster: str
    num_gpus: int
    plan: ParallelPlan
    routing: RoutingSpec

    def describe(self) -> str:
        skew = "" if self.routing == RoutingSpec() else f" routing={self.routing.distribution}:{self.routing.skew}"
        return f"{self.model.name} {self.cluster} {self.num_gpus} GPUs: {self.plan.describe()}{skew}"


def models() -> list[ModelSpec]:
    out = []
    for name, layers in SHAPES:
        spec = perfsim.load_model(name)
        dense = min(spec.num_dense_layers, 1)
        out.append(dataclasses.replace(spec, name=f"{name}-{layers}l", num_layers=layers, num_dense_layers=dense))
    return out


def _knobs(rng: random.Random, model: ModelSpec, num_gpus: int) -> dict | None:
    k = dict(tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 1, 2, 4]), cp=rng.choice([1, 1, 1, 2]),
             zero=rng.choice([0, 1, 2, 3]), mbs=rng.choice([1, 2]), seq=rng.choice([2048, 4096]),
             recompute=rng.choice(["none", "selective", "full"]), overlap_grad_reduce=rng.random() < 0.8,
             tp_comm_overlap=rng.random() < 0.3, dtype=rng.choice(["bf16", "bf16", "fp8"]))
    if num_gpus % (k["tp"] * k["pp"] * k["cp"]):
        return None
    k["vpp"] = rng.choice([1, 2]) if k["pp"] > 1 and model.num_layers % (2 * k["pp"]) == 0 else 1
    schedules = [s.value for s in Schedule if s.value != ("1f1b" if k["vpp"] > 1 else "interleaved")]
    k["schedule"] = rng.choice(schedules) if k["pp"] > 1 else "1f1b"
    if k["schedule"] == "zb-h1" and k["vpp"] > 1:
        k["schedule"] = "interleaved"
    if k["schedule"] in ("zbv", "v-half", "v-min") and k["vpp"] != 2:  # V-shaped: two chunks a stage
        k["schedule"] = "1f1b"
    k["dp"] = num_gpus // (k["tp"] * k["pp"] * k["cp"])
    if model.is_moe:
        ranks = k["tp"] * k["cp"] * k["dp"]
        k["ep"] = rng.choice([e for e in (1, 2, 4, 8) if ranks % e == 0 and model.num_experts % e == 0])
        k["etp"] = rng.choice([1, 1, 2]) if ranks % (k["ep"] * 2) == 0 else 1
    k["gbs"] = k["dp"] * k["mbs"] * rng.choice([1, 2, 4, 8])
    return k


def sample(count: int, seed: int = 0) -> list[Case]:
    """``count`` valid plans (divisibility checked; memory not: both estimators price OOM plans)."""
    rng, specs, out = random.Random(seed), models(), []
    # ZeRO-3's gather policy from a stream of its own, so the rest of the seeded sample stays as it was
    gather_rng = random.Random(f"zero3_gather-{seed}")
    # the expert-parallel all-to-all overlap likewise, where Megatron-Core runs it and perfsim prices it
    ep_rng = random.Random(f"ep_comm_overlap-{seed}")
    # and the shared-expert overlap (Megatron-Core --moe-shared-expert-overlap), where the model has
    # shared experts and the expert-parallel overlap was not drawn
    shared_rng = random.Random(f"shared_expert_overlap-{seed}")
    while len(out) < count:
        model, cluster, num_gpus = rng.choice(specs), rng.choice(CLUSTERS), rng.choice(GPUS)
        k = _knobs(rng, model, num_gpus)
        if k is None:
            continue
        if k["zero"] == 3:
            k["zero3_gather"] = gather_rng.choice(["per-pass", "once"])
        try:
            plan = ParallelPlan(**k)
            check_plan(plan, model, num_gpus)
        except ConfigError:
            continue
        if plan.ep > 1 and not ep_overlap_conflict(plan) and ep_rng.random() < 0.5:
            plan = dataclasses.replace(plan, ep_comm_overlap=True)
        elif plan.ep > 1 and model.shared_ffn_hidden_size and shared_rng.random() < 0.5:
            plan = dataclasses.replace(plan, shared_expert_overlap=True)
        routing = RoutingSpec(distribution="zipf", skew=rng.choice([0.5, 1.0]), seed=seed) \
            if model.is_moe and plan.ep > 1 and rng.random() < 0.3 else RoutingSpec()
        out.append(Case(model=model, cluster=cluster, num_gpus=num_gpus, plan=plan, routing=routing))
    return out


STACKS = ("nemo", "maxtext", "megatron-primus", "torchtitan")  # the framework stacks (ideal is the sample's)


def under_stacks(cases: list[Case], seed: int = 0) -> list[Case]:
    """The same plans, each under a framework stack drawn from a stream of its own: the
    stack's costs (launch gaps, fused kernels, FP8 recipe, MoE dispatch path) and the plan
    defaults where the sample's draw is the plain default (e.g. maxtext's unprefetched
    gathers and unoverlapped gradient reduction, nemo's FP8 primary weights under FP8); the
    other knobs stay as drawn."""
    rng, out = random.Random(f"stacks-{seed}"), []
    for case in cases:
        stack = load_stack(rng.choice(STACKS))
        drawn = {f.name for f in dataclasses.fields(ParallelPlan) if getattr(case.plan, f.name) != f.default}
        if case.plan.ep_comm_overlap:  # drawn without TP-comm overlap, the one overlap kind its passes take
            drawn.add("tp_comm_overlap")
        defaults = {k: v for k, v in stack.plan_defaults(case.plan.dtype).items() if k not in drawn}
        out.append(dataclasses.replace(case, plan=dataclasses.replace(case.plan, stack=stack, **defaults)))
    return out


def long_sample(count: int, seed: int) -> list[Case]:
    """Plans of ``sample`` given enough microbatches for the engine to fold them (eight layers
    or fewer, so their full simulation stays short): the checks on the fold."""
    out = []
    for case in sample(count * 4, seed):
        m = 4 * (2 * case.plan.pp * case.plan.vpp + 2 + case.plan.pp)
        plan = dataclasses.replace(case.plan, gbs=case.plan.mbs * case.plan.dp * m)
        if perfsim.api.fold_points(plan) is not None and case.model.num_layers <= 8:
            out.append(dataclasses.replace(case, plan=plan))
        if len(out) == count:
            break
    return out


def fold_check(case: Case) -> tuple[float, float, tuple[int, int]]:
    """(folded engine / full simulation - 1, closed form / full simulation - 1, the short
    steps the engine extended) of a plan long enough to fold."""
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    kwargs = dict(check_memory=False, routing=case.routing)
    full = perfsim.simulate(case.model, cluster, case.plan, fold=False, **kwargs).step_time_s
    folded = perfsim.simulate(case.model, cluster, case.plan, **kwargs)
    closed = perfsim.estimate(case.model, cluster, case.plan, **kwargs).step_time_s
    return folded.step_time_s / full - 1, closed / full - 1, folded.simulated_microbatches


def compare(case: Case) -> tuple[float, float]:
    """(closed-form step, engine step) in seconds."""
    cluster = perfsim.load_cluster(case.cluster, gpus=case.num_gpus)
    kwargs = dict(check_memory=False, routing=case.routing)
    closed = perfsim.estimate(case.model, cluster, case.plan, **kwargs).step_time_s
    engine = perfsim.simulate(case.model, cluster, case.plan, **kwargs).step_time_s
    return closed, engine
