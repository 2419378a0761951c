"""The ``perfsim`` command line: the issue's simulate commands, the --json contract,
and bad input as exit 2 with one line on stderr, never a traceback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfsim import api
from perfsim.cli import main
from perfsim.system.hardware import list_profiles
from perfsim.model.io import list_models

CONTRACT = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
            "peak_memory_bytes", "breakdown", "plan", "world_size")
ZAYA1 = ("simulate --model zaya1-base --cluster mi300x-pollara --nodes 128 --dp 1024 --zero 1 "
         "--mbs 1 --gbs 2048 --seq 4096 --json")
MIXTRAL = ("simulate --model mixtral-8x22b --cluster mi300x-pollara --nodes 8 --tp 8 --pp 4 --ep 8 "
           "--mbs 1 --gbs 32 --seq 4096 --json")
LLAMA70B = ("simulate --model llama3.1-70b --cluster mi300x-pollara --nodes 8 --tp 8 --pp 4 "
            "--mbs 1 --gbs 32 --seq 4096 --json")


def run_json(capsys, command: str) -> dict:
    assert main(command.split()) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return json.loads(out.out)


@pytest.mark.parametrize("command, world", [(ZAYA1, 1024), (MIXTRAL, 64), (LLAMA70B, 64)], ids=["zaya1", "mixtral", "llama70b"])
def test_issue_commands_give_plausible_steps(capsys, command, world):
    d = run_json(capsys, command)
    assert set(CONTRACT) <= set(d)
    assert d["world_size"] == world
    assert 0.05 < d["mfu"] < 0.60
    assert d["peak_memory_bytes"] <= 192e9
    assert d["tokens_per_s"] == pytest.approx(d["plan"]["gbs"] * d["plan"]["seq"] / d["step_time_s"])


def test_zaya1_via_subprocess():
    exe = Path(sys.executable).with_name("perfsim")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "perfsim.cli"]
    proc = subprocess.run(cmd + ZAYA1.split(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert set(CONTRACT) <= set(d) and 0.05 < d["mfu"] < 0.60


def test_text_report(capsys):
    assert main("simulate --model llama3.1-8b --nodes 1 --gbs 8 --seq 2048".split()) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "MFU" in out and "breakdown" in out


def test_analytic_engine_flag(capsys):
    d = run_json(capsys, "simulate --model llama3.1-8b --nodes 1 --gbs 8 --seq 2048 --engine analytic --json")
    assert d["estimator"] == "analytic"


def test_trace_writes_valid_file(capsys, tmp_path):
    path = tmp_path / "out.json"
    assert main(f"simulate --model llama3.1-8b --nodes 1 --pp 2 --gbs 8 --seq 2048 --trace {path}".split()) == 0
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert events and all(e["name"] for e in events)


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in list_profiles("cluster") + list_profiles("gpu") + list_models():
        assert name in out
    assert "mi300x-pollara" in out and "zaya1-base" in out


def test_list_provenance_says_where_a_grouped_table_is_missing(capsys):
    """A GPU with no grouped-kernel table (its experts priced as one launch at the dense
    table) is listed with that assumption instead of leaving the table out; the shipped
    MI300X and H100 grouped tables are listed as measured, MI325X's and H200's as derived
    from their base GPUs', MI355X's (and so MI350X's) as derived from MI300X's, which it
    has no grouped measurement to replace."""
    import dataclasses

    from perfsim.system.hardware import load_gpu
    from perfsim.system.kernel_tables import table_provenance

    rows = {name: {t: status for t, status, _ in table_provenance(load_gpu(name))}
            for name in ("mi300x", "mi355x", "mi350x", "h100", "mi325x", "h200")}
    for name in ("mi300x", "h100"):
        assert rows[name]["grouped_gemm.bf16"] == "measured" and "grouped_gemm" not in rows[name]
    for name in ("mi325x", "h200", "mi355x", "mi350x"):
        assert rows[name]["grouped_gemm.bf16"] == "derived" and "grouped_gemm" not in rows[name]
    assert "the mi300x table" in load_gpu("mi355x").grouped_table("bf16").source
    bare = {t: (status, why) for t, status, why in table_provenance(dataclasses.replace(load_gpu("h100"), grouped_gemm={}))}
    assert bare["grouped_gemm"][0] == "assumed" and "one launch at the dense gemm table" in bare["grouped_gemm"][1]
    assert main(["list", "--provenance"]) == 0
    out = capsys.readouterr().out
    assert "derived: the mi300x table (no grouped-GEMM measurement of this GPU" in out
    assert "one launch at the dense gemm table" not in out  # every shipped GPU has a grouped table


def test_list_provenance_shows_every_cluster_table_and_the_sms_deepep_holds(capsys):
    """Per cluster: the cluster, node, fabric (and its fitted NIC ramp), collectives and
    each MoE dispatch implementation, with its status; the compute units a dispatch holds
    are said in its source."""
    from perfsim.system.hardware import cluster_provenance

    rows = {t: (status, source) for t, status, source in cluster_provenance(api.load_cluster("h100-ib"))}
    assert list(rows) == ["cluster", "node", "fabric", "fabric.message", "collectives", "dispatch.deepep",
                          "dispatch.deepep-ll"]
    assert rows["cluster"][0] == rows["fabric"][0] == "assumed" and rows["fabric.message"][0] == "fitted"
    assert rows["dispatch.deepep"][0] == "fitted" and "compute_units 20" in rows["dispatch.deepep"][1]
    amd = {t: (status, source) for t, status, source in cluster_provenance(api.load_cluster("mi355x-pollara"))}
    assert "compute_units 0" in amd["dispatch.mori"][1] and "assumed none held" in amd["dispatch.mori"][1]
    assert main(["list", "--provenance"]) == 0
    out = capsys.readouterr().out
    for name in ("h100-ib", "h200-ib", "mi300x-pollara", "mi355x-pollara"):
        assert f"\ncluster {name}:\n" in out
    assert re.search(r"^  dispatch\.deepep +fitted +fitted by validation/dispatch_accuracy.py", out, re.M)


def test_list_provenance_says_which_stack_values_are_fitted_sourced_or_assumed(capsys):
    """Per stack table: fitted where perfsim calibrate --runs fitted a value (maxtext's kernels
    speed and input pipeline, nemo's NVIDIA speed), assumed where its source says so first,
    sourced otherwise; ideal assumes everything."""
    from perfsim.system.stacks import list_stacks, load_stack, stack_provenance

    rows = {name: {t: status for t, status, _ in stack_provenance(load_stack(name))} for name in list_stacks()}
    assert set(rows["ideal"].values()) == {"assumed"}
    assert rows["maxtext"]["kernels"] == rows["maxtext"]["data"] == rows["nemo"]["kernels"] == "fitted"
    assert rows["megatron-primus"]["kernels"] == "assumed" and rows["torchtitan"]["kernels"] == "fitted"
    assert rows["nemo"]["overlap"] == "sourced"
    assert rows["nemo"]["calibration"] == "sourced" and rows["megatron-primus"]["calibration"] == "assumed"
    assert main(["list", "--provenance"]) == 0
    out = capsys.readouterr().out
    assert "\nstack nemo:\n" in out and re.search(r"^  kernels +fitted +speed 1.0 assumed", out, re.M)
    assert re.search(r"^  calibration +sourced +fit: kernels.speed_nvidia, moe.dropless_speed; ", out, re.M)


BAD = {
    "unknown-model": ("simulate --model gpt-17 --nodes 1 --gbs 8 --seq 1024", "gpt-17"),
    "malformed-profile": ("simulate --model llama3.1-8b --cluster {bad_toml} --gbs 8 --seq 1024", "bad.toml"),
    "missing-profile": ("simulate --model llama3.1-8b --cluster {tmp}/none.toml --gbs 8 --seq 1024", "none.toml"),
    "malformed-hf-config": ("simulate --model {bad_json} --nodes 1 --gbs 8 --seq 1024", "bad.json"),
    "tp-not-dividing-gpus": ("simulate --model llama3.1-8b --nodes 1 --tp 3 --gbs 8 --seq 1024", "3"),
    "tp-not-dividing-heads": ("simulate --model llama3.1-8b --gpus 6 --tp 6 --gbs 8 --seq 1024", "plan.tp (6)"),
    "gbs-not-dividing": ("simulate --model llama3.1-8b --nodes 1 --gbs 12 --seq 1024", "plan.gbs (12)"),
    "ep-on-dense": ("simulate --model llama3.1-8b --nodes 1 --ep 2 --gbs 8 --seq 1024", "plan.ep"),
    # an MoE-only option on a dense model is named, not silently dropped
    "capacity-on-dense": ("simulate --model llama3.1-8b --nodes 1 --capacity-factor 1.25 --gbs 8 --seq 1024",
                          "--capacity-factor: applies to MoE models; llama3.1-8b is dense"),
    "dispatch-on-dense": ("simulate --model llama3.1-8b --nodes 1 --dispatch mori --gbs 8 --seq 1024", "--dispatch:"),
    "routing-on-dense": ("simulate --model llama3.1-8b --nodes 1 --routing zipf --gbs 8 --seq 1024", "--routing:"),
    "ep-overlap-on-dense": ("simulate --model llama3.1-8b --nodes 1 --ep-comm-overlap --gbs 8 --seq 1024",
                            "--ep-comm-overlap:"),
    "dispatch-units-on-dense": ("simulate --model llama3.1-8b --nodes 1 --dispatch-compute-units 0 --gbs 8 --seq 1024",
                                "--dispatch-compute-units:"),
    "dispatch-units-negative": ("simulate --model olmoe-1b-7b --nodes 1 --ep 8 --dispatch-compute-units -4 --gbs 8 "
                                "--seq 1024", "--dispatch-compute-units"),
    "dispatch-units-beyond-the-gpu": ("simulate --model olmoe-1b-7b --cluster h100-ib --nodes 2 --ep 16 --dispatch deepep "
                                      "--dispatch-compute-units 132 --gbs 16 --seq 1024",
                                      "plan.dispatch_compute_units must be below the h100 GPU's 132 compute units"),
    "search-dispatch-units-on-dense": ("search --model llama3.1-8b --gpus 8 --gbs 16 --seq 1024 "
                                       "--dispatch-compute-units 0", "--dispatch-compute-units: applies to MoE models"),
    "search-ep-overlap-on-dense": ("search --model llama3.1-8b --gpus 8 --gbs 16 --seq 1024 --ep-comm-overlap",
                                   "--ep-comm-overlap: applies to MoE models; llama3.1-8b is dense"),
    "does-not-fit": ("simulate --model llama3.1-70b --nodes 1 --zero 0 --gbs 8 --seq 4096", "out of memory"),
    "no-fold-on-the-closed-form": ("simulate --model llama3.1-8b --gpus 8 --pp 8 --gbs 128 --seq 2048 --engine analytic "
                                   "--no-fold", "--no-fold: only the engine folds"),
    "no-fold-past-the-engine-limit": ("simulate --model llama3.1-8b --gpus 8 --pp 8 --gbs 512 --seq 2048 --no-fold",
                                      "let the engine fold the step (no --no-fold"),
    "unknown-flag": ("simulate --model llama3.1-8b --frobnicate 1", "--frobnicate"),
    "negative-tp": ("simulate --model llama3.1-8b --nodes 1 --tp -2 --gbs 8 --seq 1024", "-2"),
    "negative-nodes": ("simulate --model llama3.1-8b --nodes -4 --gbs 8 --seq 1024", "-4"),
    "negative-gbs": ("simulate --model llama3.1-8b --nodes 1 --gbs -8 --seq 1024", "-8"),
    "not-a-number": ("simulate --model llama3.1-8b --nodes 1 --gbs many --seq 1024", "many"),
    "missing-seq": ("simulate --model llama3.1-8b --nodes 1 --gbs 8", "--seq"),
    "bad-dtype": ("simulate --model llama3.1-8b --nodes 1 --gbs 8 --seq 1024 --dtype fp4", "fp4"),
    "unwritable-trace": ("simulate --model llama3.1-8b --nodes 1 --gbs 8 --seq 1024 --trace {tmp}/no/dir/t.json", "trace"),
    "unknown-command": ("bogus", "bogus"),
}


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "bad.toml").write_text("name = [\n")
    (tmp_path / "bad.json").write_text('{"hidden_size": ')
    return {"bad_toml": tmp_path / "bad.toml", "bad_json": tmp_path / "bad.json", "tmp": tmp_path}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_exits_2_with_one_line(case, capsys, bad_files):
    command, needle = BAD[case]
    assert main(command.format(**bad_files).split()) == 2
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert needle in lines[0]
    assert lines[0].startswith("perfsim: ")
    assert "Traceback" not in out.err and out.out == ""


def test_bad_input_via_subprocess_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "perfsim.cli", "simulate", "--model", "gpt-17", "--gbs", "8", "--seq", "8"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_simulate_fidelity_flags(capsys):
    from perfsim.cli import main

    args = ["simulate", "--model", "mixtral-8x7b", "--gpus", "16", "--pp", "2", "--ep", "8", "--gbs", "32",
            "--seq", "1024", "--engine", "analytic", "--schedule", "zb-h1", "--routing", "zipf:1.2",
            "--gpu-variability", "0.03", "--overlap-cu-share", "0.2", "--grad-bucket-size", "20M",
            "--capacity-factor", "1.25", "--expert-placement", "speed", "--json", "--allow-oom"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["schedule"] == "zb-h1" and out["plan"]["grad_bucket_bytes"] == 20 * 2**20
    assert out["moe_imbalance"] > 1 and out["straggler_slowdown"] > 1 and out["bubble_s"] > 0
    assert main(args[:-2] + ["--allow-oom"]) == 0
    text = capsys.readouterr().out
    assert "pipeline bubble" in text and "critical path" in text and "MoE imbalance" in text
    assert main(args[:-2] + ["--overlap-cu-share", "1.5"]) == 2
    assert "--overlap-cu-share" in capsys.readouterr().err


def test_the_engine_says_when_it_folds_and_no_fold_simulates_every_microbatch(capsys):
    """A step of 128 microbatches through PP 8: the engine simulates two short steps past the
    warm-up, says so, and extends them; --no-fold walks all 128 to the same step time."""
    command = "simulate --model llama3.1-8b --cluster mi300x-pollara --gpus 8 --pp 8 --gbs 128 --seq 2048"
    assert main(command.split()) == 0
    folded = capsys.readouterr().out
    assert "engine folded    simulated 26 and 34 of 128 microbatches" in folded
    assert main((command + " --no-fold").split()) == 0
    full = capsys.readouterr().out
    assert "engine folded" not in full
    step = re.compile(r"^step time +([0-9.]+) ms", re.M)
    assert float(step.search(full)[1]) == pytest.approx(float(step.search(folded)[1]), rel=1e-3)
    d = run_json(capsys, command + " --json")
    assert d["simulated_microbatches"] == [26, 34]
