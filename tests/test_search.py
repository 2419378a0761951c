"""Plan search: valid ranked plans, the same answer on every executor (process pool,
Dask LocalCluster, in process), constraints honoured, an empty answer that names the
binding constraint, and the CLI contract (--json keys, --csv, exit 2)."""

import importlib.util
import json
import os

import pytest
from conftest import tiny_moe

import perfsim
from perfsim import cli
from perfsim.cli.search import write_atomic
from perfsim.errors import ConfigError, InfeasiblePlan
from perfsim.lowering.memory import plan_memory
from perfsim.plan.parallel import ParallelPlan, check_plan
from perfsim.search import gpu_counts
from perfsim.search.executors import make_executor

MOE = tiny_moe()
SMALL = dict(gpus=16, gbs=32, seq=1024, limits={"cp": 2, "vpp": 2, "mbs": 2}, top=5, confirm=2)
CONTRACT = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_bytes",
            "breakdown", "plan", "world_size"}


@pytest.fixture(scope="module")
def serial():
    return perfsim.search(MOE, "mi300x-pollara", executor="serial", **SMALL)


def ranking(result) -> list[tuple]:
    return [(r.world_size, tuple(sorted(r.plan.items())), r.estimator, r.step_time_s) for r in result.rows]


def test_rows_are_valid_plans_that_fit(serial):
    assert len(serial.rows) == 5 and [r.rank for r in serial.rows] == [1, 2, 3, 4, 5]
    cap = perfsim.load_cluster("mi300x-pollara").gpu.hbm_bytes
    for row in serial.rows:
        plan = ParallelPlan(**row.plan)
        check_plan(plan, MOE, row.world_size)
        assert max(m.total_bytes for m in plan_memory(MOE, plan)) <= cap
        assert row.memory_headroom_bytes == pytest.approx(cap - row.peak_memory_bytes)
        assert row.tokens_per_s == pytest.approx(32 * 1024 / row.step_time_s)
    des = [r for r in serial.rows if r.estimator == "des"]
    assert len(des) >= 2 and serial.rows[: len(des)] == des  # confirmed by the engine first
    assert [r.step_time_s for r in des] == sorted(r.step_time_s for r in des)
    assert serial.enumerated > serial.costed + serial.bounded > 0


def test_confirmed_rows_match_simulate(serial):
    top = serial.rows[0]
    report = perfsim.simulate(MOE, "mi300x-pollara", ParallelPlan(**top.plan), gpus=16)
    assert top.step_time_s == report.step_time_s


def test_losers_say_why(serial):
    assert serial.rows[0].reason == "winner"
    for row in serial.rows[1:]:
        assert "step time" in row.reason and " vs " in row.reason
    assert "runner-up" in serial.summary() and "winner" in serial.summary()


def test_dask_local_cluster_and_process_pool_give_the_same_ranking(serial):
    dask = perfsim.search(MOE, "mi300x-pollara", executor="dask-local", workers=1, **SMALL)
    pool = perfsim.search(MOE, "mi300x-pollara", executor="local", workers=2, **SMALL)
    assert ranking(dask) == ranking(serial) == ranking(pool)
    assert dask.executor == "dask-local" and pool.executor == "local"


def test_lower_bound_and_chunking_do_not_change_the_answer(serial):
    unbounded = perfsim.search(MOE, "mi300x-pollara", executor="serial", bound=False, **{**SMALL, "confirm": 0})
    bounded = perfsim.search(MOE, "mi300x-pollara", executor="serial", **{**SMALL, "confirm": 0})
    assert ranking(unbounded) == ranking(bounded)
    assert unbounded.bounded == 0 and unbounded.costed == bounded.costed + bounded.bounded


def test_fixed_axes_and_memory_fraction_are_honoured():
    res = perfsim.search(MOE, "mi300x-pollara", executor="serial", fixed={"tp": 1, "zero": (1, 3)},
                         max_memory_fraction=0.02, **{**SMALL, "confirm": 0})
    cap = perfsim.load_cluster("mi300x-pollara").gpu.hbm_bytes
    assert all(r.plan["tp"] == 1 and r.plan["zero"] in (1, 3) for r in res.rows)
    assert all(r.peak_memory_bytes <= 0.02 * cap for r in res.rows)


