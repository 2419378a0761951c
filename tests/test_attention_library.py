"""A stack's attention kernel library (issue 16, "attention kernel family"): GPU profiles
carry per-library flash-attention tables fitted to that library's rows alone
(``attention_libraries``), a stack names the library it runs on each GPU vendor
(``[kernels] attention_amd`` / ``attention_nvidia``), and the attention ops are priced at
that table where the GPU has it, else at the pooled one."""

import dataclasses

import pytest

import perfsim.api as api
from perfsim.cost.kernels import attention_efficiency
from perfsim.errors import ConfigError
from perfsim.system.hardware import load_gpu
from perfsim.system.kernel_tables import table_provenance
from perfsim.system.stacks import load_stack

CASE = dict(model="llama3.1-8b", nodes=1, mbs=1, gbs=16, seq=8192, check_memory=False)


@pytest.mark.parametrize("gpu", ["mi300x", "mi325x", "mi350x", "mi355x"])
def test_instinct_profiles_carry_a_measured_or_derived_aiter_v3_table(gpu):
    spec = load_gpu(gpu)
    table = spec.attention_table("aiter_v3")
    assert table is spec.attention_libraries["aiter_v3"] and table is not spec.attention
    assert spec.attention_table("no-such-library") is spec.attention and spec.attention_table("") is spec.attention
    rows = {name: status for name, status, _ in table_provenance(spec)}
    assert rows["attention.aiter_v3"] == ("derived" if gpu in ("mi325x", "mi350x") else "measured")


def test_te_stacks_run_aiter_v3_on_amd_and_cudnn_on_nvidia():
    for name in ("nemo", "megatron-primus", "maxtext"):  # MaxText on ROCm: Transformer Engine JAX's CK attention
        stack = load_stack(name)
        assert stack.kernels.attention_amd == "aiter_v3"
        assert stack.on_vendor("amd").kernels.attention == "aiter_v3"
    for name in ("nemo", "megatron-primus"):  # Transformer Engine prefers cuDNN fused attention on Hopper
        assert load_stack(name).on_vendor("nvidia").kernels.attention == "cudnn"
    assert load_stack("maxtext").on_vendor("nvidia").kernels.attention == ""  # not stated for it: pooled
    assert load_stack("torchtitan").on_vendor("amd").kernels.attention == ""  # no library named: pooled


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_hopper_profiles_carry_a_cudnn_table_from_the_h200_measurement(gpu):
    spec = load_gpu(gpu)
    table = spec.attention_table("cudnn")
    assert table is spec.attention_libraries["cudnn"] and table is not spec.attention
    assert "cudnn rows of validation/data/kernels/{fit,check}/h200.csv" in table.source
    rows = {name: status for name, status, _ in table_provenance(spec)}
    assert rows["attention.cudnn"] == ("derived" if gpu == "h100" else "measured")


def test_the_cudnn_table_prices_its_own_rows_closer_than_the_pooled_table():
    """In sample: the H200's cuDNN attention rows (torch SDPA's cudnn backend) against the
    table fitted to them and against the pooled table (FA3 / tritonbench rows of H100)."""
    from perfsim.calibration import kernel_fit
    from validation import accuracy_kernels as ak

    gpu = load_gpu("h200")
    rows = [p for s in ak.SPLITS for p in ak.points(gpu, s) if p.kind == "attention"
            and ak.csv_rows(s, "h200")[p.line]["library"].startswith("cuDNN")]
    assert len(rows) >= ak.MIN_LIBRARY_ROWS
    with_lib = dataclasses.replace(gpu, attention=gpu.attention_libraries["cudnn"])
    assert kernel_fit.mape(rows, with_lib) < kernel_fit.mape(rows, gpu)


@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_the_stacks_library_prices_the_attention_core(estimator):
    """On MI355X nemo's attention runs at the aiter_v3 table (faster than the pooled one
    the same stack without a library gets); on H100 the library changes nothing."""
    nemo = load_stack("nemo")
    pooled = dataclasses.replace(nemo, kernels=dataclasses.replace(nemo.kernels, attention_amd=""))

    def core(cluster, stack):
        r = api.simulate(cluster=cluster, estimator=estimator, stack=stack, **CASE)
        return r.breakdown["attention_core"]

    assert core("mi355x-pollara", nemo) < core("mi355x-pollara", pooled)
    assert core("h100-ib", nemo) == pytest.approx(core("h100-ib", pooled), rel=1e-12)
    from perfsim.cost.kernels import interp_log

    gpu = load_gpu("mi355x")
    t = gpu.attention_libraries["aiter_v3"]
    expected = (interp_log(8192, t.seq, t.forward_efficiency) * interp_log(128, t.head_dim, t.head_dim_factor)
                * t.causal_forward_factor)
    assert attention_efficiency(gpu, False, 8192, 128, True, "aiter_v3") == pytest.approx(min(expected, 1.0))
    assert attention_efficiency(gpu, False, 8192, 128, True, "aiter_v3") != attention_efficiency(gpu, False, 8192, 128, True)


