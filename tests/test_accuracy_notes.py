"""Every report says how far perfsim's own held-out checks put a prediction like it
(perfsim.calibration.accuracy, its accuracy.toml): the figures agree with the committed evaluation
(docs/accuracy.md, validation/runs/accuracy_runs.csv), and a report quotes the ones that
apply to its stack, GPU, dtype and cluster, and none where they do not apply."""

import copy
import csv
import dataclasses
import json
import re
import statistics
from pathlib import Path

import pytest
from conftest import tiny_dense, tiny_moe

from perfsim import simulate
from perfsim.calibration import accuracy
from perfsim.system.stacks import load_stack, write_stack

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "accuracy.md").read_text()


def _doc_rows(header: str) -> list[list[str]]:
    """The rows of the markdown table that follows ``header`` in docs/accuracy.md."""
    block = DOC[DOC.index(header):]
    rows, started = [], False
    for line in block.splitlines()[1:]:
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif started:
            break
    return rows[2:]  # past the head and the rule


def test_kernel_figures_are_the_docs_table():
    quoted = accuracy.figures()["kernels"]
    doc = {(g, k, d): (int(n), float(m)) for g, k, d, n, m, *_ in _doc_rows("### Held-out MAPE per GPU")
           if k in ("gemm", "attention", "grouped_gemm")}
    mine = {(g, *key.split(".")): (c["points"], c["held_out_mape_pct"])
            for g, v in quoted.items() for key, c in v["cells"].items()}
    assert mine == doc and len(mine) > 10


def test_stack_figures_are_the_committed_held_out_runs():
    rows = list(csv.DictReader(open(ROOT / "validation" / "runs" / "accuracy_runs.csv")))
    stacks = accuracy.figures()["stacks"]
    assert set(stacks) == {r["stack"] for r in rows}
    for stack, f in stacks.items():
        mine = [r for r in rows if r["stack"] == stack]
        errs = [float(r["held_out_error_pct"]) for r in mine]
        worst = max(mine, key=lambda r: abs(float(r["held_out_error_pct"])))
        assert f["runs"] == len(mine) and f["sources"] == len({r["source_id"] for r in mine})
        assert f["held_out_median_abs_pct"] == pytest.approx(statistics.median(map(abs, errs)), abs=0.06)
        assert (f["worst_run"], f["worst_error_pct"]) == (worst["id"], pytest.approx(float(worst["held_out_error_pct"]), abs=0.06))
        assert f["within_25_pct"] == sum(abs(e) <= 25 for e in errs)
        assert sum(v["runs"] for v in f["by_vendor"].values()) == f["runs"]


def test_fabric_figures_are_the_docs_check_rows():
    doc = {}
    for series, profile, role, _points, large, small, note in _doc_rows("### Collective time (all_reduce, all_gather, reduce_scatter, all-to-all)"):
        if role == "check" and "not a target" not in note:  # a series outside what its profile describes is shown only
            doc[series.strip("`")] = (profile, None if large == "-" else float(large), None if small == "-" else float(small))
    quoted = {s: (p, v.get("mape_ge_1MB_pct"), v.get("mape_lt_1MB_pct"))
              for p, series in accuracy.figures()["fabric"].items() for s, v in series.items()}
    assert quoted == doc and quoted


def _notes(model, cluster="mi300x-pollara", **knobs):
    return simulate(model, cluster, seq=2048, estimator="analytic", **knobs).accuracy


def test_ideal_says_how_far_runs_priced_without_a_stack_come_out():
    notes = _notes(tiny_dense(), gpus=8, dp=8, gbs=16)
    line = notes["lines"][0]
    assert notes["stack"]["checked"] is False and "adds no framework cost" in line
    moe = accuracy.figures()["ideal"]["moe"]
    assert f"{moe['error_max_pct']:+.0f}%" in line  # the MoE runs' worst, as the table has it


