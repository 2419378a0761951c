"""A stack profile's calibration protocol (``[calibration] fit``): what ``perfsim calibrate
--runs`` frees by default, what the leave-one-source-out folds refit, and what a fitted
profile records."""

import csv
import io
import tomllib
from pathlib import Path

import pytest

from perfsim.cli import main
from perfsim.design.runs import read_runs
from perfsim.design.runs_fit import BOUNDS, default_params, params_for, protocol_params
from perfsim.errors import ConfigError
from perfsim.system.stacks import FREE_PARAMETERS, load_stack

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "validation" / "runs" / "published.csv"


def _subset(path: Path, keep) -> Path:
    rows = list(csv.DictReader(io.StringIO(RUNS.read_text())))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(r for r in rows if keep(r))
    path.write_text(out.getvalue())
    return path


def _composer_runs(tmp_path: Path) -> Path:
    """Six composer runs, three from each of its two sources (seq 2048, small models: fast)."""
    picked = {"llm-foundry-mpt-benchmarks-h100": 0, "llm-foundry-mpt-benchmarks-h100-large": 0}

    def keep(r):
        if r["stack"] != "composer" or r["seq"] != "2048" or picked[r["source_id"]] >= 3:
            return False
        picked[r["source_id"]] += 1
        return True
    return _subset(tmp_path / "composer.csv", keep)


def test_the_protocol_names_only_free_parameters():
    assert set(FREE_PARAMETERS) == set(BOUNDS)


def test_nemo_frees_what_its_shipped_values_were_fitted_on():
    """nemo's runs identify five parameters (an AMD speed from MLPerf's two MI355X / MI350X
    runs, the padded experts from two token-drop runs, the input pipeline from the DGX Cloud
    real-data rows), but its shipped values were fitted on two: the default is those two."""
    nemo = [c for c in read_runs(RUNS) if c.stack == "nemo"]
    stack = load_stack("nemo")
    assert stack.calibration.fit == ("kernels.speed_nvidia", "moe.dropless_speed")
    assert {"kernels.speed_amd", "moe.padded_speed", "data.host_s_per_mtoken"} <= set(params_for(nemo, stack))
    assert protocol_params(nemo, stack) == ("kernels.speed_nvidia", "moe.dropless_speed")
    assert default_params(nemo, stack) == ("kernels.speed_nvidia", "moe.dropless_speed")
    dense = [c for c in nemo if c.family == "dense" and c.stack == "nemo"]
    assert protocol_params(dense, stack) == ("kernels.speed_nvidia",)  # no MoE run: no dropless speed to fit


def test_the_protocol_falls_back_to_what_the_runs_identify():
    """Runs that identify none of the protocol's parameters (nemo's on AMD GPUs only) fit what
    they do identify; a stack naming no protocol fits everything identified; one run, one
    parameter."""
    cases = read_runs(RUNS)
    amd = [c for c in cases if c.stack == "nemo" and c.source_id == "mlperf-training-5.1-amd"]
    assert protocol_params(amd, load_stack("nemo")) == params_for(amd, load_stack("nemo")) == ("kernels.speed",)
    primus = [c for c in cases if c.stack == "megatron-primus"]
    assert load_stack("megatron-primus").calibration.fit == ()
    assert protocol_params(primus, load_stack("megatron-primus")) == params_for(primus, load_stack("megatron-primus"))
    maxtext = [c for c in cases if c.stack == "maxtext"]
    assert protocol_params(maxtext, load_stack("maxtext")) == params_for(maxtext, load_stack("maxtext"))
    assert default_params(maxtext[:1], load_stack("maxtext")) != protocol_params(maxtext, load_stack("maxtext"))
    assert len(default_params(maxtext[:1], load_stack("maxtext"))) == 1


@pytest.mark.parametrize("fit, why", [('["kernels.sped"]', "'kernels.sped' is not a free stack parameter"),
                                      ('"kernels.speed"', "expected a list"),
                                      ('["kernels.speed", "kernels.speed"]', "names a parameter twice")])
def test_a_bad_protocol_is_one_clear_line(tmp_path, capsys, fit, why):
    profile = tmp_path / "mine.toml"
    profile.write_text(f'base = "composer"\n\n[calibration]\nfit = {fit}\n')
    with pytest.raises(ConfigError, match="calibration.fit"):
        load_stack(profile)
    out = tmp_path / "fitted.toml"
    code = main(["calibrate", "--runs", str(_composer_runs(tmp_path)), "--stack", str(profile), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "calibration.fit" in err and why in err
    assert not out.exists()


def test_calibrate_says_what_it_frees_and_records_it(tmp_path, capsys):
    runs = _composer_runs(tmp_path)
    shipped = tmp_path / "shipped.toml"
    assert main(["calibrate", "--runs", str(runs), "--stack", "composer", "--out", str(shipped)]) == 0
    assert "# free parameters: kernels.speed_nvidia (the stack's protocol, [calibration] fit)" in capsys.readouterr().out
    protocol = tomllib.loads(shipped.read_text())["calibration"]
    assert protocol["fit"] == list(load_stack("composer").calibration.fit)  # the same parameters, its own runs
    assert "fitted these to 6 runs" in protocol["source"]

    wider = tmp_path / "wider.toml"
    assert main(["calibrate", "--runs", str(runs), "--stack", "composer", "--fit", "kernels.speed_nvidia",
                 "--fit", "launch.kernel_gap_us", "--out", str(wider)]) == 0
    assert "(--fit)" in capsys.readouterr().out
    protocol = tomllib.loads(wider.read_text())["calibration"]
    assert protocol["fit"] == ["kernels.speed_nvidia", "launch.kernel_gap_us"]
    assert "6 runs" in protocol["source"]
    # refitting the written profile frees the same two
    assert main(["calibrate", "--runs", str(runs), "--stack", str(wider), "--out", str(tmp_path / "again.toml")]) == 0
    assert "# free parameters: kernels.speed_nvidia, launch.kernel_gap_us (the stack's protocol" in capsys.readouterr().out


def test_refitting_the_shipped_runs_gives_the_shipped_values_back():
    """composer's profile (70 runs, one parameter: seconds to fit) refitted by its protocol
    over the shipped runs returns the value it ships."""
    from perfsim.design.runs_fit import fit_stack

    runs = [c for c in read_runs(RUNS) if c.stack == "composer"]
    fit = fit_stack(runs, "composer")
    assert list(fit.values) == ["kernels.speed_nvidia"]
    assert fit.values["kernels.speed_nvidia"] == pytest.approx(load_stack("composer").kernels.speed_nvidia, abs=6e-5)


def test_calibrate_says_when_the_runs_identify_none_of_the_protocol(tmp_path, capsys):
    """nemo's two MLPerf runs on AMD GPUs inform neither of its protocol's NVIDIA-side
    parameters: calibrate fits what they identify and says so."""
    runs = _subset(tmp_path / "amd.csv", lambda r: r["source_id"] == "mlperf-training-5.1-amd")
    assert main(["calibrate", "--runs", str(runs), "--stack", "nemo", "--out", str(tmp_path / "amd.toml")]) == 0
    out = capsys.readouterr().out
    assert "# free parameters: kernels.speed (every parameter the runs identify: none of the stack's protocol)" in out
