"""Fault tolerance: Young/Daly interval, the exact expected wall time, the seeded
Monte-Carlo that must reproduce it, checkpoint sizes, storage profiles, resharding, CLI."""

import json
import math

import pytest

import perfsim
from perfsim.design import checkpoint, goodput as gp
from perfsim.cli import main
from perfsim.errors import ConfigError

HOUR = 3600.0


def test_daly_first_order_formula():
    assert gp.daly_interval(60.0, 10 * HOUR) == pytest.approx(math.sqrt(2 * 60 * 36000) - 60)
    assert gp.young_interval(60.0, 10 * HOUR) == pytest.approx(math.sqrt(2 * 60 * 36000))
    assert gp.daly_interval(3 * HOUR, HOUR) == HOUR  # delta >= 2M: checkpoint every M (Daly 2006)


def test_failure_rates_add():
    f = gp.FailureModel(mtbf_node_s=2000 * HOUR, mtbf_gpu_s=16000 * HOUR)
    assert f.system_mtbf_s(128, 8) == pytest.approx(1 / (128 / (2000 * HOUR) + 1024 / (16000 * HOUR)))
    with pytest.raises(ConfigError, match="MTBF"):
        gp.FailureModel()
    with pytest.raises(ConfigError, match="mtbf_node_s"):
        gp.FailureModel(mtbf_node_s=0)


def test_segment_time_limits():
    cost = gp.CheckpointCost(delta_s=30, restart_s=300)
    assert gp.goodput(600, cost, 1e12) == pytest.approx(600 / 630, rel=1e-6)  # no failures: only checkpoints
    m = 5 * HOUR  # Daly 2006: S = M e^{R/M} (e^{(tau+delta)/M} - 1)
    assert gp.segment_time_s(600, cost, m) == pytest.approx(m * math.exp(300 / m) * math.expm1(630 / m))
    async_cost = gp.CheckpointCost(delta_s=30, restart_s=300, persist_s=200)
    assert gp.segment_time_s(600, async_cost, m) > gp.segment_time_s(600, async_cost, m, vulnerable=False)
    with pytest.raises(ConfigError, match="asynchronous write"):
        gp.segment_time_s(100, gp.CheckpointCost(delta_s=1, restart_s=0, persist_s=500), m)


def test_exact_optimum_is_near_daly_and_no_worse():
    cost, m = gp.CheckpointCost(delta_s=60, restart_s=600), 15.6 * HOUR
    daly, best = gp.daly_interval(60, m), gp.optimal_interval(cost, m)
    assert best == pytest.approx(daly, rel=0.05)
    assert gp.goodput(best, cost, m) >= gp.goodput(daly, cost, m) - 1e-12


CASES = {  # (tau, delta, restart, persist, mtbf): sync and async, rare and frequent failures
    "sync-rare": (2500.0, 60.0, 600.0, 0.0, 15.6 * HOUR),
    "sync-frequent": (1200.0, 300.0, 900.0, 0.0, HOUR),
    "async-rare": (750.0, 5.0, 600.0, 300.0, 15.6 * HOUR),
    "async-frequent": (1200.0, 30.0, 300.0, 1200.0, 5000.0),
}


@pytest.mark.parametrize("case", CASES)
def test_monte_carlo_agrees_with_closed_form(case):
    tau, delta, restart, persist, m = CASES[case]
    cost = gp.CheckpointCost(delta_s=delta, restart_s=restart, persist_s=persist)
    mc = gp.simulate_failures(tau, 200, cost, m, runs=400, seed=1)
    lo, hi = mc["ci95_wall_s"]
    assert mc["agrees"] and lo <= mc["closed_form_wall_s"] <= hi
    assert not lo <= 1.01 * mc["closed_form_wall_s"] <= hi  # the CI is tight enough to catch a 1% error
    assert mc["ci95_goodput"][0] <= mc["closed_form_goodput"] <= mc["ci95_goodput"][1]


def test_monte_carlo_is_seeded():
    cost = gp.CheckpointCost(delta_s=30, restart_s=300, persist_s=100)
    a = gp.simulate_failures(900, 50, cost, 2 * HOUR, runs=50, seed=7)
    assert a == gp.simulate_failures(900, 50, cost, 2 * HOUR, runs=50, seed=7)
    assert a["mean_wall_s"] != gp.simulate_failures(900, 50, cost, 2 * HOUR, runs=50, seed=8)["mean_wall_s"]


def test_checkpoint_size_counts_weights_and_adam():
    model = perfsim.load_model("zaya1-base")
    plan = perfsim.make_plan(1024, zero=1, gbs=2048, seq=4096)
    size = checkpoint.checkpoint_size(model, plan)
    assert size.total_bytes == model.total_params() * (2 + 12)
    assert size.per_rank_bytes == pytest.approx(size.total_bytes / 1024, rel=1e-6)  # dp-only ZeRO-1: even shards
    zero0 = checkpoint.checkpoint_size(model, perfsim.make_plan(1024, zero=0, gbs=2048, seq=4096))
    assert zero0.total_bytes == size.total_bytes


def test_storage_profiles_are_strict_and_sourced(tmp_path):
    for name in checkpoint.list_storage():
        spec = checkpoint.load_storage(name)
        assert spec.source.strip() and spec.write_Bps(1) > 0
    bad = tmp_path / "bad.toml"
    text = (checkpoint.STORAGE_DIR / "pfs-shared.toml").read_text()
    bad.write_text(text + "\nspeed = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'speed'"):
        checkpoint.load_storage(bad)
    bad.write_text(text.replace('assumed = ["write_bw_per_node_GBps"', 'assumed = ["colour"'))
    with pytest.raises(ConfigError, match="storage.assumed"):
        checkpoint.load_storage(bad)
    with pytest.raises(ConfigError, match="unknown profile"):
        checkpoint.load_storage("tape")


