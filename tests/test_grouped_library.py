"""A stack's grouped (MoE expert) GEMM library (issue 16, "MoE kernels as the stack runs
them"): H100 / H200 carry a ``torch_grouped_mm`` table fitted to torch._grouped_mm rows
measured on an H200 (validation/data/device/h200), torchtitan names it on NVIDIA GPUs
(``[kernels] grouped_nvidia``), and the expert GEMMs are priced at it there; elsewhere, and
for FP8 inputs, at the GPU's grouped_gemm table."""

import dataclasses

import pytest

import perfsim.api as api
from perfsim.cost.kernels import grouped_gemm_time
from perfsim.errors import ConfigError
from perfsim.system.hardware import load_gpu
from perfsim.system.kernel_tables import table_provenance
from perfsim.system.stacks import load_stack

CASE = dict(model="qwen3-30b-a3b", cluster="h200-ib", nodes=2, tp=1, pp=1, ep=8, dp=16, zero=1, mbs=1, gbs=64,
            seq=4096, check_memory=False)


def test_hopper_profiles_carry_the_table_and_say_where_it_comes_from():
    h200, h100 = load_gpu("h200"), load_gpu("h100")
    table = h200.grouped_libraries["torch_grouped_mm"]
    assert h200.grouped_table("bf16", "torch_grouped_mm") is table
    assert h200.grouped_table("fp8", "torch_grouped_mm") is h200.grouped_table("fp8")  # FP8 experts: not this kernel
    assert h200.grouped_table("bf16", "no_such_library") is h200.grouped_table("bf16") is not table
    assert h100.grouped_libraries["torch_grouped_mm"].forward_speed == table.forward_speed
    status = {name: s for name, s, _ in table_provenance(h200)}, {name: s for name, s, _ in table_provenance(h100)}
    assert status[0]["grouped_gemm.torch_grouped_mm"] == "measured" and status[1]["grouped_gemm.torch_grouped_mm"] == "derived"
    assert not load_gpu("mi300x").grouped_libraries  # no measurement of it on Instinct


def test_torchtitan_names_the_library_on_nvidia_only():
    stack = load_stack("torchtitan")
    assert stack.on_vendor("nvidia").kernels.grouped == "torch_grouped_mm"
    assert stack.on_vendor("amd").kernels.grouped == ""
    assert all(load_stack(n).on_vendor("nvidia").kernels.grouped == "" for n in ("nemo", "megatron-primus", "maxtext"))


def test_the_library_prices_a_grouped_launch_at_its_own_speed():
    gpu = load_gpu("h200")
    groups = (512,) * 16
    lib = gpu.grouped_libraries["torch_grouped_mm"].forward_speed[0]
    generic = gpu.grouped_table("bf16").forward_speed[0]
    fast, slow = (grouped_gemm_time(groups, 4096, 2048, gpu, "bf16", library=x) for x in ("torch_grouped_mm", None))
    assert slow / fast == pytest.approx(lib / generic, rel=0.05)  # compute-bound launch: time scales as 1 / speed
    mi300x = load_gpu("mi300x")
    assert grouped_gemm_time(groups, 4096, 2048, mi300x, "bf16", library="torch_grouped_mm") == \
        grouped_gemm_time(groups, 4096, 2048, mi300x, "bf16")


@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_torchtitans_experts_run_at_the_library_speed_in_both_estimators(estimator):
    titan = load_stack("torchtitan")
    generic = dataclasses.replace(titan, kernels=dataclasses.replace(titan.kernels, grouped_nvidia=""))

    def experts(stack, **kw):
        return api.simulate(estimator=estimator, stack=stack, **{**CASE, **kw}).breakdown["experts"]

    gpu = load_gpu("h200")
    lib, pooled = gpu.grouped_libraries["torch_grouped_mm"], gpu.grouped_table("bf16")
    # the experts' forward and backward launches each run at their direction's speed ratio: the
    # step's ratio lies between the two (within float and launch-gap noise)
    ratios = (lib.forward_speed[0] / pooled.forward_speed[0], lib.backward_speed[0] / pooled.backward_speed[0])
    assert min(ratios) * 0.97 <= experts(generic) / experts(titan) <= max(ratios) * 1.03
    assert experts(generic) / experts(titan) > 1.1  # the library is faster than the pooled table here
    assert experts(titan, cluster="mi300x-pollara") == pytest.approx(experts(generic, cluster="mi300x-pollara"), rel=1e-12)


