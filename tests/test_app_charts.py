"""The planner's pure parts: data shaping (app/derive.py), Plotly figures (app/charts.py)
and the inputs dict (app/inputs.py), on real reports where a report is needed."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "app"))

import charts  # noqa: E402
import derive  # noqa: E402
import inputs as planner_inputs  # noqa: E402

import perfsim  # noqa: E402
from perfsim.plan.parallel import ParallelPlan  # noqa: E402
from perfsim.estimators.engine import Span  # noqa: E402


def span(rank=0, stream="compute", category="gemm", start=0.0, end=1.0, nbytes=0.0, op="op"):
    return Span(rank=rank, stream=stream, op=op, category=category, kind="k", start_s=start, end_s=end,
                bytes=nbytes, flops=0.0, microbatch=0, layer=0, phase="F")


@pytest.fixture(scope="module")
def report():
    """A small pipelined plan with TP and DP traffic: several stages and streams."""
    return perfsim.simulate("llama3.1-8b", "mi300x-pollara", nodes=2, tp=2, pp=2, gbs=32, seq=2048,
                            check_memory=False)


# ---- derive ---------------------------------------------------------------------------------

def test_busy_seconds_is_the_union():
    assert derive.busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    assert derive.busy_seconds([(0, 10), (2, 3)]) == 10
    assert derive.busy_seconds([]) == 0


def test_stream_utilization_counts_overlap_once():
    spans = [span(stream="dp_comm", start=0, end=2, nbytes=1e9), span(stream="dp_comm", start=1, end=3, nbytes=1e9),
             span(start=0, end=4)]
    rows = {r["stream"]: r for r in derive.stream_utilization(spans, step_s=8.0)}
    assert rows["dp_comm"]["busy_fraction"] == pytest.approx(3 / 8)
    assert rows["dp_comm"]["busy_GBps"] == pytest.approx(2e9 / 3 / 1e9)
    assert rows["compute"]["busy_fraction"] == pytest.approx(0.5) and rows["compute"]["bytes"] == 0


def test_stream_utilization_of_a_real_step_is_a_fraction(report):
    rows = derive.stream_utilization(report.spans, report.step_time_s)
    assert {r["rank"] for r in rows} == {0, 1}
    assert {"compute", "tp_comm", "pp_comm"} <= {r["stream"] for r in rows}
    assert all(0 < r["busy_fraction"] <= 1 + 1e-9 for r in rows)


def test_idle_link_notes_flag_only_quiet_comm_streams():
    rows = [{"rank": 0, "stream": "compute", "busy_fraction": 0.01},
            {"rank": 0, "stream": "pp_comm", "busy_fraction": 0.01},
            {"rank": 0, "stream": "dp_comm", "busy_fraction": 0.5}]
    notes = derive.idle_link_notes(rows)
    assert len(notes) == 1 and "pp_comm" in notes[0]


def test_gantt_bars_merge_until_under_the_cap(report):
    exact = derive.gantt_bars(report.spans, report.step_time_s, max_bars=10**9)
    capped = derive.gantt_bars(report.spans, report.step_time_s, max_bars=200)
    assert len(exact) <= len(report.spans) and len(capped) <= 200
    for bars in (exact, capped):  # merging keeps every op and the covered time span
        assert sum(b["count"] for b in bars) == len(report.spans)
        assert min(b["start_s"] for b in bars) == min(s.start_s for s in report.spans)
        assert max(b["end_s"] for b in bars) == max(s.end_s for s in report.spans)


def test_gantt_bars_merge_only_same_category_neighbours():
    spans = [span(category="a", start=0, end=1), span(category="a", start=1, end=2),
             span(category="b", start=2, end=3), span(category="a", start=3, end=4)]
    bars = derive.gantt_bars(spans, step_s=4, max_bars=100)
    assert [(b["category"], b["start_s"], b["end_s"], b["count"]) for b in bars] == [
        ("a", 0, 2, 2), ("b", 2, 3, 1), ("a", 3, 4, 1)]


def test_idle_bars_fill_the_gaps_of_compute():
    spans = [span(start=1, end=2), span(start=3, end=4), span(stream="dp_comm", start=0, end=5)]
    idle = derive.idle_bars(spans, step_s=5)
    assert [(b["start_s"], b["end_s"]) for b in idle] == [(0, 1), (2, 3), (4, 5)]
    assert all(b["stream"] == "compute" and b["category"] == derive.IDLE for b in idle)


def test_pipeline_idle_matches_the_reported_bubble(report):
    """Idle compute time on the critical stage equals the report's pipeline bubble."""
    crit = [s for s in report.spans if s.rank == report.critical_stage]
    idle = derive.idle_bars(crit, report.step_time_s, min_fraction=0)
    assert sum(b["end_s"] - b["start_s"] for b in idle) == pytest.approx(
        report.breakdown.get("pipeline_bubble", 0) + sum(
            v for k, v in report.breakdown.items() if k in report.overlapped_comm_s), rel=1e-6)


