"""Tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap)."""

from dataclasses import replace

import pytest

import perfsim
from perfsim.cli import main
from perfsim.lowering.graph import build_graph
from perfsim.lowering.layers import LayerBuilder, backward, overlap_tp_comm
from perfsim.model.io import load_model
from perfsim.lowering.ops import OpKind
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.stacks import load_stack
from perfsim.lowering.graph import block_passes

DENSE = dict(gpus=8, tp=8, gbs=8, seq=4096, overlap_grad_reduce=False)


def _step(model="llama3.1-8b", estimator="des", **knobs):
    return perfsim.simulate(model, "mi300x-pollara", estimator=estimator, check_memory=False, **knobs)


def _meta(step, key):
    return dict(step.meta).get(key, False)


def test_pass_moves_each_tp_comm_beside_its_gemm_and_joins_the_next_step():
    model = load_model("llama3.1-8b")
    plan = ParallelPlan(tp=8, gbs=8, seq=4096)
    raw = LayerBuilder(model, plan).layer_forward(0)
    for chain in (raw, backward(raw)):
        out = overlap_tp_comm(chain)
        assert sorted(s.name for s in out) == sorted(s.name for s in chain)  # nothing lost or added
        sides = [i for i, s in enumerate(out) if _meta(s, "offchain")]
        tp_comms = sum(1 for s in chain if s.kind is OpKind.COLLECTIVE and s.collective.group == "tp")
        assert tp_comms - 1 <= len(sides) < tp_comms + 1  # a comm ending the layer stays blocking
        for i in sides:
            assert out[i + 1].kind is OpKind.GEMM and _meta(out[i + 2], "join")


def test_overlap_shortens_a_tp_bound_step_but_not_below_its_compute():
    plain, overlapped = _step(**DENSE), _step(**DENSE, tp_comm_overlap=True)
    assert overlapped.step_time_s < 0.9 * plain.step_time_s
    compute = sum(v for k, v in plain.breakdown.items() if k not in ("tp_comm", "pipeline_bubble", "dp_grad_reduce"))
    assert overlapped.step_time_s >= compute * (1 - 1e-9)
    assert overlapped.overlapped_comm_s["tp_comm"] > 0


def test_engine_and_analytic_agree_with_overlap():
    des = _step(**DENSE, tp_comm_overlap=True)
    ana = _step(**DENSE, tp_comm_overlap=True, estimator="analytic")
    assert ana.step_time_s == pytest.approx(des.step_time_s, rel=0.01)


def test_no_tensor_parallelism_no_change():
    knobs = dict(gpus=8, gbs=8, seq=4096)
    assert _step(**knobs).step_time_s == _step(**knobs, tp_comm_overlap=True).step_time_s


@pytest.mark.parametrize("extra", [
    dict(cp=2, tp=4, gbs=8),
    dict(tp=4, pp=2, schedule="zb-h1", gbs=16),
    dict(tp=8, recompute="full", gbs=8),
])
def test_overlap_composes_with_ring_attention_zero_bubble_and_recompute(extra):
    knobs = dict(gpus=8, seq=4096, **extra)
    graph = build_graph(load_model("llama3.1-8b"), perfsim.make_plan(8, tp_comm_overlap=True, **{k: v for k, v in knobs.items() if k != "gpus"}))
    assert graph.ops  # lowering works
    des = _step(**knobs, tp_comm_overlap=True)
    ana = _step(**knobs, tp_comm_overlap=True, estimator="analytic")
    assert des.step_time_s <= _step(**knobs).step_time_s * (1 + 1e-9)
    assert ana.step_time_s == pytest.approx(des.step_time_s, rel=0.05)


