"""The Python API with wrong types and values: every public function raises ConfigError
(one line) or answers with finite numbers; never another exception, a hang or a NaN.
Each argument of each function is replaced in turn by each value of a class of bad
values (issue 18: 829 of 2,226 such calls raised something else)."""

import math

import pytest

import perfsim
from perfsim.design import goodput
from fuzz_harness import GOOD, record, run_api

NAN, INF = float("nan"), float("inf")


class Opaque:
    """A value of no type the API knows (a plain object), whose repr is the same in every
    test process, so parallel workers collect the same test ids."""

    def __repr__(self) -> str:
        return "<object>"


BAD_COUNTS = [None, "8", 8.5, -1, 0, True, NAN, INF, 10 ** 30, [8], {}, Opaque()]
BAD_NUMBERS = [None, "1", -1.0, NAN, INF, -INF, True, [1.0], 1e300]
BAD_NAMES = [None, 8, 8.5, "", "no-such-thing", ["llama3.1-8b"], {}, b"x", Opaque()]
BAD_FLAGS = [None, "yes", 1, 0.5, [True]]

SIM = dict(model="llama3.1-8b", cluster="mi300x-pollara", nodes=1, gbs=8, seq=512, estimator="analytic")
SIM_ARGS = {"model": BAD_NAMES, "cluster": BAD_NAMES, "nodes": BAD_COUNTS, "gbs": BAD_COUNTS, "seq": BAD_COUNTS,
            "estimator": BAD_NAMES, "tp": BAD_COUNTS, "pp": BAD_COUNTS, "cp": BAD_COUNTS, "mbs": BAD_COUNTS,
            "zero": BAD_COUNTS, "dtype": BAD_NAMES, "recompute": BAD_NAMES, "schedule": BAD_NAMES,
            "check_memory": BAD_FLAGS, "trace": BAD_FLAGS, "routing": [0.1, "zipf", {}, 1],
            "variability": [0.1, "x", {}, 1], "plan": [8, "tp8", {}], "comm_compute_interference": BAD_NUMBERS,
            "grad_bucket_bytes": BAD_COUNTS, "gpus": BAD_COUNTS}
COLL = dict(op="all_reduce", size_bytes=1 << 20, ranks=8, cluster="mi300x-pollara")
COLL_ARGS = {"op": BAD_NAMES, "size_bytes": BAD_NUMBERS + [-1, 10 ** 30], "ranks": BAD_COUNTS, "cluster": BAD_NAMES,
             "protocol": BAD_NAMES, "algorithm": BAD_NAMES}
PLAN = dict(num_gpus=8, gbs=8, seq=512)
PLAN_ARGS = {"num_gpus": BAD_COUNTS, "gbs": BAD_COUNTS, "seq": BAD_COUNTS, "tp": BAD_COUNTS, "pp": BAD_COUNTS,
             "cp": BAD_COUNTS, "dp": BAD_COUNTS, "vpp": BAD_COUNTS, "ep": BAD_COUNTS}
FAIL = dict(tau_s=3600.0, num_intervals=10, cost=goodput.CheckpointCost(delta_s=10, restart_s=600), mtbf_s=8.0 * 3600,
            runs=10)
FAIL_ARGS = {"tau_s": BAD_NUMBERS, "num_intervals": BAD_COUNTS, "mtbf_s": BAD_NUMBERS, "runs": BAD_COUNTS,
             "cost": [None, 5, "x"], "seed": [-1, "x", NAN, None]}
GOODPUT = dict(model="llama3.1-8b", cluster="mi300x-pollara", nodes=1, gbs=8, seq=512, estimator="analytic",
               failures=goodput.FailureModel(mtbf_node_s=100 * 3600.0))
GOODPUT_ARGS = {"restart_s": BAD_NUMBERS, "interval_s": BAD_NUMBERS, "monte_carlo_runs": BAD_COUNTS,
                "run_days": BAD_NUMBERS, "seed": BAD_COUNTS, "failures": [None, 5, "x"], "storage": BAD_NAMES,
                "nodes": BAD_COUNTS, "gbs": BAD_COUNTS}