def test_a_bad_library_name_is_one_clear_error(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[kernels]\nattention_amd = "Bad Name"\n')
    with pytest.raises(ConfigError, match="stack.kernels.attention_amd"):
        load_stack(str(path))


def test_the_library_table_is_fitted_to_that_librarys_rows_alone():
    """validation/accuracy_kernels.library_tables refits the shipped aiter_v3 table from the
    AITER v3 rows (head dim 128 / 192) of the kernel data."""
    from validation import accuracy_kernels as ak

    gpu = load_gpu("mi300x")
    (table,) = ak.library_tables("mi300x", gpu).values()
    shipped = gpu.attention_libraries["aiter_v3"]
    assert table.forward_efficiency == pytest.approx(shipped.forward_efficiency, rel=1e-3)
    assert table.backward_efficiency == pytest.approx(shipped.backward_efficiency, rel=1e-3)
    assert "aiter_v3 rows" in table.source and "in-sample" in table.source


def test_calibrating_attention_drops_the_profiles_library_tables():
    """perfsim calibrate's kernel fit (kernel_fit.fit_kernels) refits the pooled attention
    table to the user's rows; the shipped per-library tables, fitted to other measurements,
    are dropped so a stack naming a library prices attention at the user's table."""
    from perfsim.calibration import kernel_fit
    from validation import accuracy_kernels as ak

    gpu = load_gpu("mi300x")
    rows = [p for p in ak.points(gpu, "fit") + ak.points(gpu, "check") if p.kind == "attention"]
    fitted, fits = kernel_fit.fit_kernels(rows, gpu)
    assert any(f.name == "attention" for f in fits) and fitted.attention_libraries == {}
    assert fitted.attention_table("aiter_v3") is fitted.attention
    gemm_only = [p for p in ak.points(gpu, "fit") if p.kind == "gemm"][:20]
    kept, _ = kernel_fit.fit_kernels(gemm_only, gpu)
    assert kept.attention_libraries == gpu.attention_libraries


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_hopper_profiles_carry_an_sdpa_flash_table_slower_than_cudnn(gpu):
    """torch SDPA's flash backend (FlashAttention-2) measured beside its cuDNN backend on the
    H200 (validation/data/device/h200): both kept as library tables; FA2 runs well below cuDNN."""
    spec = load_gpu(gpu)
    flash, cudnn = spec.attention_table("sdpa_flash"), spec.attention_table("cudnn")
    assert flash is spec.attention_libraries["sdpa_flash"] and "sdpa_flash rows" in flash.source
    for backward in (False, True):
        assert (attention_efficiency(spec, backward, 8192, 128, True, "sdpa_flash")
                < 0.8 * attention_efficiency(spec, backward, 8192, 128, True, "cudnn"))
    rows = {name: status for name, status, _ in table_provenance(spec)}
    assert rows["attention.sdpa_flash"] == ("derived" if gpu == "h100" else "measured")
    assert flash is not cudnn


@pytest.mark.parametrize("estimator", ["analytic", "des"])
def test_torchtitan_runs_sdpas_flash_backend_on_nvidia(estimator):
    """torchtitan calls SDPA with the flash backend first before Blackwell (its PR #1196), which
    is FlashAttention-2 on Hopper: its attention core on H100 costs more than nemo's cuDNN one
    at the same speed, and nothing changes on AMD (no library named there)."""
    titan = load_stack("torchtitan")
    assert titan.on_vendor("nvidia").kernels.attention == "sdpa_flash"
    assert titan.on_vendor("amd").kernels.attention == ""
    as_cudnn = dataclasses.replace(titan, kernels=dataclasses.replace(titan.kernels, attention_nvidia="cudnn"))

    def core(stack):
        return api.simulate(cluster="h100-ib", estimator=estimator, stack=stack, **CASE).breakdown["attention_core"]

    assert core(titan) > 1.3 * core(as_cudnn)