def test_cli_flag(capsys):
    args = ["simulate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--gbs", "8", "--seq", "4096", "--json"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--tp-comm-overlap"]) == 0
    assert '"tp_comm_overlap": true' in capsys.readouterr().out and '"tp_comm_overlap": false' in plain


def test_a_stacks_tp_overlap_share_hides_part_of_the_comm_in_both_estimators():
    """overlap.tp_comm_share: the part of an overlapped TP collective that runs beside its GEMM
    (1: all of it, the shipped default; 0: as if not overlapped); the closed form and the engine
    price the same chains."""
    from perfsim import api
    from perfsim.system.stacks import load_stack

    knobs = dict(model="llama3.1-70b", cluster="h100-ib", nodes=4, tp=8, zero=3, mbs=2, gbs=8, seq=8192,
                 recompute="full", check_memory=False)
    titan = load_stack("torchtitan")
    assert titan.overlap.tp_comm_share == 1.0

    def step(share, estimator="analytic", overlap=True):
        stack = titan.with_values(**{"overlap.tp_comm_share": share})
        return api.simulate(stack=stack, estimator=estimator, tp_comm_overlap=overlap, **knobs).step_time_s

    full, half, none = step(1.0), step(0.5), step(0.0)
    assert full < half < none
    assert none == pytest.approx(step(1.0, overlap=False), rel=2e-3)  # only the split call's extra latency
    assert step(0.5, "des") == pytest.approx(half, rel=1e-3)


def test_calibrate_fits_the_overlap_share_only_where_asked():
    """Runs with TP both overlapped and not identify the share, but the default fit leaves it
    (on torchtitan's sources a fitted share held out priced worse); --fit names it."""
    from pathlib import Path

    from perfsim.design.runs import read_runs
    from perfsim.design.runs_fit import fit_stack, identified, params_for

    cases = [c for c in read_runs(Path(__file__).resolve().parents[1] / "validation" / "runs" / "published.csv")
             if c.source_id == "torchtitan-asynctp-2506"]
    assert identified("overlap.tp_comm_share", cases)
    assert "overlap.tp_comm_share" not in params_for(cases)
    fit = fit_stack(cases, "torchtitan", ["kernels.speed_nvidia", "overlap.tp_comm_share"])
    assert 0.0 < fit.values["overlap.tp_comm_share"] < 0.9  # Async TP hides well under all of it


def _blocking_tp_comms(model_name, summed_dgrad, layer=0):
    """(forward, backward) names of the TP collectives left on the chain under Async TP."""
    titan = load_stack("torchtitan")
    stack = replace(titan, overlap=replace(titan.overlap, tp_summed_dgrad=summed_dgrad))
    model = load_model(model_name) if isinstance(model_name, str) else model_name
    plan = perfsim.make_plan(8, tp=8, gbs=8, seq=4096, stack=stack, tp_comm_overlap=True)
    fwd, bwd, _ = block_passes(LayerBuilder(model, plan), plan, layer)

    def on_chain(chain):
        return [s.name for s in chain if s.kind is OpKind.COLLECTIVE and s.collective.group == "tp"
                and not _meta(s, "offchain")]
    return on_chain(fwd), on_chain(bwd)


def test_torchtitans_async_tp_leaves_the_reduce_scatter_of_a_summed_input_gradient_blocking():
    """PyTorch's micro-pipeline TP fuses a reduce-scatter only with the one matmul producing it;
    torchtitan runs wq / wk / wv and w1 / w3 as separate matmuls, so the backward's
    reduce-scatters into them drain a sum and stay on the chain. The forward's collectives and
    the backward's all-gathers are pipelined; an ungated MLP's up projection is one matmul."""
    assert load_stack("torchtitan").overlap.tp_summed_dgrad is False
    assert load_stack("megatron-primus").overlap.tp_summed_dgrad is True
    assert _blocking_tp_comms("llama3.1-8b", True) == ([], [])
    fwd, bwd = _blocking_tp_comms("llama3.1-8b", False)
    assert fwd == [] and sorted(bwd) == ["attn_ag_bwd", "mlp_ag_bwd"]  # the forward all-gathers' mirrors
    ungated = replace(load_model("llama3.1-8b"), gated_mlp=False)
    assert _blocking_tp_comms(ungated, False) == ([], ["attn_ag_bwd"])
    # MLA: the query path and wkv_a both read the normed input, so its gradient is a sum too
    mla = load_model("deepseek-v2-lite")
    assert "attn_ag_bwd" in _blocking_tp_comms(mla, False)[1] and _blocking_tp_comms(mla, True) == ([], [])
    # an MoE layer's shared experts are a gated TP MLP (w1 / w3 apart): their gather's mirror too
    assert sorted(_blocking_tp_comms(mla, False, layer=1)[1]) == ["attn_ag_bwd", "shared_ag_bwd"]
    assert _blocking_tp_comms(mla, True, layer=1) == ([], [])


def test_a_blocking_summed_gradient_costs_time_in_both_estimators():
    from perfsim import api
    knobs = dict(model="llama3.1-8b", cluster="h100-ib", nodes=8, tp=8, zero=3, mbs=12, gbs=96, seq=8192,
                 recompute="full", check_memory=False)
    titan = load_stack("torchtitan")
    pipelined = replace(titan, overlap=replace(titan.overlap, tp_summed_dgrad=True))

    def step(stack, estimator="analytic", overlap=True):
        return api.simulate(stack=stack, estimator=estimator, tp_comm_overlap=overlap, **knobs).step_time_s

    full, titan_s, none = step(pipelined), step(titan), step(titan, overlap=False)
    assert full < titan_s < none
    assert step(titan, "des") == pytest.approx(titan_s, rel=1e-2)