def _cases(name, fn, base, table):
    return [(name, fn, base, arg, value) for arg, values in table.items() for value in values]


CASES = (_cases("simulate", perfsim.simulate, SIM, SIM_ARGS)
         + _cases("estimate", perfsim.estimate, {k: v for k, v in SIM.items() if k != "estimator"},
                  {k: v for k, v in SIM_ARGS.items() if k != "estimator"})
         + _cases("collective", perfsim.collective, COLL, COLL_ARGS)
         + _cases("make_plan", perfsim.make_plan, PLAN, PLAN_ARGS)
         + _cases("simulate_failures", perfsim.simulate_failures, FAIL, FAIL_ARGS)
         + _cases("plan_goodput", perfsim.plan_goodput, GOODPUT, GOODPUT_ARGS))


def _call(fn, base, arg, value):
    kwargs = {**base, arg: value}
    if fn is perfsim.make_plan:
        return lambda: fn(kwargs.pop("num_gpus"), **kwargs)
    if arg == "plan" and fn in (perfsim.simulate, perfsim.estimate):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("gbs", "seq")}
    return lambda: fn(**kwargs)


@pytest.mark.parametrize("name, fn, base, arg, value", CASES,
                         ids=[f"{c[0]}-{c[3]}={c[4]!r}"[:80] for c in CASES])
def test_api_wrong_argument(name, fn, base, arg, value):
    result = record(f"api.{name}", run_api(_call(fn, base, arg, value)))
    assert result.outcome in GOOD, f"{name}({arg}={value!r}): {result}"


ISSUE_CASES = {
    "simulate-cluster-None": lambda: perfsim.simulate("llama3.1-8b", None, nodes=1, gbs=8, seq=512),
    "make_plan-str-gpus": lambda: perfsim.make_plan("8", gbs=8, seq=512),
    "simulate-variability-float": lambda: perfsim.simulate("llama3.1-8b", "mi300x-pollara", nodes=1, gbs=8, seq=512,
                                                           estimator="analytic", variability=0.1),
    "collective-nan-size": lambda: perfsim.collective("all_reduce", NAN, 8, "mi300x-pollara"),
    "search-executor-None": lambda: perfsim.search("llama3.1-8b", "mi300x-pollara", gpus=8, gbs=16, seq=512,
                                                   executor=None),
    "search-gpus-0-8": lambda: perfsim.search("llama3.1-8b", "mi300x-pollara", gpus="0-8", gbs=16, seq=512,
                                              executor="serial"),
    "search-usd-inf": lambda: perfsim.search("llama3.1-8b", "mi300x-pollara", gpus=8, gbs=16, seq=512,
                                             executor="serial", objective="cost", usd_per_gpu_hour=INF),
    "simulate_failures-restart-far-above-mtbf": lambda: perfsim.simulate_failures(
        3600, 10, goodput.CheckpointCost(delta_s=10, restart_s=600), 8.0),
    "engine-1e5-microbatches": lambda: perfsim.simulate("llama3.1-8b", "mi300x-pollara", nodes=1, pp=8, gbs=100_000 // 8 * 8,
                                                        seq=2048),
    "failure-model-nan": lambda: goodput.FailureModel(mtbf_node_s=NAN),
    "calibrate-no-files": lambda: perfsim.calibrate("mi300x-pollara"),
    "calibrate-files-None": lambda: perfsim.calibrate("mi300x-pollara", rccl_logs=[None]),
}


ANSWER_OR_REFUSE = {"engine-1e5-microbatches"}  # bounded work: an answer in seconds (the engine folds) or a refusal


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_api_issue_examples(case):
    result = record("api.issue", run_api(ISSUE_CASES[case]))
    expected = ("ok", "error") if case in ANSWER_OR_REFUSE else ("error",)
    assert result.outcome in expected, f"{case}: {result}"


