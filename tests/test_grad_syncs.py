"""Gradient reduction per microbatch where ZeRO-2/3 hold the gradients sharded without a
pipeline (``plan.grad_syncs``): every backward reduce-scatters its own gradients and the
next microbatch waits for them (FSDP2's FSDPParamGroup.finalize_backward; DeepSpeed
ZeRO-2/3 every micro-step); ZeRO-0/1, ZeRO-3 keeping its weights gathered and pipelines
accumulate and reduce once after the last microbatch."""

import pytest
from conftest import tiny_dense

import perfsim.api as api
from perfsim.lowering.graph import build_graph
from perfsim.plan.parallel import ParallelPlan

# Llama-3.1-8B over 8 MI300X nodes, dp 64 across the NICs: each microbatch's gradient
# reduce-scatter drains past its backward
CASE = dict(tp=1, pp=1, mbs=1, seq=4096, check_memory=False)


def _cluster():
    return api.load_cluster("mi300x-pollara").with_nodes(8)


@pytest.mark.parametrize("knobs,syncs", [
    (dict(zero=2, pp=1), 4), (dict(zero=3, pp=1), 4),  # sharded gradients, no pipeline: every microbatch
    (dict(zero=0, pp=1), 1), (dict(zero=1, pp=1), 1),  # full gradients accumulate
    (dict(zero=2, pp=2), 1), (dict(zero=3, pp=2), 1),  # a pipeline accumulates first
    (dict(zero=3, pp=1, zero3_gather="once"), 1),  # ZeRO-3 keeping weights (and gradients) unsharded
])
def test_which_plans_reduce_every_microbatch(knobs, syncs):
    plan = ParallelPlan(dp=2, gbs=8, seq=1024, **knobs)
    assert plan.num_microbatches == 4 and plan.grad_syncs == syncs


def test_graph_reduces_each_microbatch_and_waits_for_it():
    model = tiny_dense()
    plan = ParallelPlan(dp=2, zero=2, gbs=8, seq=1024)
    graph = build_graph(model, plan)
    ops = {o.op_id: o for o in graph.ops}
    grads = [o for o in graph.ops if o.category == "dp_grad_reduce" and o.collective is not None]
    per_mb = {mb: [o.op_id for o in grads if o.microbatch == mb] for mb in range(4)}
    assert all(per_mb.values()) and len({len(v) for v in per_mb.values()}) == 1  # the same buckets each time
    for mb in range(3):  # a barrier waits for the microbatch's reductions; the next forward waits for it
        barrier = next(o for o in graph.ops if o.name == "grad_reduce_wait" and o.microbatch == mb)
        assert barrier.flops == 0 and barrier.bytes == 0 and dict(barrier.meta)["host_s"] == 0
        assert set(per_mb[mb]) <= set(barrier.deps)
        first_next = min(o.op_id for o in graph.ops if o.microbatch == mb + 1 and o.stream == barrier.stream)
        assert _reaches(ops, first_next, barrier.op_id)
    once = build_graph(model, ParallelPlan(dp=2, zero=1, gbs=8, seq=1024))
    assert {o.microbatch for o in once.ops if o.category == "dp_grad_reduce"} == {3}
    assert not [o for o in once.ops if o.name == "grad_reduce_wait"]


def _reaches(ops: dict, start: int, target: int) -> bool:
    seen, todo = set(), [start]
    while todo:
        op = todo.pop()
        if op == target:
            return True
        if op not in seen:
            seen.add(op)
            todo += list(ops[op].deps)
    return False


@pytest.mark.parametrize("estimate", [api.simulate, api.estimate], ids=["engine", "closed_form"])
def test_sharded_gradients_pay_a_drain_each_microbatch(estimate):
    """At one microbatch ZeRO-1/2/3 (gathers hidden) cost the same; at four, ZeRO-2 pays
    three more drains than ZeRO-1 and reports four times its reduce-scatters."""
    one = {z: estimate("llama3.1-8b", _cluster(), zero=z, gbs=64, **CASE) for z in (1, 2)}
    four = {z: estimate("llama3.1-8b", _cluster(), zero=z, gbs=256, **CASE) for z in (1, 2)}
    assert one[2].step_time_s == pytest.approx(one[1].step_time_s, rel=1e-9)
    key = "dp_grad_reduce/reduce_scatter"
    drain = one[2].comm_by_collective[key]["exposed_s"]
    assert drain > 0
    assert four[2].step_time_s - four[1].step_time_s == pytest.approx(3 * drain, rel=0.05)
    assert four[2].comm_by_collective[key]["count"] == 4 * four[1].comm_by_collective[key]["count"]
    assert four[2].comm_by_collective[key]["exposed_s"] == pytest.approx(4 * drain, rel=0.05)


def test_closed_form_follows_the_engine_with_zero3_gathers_sharing_the_links():
    """ZeRO-3's backward gathers go first on the NICs, so the reduce-scatters beside them
    drain later; the closed form's drain rate counts them (``_grad_rate``)."""
    for knobs in (dict(zero=3, gbs=256), dict(zero=3, gbs=256, recompute="full"), dict(zero=2, gbs=512, mbs=2)):
        case = {**CASE, **knobs}
        engine = api.simulate("llama3.1-8b", _cluster(), **case)
        closed = api.estimate("llama3.1-8b", _cluster(), **case)
        assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.05)


def test_a_pipeline_with_sharded_gradients_says_what_its_reduction_leaves_out():
    base = dict(tp=8, gbs=64, mbs=1, seq=4096, check_memory=False)
    warned = api.estimate("llama3.1-70b", _cluster(), pp=2, zero=2, **base)
    assert any("reduced once" in w and "zero3_gather='once'" in w for w in warned.warnings)
    for knobs in (dict(pp=1, zero=2), dict(pp=2, zero=1), dict(pp=2, zero=3, zero3_gather="once")):
        quiet = api.estimate("llama3.1-70b", _cluster(), **knobs, **base)
        assert not any("reduced once" in w for w in quiet.warnings), knobs


def test_the_closed_form_answers_the_same_whatever_it_priced_before():
    """Its memoised drains key on what they read: ZeRO-3's gathers slow the gradient buckets,
    so a ZeRO-3 plan priced first must not lend its drain to a ZeRO-1 one (or to ZeRO-3
    keeping its weights gathered, which runs as ZeRO-1)."""
    from perfsim.estimators.analytic import ClosedForm

    model, cluster = api.load_model("llama3.1-70b"), _cluster()
    plans = [ParallelPlan(tp=8, pp=2, dp=4, zero=3, gbs=64, seq=4096),
             ParallelPlan(tp=8, pp=2, dp=4, zero=3, gbs=64, seq=4096, zero3_gather="once"),
             ParallelPlan(tp=8, pp=2, dp=4, zero=1, gbs=64, seq=4096)]
    shared = ClosedForm(model, cluster)
    in_turn = [shared.step_time_s(p) for p in plans]
    fresh = [ClosedForm(model, cluster).step_time_s(p) for p in plans]
    assert in_turn == pytest.approx(fresh, rel=1e-12)
    assert fresh[1] == pytest.approx(fresh[2], rel=1e-12) and fresh[0] > fresh[2]