def test_span_groups():
    bars = [{"category": "gemm", "stream": "compute"}, {"category": "tp_ag", "stream": "tp_comm"},
            {"category": "idle", "stream": "compute"}]
    assert derive.span_groups(bars) == {"gemm": "compute", "tp_ag": "comm", "idle": "bubble"}


def test_breakdown_rows_group_and_order(report):
    rows = derive.breakdown_rows(report.breakdown, report.overlapped_comm_s)
    assert sum(r["seconds"] for r in rows) == pytest.approx(report.step_time_s, rel=1e-9)
    assert [r["seconds"] for r in rows] == sorted((r["seconds"] for r in rows), reverse=True)
    groups = {r["category"]: r["group"] for r in rows}
    assert groups.get("pipeline_bubble", "bubble") == "bubble"
    assert all(groups[k] == "comm" for k in report.overlapped_comm_s if k in groups)


def test_size_sweep():
    assert derive.size_sweep(8, 64) == [8, 16, 32, 64]
    assert derive.size_sweep(1, 100, 10) == [1, 10, 100]
    with pytest.raises(ValueError, match="size sweep"):
        derive.size_sweep(64, 8)


def test_read_measured_busbw(tmp_path):
    shipped = ROOT / "validation" / "data" / "calibration" / "allreduce_busbw_vs_size.csv"
    assert derive.read_measured_busbw(tmp_path / "absent.csv") == []
    rows = derive.read_measured_busbw(shipped)  # shipped in the repo (issue 17.3): never skipped
    assert rows and all(r["busbw_GBps"] >= 0 and r["size_bytes"] > 0 for r in rows)
    assert max(r["busbw_GBps"] for r in rows if r["gpu"] == "MI300X") > 250  # 8-GPU plateau ~316-319 GB/s


def test_pareto_front():
    points = [{"x": 1, "y": 1}, {"x": 2, "y": 3}, {"x": 2, "y": 2}, {"x": 3, "y": 2}, {"x": 4, "y": 5}]
    assert [(p["x"], p["y"]) for p in derive.pareto_front(points, "x", "y")] == [(1, 1), (2, 3), (4, 5)]


def test_compare_rows_deltas():
    rows = derive.compare_rows({"a": {"step_time_s": 2.0, "mfu": 0.4}, "b": {"step_time_s": 1.0, "mfu": 0.5}})
    step = next(r for r in rows if r["metric"] == "step time")
    assert step["a"] == 2.0 and step["b"] == 1.0 and step["b vs a"] == pytest.approx(-0.5)
    mfu = next(r for r in rows if r["metric"] == "MFU")
    assert mfu["b vs a"] == pytest.approx(0.25)
    assert next(r for r in rows if r["metric"] == "GPUs")["b vs a"] is None  # missing values: no delta


def test_plan_differences():
    diff = derive.plan_differences({"a": {"tp": 1, "pp": 2}, "b": {"tp": 2, "pp": 2}})
    assert diff == [{"knob": "tp", "a": "1", "b": "2"}]


