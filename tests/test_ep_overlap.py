"""Expert-parallel all-to-all overlap (Megatron-Core --overlap-moe-expert-parallel-comm,
Megatron-Bridge moe_a2a_overlap): an MoE layer's all-to-alls run beside compute, in both
estimators, as a plan knob, a stack default, a CLI flag and a runs-CSV column."""

import csv
import dataclasses
import json

import pytest

from perfsim import api
from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.design.runs_fit import identified
from perfsim.errors import ConfigError
from perfsim.lowering.layers import overlap_ep_comm
from perfsim.lowering.ops import Coll
from perfsim.lowering.steps import coll_step, gemm_step
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.stacks import load_stack

from conftest import tiny_moe

# 2 nodes of 8, pp 2 x vpp 2 (the combined 1F1B needs virtual stages), ep 8 inside a node
MOE = dict(model="olmoe-1b-7b", cluster="mi300x-pollara", nodes=2, tp=1, pp=2, vpp=2, ep=8, mbs=1, gbs=32,
           seq=4096, schedule="interleaved", recompute="none")


def step(estimator="analytic", **knobs) -> api.Report:
    return api.simulate(estimator=estimator, check_memory=False, **{**MOE, **knobs})


def test_the_all_to_alls_run_beside_the_compute_in_both_estimators():
    for estimator in ("analytic", "des"):
        serial, hidden = step(estimator), step(estimator, ep_comm_overlap=True)
        assert hidden.breakdown["ep_a2a"] < 0.5 * serial.breakdown["ep_a2a"]
        assert hidden.step_time_s < serial.step_time_s
        # compute is untouched: the overlap moves time, it does not remove work
        assert hidden.breakdown["experts"] == pytest.approx(serial.breakdown["experts"], rel=1e-6)
    closed, engine = step("analytic", ep_comm_overlap=True), step("des", ep_comm_overlap=True)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.05)


def test_the_hidden_share_scales_between_no_overlap_and_full():
    base = step("analytic").step_time_s
    full = step("analytic", ep_comm_overlap=True).step_time_s
    none = step("analytic", ep_comm_overlap=True,
                stack=load_stack("ideal").with_values(**{"overlap.ep_comm_share": 0.0})).step_time_s
    half = step("analytic", ep_comm_overlap=True,
                stack=load_stack("ideal").with_values(**{"overlap.ep_comm_share": 0.5})).step_time_s
    assert none == pytest.approx(base, rel=1e-3)
    assert full < half < none