def test_good_call_is_finite():
    report = perfsim.estimate(**{k: v for k, v in SIM.items() if k != "estimator"})
    assert math.isfinite(report.step_time_s) and 0 < report.mfu < 1


# ---- the design functions ----------------------------------------------------------------

from perfsim.design import checkpoint, moe_width, sizing  # noqa: E402

MODEL = perfsim.load_model("llama3.1-8b")
NODE = perfsim.load_cluster("mi300x-pollara", nodes=1)
SIZING = dict(model=MODEL, cluster=NODE, workload=sizing.Workload(), align=64, window=0.125, min_gain_pct=1.0)
SIZING_ARGS = {"model": BAD_NAMES, "cluster": BAD_NAMES, "workload": [None, 5, "x"], "align": BAD_COUNTS,
               "window": BAD_NUMBERS + [0.0, 2.0, 1e30], "min_gain_pct": BAD_NUMBERS}
WORK = dict(seq=4096, mbs=1, tp=1, ep=1)
WORK_ARGS = {"seq": BAD_COUNTS, "mbs": BAD_COUNTS, "tp": BAD_COUNTS, "ep": BAD_COUNTS, "dtype": BAD_NAMES}
WIDTH = dict(base=perfsim.load_model("olmoe-1b-7b"), cluster=NODE, active_params=1e9, experts=(8,), top_k=(2,))
WIDTH_ARGS = {"base": BAD_NAMES, "cluster": BAD_NAMES, "active_params": BAD_NUMBERS, "total_params": BAD_NUMBERS,
              "experts": [None, 8, (0,), ("8",), (10 ** 9,)], "top_k": [None, 2, (0,), (99,)], "align": BAD_COUNTS,
              "serving": [None, 5], "training": [None, 5]}
RESHARD = dict(model=MODEL, cluster=NODE, source=perfsim.make_plan(8, gbs=8, seq=4096),
               target=perfsim.make_plan(16, gbs=16, seq=4096), storage=checkpoint.load_storage("pfs-shared"))
RESHARD_ARGS = {"model": BAD_NAMES, "cluster": BAD_NAMES, "source": [None, 8, "tp8"], "target": [None, 8, "tp8"],
                "storage": BAD_NAMES}
DESIGN_CASES = (_cases("sizing_table", sizing.sizing_table, SIZING, SIZING_ARGS)
                + _cases("Workload", sizing.Workload, WORK, WORK_ARGS)
                + _cases("moe_width_sweep", moe_width.sweep, WIDTH, WIDTH_ARGS)
                + _cases("reshard", checkpoint.reshard, RESHARD, RESHARD_ARGS))


@pytest.mark.parametrize("name, fn, base, arg, value", DESIGN_CASES,
                         ids=[f"{c[0]}-{c[3]}={c[4]!r}"[:80] for c in DESIGN_CASES])
def test_design_wrong_argument(name, fn, base, arg, value):
    result = record(f"api.{name}", run_api(lambda: fn(**{**base, arg: value})))
    assert result.outcome in GOOD, f"{name}({arg}={value!r}): {result}"


# ---- search and the calibration functions --------------------------------------------------

from perfsim.model.spec import ModelSpec  # noqa: E402

TINY = ModelSpec(name="fuzz-tiny", source="test", num_layers=4, hidden_size=1024, num_heads=16, num_kv_heads=4,
                 head_dim=64, ffn_hidden_size=4096, vocab_size=32000)