def test_search_rows_accept_lists_objects_and_reports(report):
    as_dicts = [{"plan": report.plan, "step_time_s": 1.0, "tokens_per_s_per_gpu": 10.0, "why": "slower"}]
    wrapped = SimpleNamespace(ranked=[SimpleNamespace(to_dict=lambda: as_dicts[0])])
    for result in (as_dicts, wrapped, [report]):
        rows = derive.search_rows(result)
        assert rows[0]["rank"] == 1 and rows[0]["plan"]["tp"] == 2 and rows[0]["world_size"] == 16
        assert "tp=2" in rows[0]["label"] and "pp=2" in rows[0]["label"]
    assert derive.search_rows(as_dicts)[0]["why"] == "slower"
    with pytest.raises(ValueError, match="search"):
        derive.search_rows(42)


def test_error_stats():
    stats = derive.error_stats([{"measured": 100, "predicted": 110}, {"measured": 200, "predicted": 150}])
    assert stats["points"] == 2 and stats["mape"] == pytest.approx(0.175) and stats["worst"] == pytest.approx(-0.25)
    assert derive.error_stats([])["mape"] is None


def test_rccl_points_from_a_shipped_log():
    readers = pytest.importorskip("perfsim.calibration.readers")
    log_path = ROOT / "validation" / "data" / "calibration" / "rccl-tests" / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
    points = derive.rccl_points(readers.read_rccl_log(log_path), "mi300x")
    assert all(p["op"] == "all_reduce" and p["ranks"] == 8 and p["time_us"] > 0 for p in points)
    assert len(points) == len(readers.read_rccl_log(log_path).rows) == 32  # 8 B..16 GiB, as validate scores them


# ---- charts ---------------------------------------------------------------------------------

def test_category_colors_are_stable_and_grouped():
    colors = charts.category_colors({"gemm": "compute", "dp": "comm", "idle": "bubble"})
    assert colors == charts.category_colors({"idle": "bubble", "dp": "comm", "gemm": "compute"})
    assert colors["idle"] in charts.GROUP_PALETTES["bubble"]
    assert colors["dp"] in charts.GROUP_PALETTES["comm"]


def test_a_category_keeps_its_colour_whatever_else_the_plan_has():
    """Issue 17.10: dp_param_gather was orange in one plan and ep_a2a in the next."""
    one = charts.category_colors({"dp_param_gather": "comm", "mlp": "compute"})
    other = charts.category_colors({"ep_a2a": "comm", "tp_comm": "comm", "dp_param_gather": "comm", "mlp": "compute"})
    assert one["dp_param_gather"] == other["dp_param_gather"] and one["mlp"] == other["mlp"]
    assert other["ep_a2a"] != other["dp_param_gather"]


def test_fixed_palette_is_one_colour_per_category_and_grey_only_for_waiting():
    fixed = charts.CATEGORY_COLORS
    named = {k: v for k, v in fixed.items() if k != "head"}  # "head" is lm_head's other name
    assert len(set(named.values())) == len(named)  # no two categories share a colour
    greys = {k for k, v in fixed.items() if len({v[1:3], v[3:5], v[5:7]}) == 1}
    assert greys == {"pipeline_bubble", "idle", "wait"}


def test_every_category_of_real_plans_has_a_fixed_colour(report):
    moe = perfsim.simulate("mixtral-8x7b", "mi300x-pollara", nodes=2, tp=2, cp=2, ep=4, zero=3, pp=2, gbs=16,
                           seq=2048, recompute="full", check_memory=False)
    categories = set()
    for r in (report, moe):
        bars = derive.gantt_bars(r.spans, r.step_time_s, 500) + derive.idle_bars(r.spans, r.step_time_s)
        categories |= set(r.breakdown) | {b["category"] for b in bars}
    assert {"ep_a2a", "cp_comm", "tp_comm", "experts"} <= categories
    assert categories <= set(charts.CATEGORY_COLORS), categories - set(charts.CATEGORY_COLORS)