def test_a_shipped_stack_quotes_its_held_out_runs_and_says_where_they_ran():
    figures = accuracy.figures()["stacks"]["maxtext"]
    on = _notes(tiny_moe(), "mi355x-pollara", gpus=8, dp=8, ep=4, gbs=16, stack="maxtext")
    assert on["stack"]["checked"] and on["stack"]["runs"] == figures["runs"]
    assert f"median |error| {figures['held_out_median_abs_pct']:.1f}%" in on["lines"][0]
    assert "none on" not in on["lines"][0]
    off = _notes(tiny_moe(), "h100-ib", gpus=8, dp=8, ep=4, gbs=16, stack="maxtext")
    assert "none on NVIDIA GPUs" in off["lines"][0]  # every maxtext run is on an AMD GPU


def test_a_stack_run_on_both_vendors_quotes_the_runs_of_the_gpus_vendor():
    """A stack runs other kernel libraries on each vendor, so its held-out figures are quoted
    for the runs on the plan's GPU vendor (nemo: its H100 and H200 runs for H100 / H200, MLPerf
    MI355X / MI350X runs for AMD GPUs)."""
    nemo = accuracy.figures()["stacks"]["nemo"]
    nvidia, amd = nemo["by_vendor"]["nvidia"], nemo["by_vendor"]["amd"]
    assert nvidia["runs"] + amd["runs"] == nemo["runs"] and nvidia["gpus"] == ["h100", "h200"]
    h200 = _notes(tiny_dense(), "h200-ib", gpus=8, dp=8, gbs=16, stack="nemo")["lines"][0]
    assert f"{nvidia['runs']} published runs on NVIDIA GPUs" in h200 and "h100/h200" in h200 and "none on h200" not in h200
    assert f"median |error| {nvidia['held_out_median_abs_pct']:.1f}%" in h200
    mi355x = _notes(tiny_dense(), "mi355x-pollara", gpus=8, dp=8, gbs=16, stack="nemo")["lines"][0]
    assert f"{amd['runs']} published runs on AMD GPUs" in mi355x and amd["worst_run"] in mi355x


def test_an_edited_or_own_stack_is_not_quoted_at_the_shipped_figures(tmp_path):
    edited = load_stack("maxtext").with_values(**{"kernels.speed": 0.5})
    notes = _notes(tiny_dense(), gpus=8, dp=8, gbs=16, stack=edited)
    assert notes["stack"]["checked"] is False and "not the shipped profile" in notes["lines"][0]
    own = write_stack(load_stack("maxtext").with_values(**{"kernels.speed": 0.5}), tmp_path / "mine.toml")
    spec = load_stack(own)
    notes = _notes(tiny_dense(), gpus=8, dp=8, gbs=16, stack=spec)
    assert notes["stack"]["checked"] is False
    unshipped = load_stack(write_stack(dataclasses.replace(spec, name="mystack"), tmp_path / "my.toml"))
    notes = _notes(tiny_dense(), gpus=8, dp=8, gbs=16, stack=unshipped)
    assert "of your own" in notes["lines"][0]


def test_kernels_quote_the_plan_dtype_the_moe_class_and_a_derived_gpu_at_its_base():
    fp8 = _notes(tiny_dense(), "h100-ib", gpus=8, dp=8, gbs=16, dtype="fp8")
    cell = accuracy.figures()["kernels"]["h100"]["cells"]["gemm.fp8"]
    assert fp8["kernels"]["cells"]["gemm.fp8"]["held_out_mape_pct"] == cell["held_out_mape_pct"]
    assert f"GEMM fp8 {cell['held_out_mape_pct']:.1f}%" in fp8["lines"][1]
    dense = _notes(tiny_dense(), gpus=8, dp=8, gbs=16)
    assert "grouped GEMM" not in dense["lines"][1]
    moe = _notes(tiny_moe(), gpus=8, dp=8, ep=4, gbs=16)
    assert "grouped_gemm.bf16" in moe["kernels"]["cells"]
    derived = _notes(tiny_dense(), "mi350x-pollara", gpus=8, dp=8, gbs=16)
    # MI350X's own BF16 GEMM rows (session 46) give it its own cell; its attention is MI355X's
    assert derived["kernels"]["cells"]["gemm.bf16"]["gpu"] == "mi350x"
    assert derived["kernels"]["cells"]["attention.bf16"]["gpu"] == "mi355x" and "on mi355x: same die" in derived["lines"][1]


