"""V-shape pipeline schedules (zbv, v-half, v-min): the V layout (stage 0 holds the first
layers and the LM head), every pass once in dependency order, the memory limit each
schedule holds and the bubble that less memory costs, both estimators on the same plans,
memory ordering, and the plan checks."""

import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.estimators import pipeline
from perfsim.lowering.memory import stage_memory
from perfsim.plan.parallel import ParallelPlan, Schedule
from perfsim.plan.schedules import (BWD, FWD, WGT, head_stage, peak_chunks, stage_layers, stage_order, v_chunks_held,
                                    v_limit, virtual_stage)
from perfsim.plan.sharding import stage_layer_ids

V = ("zbv", "v-half", "v-min")


def plan(pp, m, schedule, **kw) -> ParallelPlan:
    return ParallelPlan(pp=pp, vpp=2, gbs=m, mbs=1, dp=1, seq=1024, schedule=schedule, **kw)


def unit_makespan(p: ParallelPlan) -> int:
    """Replay every stage's order at unit pass times (no sends): the step in passes."""
    orders = {s: stage_order(p, s) for s in range(p.pp)}
    last, done, free, cursor = 2 * p.pp - 1, {}, [0] * p.pp, [0] * p.pp
    left = sum(map(len, orders.values()))
    while left:
        moved = False
        for s in range(p.pp):
            while cursor[s] < len(orders[s]):
                phase, mb, chunk = orders[s][cursor[s]]
                vs = virtual_stage(p.schedule, p.pp, s, chunk)
                need = {FWD: (FWD, mb, vs - 1) if vs else None,
                        BWD: (FWD, mb, vs) if vs == last else (BWD, mb, vs + 1), WGT: (BWD, mb, vs)}[phase]
                if need is not None and need not in done:
                    break
                start = max(free[s], done.get(need, 0))
                free[s] = done[(phase, mb, vs)] = start + 1
                cursor[s] += 1
                left -= 1
                moved = True
        assert moved, "orders deadlock"
    return max(free)


