"""Kernel tables fitted to the rows of every GPU of one die (validation/accuracy_kernels.pooled:
H100 with H200's rows, MI300X with MI325X's, MI355X with MI350X's), each row priced on its own
GPU's spec; a derived GPU's rows of a kernel library with its own table stay out; and a GEMM
refit that depends on its rows alone, never on the table it replaces."""

import dataclasses

import pytest

from perfsim.calibration import kernel_fit
from perfsim.system.hardware import load_gpu


def test_the_h100_fit_pools_h200_rows_but_not_its_library_rows():
    from validation import accuracy_kernels as ak

    own = {id(p) for p, _ in ak.pool("h100")}
    extra = [(p, f) for p, f in ak.pooled("h100") if id(p) not in own]
    assert extra and {p.device for p, _ in extra} == {"h200"}
    kinds = {p.kind for p, _ in extra}
    assert "gemm" in kinds and "memory" in kinds
    # torch._grouped_mm's, cuDNN's and SDPA flash's rows fit their own library tables: the grouped and
    # attention rows pooled are the others' (TileOPs' DeepGEMM column, cuDNN frontend's FlashAttention-4)
    fams = {(p.kind, f) for p, f in extra if p.kind in ("grouped_gemm", "attention")}
    assert fams == {("grouped_gemm", "tileops"), ("attention", "cudnn-frontend")}
    assert sum(p.kind == "grouped_gemm" for p, _ in extra) == 4
    assert ak.pooled("h200") == ak.pool("h200") and ak.POOLED["h100"] == ("h200",)


def test_a_same_die_row_is_priced_on_its_own_gpus_spec():
    """An H200 copy row (HBM-bound) is priced at the H200's 4.8 TB/s with the H100's tables,
    not at the H100's 3.35 TB/s."""
    from validation import accuracy_kernels as ak

    h100, h200 = load_gpu("h100"), load_gpu("h200")
    rows = [p for p, f in ak.pool("h200") if p.kind == "memory" and p.bytes >= 1e9]
    on_h100 = kernel_fit.mape(rows, h100)
    on_h200 = kernel_fit.mape(rows, h100, siblings={"h200": h200})
    assert on_h200 == pytest.approx(kernel_fit.mape(rows, kernel_fit.with_tables(h200, h100)))
    assert on_h200 < on_h100


def test_a_gemm_refit_does_not_inherit_the_k_loop_step_of_the_table_it_replaces():
    """Before, the tile and roofline trials kept the starting table's K-loop step, so a held-out
    fold started from a profile fitted to every family carried what that family taught it."""
    from validation import accuracy_kernels as ak

    gpu = load_gpu("h100")
    rows = [p for p, _ in ak.pool("h100") if p.kind == "gemm" and p.dtype == "bf16"]
    fits = []
    for step in (0.0, 2.0):
        start = dataclasses.replace(gpu, gemm=dataclasses.replace(gpu.gemm, k_step_ns=step))
        fitted, _ = kernel_fit.fit_kernels(rows, start, regenerate_gemm=True)
        fits.append(fitted.gemm)
    assert fits[0] == fits[1]