def test_a_gpu_pricing_experts_at_another_gpus_grouped_tables_quotes_that_gpus_figure(capsys):
    """MI355X (and MI350X) borrow MI300X's grouped tables (no grouped measurement of their
    own): an MoE plan's note quotes MI300X's held-out grouped figure as MI300X's, never as a
    check on this GPU, and a dense plan's note has no grouped part; ``list --accuracy`` says
    where the grouped tables come from."""
    from perfsim.cli import main

    donor = accuracy.figures()["kernels"]["mi300x"]["cells"]["grouped_gemm.bf16"]
    for cluster in ("mi355x-pollara", "mi350x-pollara"):
        assert accuracy.figures()["kernels"][cluster.split("-")[0]]["grouped_from"] == "mi300x"
        moe = _notes(tiny_moe(), cluster, gpus=8, dp=8, ep=4, gbs=16)
        cell = moe["kernels"]["cells"]["grouped_gemm.bf16"]
        assert cell["gpu"] == "mi300x" and cell["borrowed"] is True
        assert cell["held_out_mape_pct"] == donor["held_out_mape_pct"]
        assert (f"grouped GEMM bf16 at mi300x's table, no measurement of it on this GPU (mi300x's held-out "
                f"{donor['held_out_mape_pct']:.1f}%, {donor['points']} points)") in moe["lines"][1]
    assert "grouped" not in _notes(tiny_dense(), "mi355x-pollara", gpus=8, dp=8, gbs=16)["lines"][1]
    h100 = _notes(tiny_moe(), "h100-ib", gpus=8, dp=8, ep=4, gbs=16)["kernels"]["cells"]["grouped_gemm.bf16"]
    assert h100["gpu"] == "h100" and "borrowed" not in h100  # its own measured table
    assert main(["list", "--accuracy"]) == 0
    assert "mi355x   [grouped tables from mi300x]" in capsys.readouterr().out


def test_an_fp8_moe_plan_on_a_borrowing_gpu_names_the_fp8_cell_it_quotes():
    """The borrowed grouped figure keeps the plan's dtype in its label: an FP8 MoE plan on
    MI355X quotes MI300X's FP8 grouped cell as FP8 (not under the BF16 label)."""
    donor = accuracy.figures()["kernels"]["mi300x"]["cells"]["grouped_gemm.fp8"]
    fp8 = _notes(tiny_moe(), "mi355x-pollara", gpus=8, dp=8, ep=4, gbs=16, dtype="fp8")
    assert fp8["kernels"]["cells"]["grouped_gemm.fp8"]["held_out_mape_pct"] == donor["held_out_mape_pct"]
    assert f"grouped GEMM fp8 at mi300x's table, no measurement of it on this GPU (mi300x's held-out " \
           f"{donor['held_out_mape_pct']:.1f}%, {donor['points']} points)" in fp8["lines"][1]


def test_a_kernel_library_table_quotes_its_held_out_figure_where_two_families_measure_it():
    """A stack naming a kernel library is priced at that library's table: the note quotes the
    table's held-out figure (each family's rows against the library's other families'), the
    same die's where the GPU has none of its own; a library only one family measures is said
    to be fitted in sample."""
    notes = _notes(tiny_dense(), gpus=8, dp=8, gbs=16, stack="megatron-primus")
    assert notes["kernels"]["libraries"] == {"attention": "aiter_v3"}
    aiter = accuracy.figures()["kernels"]["mi300x"]["libraries"]["aiter_v3"]
    assert notes["kernels"]["cells"]["attention.aiter_v3"] == {"gpu": "mi300x", **aiter}
    assert (f"attention at its aiter_v3 table {aiter['held_out_mape_pct']:.1f}% ({aiter['points']} points, each family "
            f"against the library's other families)") in notes["lines"][1]
    mi355x = _notes(tiny_dense(), "mi355x-pollara", gpus=8, dp=8, gbs=16, stack="maxtext")
    assert "attention at its aiter_v3 table (in-sample fit, no held-out figure)" in mi355x["lines"][1]
    grouped = accuracy.figures()["kernels"]["h200"]["libraries"]["torch_grouped_mm"]
    titan = _notes(tiny_moe(), "h100-ib", gpus=8, dp=8, ep=4, gbs=16, stack="torchtitan")
    assert titan["kernels"]["cells"]["grouped_gemm.torch_grouped_mm"]["gpu"] == "h200"
    assert (f"grouped GEMM bf16 at its torch_grouped_mm table {grouped['held_out_mape_pct']:.1f}% ({grouped['points']} "
            f"points, each family against the library's other families; on h200: same die)") in titan["lines"][1]