def test_top_plan_beats_plain_data_parallel_zaya1_1024(tmp_path):
    """Done-when of issue 7 on a trimmed space (cp, etp and vpp 1; pp <= 2; mbs <= 2)
    that still holds plain dp=1024 zero=1."""
    res = perfsim.search("zaya1-base", "mi300x-pollara", gpus=1024, gbs=2048, seq=4096, top=10, confirm=2,
                         fixed={"cp": 1, "etp": 1, "vpp": 1}, limits={"pp": 2, "mbs": 2}, executor="serial")
    plain = perfsim.simulate("zaya1-base", "mi300x-pollara", gpus=1024, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096)
    assert len(res.rows) == 10 and res.rows[0].estimator == "des"
    assert res.rows[0].tokens_per_s >= plain.tokens_per_s


def test_pareto_front_over_gpu_counts():
    res = perfsim.search(MOE, "mi300x-pollara", executor="serial", **{**SMALL, "gpus": "8-32", "confirm": 1})
    assert res.gpus == (8, 16, 32)
    front = res.pareto
    assert front and [p["gpus"] for p in front] == sorted(p["gpus"] for p in front)
    speeds = [p["tokens_per_s"] for p in front]
    assert speeds == sorted(speeds) and len(set(speeds)) == len(speeds)
    assert {r.world_size for r in res.rows if r.pareto} == {p["gpus"] for p in front}


def test_cost_objective_needs_a_price_and_ranks_by_it():
    with pytest.raises(ConfigError, match="usd_per_gpu_hour"):
        perfsim.search(MOE, "mi300x-pollara", objective="cost", executor="serial", **SMALL)
    res = perfsim.search(MOE, "mi300x-pollara", objective="cost", usd_per_gpu_hour=2.0, executor="serial",
                         **{**SMALL, "gpus": "8,16", "confirm": 0})
    costs = [r.usd_per_mtoken for r in res.rows]
    assert costs == sorted(costs) and all(c > 0 for c in costs)


def test_no_valid_plan_names_the_binding_constraint():
    with pytest.raises(InfeasiblePlan, match="memory binds.*smallest footprint"):
        perfsim.search("deepseek-v3", "mi300x-pollara", gpus=8, gbs=64, seq=4096, executor="serial")
    with pytest.raises(InfeasiblePlan, match="fail divisibility, mostly: plan.pp.vpp must divide the model's layers"):
        perfsim.search(MOE, "mi300x-pollara", gpus=16, gbs=32, seq=1024, fixed={"pp": 16}, executor="serial")