def test_both_estimators_agree_with_the_library():
    a, d = (api.simulate(estimator=e, stack="torchtitan", **CASE).step_time_s for e in ("analytic", "des"))
    assert a == pytest.approx(d, rel=0.05)


def test_a_bad_grouped_library_name_is_one_clear_error(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[kernels]\ngrouped_nvidia = "Bad Name"\n')
    with pytest.raises(ConfigError, match="stack.kernels.grouped_nvidia"):
        load_stack(str(path))


def test_the_table_is_fitted_to_the_librarys_rows_and_beats_the_generic_table_on_them():
    """validation/accuracy_kernels.grouped_library_tables refits the shipped table from the
    torch._grouped_mm rows of the H200 kernel data; on those rows it prices far closer than the
    GPU's grouped table (fitted to other grouped kernels), in sample."""
    from perfsim.calibration import kernel_fit
    from validation import accuracy_kernels as ak

    gpu = load_gpu("h200")
    table = ak.grouped_library_tables("h200", gpu)["torch_grouped_mm"]
    shipped = gpu.grouped_libraries["torch_grouped_mm"]
    assert table.forward_speed == pytest.approx(shipped.forward_speed, rel=1e-3)
    assert "torch_grouped_mm rows" in table.source and "in-sample" in table.source
    rows = [p for s in ak.SPLITS for p in ak.points(gpu, s) if p.kind == "grouped_gemm"
            and ak.csv_rows(s, "h200")[p.line]["library"].startswith("torch._grouped_mm")]
    assert len(rows) >= ak.MIN_GROUPED_LIBRARY_ROWS
    with_lib = dataclasses.replace(gpu, grouped_gemm={"bf16": shipped})
    # the pooled table (tgale96's step rows, Transformer Engine's) is within about 2.4x of it
    # since kernels SOURCES.md round 16 (15x before, when tgale96 was read as forward times)
    assert kernel_fit.mape(rows, with_lib) < kernel_fit.mape(rows, gpu) / 2


def test_calibrating_grouped_gemm_drops_the_profiles_library_tables():
    from perfsim.calibration import kernel_fit
    from validation import accuracy_kernels as ak

    gpu = load_gpu("h100")
    rows = [p for s in ak.SPLITS for p in ak.points(gpu, s) if p.kind == "grouped_gemm"]
    fitted, fits = kernel_fit.fit_kernels(rows, gpu)
    assert any(f.name.startswith("grouped_gemm") for f in fits) and fitted.grouped_libraries == {}


def test_the_report_names_the_libraries_that_priced_its_kernels():
    """A report says which of the stack's kernel libraries had a GPU table of their own (the
    rest ran at the pooled tables): torchtitan's grouped GEMM and SDPA flash attention on H200,
    nothing on MI300X."""
    import json
    import subprocess
    import sys

    h200 = api.simulate(stack="torchtitan", **CASE)
    assert h200.kernel_libraries == {"grouped_gemm": "torch_grouped_mm", "attention": "sdpa_flash"}
    assert api.simulate(stack="torchtitan", **{**CASE, "cluster": "mi300x-pollara"}).kernel_libraries == {}
    assert api.simulate(stack="nemo", **{**CASE, "cluster": "mi300x-pollara"}).kernel_libraries == {"attention": "aiter_v3"}
    args = [sys.executable, "-m", "perfsim.cli", "simulate", "--model", "llama3.1-8b", "--cluster", "h100-ib", "--nodes", "1",
            "--gbs", "16", "--seq", "2048", "--stack", "nemo", "--engine", "analytic"]
    text = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and text.stdout.splitlines()[0].endswith("stack nemo, attention cudnn")
    out = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout)["kernel_libraries"] == {"attention": "cudnn"}