@pytest.mark.parametrize("schedule", V)
@pytest.mark.parametrize("pp, m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16), (8, 64)])
def test_every_pass_once_in_dependency_order(schedule, pp, m):
    p = plan(pp, m, schedule)
    expected = Counter((ph, mb, c) for ph in (FWD, BWD, WGT) for mb in range(m) for c in (0, 1))
    for stage in range(pp):
        order = stage_order(p, stage)
        assert Counter(order) == expected
        seen = set()
        for phase, mb, chunk in order:  # on one stage: B after its F, W after its B
            if phase == BWD:
                assert (FWD, mb, chunk) in seen
            if phase == WGT:
                assert (BWD, mb, chunk) in seen
            seen.add((phase, mb, chunk))
    assert unit_makespan(p) >= 6 * m  # replays without deadlock


def test_v_layout_puts_the_head_on_stage_zero():
    p = plan(4, 8, "zbv")
    assert [virtual_stage(p.schedule, 4, s, c) for c in (0, 1) for s in range(4)] == [0, 1, 2, 3, 7, 6, 5, 4]
    assert head_stage(p) == 0 and head_stage(replace(p, schedule="interleaved")) == 3
    assert list(stage_layers(16, 4, 2, 0, 1, schedule=Schedule.ZBV)) == [14, 15]
    assert sorted(stage_layer_ids(perfsim.load_model("llama3.1-8b"), plan(4, 8, "zbv"), 0)) == [0, 1, 2, 3, 28, 29, 30, 31]


def test_uneven_first_and_last_virtual_stages():
    """94 layers over 2 x 4 virtual stages: 11 on the first and last (both on stage 0), 12 elsewhere."""
    assert [len(stage_layers(94, 4, 2, s, c, 11, 11, Schedule.ZBV)) for s in range(4) for c in (0, 1)] == \
        [11, 11, 12, 12, 12, 12, 12, 12]


@pytest.mark.parametrize("pp, m", [(4, 16), (8, 64)])
def test_memory_limit_and_bubble_order(pp, m):
    """zbv holds 1F1B's peak (2pp chunks) for near-zero bubble; v-half and v-min hold about a
    half and a third, with less bubble than 1F1B's (pp-1) x 6 chunk passes at equal pass times."""
    peaks = {s: max(peak_chunks(Schedule(s), pp, m, st) for st in range(pp)) for s in V}
    assert peaks["zbv"] <= v_limit(Schedule.ZBV, pp) == 2 * pp
    assert peaks == {s: v_chunks_held(Schedule(s), pp, m) for s in V}
    assert peaks["zbv"] > peaks["v-half"] > peaks["v-min"]
    assert peaks["v-half"] <= pp + 2 and peaks["v-min"] <= -(-2 * pp // 3) + 1
    bubble = {s: unit_makespan(plan(pp, m, s)) - 6 * m for s in V}
    assert bubble["zbv"] <= min(bubble["v-half"], bubble["v-min"]) and max(bubble.values()) < 6 * (pp - 1)


def test_estimators_agree_and_memory_follows_the_limit():
    model, cluster = perfsim.load_model("llama3.1-8b"), perfsim.load_cluster("mi300x-pollara", gpus=8)
    steps, peaks = {}, {}
    for s in ("1f1b", *V):
        p = ParallelPlan(pp=8, vpp=1 if s == "1f1b" else 2, dp=1, mbs=1, gbs=32, seq=4096, schedule=s)
        closed = perfsim.estimate(model, cluster, p, check_memory=False)
        engine = perfsim.simulate(model, cluster, p, check_memory=False)
        assert closed.step_time_s == pytest.approx(engine.step_time_s, rel=0.02)
        steps[s] = engine.step_time_s
        peaks[s] = max(stage_memory(model, p, st).activations_bytes for st in range(8))
    assert steps["zbv"] < steps["1f1b"] and steps["zbv"] <= steps["v-half"] < steps["v-min"]
    assert peaks["zbv"] > peaks["v-half"] > peaks["v-min"]


def test_zero3_prefetch_agrees():
    model = perfsim.load_model("llama3.1-8b")
    cluster = perfsim.load_cluster("mi300x-pollara", gpus=16)
    for s in V:
        p = ParallelPlan(pp=4, vpp=2, dp=4, mbs=1, gbs=16, seq=4096, zero=3, schedule=s, overlap_param_gather=True)
        closed = perfsim.estimate(model, cluster, p, check_memory=False).step_time_s
        engine = perfsim.simulate(model, cluster, p, check_memory=False).step_time_s
        assert closed == pytest.approx(engine, rel=0.05)


@pytest.mark.parametrize("kw, field", [(dict(vpp=1), "vpp"), (dict(vpp=3), "vpp")])
def test_v_needs_two_chunks(kw, field):
    model = perfsim.load_model("llama3.1-8b")
    p = ParallelPlan(pp=4, dp=2, mbs=1, gbs=8, seq=1024, schedule="zbv", **kw)
    with pytest.raises(ConfigError, match="V-shaped.*vpp 2"):
        perfsim.estimate(model, perfsim.load_cluster("mi300x-pollara", gpus=8), p)


def test_cli_runs_a_v_schedule_and_refuses_a_bad_one():
    base = [sys.executable, "-m", "perfsim", "simulate", "--model", "llama3.1-8b", "--cluster", "mi300x-pollara",
            "--nodes", "1", "--pp", "8", "--gbs", "16", "--mbs", "1", "--seq", "2048", "--schedule", "v-half"]
    ok = subprocess.run(base + ["--vpp", "2"], capture_output=True, text=True)
    assert ok.returncode == 0 and "step time" in ok.stdout
    bad = subprocess.run(base, capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "v-half" in bad.stderr and "vpp 2" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_walk_turn_is_local():
    """The V's turn (stage pp-1, chunk 0 -> chunk 1) needs no send."""
    steps = pipeline.compiled(Schedule.ZBV, 4, 2, 4)
    turns = [st for st in steps if st[2] >= 0 and st[7]]
    assert turns and all(st[0] == 3 and steps[st[2]][0] == 3 for st in turns)