def test_cli_no_valid_plan_exits_2_with_one_line(capsys):
    assert cli.main(["search", "--model", "deepseek-v3", "--gpus", "8", "--gbs", "64", "--seq", "4096",
                     "--executor", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfsim: infeasible plan: no valid plan") and "\n" not in err


def test_cli_json_and_csv(tmp_path, capsys):
    out = tmp_path / "plans.csv"
    argv = ["search", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "16", "--seq", "2048", "--tp", "1,2",
            "--max-pp", "2", "--max-cp", "1", "--max-mbs", "2", "--top", "4", "--confirm", "1",
            "--executor", "serial", "--json", "--csv", str(out)]
    assert cli.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and all(CONTRACT <= set(r) for r in rows)
    assert all(r["plan"]["tp"] in (1, 2) for r in rows)
    lines = out.read_text().splitlines()
    assert lines[0].startswith("rank,world_size,tp,pp") and len(lines) == 5
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_atomic_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    target = tmp_path / "plans.csv"
    target.write_text("old\n")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(str(target), "new\n" * 1000)
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["plans.csv"]


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="fixed: unknown axis 'foo'"):
        perfsim.search(MOE, "mi300x-pollara", gpus=8, gbs=16, seq=1024, fixed={"foo": 1})
    with pytest.raises(ConfigError, match="executor"):
        make_executor("mpi://x")
    with pytest.raises(ConfigError, match="gpus"):
        gpu_counts("eight")
    assert gpu_counts("256-1024") == (256, 512, 1024) and gpu_counts([16, 8, 16]) == (8, 16)


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_is_optional_with_a_clear_message():
    with pytest.raises(ConfigError, match="ray is not installed"):
        make_executor("ray://localhost:10001")


def test_plan_switches_reach_every_plan_and_the_engine():
    """``plan_knobs`` (CLI --no-clip-grad, --no-overlap, --no-param-prefetch, --dispatch-fp8)
    are carried by every plan, the closed form's and the confirmed engine's: no clip is a
    shorter step than the default clip, and every row says so."""
    base = perfsim.search(MOE, "mi300x-pollara", executor="serial", **{**SMALL, "confirm": 1})
    bare = perfsim.search(MOE, "mi300x-pollara", executor="serial", plan_knobs={"clip_grad": False},
                          **{**SMALL, "confirm": 1})
    assert all(r.plan["clip_grad"] is False for r in bare.rows) and all(r.plan["clip_grad"] for r in base.rows)
    assert bare.rows[0].estimator == "des" and bare.rows[0].step_time_s < base.rows[0].step_time_s
    fp8 = perfsim.search(MOE, "mi300x-pollara", executor="serial", dtype="fp8", plan_knobs={"dispatch_fp8": True},
                         **{**SMALL, "confirm": 0})
    assert all(r.plan["dispatch_fp8"] for r in fp8.rows)


@pytest.mark.parametrize("knobs, field", [({"dispatch_fp8": True}, "plan_knobs.dispatch_fp8"),
                                          ({"clip": False}, "plan_knobs"), ({"clip_grad": "no"}, "plan_knobs.clip_grad")])
def test_bad_plan_switches_are_config_errors(knobs, field):
    with pytest.raises(ConfigError, match=field):
        perfsim.search(MOE, "mi300x-pollara", executor="serial", plan_knobs=knobs, **SMALL)


def test_pipeline_flushes_reach_the_pipelined_plans_and_leave_the_others():
    """``plan_knobs`` pipeline_flushes (CLI --pipeline-flushes): every plan with a pipeline runs
    its microbatches as that many schedules, each paying its own fill and drain, so its step is
    no shorter than the same plan as one schedule; a plan without a pipeline carries 1 (its
    microbatches run back to back either way); plans it does not divide are rejected, counted
    under one reason."""
    fixed = {"pp": (1, 2), "vpp": 1, "tp": 1, "cp": 1, "mbs": 1}
    knobs = dict(gpus=16, gbs=64, seq=1024, top=40, confirm=0, fixed=fixed)
    one = perfsim.search(MOE, "mi300x-pollara", executor="serial", **knobs)
    four = perfsim.search(MOE, "mi300x-pollara", executor="serial", plan_knobs={"pipeline_flushes": 4}, **knobs)
    piped = [r for r in four.rows if r.plan["pp"] > 1]
    assert piped and all(r.plan["pipeline_flushes"] == 4 for r in piped)
    assert all(r.plan["pipeline_flushes"] == 1 for r in four.rows if r.plan["pp"] == 1)
    steps = {(r.plan["pp"], r.plan["ep"], r.plan["zero"], r.plan["schedule"], r.plan["recompute"],
              r.plan["grad_bucket_bytes"]): r.step_time_s for r in one.rows}
    pairs = [(steps[k], r.step_time_s) for r in piped
             if (k := (2, r.plan["ep"], r.plan["zero"], r.plan["schedule"], r.plan["recompute"],
                       r.plan["grad_bucket_bytes"])) in steps]
    assert pairs and all(flushed > whole for whole, flushed in pairs)
    odd = perfsim.search(MOE, "mi300x-pollara", executor="serial", plan_knobs={"pipeline_flushes": 3}, **knobs)
    assert all(r.plan["pp"] == 1 for r in odd.rows)  # 8 microbatches a pipelined step (dp 8): 3 divides none
    assert odd.rejected["plan.pipeline_flushes must divide the step's microbatches"] > 0


@pytest.mark.parametrize("value", [0, True, 2.0])
def test_bad_pipeline_flushes_knob_is_a_config_error(value):
    with pytest.raises(ConfigError, match=f"plan_knobs.pipeline_flushes: expected a whole number >= 1, got {value!r}"):
        perfsim.search(MOE, "mi300x-pollara", executor="serial", plan_knobs={"pipeline_flushes": value}, **SMALL)


def test_cli_search_pipeline_flushes(capsys):
    assert cli.main(["search", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--gpus", "16", "--gbs", "64",
                     "--seq", "2048", "--pp", "2", "--vpp", "1", "--tp", "1", "--stack", "torchtitan",
                     "--pipeline-flushes", "4", "--executor", "serial", "--top", "2", "--confirm", "0"]) == 0
    out = capsys.readouterr().out
    assert "flushes4" in out
    assert cli.main(["search", "--model", "llama3.1-8b", "--gpus", "16", "--gbs", "64", "--seq", "2048",
                     "--pipeline-flushes", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--pipeline-flushes" in err and "\n" not in err


def test_cli_dispatch_fp8_needs_fp8_in_one_line(capsys):
    assert cli.main(["search", "--model", "mixtral-8x7b", "--gpus", "8", "--gbs", "64", "--seq", "4096",
                     "--dispatch-fp8", "--executor", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--dispatch-fp8" in err and "--dtype fp8" in err and "\n" not in err


def test_search_prices_plans_at_the_stacks_speed_for_the_clusters_gpu_vendor():
    from perfsim.system.stacks import load_stack
    small = {**SMALL, "confirm": 0, "top": 1}
    slow_nvidia = load_stack("ideal").with_values(**{"kernels.speed_nvidia": 0.5})
    base = perfsim.search(MOE, "mi300x-pollara", executor="serial", **small)
    same = perfsim.search(MOE, "mi300x-pollara", executor="serial", stack=slow_nvidia, **small)
    assert same.rows[0].step_time_s == pytest.approx(base.rows[0].step_time_s, rel=1e-12)  # AMD GPUs: speed 1
    slow_amd = load_stack("ideal").with_values(**{"kernels.speed_amd": 0.5})
    slower = perfsim.search(MOE, "mi300x-pollara", executor="serial", stack=slow_amd, **small)
    assert slower.rows[0].step_time_s > 1.3 * base.rows[0].step_time_s


def test_a_plan_that_fits_only_under_recompute_recomputes_the_fewest_layers():
    # Llama-3.1-70B at TP8, mbs 2, seq 8192 on one MI300X node fits only with recompute: the
    # search recomputes a block of layers (Megatron --recompute-num-layers), not every layer,
    # and so beats the same plan with every layer recomputed.
    pins = {"tp": 8, "pp": 1, "mbs": 2, "zero": 1, "cp": 1}
    free = perfsim.search("llama3.1-70b", "mi300x-pollara", gpus=8, gbs=16, seq=8192, fixed=pins,
                          executor="serial", top=1, confirm=1).rows[0]
    full = perfsim.search("llama3.1-70b", "mi300x-pollara", gpus=8, gbs=16, seq=8192,
                          fixed={**pins, "recompute": "full"}, executor="serial", top=1, confirm=1).rows[0]
    assert free.plan["recompute"] == "full" and 0 < free.plan["recompute_layers"] < 80
    assert full.plan["recompute_layers"] == 0  # recompute pinned to full: every layer, as asked
    assert free.step_time_s < full.step_time_s
    fewer = ParallelPlan(**{k: v for k, v in free.plan.items() if k in ParallelPlan.__dataclass_fields__ and k != "stack"}
                         | {"recompute_layers": free.plan["recompute_layers"] - 1, "dp": 1})
    hbm = perfsim.load_cluster("mi300x-pollara").gpu.hbm_bytes  # the search's default: all of HBM
    assert max(m.total_bytes for m in plan_memory(perfsim.load_model("llama3.1-70b"), fewer)) > hbm  # the fewest