SEARCH_BAD = [None, "8", -1, 0, True, NAN, INF, 10 ** 30, [8], {}]
SEARCH = dict(model=TINY, cluster="mi300x-pollara", gpus=8, gbs=16, seq=512, executor="serial", confirm=0, top=3)
SEARCH_ARGS = {"gpus": SEARCH_BAD + ["0-8", "8-4", "1-99999999999", "8,x"], "gbs": SEARCH_BAD, "seq": SEARCH_BAD,
               "top": SEARCH_BAD, "confirm": SEARCH_BAD, "max_memory_fraction": SEARCH_BAD,
               "usd_per_gpu_hour": SEARCH_BAD, "objective": BAD_NAMES, "executor": BAD_NAMES + ["dask://127.0.0.1:1"],
               "workers": SEARCH_BAD, "dtype": BAD_NAMES,
               "fixed": [None, 5, {"tp": 0}, {"tp": "x"}, {"zero": 9}, {"nope": 1}, {"tp": []}],
               "limits": [5, {"tp": 0}, {"tp": 10 ** 9}, {"mbs": 10 ** 9}, {"vpp": 10 ** 9}, {"nope": 2}, {"pp": NAN}]}
VALIDATE = dict(cluster="mi300x-pollara", rccl_logs=(), kernel_csvs=())
VALIDATE_ARGS = {"cluster": BAD_NAMES, "rccl_logs": [None, 5, [None], [5], ["/no/such.log"], "x"],
                 "kernel_csvs": [None, 5, [None], [5], ["/no/such.csv"]]}
CALIBRATE = dict(cluster="mi300x-pollara", rccl_logs=("/no/such.log",))
CALIBRATE_ARGS = {"cluster": BAD_NAMES, "rccl_logs": [None, 5, [None], [5], "x"], "kernel_csvs": [5, [None], [5]],
                  "p2p": [5, [None], [5]], "out": [5, [1], "/no/such/dir/x.toml"]}
MORE_CASES = (_cases("search", perfsim.search, SEARCH, SEARCH_ARGS)
              + _cases("validate", perfsim.validate, VALIDATE, VALIDATE_ARGS)
              + _cases("calibrate", perfsim.calibrate, CALIBRATE, CALIBRATE_ARGS))


@pytest.mark.parametrize("name, fn, base, arg, value", MORE_CASES,
                         ids=[f"{c[0]}-{c[3]}={c[4]!r}"[:80] for c in MORE_CASES])
def test_search_and_calibration_wrong_argument(name, fn, base, arg, value):
    result = record(f"api.{name}", run_api(lambda: fn(**{**base, arg: value})))
    assert result.outcome in GOOD, f"{name}({arg}={value!r}): {result}"


# ---- the specs people build by hand ----------------------------------------------------------

from perfsim.plan.routing import RoutingSpec  # noqa: E402
from perfsim.plan.stragglers import VariabilitySpec  # noqa: E402

SPEC_BAD = [None, "x", NAN, INF, -1, [1], True]
SPECS = {
    "FailureModel.mtbf_node_s": lambda v: goodput.FailureModel(mtbf_node_s=v),
    "CheckpointCost.delta_s": lambda v: goodput.CheckpointCost(delta_s=v, restart_s=1.0),
    "load_storage": lambda v: checkpoint.load_storage(v),
    "Serving.batch": lambda v: moe_width.Serving(batch=v),
    "Training.seq": lambda v: moe_width.Training(seq=v),
    "RoutingSpec.skew": lambda v: RoutingSpec(distribution="zipf", skew=v),
    "RoutingSpec.concentration": lambda v: RoutingSpec(distribution="dirichlet", concentration=v),
    "RoutingSpec.seed": lambda v: RoutingSpec(seed=v),
    "RoutingSpec.histogram": lambda v: RoutingSpec(distribution="histogram", histogram=v),
    "VariabilitySpec.cv": lambda v: VariabilitySpec(cv=v),
    "efficiency_grid.x_values": lambda v: sizing.efficiency_grid(MODEL, NODE.gpu, "hidden_size", v, "ffn_hidden_size",
                                                                 [4096]),
}
SPEC_CASES = [(name, value) for name in SPECS for value in SPEC_BAD]


@pytest.mark.parametrize("name, value", SPEC_CASES, ids=[f"{n}={v!r}" for n, v in SPEC_CASES])
def test_spec_wrong_value(name, value):
    result = record("api.specs", run_api(lambda: SPECS[name](value)))
    assert result.outcome in GOOD, f"{name}({value!r}): {result}"
