"""An attention fit started from, and weakly held to, another table (``TableRef.prior``):
axes the rows do not measure keep that table's shape (``accuracy_kernels.ATTENTION_FROM``,
``perfsim calibrate --kernel-csv`` with the profile's own table)."""

import dataclasses

import pytest

from perfsim.calibration import kernel_fit
from perfsim.calibration.kernel_tables_fit import TableRef, curve_params, saturating
from perfsim.calibration.readers import KernelPoint
from perfsim.system.hardware import load_gpu
from perfsim.system.kernel_tables import AttentionEfficiency


def _knots():
    return TableRef("attention").knots([])  # the grid an attention fit writes


def _table(fwd, bwd, dims, factors, causal_f, causal_b) -> AttentionEfficiency:
    xs = _knots()
    return AttentionEfficiency(source="test", seq=xs, forward_efficiency=tuple(saturating(xs, *fwd)),
                               backward_efficiency=tuple(saturating(xs, *bwd)), head_dim=dims,
                               head_dim_factor=factors, causal_forward_factor=causal_f, causal_backward_factor=causal_b)


def _row(gpu, seq, head_dim, causal, direction):
    p = KernelPoint(kind="attention", dtype="bf16", device=gpu.name, time_s=1.0, batch=4, seq=seq, heads=32,
                    kv_heads=8, head_dim=head_dim, causal=causal, direction=direction)
    return dataclasses.replace(p, time_s=kernel_fit.predict_kernel(p, gpu))


@pytest.fixture(scope="module")
def truth():
    gpu = load_gpu("mi355x")
    return dataclasses.replace(gpu, attention=_table((0.62, 3.1), (0.55, 3.4), (64.0, 128.0, 192.0),
                                                     (0.8, 1.2, 1.1), 0.9, 0.8))


def test_curve_params_reads_back_a_written_curve():
    xs = _knots()
    plateau, half = curve_params(xs, tuple(saturating(xs, 0.61, 3.27)))
    assert plateau == pytest.approx(0.61, rel=1e-6) and half == pytest.approx(3.27, rel=1e-6)
    assert curve_params(xs, (0.4,) * len(xs))[0] == pytest.approx(0.4)  # flat: no fall-off


def test_prior_keeps_the_axes_the_rows_do_not_measure(truth):
    """Rows of causal head-dim-128 forwards only (what aiter's MI355X rows are): fitted from the
    generic start, the backward, non-causal and head-dim-64 prices are guesses; fitted from the
    true table as prior, they keep its shape while the forward still follows the rows."""
    rows = [_row(truth, s, 128, True, "fwd") for s in (1024, 2048, 4096, 8192, 16384)]
    start = dataclasses.replace(truth, attention=_table((0.5, 3.0), (0.5, 3.0), (128.0,), (1.0,), 1.0, 1.0))
    unseen = [_row(truth, s, d, c, w) for s in (2048, 8192) for d in (64, 128, 192) for c in (False, True)
              for w in ("fwd", "bwd") if (d, c, w) != (128, True, "fwd")]
    plain, _ = kernel_fit.fit_kernels(rows, start)
    held, fits = kernel_fit.fit_kernels(rows, start, attention_prior=truth.attention)
    assert fits[0].mape_after < 1.0  # the rows themselves fit either way
    assert kernel_fit.mape(rows, plain) < 1.0
    assert kernel_fit.mape(unseen, held) < 3.0 < 10.0 < kernel_fit.mape(unseen, plain)
    # the head dims only the prior measures are written, at its ratio to the measured 128
    a = held.attention
    assert a.head_dim == (64.0, 128.0, 192.0) and plain.attention.head_dim == (128.0,)
    assert a.head_dim_factor[0] / a.head_dim_factor[1] == pytest.approx(0.8 / 1.2, rel=1e-4)
    assert a.head_dim_factor[2] / a.head_dim_factor[1] == pytest.approx(1.1 / 1.2, rel=1e-4)


def test_rows_that_measure_an_axis_override_the_prior(truth):
    """Where the rows measure the backward pass, a wrong prior does not hold the fit: the weak
    prior only splits what the rows cannot tell apart."""
    rows = [_row(truth, s, 128, c, w) for s in (1024, 4096, 16384) for c in (False, True) for w in ("fwd", "bwd")]
    wrong = _table((0.3, 2.5), (0.9, 4.0), (128.0,), (1.0,), 1.3, 0.5)
    fitted, fits = kernel_fit.fit_kernels(rows, truth, attention_prior=wrong)
    assert fits[0].mape_after < 1.0