def test_collectives_quote_the_held_out_series_of_the_cluster_profile_only():
    ours = _notes(tiny_dense(), gpus=8, dp=8, gbs=16)["lines"][2]
    series = accuracy.figures()["fabric"]["mi300x-pollara"]
    assert f"collectives mi300x-pollara: {len(series)} held-out series (all_reduce; 1-2 nodes)" in ours
    # a profile checked on several collectives names each, in the order a step runs them
    rccl227 = accuracy.fabric_note("mi355x-pollara-rccl227")[1]
    assert "(all_reduce, all_gather, reduce_scatter, all_to_all; 1-3 nodes)" in rccl227
    none = _notes(tiny_dense(), "mi350x-pollara", gpus=8, dp=8, gbs=16)
    assert none["collectives"]["checked"] is False and "no held-out collective series" in none["lines"][2]


def test_text_json_and_html_reports_carry_the_lines(tmp_path, capsys):
    from perfsim.cli import main

    assert main(["simulate", "--model", "llama3.1-8b", "--cluster", "mi300x-pollara", "--nodes", "1", "--dp", "8",
                 "--mbs", "1", "--gbs", "16", "--seq", "2048", "--engine", "analytic", "--stack", "megatron-primus",
                 "--html", str(tmp_path / "r.html")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^accuracy \(perfsim's own held-out checks", text, re.M)
    assert "  stack megatron-primus: " in text
    assert "How far to trust this" in (tmp_path / "r.html").read_text()
    assert main(["simulate", "--model", "llama3.1-8b", "--cluster", "mi300x-pollara", "--nodes", "1", "--dp", "8",
                 "--mbs", "1", "--gbs", "16", "--seq", "2048", "--engine", "analytic", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["accuracy"]["lines"]) == 3 and data["accuracy"]["kernels"]["gpu"] == "mi300x"


def test_without_the_figures_file_a_report_quotes_nothing(monkeypatch):
    monkeypatch.setattr(accuracy, "figures", lambda: {})
    accuracy._notes.cache_clear()
    try:
        assert _notes(tiny_dense(), gpus=8, dp=8, gbs=16) == {}
    finally:
        accuracy._notes.cache_clear()


def test_a_calibrated_or_edited_gpu_or_cluster_is_not_quoted_at_the_shipped_figures(tmp_path):
    from perfsim.system.hardware import load_cluster, write_cluster

    shipped = load_cluster("mi300x-pollara")
    more_nodes = _notes(tiny_dense(), shipped.with_nodes(4), gpus=32, dp=32, gbs=64)
    assert more_nodes["kernels"]["checked"] and more_nodes["collectives"]["checked"]  # the node count is the plan's
    gpu = dataclasses.replace(shipped.gpu, kernel_launch_us=9.0)  # as a kernel calibration would change it
    edited = _notes(tiny_dense(), dataclasses.replace(shipped, gpu=gpu), gpus=8, dp=8, gbs=16)
    assert edited["kernels"]["checked"] is False and "not the shipped tables" in edited["lines"][1]
    assert edited["collectives"]["checked"] is False and "not as shipped" in edited["lines"][2]
    path = write_cluster(dataclasses.replace(shipped, name="my-cluster"), tmp_path / "my-cluster.toml")
    own = _notes(tiny_dense(), load_cluster(path), gpus=8, dp=8, gbs=16)
    assert own["kernels"]["checked"] and own["collectives"]["checked"] is False  # shipped GPU, a cluster of one's own


def test_a_search_says_it_once_for_every_plan():
    from perfsim.search import search

    result = search(tiny_moe(), "mi300x-pollara", gpus=8, gbs=16, seq=2048, stack="maxtext", workers=1, top=3)
    assert result.accuracy == _notes(tiny_moe(), gpus=8, dp=8, gbs=16, stack="maxtext")
    text = result.summary()
    assert "the same for every plan here" in text and "  stack maxtext: " in text


def test_plan_to_plan_error_is_the_docs_one_run_table():
    rows = _doc_rows("Calibrated on one run")
    quoted = accuracy.figures()["plans"]
    assert [(g["source"], g["model"], g["runs"], g["mape_pct"], g["median_abs_pct"]) for g in quoted["groups"]] == [
        (source, model, int(n), float(mape.rstrip("%")), float(median.rstrip("%")))
        for source, model, _cluster, n, _pairs, mape, median, _worst in rows]
    # written rounded to 0.1 (an even number of groups takes the mean of the middle two)
    assert accuracy.plan_to_plan_pct() == pytest.approx(statistics.median(g["median_abs_pct"] for g in quoted["groups"]),
                                                        abs=0.051)


def test_a_search_says_how_many_ranked_plans_are_within_the_plan_to_plan_error(monkeypatch):
    from perfsim.search import search

    result = search(tiny_moe(), "mi300x-pollara", gpus=8, gbs=16, seq=2048, workers=1, top=6)
    win = result.rows[0].step_time_s
    margin = accuracy.plan_to_plan_pct()
    close = sum(100 * (r.step_time_s / win - 1) < margin for r in result.rows[1:])
    line = next((l for l in result.summary().splitlines() if "plan-to-plan error" in l), None)
    assert (line is not None) == (close > 0)
    if line:
        assert line.startswith(f"{close} of the other {len(result.rows) - 1} ranked plans on 8 GPUs are within {margin:.1f}%")
    import sys

    monkeypatch.setattr(sys.modules["perfsim.search"], "plan_to_plan_pct", lambda: 0.0)  # no margin: none too close
    assert "plan-to-plan error" not in result.summary()


def test_list_accuracy_prints_every_figure(capsys):
    from perfsim.cli import main

    assert main(["list", "--accuracy"]) == 0
    out = capsys.readouterr().out
    facts = accuracy.figures()
    for name, f in facts["stacks"].items():
        assert f"  {name:<16} {f['runs']:>3} runs" in out and f["worst_run"] in out
    for gpu, v in facts["kernels"].items():
        for key, cell in v["cells"].items():
            assert f"{key} {cell['held_out_mape_pct']:.1f}% ({cell['points']})" in out
    for series in (s for v in facts["fabric"].values() for s in v):
        assert series in out
    assert f"median {facts['plans']['median_abs_pct']:.1f}% over {len(facts['plans']['groups'])} groups" in out
    assert f"on NVIDIA GPUs {facts['stacks']['nemo']['by_vendor']['nvidia']['runs']} runs" in out  # per vendor


def test_stack_memory_figures_are_the_docs_memory_table():
    """Per stack, the predicted peaks against the printed ones and the runs predicted not to
    fit (all of them ran) are docs/accuracy.md's memory table."""
    stacks = accuracy.figures()["stacks"]
    rows = _doc_rows("Memory per stack")
    assert {r[0] for r in rows} == set(stacks)
    for stack, runs, peaks, median, spread, oom in rows:
        f = stacks[stack]
        assert int(runs) == f["runs"] and int(oom) == f["predicted_not_to_fit"]
        assert int(peaks) == f.get("peaks", 0)
        if f.get("peaks"):
            lo, hi = (float(x.rstrip("%")) for x in spread.split(" to "))
            assert float(median.rstrip("%")) == pytest.approx(f["peak_median_abs_pct"], abs=0.06)
            assert (lo, hi) == (pytest.approx(f["peak_error_min_pct"], abs=0.06),
                                pytest.approx(f["peak_error_max_pct"], abs=0.06))
    # the runs table's peak column ("predicted / printed (+e%)") agrees with each stack's range
    errors: dict[str, list[float]] = {}
    for run, stack, *_, peak, _ in _doc_rows("What the figures say:"):  # the per-run table follows it
        if "/" in peak:
            errors.setdefault(stack, []).append(float(peak.split("(")[1].rstrip("%)")))
    assert stacks["torchtitan"]["peaks"] >= 10 and set(errors) == {s for s, f in stacks.items() if f.get("peaks")}
    for stack, found in errors.items():
        assert len(found) == stacks[stack]["peaks"]
        assert min(found) == pytest.approx(stacks[stack]["peak_error_min_pct"], abs=0.51)
        assert max(found) == pytest.approx(stacks[stack]["peak_error_max_pct"], abs=0.51)


def test_a_report_quotes_how_far_its_stacks_peaks_were_from_the_printed_ones(monkeypatch):
    f = accuracy.figures()["stacks"]["torchtitan"]
    line = _notes(tiny_dense(), "h100-ib", gpus=8, dp=8, zero=3, gbs=16, stack="torchtitan")["lines"][0]
    assert f"peak memory against {f['peaks']} printed peaks (+ = predicted above): median |error| " \
           f"{f['peak_median_abs_pct']:.0f}%" in line
    stacks = accuracy.figures()["stacks"]
    clusters = {"nvidia": "h100-ib", "amd": "mi355x-pollara"}

    def shown(name: str, vendor: str) -> dict:  # what a report on that vendor's GPU quotes
        return {**stacks[name], **stacks[name].get("by_vendor", {}).get(vendor, {})}

    def line(name: str, vendor: str) -> str:
        return _notes(tiny_moe(), clusters[vendor], gpus=8, dp=8, ep=4, gbs=16, stack=name)["lines"][0]

    cases = [(n, v) for n in stacks for v in clusters if shown(n, v).get("runs")]
    # a stack all of whose runs there fit says nothing of it
    name, vendor = next((n, v) for n, v in cases if not shown(n, v).get("predicted_not_to_fit"))
    assert f"{shown(name, vendor)['runs']} published runs" in line(name, vendor)
    assert "predicted not to fit" not in line(name, vendor)
    # a stack whose sources print no peak, and of whose runs perfsim predicts one or more not to
    # fit, says how many (every shipped run fits since session 32: such a table is made here)
    name, vendor = next((n, v) for n, v in cases if "peaks" not in shown(n, v))
    table = copy.deepcopy(accuracy.figures())  # the shipped table is cached: edit a copy
    own = table["stacks"][name]
    for figures in (own, *own.get("by_vendor", {}).values()):
        figures.update(predicted_not_to_fit=2)
    monkeypatch.setattr(accuracy, "figures", lambda: table)
    from perfsim.system.stacks import load_stack

    gpu = {"nvidia": "h100", "amd": "mi355x"}[vendor]
    said = accuracy.stack_note(load_stack(name), gpu, vendor)[1]  # (the report's notes are cached per question)
    assert f"2 of {shown(name, vendor)['runs']} runs that ran predicted not to fit" in said
    assert "printed peak" not in said


def test_the_readme_block_is_what_a_maxtext_report_on_mi355x_pollara_prints():
    """The README shows the accuracy block of a report (MaxText MoE run, BF16, on mi355x-pollara):
    its lines are the ones perfsim quotes from the committed figures, so a regenerated
    accuracy.toml that moves them fails here until the README is updated with it."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```text\n(accuracy \(perfsim's own held-out checks.*?)```", readme, re.S).group(1)
    stack = load_stack("maxtext")
    notes = accuracy._notes(stack, "mi355x-pollara", "mi355x", "amd", "bf16", True,
                            (("attention", "aiter_v3"),), True, True)
    assert block.splitlines() == accuracy.text_block(notes)
