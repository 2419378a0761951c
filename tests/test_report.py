"""Report: the breakdown accounts for the whole step, throughput and MFU follow their
stated formulas, the trace opens in Perfetto, the JSON contract holds."""

import json

import pytest
from conftest import tiny_dense, tiny_moe

from perfsim import simulate
from perfsim.report import chrome_trace, write_trace

CONTRACT = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
            "peak_memory_bytes", "breakdown", "plan", "world_size")

RUNS = {
    "dense-pp2-tp2": (tiny_dense(), dict(gpus=8, tp=2, pp=2, dp=2, gbs=8)),
    "moe-ep4-zero3": (tiny_moe(), dict(gpus=8, dp=8, ep=4, gbs=16, zero=3)),
    "dense-vpp2": (tiny_dense(), dict(gpus=4, pp=4, vpp=2, gbs=8)),
}


@pytest.fixture(scope="module", params=[(c, e) for c in RUNS for e in ("des", "analytic")], ids=str)
def report(request):
    case, estimator = request.param
    model, knobs = RUNS[case]
    return simulate(model, "mi300x-pollara", seq=2048, estimator=estimator, trace=estimator == "analytic", **knobs)


def test_breakdown_sums_to_step_time(report):
    assert sum(report.breakdown.values()) == pytest.approx(report.step_time_s, rel=1e-9)
    assert all(v >= 0 for v in report.breakdown.values())


def test_throughput_formulas(report):
    plan = report.plan
    assert report.tokens_per_s == pytest.approx(plan["gbs"] * plan["seq"] / report.step_time_s)
    assert report.tokens_per_s_per_gpu == pytest.approx(report.tokens_per_s / report.world_size)
    assert report.world_size == plan["tp"] * plan["pp"] * plan["cp"] * plan["dp"]


def test_mfu_in_unit_interval(report):
    assert 0 < report.mfu < 1
    assert report.tflops_per_gpu > 0


def test_mfu_formula():
    model = tiny_dense()
    r = simulate(model, "mi300x-pollara", gpus=2, dp=2, gbs=4, seq=2048)
    flops = model.model_flops_per_token(2048) * 4 * 2048
    assert r.tflops_per_gpu == pytest.approx(flops / r.step_time_s / 2 / 1e12)
    assert r.mfu == pytest.approx(r.tflops_per_gpu / 1307.4)  # MI300X dense BF16 peak (CDNA3 white paper)


def test_step_covers_every_span(report):
    assert report.step_time_s == pytest.approx(max(s.end_s for s in report.spans))
    assert min(s.start_s for s in report.spans) >= 0


def test_pipeline_has_bubble_and_p2p(report):
    if report.plan["pp"] > 1:
        assert report.breakdown["pipeline_bubble"] > 0
        if report.estimator == "des":  # the closed form folds p2p into the bubble
            assert report.breakdown["pp_p2p"] > 0


def test_overlapped_comm_is_not_negative(report):
    assert all(v >= -1e-12 for v in report.overlapped_comm_s.values())


def test_json_contract(report):
    d = json.loads(json.dumps(report.to_dict()))
    for key in CONTRACT:
        assert key in d, key
    assert isinstance(d["breakdown"], dict) and isinstance(d["plan"], dict)
    assert d["peak_memory_bytes"] == max(m["total_bytes"] for m in d["memory"])


def test_chrome_trace(report, tmp_path):
    path = tmp_path / "trace.json"
    write_trace(report, str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(report.spans)
    assert all(e["name"] and e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert {"pid", "tid", "cat"} <= set(complete[0])
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    stages = range(report.plan["pp"]) if report.estimator == "des" else [report.critical_stage]
    assert names == {f"pp stage {s}" for s in stages}  # analytic lays out the critical stage only
    assert trace == chrome_trace(report)


# ---- breakdowns and critical path ----------------------------------------------------------

def _pipeline_report():
    from conftest import tiny_dense

    from perfsim import simulate

    return simulate(tiny_dense(), "mi300x-pollara", gpus=8, pp=2, dp=4, gbs=16, seq=1024)


def test_per_collective_exposed_plus_overlapped_is_total():
    r = _pipeline_report()
    assert r.comm_by_collective
    for entry in r.comm_by_collective.values():
        assert entry["exposed_s"] + entry["overlapped_s"] == pytest.approx(entry["total_s"])
        assert entry["exposed_s"] >= -1e-12
    assert r.exposed_comm_s == pytest.approx(sum(e["exposed_s"] for e in r.comm_by_collective.values()))


def test_per_stage_layer_stream_breakdowns():
    r = _pipeline_report()
    assert [row["stage"] for row in r.per_stage] == [0, 1]
    crit = r.per_stage[r.critical_stage]
    assert crit["compute_s"] == pytest.approx(r.per_stream_s["compute"])
    assert crit["compute_s"] + crit["idle_s"] == pytest.approx(r.step_time_s)
    layers = {k for k in r.per_layer_s if k != "other"}
    assert layers == {str(l) for l in range(4 * r.critical_stage, 4 * r.critical_stage + 4)}
    assert r.bubble_s == r.breakdown["pipeline_bubble"] and 0 < r.bubble_fraction < 1


def test_critical_path_spans_the_step():
    from perfsim.report import critical_path

    r = _pipeline_report()
    path = critical_path(r.spans)
    assert path[-1].end_s == pytest.approx(r.step_time_s)
    assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(path, path[1:]))
    assert sum(r.critical_path_s.values()) == pytest.approx(r.step_time_s)
    assert r.critical_path_ops == len(path)
    assert {"bubble_s", "exposed_comm_s", "moe_imbalance", "critical_path_s"} <= set(r.to_dict())
