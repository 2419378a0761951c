"""CLI report options added for issue 17: `validate --html` without plotly is one clear
line and exit 2 (1 means "accuracy gate failed"); `search --objective cost` prints a $
column; `simulate --trace` compresses (.json.gz), keeps chosen stages and reports progress."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "validation" / "data" / "calibration" / "rccl-tests" / "mi300x_1node_8gpu_mpi_nograph_amdblog.log"
NO_PLOTLY = "import sys; sys.modules['plotly'] = None; from perfsim.cli import main; sys.exit(main(sys.argv[1:]))"


def test_validate_html_without_plotly_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", NO_PLOTLY, "validate", "--rccl-log", str(LOG), "--html", str(out),
                           "--max-mape", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--html" in lines[0] and "plotly" in lines[0] and "Traceback" not in done.stderr
    assert not out.exists() and done.stdout == ""  # refused before any work


def test_validate_html_with_plotly_writes_the_report(tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "perfsim", "validate", "--rccl-log", str(LOG), "--html", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 100_000 and "plotly" in out.read_text()[:200_000].lower()


# ---- search --objective cost: a $ column -----------------------------------------------------

SEARCH = ["search", "--model", "llama3.1-8b", "--gpus", "8", "--gbs", "64", "--seq", "2048", "--top", "3",
          "--confirm", "1", "--executor", "serial"]


def _main(argv, capsys):
    from perfsim.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_search_cost_objective_prints_a_dollar_column(capsys):
    code, out, _ = _main([*SEARCH, "--objective", "cost", "--usd-per-gpu-hour", "2.5"], capsys)
    assert code == 0
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    assert "$/Mtok" in lines[head]
    code, listed, _ = _main([*SEARCH, "--objective", "cost", "--usd-per-gpu-hour", "2.5", "--json"], capsys)
    rows = json.loads(listed)
    for line, row in zip(lines[head + 1:head + 1 + len(rows)], rows):
        assert f"${row['usd_per_mtoken']:,.3f}" in line  # the column is the priced figure of that row
    code, out, _ = _main(SEARCH, capsys)
    assert code == 0 and "$/Mtok" not in out  # not priced: no empty column


# ---- simulate --trace: compressed, per stage, with progress on stderr ----------------------------

SIM = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--pp", "2", "--gbs", "16", "--seq", "1024",
       "--engine", "analytic"]


def test_trace_gz_is_gzip_perfetto_json_and_progress_is_on_stderr(tmp_path, capsys):
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    assert _main([*SIM, "--trace", str(plain)], capsys)[0] == 0
    code, _, err = _main([*SIM, "--trace", str(packed)], capsys)
    assert code == 0 and "writing trace" in err and "trace written" in err
    with gzip.open(packed, "rt") as handle:
        unpacked = json.load(handle)
    assert unpacked["traceEvents"] == json.loads(plain.read_text())["traceEvents"]
    assert packed.stat().st_size < plain.stat().st_size / 4


def test_trace_stages_keeps_only_those_stages(tmp_path, capsys):
    path = tmp_path / "last.json"
    assert _main([*SIM, "--trace", str(path), "--trace-stages", "last"], capsys)[0] == 0
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {1}


@pytest.mark.parametrize("extra, field", [(["--trace-stages", "5"], "--trace-stages"),
                                          (["--trace-stages", "x"], "--trace-stages")])
def test_bad_trace_stages_are_one_line_exit_2(tmp_path, capsys, extra, field):
    code, _, err = _main([*SIM, "--trace", str(tmp_path / "t.json"), *extra], capsys)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


# ---- critical path vs breakdown: both explained, both sum to the step -----------------------------

def test_critical_path_and_breakdown_are_explained_and_both_sum_to_the_step(capsys):
    argv = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--pp", "2", "--gbs", "16", "--seq", "1024"]
    code, out, _ = _main(argv, capsys)
    assert code == 0
    assert "sums to the step" in out and "longest chain of dependent ops through all stages" in out
    code, listed, _ = _main([*argv, "--json"], capsys)
    report = json.loads(listed)
    step = report["step_time_s"]
    assert sum(report["breakdown"].values()) == pytest.approx(step, rel=1e-6)
    assert sum(report["critical_path_s"].values()) == pytest.approx(step, rel=1e-6)
    assert "pipeline_bubble" in report["breakdown"] and "pipeline_bubble" not in report["critical_path_s"]
    shown = next(line for line in out.splitlines() if line.startswith("critical path"))
    assert f"{step * 1e3:.1f} ms" in shown


# ---- simulate --html: a run report without plotly -------------------------------------------------

def test_html_run_report_has_every_section_and_the_true_message_sizes(tmp_path, capsys):
    from perfsim.cli import html_report

    path = tmp_path / "run.html"
    argv = ["simulate", "--model", "mixtral-8x7b", "--nodes", "2", "--tp", "2", "--ep", "4", "--pp", "2",
            "--gbs", "16", "--seq", "2048", "--allow-oom", "--engine", "analytic"]
    code, _, _ = _main([*argv, "--html", str(path)], capsys)
    assert code == 0
    text = path.read_text()
    for section in ("Plan", "Breakdown", "Memory per rank", "Communication", "Per layer", "Timeline"):
        assert f">{section}" in text, section
    report = perfsim.estimate("mixtral-8x7b", "mi300x-pollara", nodes=2, tp=2, ep=4, pp=2, gbs=16, seq=2048,
                              check_memory=False, trace=True)
    rows = html_report.comm_rows(report.spans)
    dispatch = next(r for r in rows if r["op"] == "dispatch_a2a")
    sizes = {s.bytes for s in report.spans if s.op == "dispatch_a2a"}
    assert dispatch["min_bytes"] == min(sizes) and dispatch["calls"] == sum(s.op == "dispatch_a2a" for s in report.spans)
    assert format_bytes(dispatch["min_bytes"]) in text
    layers = html_report.layer_comm_rows(report.spans, report.critical_stage)
    assert layers and all("dispatch_a2a" in row["ops"] for row in layers)
    assert "plotly" not in text  # self-contained: opens without plotly or a network
    code, _, err = _main([*argv, "--html", str(path)], capsys)
    assert code == 2 and "--html" in err  # an existing report is not replaced without --force


def test_closed_form_critical_path_says_it_is_the_breakdown(capsys):
    """The closed form traces no op chain: its 'critical path' is the critical stage's
    breakdown (bubble included), and the CLI says so instead of the engine's explanation."""
    argv = ["simulate", "--model", "llama3.1-8b", "--nodes", "1", "--pp", "2", "--gbs", "16", "--seq", "1024",
            "--engine", "analytic"]
    code, out, _ = _main(argv, capsys)
    assert code == 0 and "closed form: it traces no op chain" in out and "longest chain" not in out
    report = json.loads(_main([*argv, "--json"], capsys)[1])
    assert report["critical_path_s"] == {k: v for k, v in report["breakdown"].items() if v > 0}