def test_storage_bandwidth_caps_at_aggregate():
    spec = checkpoint.load_storage("pfs-shared")
    assert spec.write_Bps(1) == spec.write_bw_per_node_GBps * 1e9
    assert spec.write_Bps(10_000) == spec.aggregate_write_bw_GBps * 1e9


@pytest.fixture(scope="module")
def zaya_run():
    return perfsim.plan_goodput("zaya1-base", "mi300x-pollara", nodes=128, zero=1, gbs=2048, seq=4096,
                                failures=perfsim.FailureModel(mtbf_node_s=2000 * HOUR))


def test_plan_goodput_is_consistent(zaya_run):
    r = zaya_run
    assert r["system_mtbf_s"] == pytest.approx(2000 * HOUR / 128)
    assert r["interval_s"] == pytest.approx(math.sqrt(2 * r["delta_s"] * r["system_mtbf_s"]) - r["delta_s"])
    assert r["delta_s"] == r["write_s"] and r["restart_total_s"] == pytest.approx(600 + r["read_s"])
    assert r["tokens_per_day"] == pytest.approx(r["tokens_per_s"] * 86400 * r["goodput"])
    assert 0 < r["goodput"] < 1 and r["tokens_per_day"] < r["tokens_per_day_no_failures"]


def test_async_checkpoints_block_less(zaya_run):
    fast = perfsim.plan_goodput("zaya1-base", "mi300x-pollara", nodes=128, zero=1, gbs=2048, seq=4096,
                                failures=perfsim.FailureModel(mtbf_node_s=2000 * HOUR), async_checkpoint=True)
    assert fast["delta_s"] < zaya_run["delta_s"] and fast["persist_s"] == zaya_run["write_s"]
    assert fast["goodput"] > zaya_run["goodput"]


def test_reshard_1024_to_768():
    model = perfsim.load_model("zaya1-base")
    src = perfsim.make_plan(1024, zero=1, gbs=1024, seq=4096)
    dst = perfsim.make_plan(768, zero=1, gbs=768, seq=4096)
    out = perfsim.reshard(model, perfsim.load_cluster("mi300x-pollara"), src, dst, perfsim.load_storage("pfs-shared"))
    assert out["target_nodes"] == 96
    assert out["target_shard_bytes"] == pytest.approx(out["source_shard_bytes"] * 1024 / 768, rel=1e-6)
    assert out["offline_s"] == pytest.approx(out["read_s"] + out["redistribute_s"] + out["write_s"])
    assert 0 < out["on_load_s"] < out["offline_s"]
    assert out["peak_memory_per_rank_bytes"] == pytest.approx(out["checkpoint_bytes"] / 768 + out["target_shard_bytes"])


# ---- CLI ------------------------------------------------------------------------------------------

def test_cli_goodput_prints_interval_goodput_tokens(capsys):
    assert main(["goodput", "--model", "zaya1-base", "--cluster", "mi300x-pollara", "--nodes", "128",
                 "--mtbf-node-hours", "2000", "--monte-carlo", "50", "--run-days", "5"]) == 0
    out = capsys.readouterr().out
    for label in ("interval", "goodput", "tokens/day", "sqrt(2*delta*M) - delta", "monte-carlo"):
        assert label in out
    assert main(["goodput", "--model", "zaya1-base", "--nodes", "16", "--mtbf-node-hours", "500", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_gpus"] == 128 and data["interval_s"] > 0


def test_cli_reshard_and_sizing(capsys):
    assert main(["reshard", "--model", "zaya1-base", "--from-gpus", "1024", "--to-gpus", "768", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target_gpus"] == 768
    assert main(["sizing", "--model", "zaya1-base", "--cluster", "mi300x-pollara"]) == 0
    out = capsys.readouterr().out
    assert "expert_up" in out and "lm_head" in out and "TFLOPS" in out
    assert main(["sizing", "--model", "llama3.1-8b", "--json"]) == 0
    assert {r["name"] for r in json.loads(capsys.readouterr().out)["rows"]} >= {"qkv", "mlp_up", "lm_head"}


def test_cli_moe_width_json_and_csv(capsys):
    args = ["moe-width", "--active-params", "0.8e9", "--cluster", "mi300x-pollara", "--nodes", "2",
            "--experts", "8,16", "--top-k", "1,2"]
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and any(r["pareto"] for r in rows)
    assert main(args + ["--csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("experts,top_k,expert_ffn_hidden_size") and len(lines) == 5


@pytest.mark.parametrize("argv,field", [
    (["goodput", "--model", "zaya1-base"], "MTBF"),
    (["goodput", "--model", "zaya1-base", "--mtbf-node-hours", "-1"], "--mtbf-node-hours"),
    (["goodput", "--model", "zaya1-base", "--mtbf-node-hours", "100", "--storage", "tape"], "storage"),
    (["moe-width", "--active-params", "abc"], "--active-params"),
    (["moe-width", "--active-params", "1e9", "--experts", "x"], "--experts"),
    (["sizing", "--model", "zaya1-base", "--tp", "0"], "--tp"),
    (["reshard", "--model", "zaya1-base", "--from-gpus", "8"], "--to-gpus"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