def test_prior_ref_without_prior_is_the_fixed_start():
    """No prior: the fit starts where it always did (plateau 0.5, factors 1), whatever table it replaces."""
    ref = TableRef("attention", None, (128.0,))
    start = ref.initial(load_gpu("mi355x"), _knots())
    assert list(start[[0, 2]]) == [0.5, 0.5] and list(start[4:]) == [1.0, 1.0, 1.0]


def test_calibrate_cli_keeps_the_profiles_shape_where_the_rows_are_silent(tmp_path):
    """``perfsim calibrate --kernel-csv`` with causal head-dim-128 forwards only: the written
    MI355X table keeps the profile's backward curve, backward causal factor and head dims (at
    their ratios to 128), and says so in its source."""
    import tomllib

    from perfsim.cli import main

    gpu = load_gpu("mi355x")
    path = tmp_path / "att.csv"
    lines = ["kind,dtype,batch,seq,heads,kv_heads,head_dim,causal,direction,time_us,device"]
    for s in (1024, 2048, 4096, 8192):
        t = kernel_fit.predict_kernel(_row(gpu, s, 128, True, "fwd"), gpu) * 1.2e6  # a kernel 20% slower
        lines.append(f"attention,bf16,4,{s},32,8,128,1,fwd,{t},MI355X")
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "cal.toml"
    assert main(["calibrate", "--cluster", "mi355x-pollara", "--kernel-csv", str(path), "--out", str(out)]) == 0
    table = tomllib.loads(out.read_text())["gpu"]["attention"]
    old = gpu.attention
    assert table["backward_efficiency"] == pytest.approx(list(old.backward_efficiency), rel=0.02)
    assert table["causal_backward_factor"] == pytest.approx(old.causal_backward_factor, rel=0.02)
    assert table["head_dim"] == list(old.head_dim)
    ratios = [f / table["head_dim_factor"][1] for f in table["head_dim_factor"]]
    assert ratios == pytest.approx([f / old.head_dim_factor[1] for f in old.head_dim_factor], rel=1e-3)
    assert "keeps its shape" in table["source"]
    # causal forwards alone do not measure the causal factor (it is confounded with the plateau):
    # the profile's is kept, not split with the plateau by the weak prior
    assert table["causal_forward_factor"] == old.causal_forward_factor
    # the forwards it measured are what moved: about 20% slower at the rows' sizes
    fitted = dataclasses.replace(gpu, attention=dataclasses.replace(old, **{k: tuple(v) if isinstance(v, list) else v
                                                                             for k, v in table.items()}))
    row = _row(gpu, 4096, 128, True, "fwd")
    assert kernel_fit.predict_kernel(row, fitted) / row.time_s == pytest.approx(1.2, rel=0.05)


def test_a_library_table_takes_the_head_dims_its_rows_do_not_measure_at_the_pooled_ratio():
    """A per-library attention table whose rows measure head dim 128 only (AITER's v3 rows) gains
    the pooled table's other head dims at the pooled ratio to 128 (MLA's 192 no longer runs at
    128's speed); its measured factor and curves stay as fitted."""
    from perfsim.calibration.kernel_tables_fit import with_head_dims_of

    library = _table((0.6, 3.0), (0.5, 3.2), (128.0,), (1.2,), 0.9, 0.85)
    pooled = _table((0.5, 3.0), (0.4, 3.2), (64.0, 128.0, 192.0), (0.85, 1.07, 0.99), 1.0, 1.0)
    filled = with_head_dims_of(library, pooled)
    assert filled.head_dim == (64.0, 128.0, 192.0)
    assert filled.head_dim_factor == pytest.approx((1.2 * 0.85 / 1.07, 1.2, 1.2 * 0.99 / 1.07), abs=1e-5)
    assert filled.forward_efficiency == library.forward_efficiency
    assert filled.causal_forward_factor == library.causal_forward_factor
    assert with_head_dims_of(filled, pooled) == filled  # measured everywhere the reference is: unchanged
    # the shipped MI300X aiter_v3 table: its rows measure 128; 192 at the pooled 192 / 128 ratio
    gpu = load_gpu("mi300x")
    v3, ref = gpu.attention_libraries["aiter_v3"], gpu.attention
    assert 192.0 in v3.head_dim and 64.0 in v3.head_dim
    ratio = lambda t, d: t.head_dim_factor[t.head_dim.index(d)] / t.head_dim_factor[t.head_dim.index(128.0)]
    assert ratio(v3, 192.0) == pytest.approx(ratio(ref, 192.0), rel=1e-4) and ratio(v3, 192.0) < 1.0