def test_breakdown_bar_sums_to_the_step(report):
    fig = charts.breakdown_bar(derive.breakdown_rows(report.breakdown, report.overlapped_comm_s),
                               report.overlapped_comm_s)
    step = [t for t in fig.data if t.y[0] == "step"]
    assert sum(t.x[0] for t in step) == pytest.approx(report.step_time_s * 1e3, rel=1e-9)
    assert fig.layout.barmode == "stack"


def test_memory_parts_keep_their_colour_across_plans(report):
    fig = charts.memory_bar(report.memory, report.memory_capacity_bytes)
    without_logits = [{k: v for k, v in m.items() if k != "logits_bytes"} for m in report.memory]
    other = charts.memory_bar(without_logits, report.memory_capacity_bytes)
    colours = {t.name: t.marker.color for t in fig.data}
    assert all(colours[t.name] == t.marker.color for t in other.data) and len(set(colours.values())) == len(colours)


def test_memory_bar_has_parts_and_capacity(report):
    fig = charts.memory_bar(report.memory, report.memory_capacity_bytes)
    assert len(fig.data) == len(charts.memory_parts(report.memory)) >= len(charts.MEMORY_PARTS)
    assert len(fig.data[0].x) == 2
    totals = [sum(t.y[i] for t in fig.data) for i in range(2)]
    assert totals == pytest.approx([m["total_bytes"] / 1e9 for m in report.memory])
    assert fig.layout.shapes[0].y0 == pytest.approx(report.memory_capacity_bytes / 1e9)


def test_gantt_rows_and_durations(report):
    bars = derive.gantt_bars(report.spans, report.step_time_s, 500)
    fig = charts.gantt(bars, derive.span_groups(bars))
    assert sum(len(t.x) for t in fig.data) == len(bars)
    assert sum(sum(t.x) for t in fig.data) == pytest.approx(sum(b["end_s"] - b["start_s"] for b in bars) * 1e3)
    assert len(fig.layout.yaxis.categoryarray) == len({(b["rank"], b["stream"]) for b in bars})
    json.loads(fig.to_json())  # serializable for the browser


def test_busbw_chart_lines_and_points():
    predicted = [{"op": "all_reduce", "ranks": 8, "size_bytes": s, "busbw_GBps": s / 1e6} for s in (1, 2)]
    measured = [{"series": "m", "ranks": 8, "size_bytes": 1, "busbw_GBps": 1.0}]
    fig = charts.busbw_chart(predicted, measured)
    assert [t.mode for t in fig.data] == ["lines+markers", "markers"] and fig.layout.xaxis.type == "log"
    assert charts.busbw_chart(predicted, []).data[0].name.startswith("all_reduce · 8 GPUs")


def test_utilization_bar_in_percent():
    fig = charts.utilization_bar([{"rank": 0, "stream": "dp_comm", "busy_fraction": 0.25, "busy_s": 1,
                                   "bytes": 1e9, "busy_GBps": 1.0}])
    assert fig.data[0].x[0] == pytest.approx(25)


def test_pareto_chart_and_compare_bars():
    pts = [{"x": 1, "y": 2, "label": "a"}, {"x": 2, "y": 1, "label": "b"}]
    fig = charts.pareto_chart(pts, derive.pareto_front(pts, "x", "y"), "x", "y")
    assert len(fig.data[0].x) == 2 and len(fig.data[1].x) == 1
    bars = charts.compare_bars({"a": {"m": 2.0}, "b": {"m": 3.0}}, (("m", "metric"),))
    assert [t.y[0] for t in bars.data] == pytest.approx([100, 150])


def test_predicted_vs_measured_error_axis():
    rows = [{"series": "s", "size_bytes": 8, "measured": 100, "predicted": 110}]
    fig = charts.predicted_vs_measured(rows)
    error = next(t for t in fig.data if t.yaxis == "y2")
    assert error.y[0] == pytest.approx(10)


# ---- inputs ---------------------------------------------------------------------------------