def test_full_recompute_beside_the_overlap_is_refused_as_megatron_refuses_it(capsys):
    # Megatron-Core: "disable full recomputation when enabling overlap_moe_expert_parallel_comm",
    # of every layer or a block of them
    with pytest.raises(ConfigError, match="plan.ep_comm_overlap with full recompute: Megatron-Core refuses"):
        step("analytic", recompute="full", ep_comm_overlap=True)
    with pytest.raises(ConfigError, match="plan.ep_comm_overlap with full recompute"):
        step("analytic", recompute="full", recompute_layers=2, ep_comm_overlap=True)
    assert step("analytic", recompute="selective", ep_comm_overlap=True).step_time_s > 0
    code = main(["simulate", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--nodes", "2", "--pp", "2",
                 "--vpp", "2", "--ep", "8", "--gbs", "32", "--seq", "4096", "--schedule", "interleaved",
                 "--recompute", "full", "--ep-comm-overlap"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "full recompute" in err


def test_each_all_to_all_runs_beside_the_block_megatrons_merged_step_pairs_it_with():
    """Megatron-Core's combined 1F1B step pairs the forward's attention with the backward's
    combine, the backward's experts with the forward's dispatch, the forward's experts with
    the backward's dispatch and the backward's attention with the forward's combine
    (schedule_layer_1f1b): within a pass, each all-to-all runs off the chain beside the block
    before it (forward) or after it (backward) and is joined at that block's end; its exposed
    share stays where it was; one with no compute beside it stays blocking."""
    dispatch = coll_step("dispatch_a2a", Coll.ALL_TO_ALL, "ep", 1e6, "ep_a2a")
    combine = coll_step("combine_a2a", Coll.ALL_TO_ALL, "ep", 1e6, "ep_a2a")
    attn, up, post = (gemm_step(n, 1024, 1024, 1024, "experts") for n in ("attn", "expert_up", "post"))

    def layout(steps):
        return [s.name + ("*" if dict(s.meta).get("offchain") else "") + ("^" if dict(s.meta).get("join") else "")
                for s in steps]

    fwd = overlap_ep_comm([attn, dispatch, up, combine, post], share=0.25)
    assert layout(fwd) == ["dispatch_a2a*", "attn", "dispatch_a2a_wait^", "dispatch_a2a_exposed", "combine_a2a*",
                           "expert_up", "combine_a2a_wait^", "combine_a2a_exposed", "post"]
    assert fwd[0].collective.size_bytes == pytest.approx(0.25e6)
    assert fwd[3].collective.size_bytes == pytest.approx(0.75e6)
    bwd = overlap_ep_comm([post, combine, up, dispatch, attn], backward=True)
    assert layout(bwd) == ["post", "combine_a2a*", "expert_up", "combine_a2a_wait^", "dispatch_a2a*", "attn",
                           "dispatch_a2a_wait^"]
    assert layout(overlap_ep_comm([dispatch, up, combine])) == ["dispatch_a2a", "combine_a2a*", "expert_up",
                                                               "combine_a2a_wait^"]  # nothing before the dispatch
    assert overlap_ep_comm([up, up]) == [up, up]  # a dense layer: nothing to move


def test_a_pair_lasts_the_longer_of_its_block_and_its_all_to_all():
    """Priced (closed form), a layer's pass is each block or its paired all-to-all, whichever
    is longer: a slow all-to-all beside a short attention block shows, where one all-to-all
    hidden across the whole pass (the earlier model) would not."""
    from perfsim.estimators.analytic import walk
    from perfsim.lowering.ops import Op, OpKind, Stream

    def op(i, name, seconds, meta=(), stream=None):
        kind = OpKind.COLLECTIVE if stream else OpKind.ELEMENTWISE
        return Op(op_id=i, stage=0, kind=kind, name=name, stream=stream or Stream.COMPUTE,
                  category="ep_a2a" if stream else "experts", duration_s=seconds, meta=dict(meta))

    chain = [op(0, "a2a", 3.0, {"offchain": True}, Stream.EP_COMM), op(1, "attn", 1.0),
             op(2, "wait", 0.0, {"join": True}), op(3, "a2a2", 1.0, {"offchain": True}, Stream.EP_COMM),
             op(4, "experts", 4.0), op(5, "wait2", 0.0, {"join": True})]
    assert walk(chain).seconds == pytest.approx(3.0 + 4.0)


@pytest.mark.parametrize("knobs, field", [
    (dict(tp=2, pp=2, vpp=1, ep=8, dp=8), "vpp"),
    (dict(tp=2, pp=1, ep=8, dp=8, tp_comm_overlap=True), "tp_comm_overlap"),
    (dict(tp=1, pp=1, cp=2, ep=8, dp=8), "cp"),
])
def test_plans_the_overlap_cannot_run_are_refused(knobs, field):
    with pytest.raises(ConfigError, match="plan.ep_comm_overlap") as err:
        ParallelPlan(mbs=1, gbs=64, seq=4096, ep_comm_overlap=True, **knobs)
    assert field in str(err.value)
    ParallelPlan(mbs=1, gbs=64, seq=4096, ep_comm_overlap=False, **knobs)  # the same plan without it is fine


def test_the_stack_default_and_the_megatron_switch_set_it():
    spec = load_stack("megatron-primus").with_values(**{"overlap.ep_comm": True})
    assert spec.plan_defaults()["ep_comm_overlap"] is True
    assert "ep_comm_overlap" not in load_stack("nemo").plan_defaults()
    from perfsim.plan.megatron import BOOL_KNOBS
    assert BOOL_KNOBS["overlap_moe_expert_parallel_comm"] == ("ep_comm_overlap", True)
    with pytest.raises(ConfigError, match="ep_comm_share"):
        load_stack("ideal").with_values(**{"overlap.ep_comm_share": 1.5})


def test_cli_flag_and_its_errors(capsys):
    args = ["simulate", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--nodes", "2", "--pp", "2",
            "--vpp", "2", "--ep", "8", "--mbs", "1", "--gbs", "32", "--seq", "4096", "--schedule", "interleaved",
            "--recompute", "none", "--json"]
    assert main(args + ["--ep-comm-overlap"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["ep_comm_overlap"] is True
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["ep_comm_overlap"] is False
    bad = ["simulate", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--nodes", "2", "--pp", "2",
           "--ep", "8", "--mbs", "1", "--gbs", "32", "--seq", "4096", "--ep-comm-overlap"]
    assert main(bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plan.ep_comm_overlap" in err[0] and "Traceback" not in err[0]


def test_runs_csv_column_and_what_identifies_the_hidden_share(tmp_path):
    cases = [c for c in read_runs("validation/runs/published.csv") if c.stack in ("nemo", "nemo-25.11")]
    overlapped = {c.id for c in cases if dict(c.knobs).get("ep_comm_overlap")}
    # the Qwen3 presets with moe_a2a_overlap (from 26.04 the Qwen3-30B-A3B one runs EP16 without it)
    assert overlapped == {"MB2511-Q30B-H100", "MB2511-Q235B-H100", "MB2602-Q30B-H100", "MB2602-Q235B-H100",
                          "MB2509-DSV3-H100", "MB260201-Q30B-H100", "MB260201-Q235B-H100", "MB2604-Q235B-H100",
                          "MB260401-Q235B-H100"}
    assert not {"MB2604-Q30B-H100", "MB260401-Q30B-H100", "MB2606-Q30B-H100"} & overlapped
    # runs with expert parallelism with and without the overlap tell its share apart
    assert identified("overlap.ep_comm_share", cases)
    assert not identified("overlap.ep_comm_share", [c for c in cases if c.id in overlapped])
    path = tmp_path / "runs.csv"
    with open("validation/runs/published.csv") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["id"] == "MB2511-Q235B-H100")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow({**row, "ep_comm_overlap": "maybe"})
    with pytest.raises(ConfigError, match="ep_comm_overlap"):
        read_runs(path)


def test_the_report_shows_the_all_to_alls_mostly_hidden():
    rep = step("analytic", ep_comm_overlap=True)
    a2a = [v for k, v in rep.comm_by_collective.items() if "a2a" in k]
    assert a2a and sum(v["exposed_s"] for v in a2a) < 0.5 * sum(v["total_s"] for v in a2a)



def test_search_tries_the_overlap_only_where_it_can_run():
    import perfsim

    small = dict(gpus=16, gbs=32, seq=1024, limits={"cp": 2, "vpp": 2, "mbs": 1, "pp": 2}, top=40, confirm=0,
                 executor="serial")
    plain = perfsim.search(tiny_moe(), "mi300x-pollara", **small)
    assert not any(r.plan.get("ep_comm_overlap") for r in plain.rows)
    both = perfsim.search(tiny_moe(), "mi300x-pollara", fixed={"ep_comm_overlap": (False, True)}, **small)
    assert both.enumerated > plain.enumerated
    tried = [r for r in both.rows if r.plan["ep_comm_overlap"]]
    assert tried
    for r in tried:
        p = r.plan
        assert p["ep"] > 1 and p["cp"] == 1 and (p["pp"] == 1 or p["vpp"] > 1)
        assert not (p["tp_comm_overlap"] and p["tp"] > 1)
        knobs = {k: p[k] for k in ("tp", "pp", "vpp", "ep", "etp", "cp", "zero", "mbs", "recompute", "schedule",
                                   "tp_comm_overlap", "grad_bucket_bytes", "dispatch", "recompute_layers")}
        again = perfsim.simulate(tiny_moe(), "mi300x-pollara", nodes=2, gbs=32, seq=1024, dp=p["dp"],
                                 ep_comm_overlap=True, check_memory=False, estimator=r.estimator, **knobs)
        assert again.step_time_s == pytest.approx(r.step_time_s, rel=1e-9)
    assert both.rows[0].step_time_s <= plain.rows[0].step_time_s


def test_search_cli_flag_tries_the_overlap(capsys):
    args = ["search", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--gpus", "16", "--gbs", "32",
            "--seq", "2048", "--tp", "1", "--pp", "2", "--ep", "8", "--max-vpp", "2", "--max-mbs", "1", "--top", "3",
            "--executor", "serial"]
    assert main(args) == 0
    assert "ep-overlap" not in capsys.readouterr().out
    assert main(args + ["--ep-comm-overlap"]) == 0
    assert "ep-overlap" in capsys.readouterr().out


def test_a_stacks_tp_overlap_default_is_turned_off_from_the_cli(capsys):
    args = ["simulate", "--model", "olmoe-1b-7b", "--cluster", "mi300x-pollara", "--nodes", "2", "--tp", "2",
            "--ep", "8", "--mbs", "1", "--gbs", "32", "--seq", "4096", "--stack", "nemo", "--engine", "analytic",
            "--ep-comm-overlap", "--json"]
    assert main(args) == 2  # nemo overlaps TP communication by default
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-tp-comm-overlap" in err[0]
    assert main(args + ["--no-tp-comm-overlap"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["ep_comm_overlap"] is True and plan["tp_comm_overlap"] is False


def test_the_overlap_holds_one_more_layer_not_one_more_chunk():
    """Megatron-Core schedules one more forward before the steady steps under the overlap,
    then merges each step's forward and backward layer by layer (schedule_chunk_1f1b: the
    forward chunk's layer i beside the backward chunk's layer n - 1 - i), so the backward
    frees a layer as the forward keeps one: the peak holds one layer's activations more than
    without the overlap, interleaved or without a pipeline, never a whole chunk or microbatch
    more (the fast search memory model keys it too)."""
    from perfsim.estimators.fastmem import MemoryModel
    from perfsim.lowering.memory import in_flight_microbatches, plan_memory
    from perfsim.plan.schedules import interleaved_peak

    model = api.load_model("olmoe-1b-7b")
    for knobs in (dict(pp=2, vpp=2, dp=8, schedule="interleaved"), dict(dp=16)):
        plan = ParallelPlan(tp=1, ep=8, mbs=1, gbs=32, seq=4096, **knobs)
        over = dataclasses.replace(plan, ep_comm_overlap=True)
        assert in_flight_microbatches(over, 0) == in_flight_microbatches(plan, 0)  # the schedule's own count
        base, extra = plan_memory(model, plan)[0], plan_memory(model, over)[0]
        chunk_layers = model.num_layers // (plan.pp * plan.vpp)
        per_layer = base.activations_bytes / in_flight_microbatches(plan, 0) / (chunk_layers * plan.vpp)
        assert extra.activations_bytes - base.activations_bytes == pytest.approx(per_layer, rel=1e-6)
        fast = MemoryModel(model)
        assert fast.peak(plan)[0] < fast.peak(over)[0] == pytest.approx(max(m.total_bytes for m in plan_memory(model, over)))
    # the walk itself: equal chunks of 4 layers, one warm-up forward more, each merged step one layer more
    plain = interleaved_peak(2, 2, 0, 16, (4.0, 4.0))
    assert interleaved_peak(2, 2, 0, 16, (4.0, 4.0), merged=(1.0, 1.0)) == plain + 1.0
    # one microbatch: no steady step to merge, nothing more
    single = ParallelPlan(tp=1, ep=8, dp=16, mbs=1, gbs=16, seq=4096)
    assert (plan_memory(model, dataclasses.replace(single, ep_comm_overlap=True))[0].activations_bytes
            == plan_memory(model, single)[0].activations_bytes)


def test_recompute_auto_stops_before_full_recompute_beside_the_overlap():
    """Megatron-Core refuses full recompute (every layer or a block) with the overlap, so
    recompute auto walks none and selective only; where neither fits the plan keeps selective
    and is reported out of memory, with a hint that names the overlap."""
    knobs = dict(model="olmoe-1b-7b", cluster="mi300x-pollara", nodes=2, tp=1, pp=2, vpp=2, ep=8, gbs=128,
                 schedule="interleaved", recompute="auto", stack="megatron-primus")
    fits = api.simulate(mbs=1, seq=4096, ep_comm_overlap=True, **knobs)
    assert fits.plan["recompute"] == "none"
    big = dict(mbs=8, seq=16384)
    plain = api.simulate(check_memory=False, **big, **knobs)
    assert plain.plan["recompute"] == "full"  # without the overlap auto reaches full recompute
    with pytest.raises(api.InfeasiblePlan, match="refuses full recompute beside the expert-parallel"):
        api.simulate(ep_comm_overlap=True, **big, **knobs)
    report = api.simulate(ep_comm_overlap=True, check_memory=False, **big, **knobs)
    assert report.plan["recompute"] == "selective" and not report.fits


# ---- the compute units a dispatch implementation's kernels hold (DeepEP's SMs) ----------

# h100-ib: DeepEP across 2 nodes (ep 16), pp 2 x vpp 2
DEEPEP = dict(model="qwen3-30b-a3b", cluster="h100-ib", nodes=2, tp=1, pp=2, vpp=2, ep=8, mbs=1, gbs=16, seq=4096,
              schedule="interleaved", recompute="selective", dispatch="deepep")


def _holding(units: int):
    cluster = api.load_cluster("h100-ib")
    deepep = dataclasses.replace(cluster.dispatch["deepep"], compute_units=units)
    return dataclasses.replace(cluster, dispatch={**cluster.dispatch, "deepep": deepep})


def deepep(estimator="analytic", **knobs) -> api.Report:
    return api.simulate(estimator=estimator, check_memory=False, **{**DEEPEP, **knobs})


def test_deepep_holds_its_sms_and_the_overlapped_compute_runs_on_the_rest_in_both_estimators():
    assert api.load_cluster("h100-ib").dispatch["deepep"].compute_units == 20  # DeepEP's and Megatron-Core's default
    for estimator in ("analytic", "des"):
        free = deepep(estimator, ep_comm_overlap=True, cluster=_holding(0))
        held = deepep(estimator, ep_comm_overlap=True)
        more = deepep(estimator, ep_comm_overlap=True, cluster=_holding(60))
        assert free.step_time_s < held.step_time_s < more.step_time_s
    closed, engine = deepep("analytic", ep_comm_overlap=True), deepep("des", ep_comm_overlap=True)
    assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.01)
    # the closed form names the cost; it is at most the hidden all-to-alls' time at 20/112 (the
    # compute beside them runs at 112/132 of its speed) and the passes grow by exactly it (the
    # pipeline bubble, paced by the passes, grows with them)
    free, held = deepep(ep_comm_overlap=True, cluster=_holding(0)), deepep(ep_comm_overlap=True)
    lost = held.breakdown["comm_interference"]

    def passes(r):
        return r.step_time_s - r.breakdown["pipeline_bubble"]

    assert lost == pytest.approx(passes(held) - passes(free), rel=1e-6)
    assert held.breakdown["pipeline_bubble"] > free.breakdown["pipeline_bubble"]
    assert 0 < lost <= deepep().breakdown["ep_a2a"] * 20 / 112 * 1.001
    assert "comm_interference" not in free.breakdown


def test_without_the_overlap_or_with_hookless_kernels_nothing_is_lost():
    # blocking all-to-alls: the compute waits for them, so the SMs they hold slow nothing
    assert deepep(cluster=_holding(60)).step_time_s == pytest.approx(deepep(cluster=_holding(0)).step_time_s, rel=1e-9)
    # DeepEP's low-latency kernels receive through a hook that holds no SMs
    assert api.load_cluster("h100-ib").dispatch["deepep-ll"].compute_units == 0
    assert "comm_interference" not in deepep(ep_comm_overlap=True, dispatch="deepep-ll").breakdown


@pytest.mark.parametrize("units", [-1, True, 1.5, 132, 500])
def test_a_dispatch_holding_impossible_compute_units_is_refused(units):
    with pytest.raises(ConfigError, match=r"dispatch(\.deepep)?\.compute_units"):
        _holding(units)


def test_the_plan_the_cli_the_search_and_a_runs_csv_set_the_units_the_dispatch_holds(tmp_path, capsys):
    # the plan's count replaces the profile's; 0 holds none
    assert deepep(ep_comm_overlap=True, dispatch_compute_units=0).step_time_s == pytest.approx(
        deepep(ep_comm_overlap=True, cluster=_holding(0)).step_time_s, rel=1e-12)
    assert deepep(ep_comm_overlap=True, dispatch_compute_units=60).step_time_s == pytest.approx(
        deepep(ep_comm_overlap=True, cluster=_holding(60)).step_time_s, rel=1e-12)
    with pytest.raises(ConfigError, match="plan.dispatch_compute_units must be a whole number"):
        ParallelPlan(tp=1, pp=1, dp=8, ep=8, gbs=8, seq=1024, dispatch_compute_units=-1)
    base = ["simulate", "--model", "qwen3-30b-a3b", "--cluster", "h100-ib", "--nodes", "2", "--pp", "2", "--vpp", "2",
            "--schedule", "interleaved", "--ep", "8", "--gbs", "16", "--seq", "4096", "--dispatch", "deepep",
            "--ep-comm-overlap", "--engine", "analytic", "--json", "--allow-oom"]
    steps = {}
    for units in (None, 60):
        assert main(base + ([] if units is None else ["--dispatch-compute-units", str(units)])) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["plan"]["dispatch_compute_units"] == units
        steps[units] = report["step_time_s"]
    assert steps[60] > steps[None]
    # the search carries it into every plan; a bad value is named
    from perfsim.search import search
    found = search("qwen3-30b-a3b", "h100-ib", gpus=16, gbs=16, seq=4096, fixed={"tp": 1, "pp": 1, "ep": 16, "cp": 1},
                   limits={"mbs": 1}, top=1, confirm=0, executor="serial", plan_knobs={"dispatch_compute_units": 40})
    assert found.rows[0].plan["dispatch_compute_units"] == 40
    with pytest.raises(ConfigError, match="plan_knobs.dispatch_compute_units: expected a whole number"):
        search("qwen3-30b-a3b", "h100-ib", gpus=16, gbs=16, seq=4096, plan_knobs={"dispatch_compute_units": -1})
    # a runs CSV's optional column
    path = tmp_path / "runs.csv"
    path.write_text("id,source_id,source,stack,model,cluster,nodes,ep,mbs,gbs,seq,dispatch,dispatch_compute_units,"
                    "metric,measured\nr1,s,x,megatron-primus,qwen3-30b-a3b,h100-ib,2,16,1,16,4096,deepep,24,"
                    "step_time_s,1.0\n")
    assert dict(read_runs(path)[0].knobs)["dispatch_compute_units"] == 24