def test_default_inputs_are_the_zaya1_run():
    d = planner_inputs.default_inputs()
    assert (d["model"], d["cluster"], d["nodes"]) == ("zaya1-base", "mi300x-pollara", 128)
    assert {k: d["knobs"][k] for k in ("dp", "zero", "mbs", "gbs", "seq")} == {
        "dp": 1024, "zero": 1, "mbs": 1, "gbs": 2048, "seq": 4096}
    d["knobs"]["tp"] = 8
    assert planner_inputs.default_inputs()["knobs"]["tp"] == 1  # a copy each time


def test_simulate_matches_the_api():
    d = planner_inputs.default_inputs()
    direct = perfsim.simulate("zaya1-base", "mi300x-pollara", nodes=128, dp=1024, zero=1, mbs=1, gbs=2048, seq=4096)
    assert planner_inputs.simulate(d).step_time_s == direct.step_time_s
    d["knobs"]["dp"] = 0  # derived from the GPU count
    assert planner_inputs.simulate(d).plan["dp"] == 1024


def test_uploaded_config_and_its_errors():
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
              "num_key_value_heads": 4, "intermediate_size": 4096, "vocab_size": 32000}
    d = planner_inputs.default_inputs() | {"model": "mini", "model_config": json.dumps(config)}
    assert planner_inputs.model_spec(d).num_layers == 4
    with pytest.raises(perfsim.ConfigError, match="not valid JSON"):
        planner_inputs.model_spec(d | {"model_config": "{nope"})
    with pytest.raises(perfsim.ConfigError, match="JSON object"):
        planner_inputs.model_spec(d | {"model_config": "[1]"})


def test_with_plan_normalize_and_cache_key():
    d = planner_inputs.default_inputs()
    new = planner_inputs.with_plan(d, {"tp": 8, "dp": 128, "schedule": "interleaved", "unknown": 1})
    assert new["knobs"]["tp"] == 8 and new["knobs"]["schedule"] == "interleaved" and d["knobs"]["tp"] == 1
    assert planner_inputs.normalize({"nodes": 4, "knobs": {"tp": 2}})["knobs"]["gbs"] == 2048
    assert planner_inputs.cache_key(d) == planner_inputs.cache_key(json.loads(json.dumps(d)))
    assert planner_inputs.cache_key(d) != planner_inputs.cache_key(new)
    assert planner_inputs.nodes_for(1024, 8) == 128 and planner_inputs.nodes_for(9, 8) == 2


def test_an_opened_search_plan_prices_as_searched():
    # the search's block recompute, TP-comm overlap and bucket size reach the Plan page's knobs
    # (before: an opened full/38 plan recomputed every layer without TP overlap, 20.9 s vs 17.1 s)
    result = perfsim.search("llama3.1-70b", "mi300x-pollara", gpus=8, gbs=16, seq=8192, executor="serial", top=1,
                            confirm=1, fixed={"tp": 8, "pp": 1, "mbs": 2, "zero": 1, "cp": 1})
    row = derive.search_rows(result)[0]
    assert row["recompute"].startswith("full/") and "recompute=full/" in row["label"]
    base = planner_inputs.normalize({"model": "llama3.1-70b", "nodes": 1, "estimator": "analytic"})
    opened = planner_inputs.simulate(planner_inputs.with_plan(base, row["plan"]))
    for key in ("recompute", "recompute_layers", "tp_comm_overlap", "grad_bucket_bytes"):
        assert opened.plan[key] == row["plan"][key], key
    closed_form = perfsim.estimate("llama3.1-70b", "mi300x-pollara", nodes=1, **{
        k: v for k, v in row["plan"].items() if k in ParallelPlan.__dataclass_fields__ and k != "stack"})
    assert opened.step_time_s == pytest.approx(closed_form.step_time_s, rel=1e-9)


def test_critical_path_rows_cover_the_breakdown_and_sum_to_the_step(report):
    """Issue 17.11: the Plan page shows the path next to the breakdown; both sum to the step."""
    rows = derive.critical_path_rows(report)
    assert sum(v for _, v in rows) == pytest.approx(report.step_time_s, rel=1e-6)
    assert {k for k, _ in rows} >= set(report.breakdown)
    assert dict(rows)["pipeline_bubble"] == 0.0 and report.breakdown["pipeline_bubble"] > 0
    note = derive.critical_path_note(report)
    assert f"{report.step_time_s * 1e3:,.1f} ms" in note and "longest chain" in note
    closed = perfsim.estimate("llama3.1-8b", "mi300x-pollara", nodes=2, tp=2, pp=2, gbs=32, seq=2048, check_memory=False)
    assert "traces no op chain" in derive.critical_path_note(closed)


def test_kernel_rows_show_the_achieved_rate_and_how_each_row_was_timed():
    from perfsim.calibration.readers import KernelPoint

    gemm = KernelPoint(kind="gemm", dtype="fp8", device="MI300X", time_s=100e-6, m=1024, n=1024, k=1024, timing="host")
    copy = KernelPoint(kind="memory", dtype="bf16", device="MI300X", time_s=1e-3, bytes=4e9, kernel="copy")
    rows = derive.kernel_rows([gemm, copy])
    assert [r["timing"] for r in rows] == ["host", "device"]
    assert rows[0]["achieved"] == f"{2 * 1024 ** 3 / 100e-6 / 1e12:.1f} TFLOPS" and rows[1]["achieved"] == "4.00 TB/s"


def test_memory_bar_shows_the_zero3_working_buffers():
    """The planner's memory chart draws ZeRO-3's gathered weights / gradients as their own part."""
    r = perfsim.simulate("llama3.1-8b", "mi300x-pollara", gpus=8, dp=8, zero=3, gbs=8, seq=2048, estimator="analytic")
    assert r.memory[0]["zero_buffers_bytes"] > 1e9  # a layer + the prefetched one + the 128k-vocab ends, gathered
    fig = charts.memory_bar(r.memory, r.memory_capacity_bytes)
    assert "zero_buffers" in {t.name for t in fig.data}


def test_memory_bar_marks_the_peak_where_gradients_reuse_freed_activations():
    """Under MaxText one microbatch's gradients are written where its activations were freed:
    the stacked parts overshoot the stage's peak, which the chart marks on its own; the reuse
    is not drawn as a part. A Megatron plan has no such marker."""
    kw = dict(gpus=8, dp=8, zero=3, gbs=8, seq=2048, estimator="analytic")
    r = perfsim.simulate("llama3.1-8b", "mi300x-pollara", stack="maxtext", **kw)
    (stage,) = r.memory
    assert stage["reused_bytes"] > 0 and r.peak_memory_bytes == stage["total_bytes"]
    fig = charts.memory_bar(r.memory, r.memory_capacity_bytes)
    bars = [t for t in fig.data if t.type == "bar"]
    assert "reused" not in {t.name for t in bars}
    assert sum(t.y[0] for t in bars) * charts.GB == pytest.approx(stage["total_bytes"] + stage["reused_bytes"])
    (peak,) = [t for t in fig.data if t.type == "scatter"]
    assert peak.y[0] * charts.GB == pytest.approx(stage["total_bytes"])
    plain = perfsim.simulate("llama3.1-8b", "mi300x-pollara", stack="megatron-primus", **kw)
    assert plain.memory[0]["reused_bytes"] == 0
    assert not [t for t in charts.memory_bar(plain.memory, plain.memory_capacity_bytes).data if t.type == "scatter"]


def test_the_planner_offers_the_blocked_routing():
    """The Plan page's MoE routing choice 'blocked' is the uniform shares with each token's
    top-k one block of expert ids (RoutingSpec.topk_block), as `--routing blocked` is."""
    assert "blocked" in planner_inputs.CHOICES["distribution"]
    spec = planner_inputs.routing_spec({"routing": {"distribution": "blocked"}})
    assert spec.topk_block and spec.distribution == "uniform"
    assert not planner_inputs.routing_spec({"routing": {"distribution": "zipf"}}).topk_block
