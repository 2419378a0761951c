"""Kernel fidelity: held-out (by source) MAPE must not regress; per-expert grouped GEMM
pricing; FP8 steps carry their casts; per-dtype tables with provenance."""

import csv
import dataclasses

import pytest

from perfsim.cost import kernels as costs
from perfsim.lowering.layers import LayerBuilder
from perfsim.lowering.ops import Gemm, OpKind
from perfsim.model.io import load_model
from perfsim.plan.parallel import ParallelPlan
from perfsim.system.hardware import load_gpu
from perfsim.system.kernel_tables import is_assumed
from validation import accuracy_kernels as acc

from conftest import write_kernel_csv

# Held-out MAPE (%) measured at commit time by validation/accuracy_kernels.py (leave one
# source family out: each family's rows priced by tables fitted to the other families),
# plus a 10% relative margin for float noise: a change to the kernel model must not make
# these worse. They are the true figures, not targets: issue 14 asks <= 10% (GEMM) and
# <= 15% (attention, grouped GEMM); the cells above that are open work (docs/accuracy.md).
GATES = {  # (gpu, class, dtype): held-out MAPE %; memory rows read dtype bf16 (unused)
    # 21.0 before attn-dsl-bench's AITER rows made a third family (session 46); 19.0 before MoonMath's
    # AITER v3 rows made a fourth (session 47); 17.3 before library rows were held out against their
    # library's table (session 48: attn-dsl-bench's and MoonMath's AITER v3 rows, priced by the aiter_v3
    # table fitted to aiter's README rows, run 17-22% slower than it); 17.9 before aiter's README backward
    # rows were read in the a32 variant Transformer Engine ROCm and Primus run (session 49: the a16 rows,
    # a median 11% faster, had been kept as the fastest; aiter's and Primus-Turbo's backwards then disagreed)
    ("mi300x", "attention", "bf16"): 14.5,
    # session 20: folds no longer inherit the shipped table's K-loop step (a leak: the shipped
    # table is fitted to every family), and same-die rows are pooled; the cells it moved say so
    ("mi300x", "gemm", "bf16"): 10.8,  # 10.5 with the leak; 11.1 before gau-nernst's row (session 46)
    # 24.4 before host-timed rows were fitted with a host time per call; 23.3 before hipblaslt-bench's
    # rows (the Azure guide's: a flat 40 us for 1-17 GFLOP) were read as the host-timed loop they are
    ("mi300x", "gemm", "fp8"): 20.2,  # 20.4 before EmbeddedLLM's aiter-tuner rows (session 46)
    ("mi300x", "grouped_gemm", "bf16"): 9.8,  # 11.0 before grouped GEMMs were priced as one dense launch
    # AITER's inference fused-MoE stages, priced by the grouped pricing, fitted to nothing (no target)
    ("mi300x", "fused_moe", "bf16"): 32.8,
    ("mi355x", "fused_moe", "bf16"): 28.7,
    ("mi355x", "fused_moe", "fp8"): 30.8,  # 24.5 with the K-loop leak
    # 10.5 (10.3 measured) before session 46: its speed is against the dense FP8 price, which EmbeddedLLM's
    # aiter-tuner rows set faster
    ("mi300x", "grouped_gemm", "fp8"): 14.0,
    ("mi300x", "memory", "bf16"): 36.7,
    ("mi325x", "gemm", "bf16"): 14.5,
    ("mi350x", "memory", "bf16"): 30.7,  # MI350X's own rows (rotary, norm) priced by the MI355X tables
    # 48.7 while HipKittens was the one family, split by backend (AITER vs CK); FlyDSL's rows
    # (aiter's family) made it a two-family cell, HipKittens held out whole (session 46); 24.4 before
    # its fits started from MI300X's attention table (ATTENTION_FROM, session 49): with HipKittens held
    # out, aiter's 8 causal head-dim-128 forwards had left backward, non-causal and head dim 64 generic
    # 20.3 before MI300X's prior took the a32 backward rows, 19.9 before a causal factor the fold's rows
    # do not measure (aiter's causal forwards alone) was held at the prior's instead of shared with the plateau
    ("mi355x", "attention", "bf16"): 19.7,
    # 24.2 with the K-loop leak; 25.8 before session 46, when aiter's fold had one MAMF row; with the
    # training-sized kimi_k3 and MI350X rows in it (all >= 25 GFLOP) its fall-off extrapolates to aiter's
    # small inference GEMMs 80-120% slow: a true figure, not a model change; 50.6 before Z-Y00's MI350X
    # hipblaslt-bench sweep (GPU-timed, caches flushed, 2,048-8,192 tokens) joined that fold (session 50:
    # aiter's small rows +30.9 -> +39.0% median; the MI350X cell below met)
    ("mi355x", "gemm", "bf16"): 58.4,
    ("mi350x", "gemm", "bf16"): 9.5,  # 15.5 on alfredyu24's 7 rows before Z-Y00's sweep (session 50)
    ("mi355x", "gemm", "fp8"): 14.4,  # 13.4 with the K-loop leak; 13.9 before FlyDSL's seven rows (session 46)
    ("mi355x", "memory", "bf16"): 27.6,  # MI350X's rows pooled into the fit
    # tgale96 read as the step times they are, VeOmni's whole-MoE forwards checked, not fitted,
    # Transformer Engine PR #2045's rows a third family, grouped fits from a fixed start (kernels
    # SOURCES.md round 16): 60.7 on 9 rows before, when tgale96 and VeOmni disagreed by about 3x
    ("h100", "grouped_gemm", "bf16"): 28.1,  # 29.5 before the H200 TileOPs / PyTorch rows joined the fit (session 46)
    ("h100", "attention", "bf16"): 7.4,  # 5.9 before the H200 cuDNN-frontend training rows joined the fit (session 46)
    ("h100", "gemm", "fp8"): 6.4,
    # 3.9 on 6 rows (24.3 before the H200's measured rows were pooled into its fit) until OpenXLA's
    # sm_90 sweep joined as a family (180 rows, SOURCES.md round 15): a wider check, not a regression
    ("h100", "gemm", "bf16"): 8.1,
    ("h100", "memory", "bf16"): 25.3,
    ("h200", "gemm", "fp8"): 9.6,
    # the H200 device run (validation/data/device/h200), held out as its own family
    ("h200", "gemm", "bf16"): 9.0,  # 19.9 when its fold's H100 rows were six large GEMMs
    # 27.4 while its cuDNN rows were priced at the pooled table (FlashAttention-2's still are: one family)
    ("h200", "attention", "bf16"): 25.3,
    # torch._grouped_mm at the generic grouped table (202.1 before round 16; 33.0 while the device
    # run was the one family, split by direction, before TileOPs' and PyTorch's rows, session 46;
    # 24.1 before prime-rl's 36 rows, session 48: their forwards check at 4.7%, their backwards at
    # +83%, the generic table's backward speed being tgale96's; 30.8 so, before library rows were held
    # out against their library's table: torch._grouped_mm's, fitted to its other families' rows)
    ("h200", "grouped_gemm", "bf16"): 10.1,
    ("h200", "memory", "bf16"): 30.4,
}


@pytest.fixture(scope="module")
def summaries():
    return {name: acc.summary(load_gpu(name)) for name in {g for g, _, _ in GATES}}


@pytest.mark.parametrize("cell", sorted(GATES))
def test_held_out_mape_does_not_regress(summaries, cell):
    name, kind, dtype = cell
    points, err = summaries[name][(kind, dtype)]
    assert points > 0 and err <= GATES[cell] * 1.1


def test_cudnn_frontend_rows_are_a_second_h200_attention_family(summaries):
    """cuDNN frontend's H200 sweeps are one family in the H200 attention cell, held out
    against the rest: the 24 equal-length rows of its prefill sweep (session 41) and, one row
    per shape and pass, the 52 forward and backward rows of its attention-training results
    (session 46: cuDNN or FlashAttention-4, whichever ran faster); the prefill sweep's four
    Qwen3.5 shapes are the training results' causal forwards at 2-16k tokens, where the faster
    (FlashAttention-4) row is kept; with them the cell's held-out MAPE is 25.3% (27.4% with every
    row at the pooled table)."""
    rows = [f for split in acc.SPLITS for f in acc.families(split, "h200").values() if f == "cudnn-frontend"]
    assert len(rows) == 20 + 52
    points, err = summaries["h200"][("attention", "bf16")]
    assert points == 112 and err <= 25.3 * 1.1


@pytest.fixture
def fitted_points(monkeypatch):
    """The point lists every ``kernel_fit.fit_kernels`` call of the test is given, in order."""
    seen = []
    fit = acc.kernel_fit.fit_kernels

    def spy(points, gpu, **kw):
        seen.append(points)
        return fit(points, gpu, **kw)

    monkeypatch.setattr(acc.kernel_fit, "fit_kernels", spy)
    return seen


def test_every_row_is_priced_by_tables_not_fitted_to_its_family(monkeypatch, fitted_points):
    """Leave one family out: the fold that checks a family never fits a row of it (a
    derived GPU's fold fits its base's rows, also without that family), and every row is
    checked exactly once."""
    seen = fitted_points
    monkeypatch.setattr(acc, "_fold", acc._fold.__wrapped__)  # fit each fold here, not from the cache
    for name in ("h200", "h100"):
        base = acc.DERIVED.get(name, name)
        rows = acc.pool(name)
        for held in sorted({f for _, f in rows}):
            seen.clear()
            acc.fit_tables(name, held)
            fam_of = {id(p): f for p, f in acc.pooled(base)}  # its own rows and its same-die GPUs'
            assert seen and all(fam_of[id(p)] != held for p in seen[0])
    # a GPU whose attention fit starts from another's table (``ATTENTION_FROM``): that table is
    # fitted without the held family too (its root: every backend), as the grouped tables it borrows
    for held in ("aiter", "hipkittens"):
        seen.clear()
        acc.fit_tables("mi355x", held)
        own = {id(p): f for p, f in acc.pooled("mi355x")}
        donor = {id(p): acc._root(f) for p, f in acc.pooled("mi300x")}
        assert len(seen) >= 2 and all((own[id(p)] if id(p) in own else donor[id(p)]) != held
                                      for pts in seen for p in pts)
        assert any(id(p) in donor for pts in seen for p in pts)
    # a derived GPU's lone family is split by backend (``family/backend``): its base's fold
    # leaves out every row of the root family, whatever backend label those rows carry
    held = next(f for f in sorted({f for _, f in acc.pool("mi350x")}) if "/" in f)  # its memory rows' lone family
    seen.clear()
    acc.fit_tables("mi350x", held)
    fams = {id(p): f for p, f in acc.pooled("mi355x")}
    assert "/" in held and any(f.startswith("hipkittens") for f in fams.values())
    base_fits = [pts for pts in seen if all(id(p) in fams for p in pts)]  # not the MI300X donors' fits
    assert base_fits and not any(fams[id(p)].split("/")[0] == held.split("/")[0] for p in base_fits[0])
    acc.held_out_errors.cache_clear()
    errors = acc.held_out_errors("h100")
    assert sorted(id(p) for p, _, _ in errors) == sorted(id(p) for p, _ in acc.pool("h100"))


def test_a_library_row_is_checked_against_its_librarys_table_fitted_without_its_family(monkeypatch, fitted_points):
    """A row of a kernel library with a table of its own (torch._grouped_mm on H200) is priced
    held out as a stack naming the library prices it: at that library's table, fitted to the
    library's rows of the other families only; a row of no such library at the pooled fold."""
    seen = fitted_points
    monkeypatch.setattr(acc, "library_fold", acc.library_fold.__wrapped__)
    table, rows = acc.library_fold("h200", "torch_grouped_mm", "prime-rl")
    fams = {p.line: f for split in acc.SPLITS for p in acc.points(acc.load_gpu("h200"), split)
            for f in [acc.families(split, "h200").get(p.line)] if p.kind == "grouped_gemm"}
    assert table is not None and rows == len(seen[-1]) >= acc.MIN_GROUPED_LIBRARY_ROWS
    assert "prime-rl" not in {fams[p.line] for p in seen[-1]}
    assert acc.library_fold("h100", "torch_grouped_mm", "tgale96")[1] == len([p for p, f in acc.pool("h200")
                                                                             if id(p) in acc.libraries("h200")
                                                                             and p.kind == "grouped_gemm"])
    held = {id(p): e for p, f, e in acc.held_out_errors("h200")}
    pooled = {id(p): e for p, f, e in acc.pooled_errors("h200")}
    lib = [p for p, f in acc.pool("h200") if f == "prime-rl"]
    gpu = acc.fit_tables("h200", "prime-rl")[0]
    priced = acc.dataclasses.replace(gpu, grouped_gemm={**gpu.grouped_gemm, "bf16": table})
    assert all(held[id(p)] == pytest.approx(acc.kernel_fit.predict_kernel(p, priced) / p.time_s - 1) for p in lib)
    assert any(abs(held[id(p)] - pooled[id(p)]) > 0.05 for p in lib)
    other = [p for p, f in acc.pool("h200") if p.kind == "gemm"]
    assert other and all(held[id(p)] == pooled[id(p)] for p in other)


def test_a_table_only_the_held_out_family_informs_is_dropped_from_its_fold():
    """A fold keeps no table fitted to the family it checks: where no other family has
    rows for a table (MI300X FP16: one row), the fold prices with the BF16 table."""
    fam = next(f for p, f in acc.pool("mi300x") if p.kind == "gemm" and p.dtype == "fp16")
    gpu, cells, _ = acc.fit_tables("mi300x", fam)
    assert ("gemm", "fp16") not in cells and "fp16" not in gpu.gemm_dtypes
    assert "fp16" in load_gpu("mi300x").gemm_dtypes  # the shipped profile has it (fitted to all)


def test_batched_gemm_waves_count_every_gemm_of_the_call():
    """200 tiles fill part of MI300X's 304 CUs (one partial wave: priced as full, stream-K);
    two of them in one batched call make 400 tiles, more than a wave: wave quantization
    sees the whole call, whichever tile split the library picks."""
    import math

    from perfsim.lowering.ops import Gemm

    gpu = load_gpu("mi300x")
    table = gpu.gemm_table("bf16")
    m, n = 8 * table.tile_m, 25 * table.tile_n  # 200 macro tiles
    assert costs.wave_utilization(Gemm(m=m, n=n, k=1024), gpu) == 1.0
    tm, tn, util = costs.tile_choice(m, n, table, gpu, batch=2)
    tiles = 2 * math.ceil(m / tm) * math.ceil(n / tn)
    assert util == pytest.approx(tiles / (math.ceil(tiles / 304) * 304)) and util < 1.0
    assert costs.wave_utilization(Gemm(m=m, n=n, k=1024, batch=2), gpu) == util


def test_batched_gemm_below_one_wave_leaves_cus_idle():
    """A batched call launches one workgroup per output tile (no split-K across its GEMMs):
    16 GEMMs of 8 macro tiles each fill 128 of MI300X's 304 CUs, so the call is priced at
    that fill, while one GEMM of the same 128 tiles splits K and is priced as a full wave."""
    from perfsim.lowering.ops import Gemm

    gpu = load_gpu("mi300x")
    table = gpu.gemm_table("bf16")
    m, n = table.tile_m, 8 * table.tile_n
    assert costs.wave_utilization(Gemm(m=16 * m, n=n, k=8192), gpu) == 1.0
    tm, tn, util = costs.tile_choice(m, n, table, gpu, batch=16)
    assert util < 1.0
    per_gemm = -(-m // tm) * -(-n // tn)
    tiles, cus = 16 * per_gemm, gpu.num_compute_units
    fill = tiles / cus if tiles < cus else tiles / (-(-tiles // cus) * cus)  # idle CUs, or wave quantization
    assert util == pytest.approx(m * n / (per_gemm * tm * tn) * fill)
    one = costs.gemm_time(Gemm(m=16 * m, n=n, k=8192), gpu, "bf16")
    batched = costs.gemm_time(Gemm(m=m, n=n, k=8192, batch=16), gpu, "bf16")
    assert batched > one  # same FLOPs and bytes of output, fewer busy CUs


def test_gemm_fixed_cost_is_not_scaled_by_tile_padding():
    """A one-row GEMM pads its tile 32x, but the size fall-off (a fixed per-call cost) is
    paid once: its compute time is that of the padded work, far under 32x the fixed
    cost, so a weight-streaming GEMV stays memory-bound."""
    import dataclasses

    from perfsim.lowering.ops import Gemm

    gpu = load_gpu("mi300x")
    # a size table whose fall-off reaches 1 GFLOP (half the plateau at about 5 GFLOP), so
    # the test does not hang on where the shipped fit puts it
    fall = dataclasses.replace(gpu.gemm, gflop=(0.01, 0.1, 1.0, 10.0, 100.0), efficiency=(0.005, 0.02, 0.15, 0.58, 0.8))
    gpu = dataclasses.replace(gpu, gemm=fall, gemm_dtypes={})
    g = Gemm(m=1, n=8192, k=8192)
    compute = g.flops / (costs.peak(gpu, "bf16") * costs.gemm_efficiency(g, gpu, "bf16"))
    memory = costs.hbm_time(costs.gemm_bytes(g, "bf16", gpu), gpu)
    table = gpu.gemm_table("bf16")
    util = costs.wave_utilization(g, gpu)
    scaled = g.flops / (costs.peak(gpu, "bf16") * util * costs.interp_log(g.flops / costs.GFLOP, table.gflop, table.efficiency))
    assert compute < memory < scaled  # the old pricing (fall-off at the real FLOPs, times the padding) was not


def test_64_tokens_per_expert_is_slower_per_flop_than_4096():
    gpu = load_gpu("mi300x")
    n, k = 2 * 1408, 2048
    small = costs.grouped_gemm_time((64,) * 64, n, k, gpu, "bf16")
    big = costs.grouped_gemm_time((4096,) * 64, n, k, gpu, "bf16")
    per_flop_small, per_flop_big = small / (64 * 64), big / (4096 * 64)
    assert per_flop_small > 1.5 * per_flop_big


def test_grouped_gemm_is_one_launch_at_the_dense_table_times_the_kernels_speed():
    """A grouped kernel is priced as the library runs it: one launch over every expert's
    tile-padded GEMM (the dense table's price of that launch: CU fill over all the
    experts' tiles, the size fall-off at the launch's work), its compute at the GPU's
    grouped speed. Uniform experts with no grouped table cost what the same experts as one
    batched dense call cost; a slower grouped kernel is slower in proportion, up to the
    HBM floor (the weights' reads do not slow with the kernel)."""
    from perfsim.lowering.ops import Gemm

    gpu = dataclasses.replace(load_gpu("mi300x"), grouped_gemm={})
    batched = costs.gemm_time(Gemm(m=2048, n=2816, k=2048, batch=16), gpu, "bf16")
    assert costs.grouped_gemm_time((2048,) * 16, 2816, 2048, gpu, "bf16") == pytest.approx(batched)
    assert costs.grouped_gemm_time((2048,) * 16, 2816, 2048, gpu, "bf16", batched=True) == pytest.approx(batched)
    shipped = load_gpu("mi300x")
    speed = costs.grouped_speed((2048,) * 16, shipped, "bf16")
    assert 0 < speed < 1  # the measured grouped kernels run below the dense table's price
    slow = costs.grouped_gemm_time((2048,) * 16, 2816, 2048, shipped, "bf16")
    assert batched < slow <= (batched - gpu.kernel_launch_s) / speed + gpu.kernel_launch_s + 1e-12
    # a grouped wgrad's GEMMs walk each expert's own tokens as K: in one wave the longest K
    # bounds the launch, with more waves the tiles' mean K per wave
    table = gpu.gemm_table("bf16")
    one_wave = ((64, 64, 8192, 1), (64, 64, 64, 1))
    assert costs._launch_k_loop(one_wave, gpu, "bf16") == pytest.approx(8192 * table.k_step_ns * 1e-9)


def test_grouped_gemm_prices_each_experts_tokens():
    """Each expert's GEMM is tile-padded on its own M, not the summed work: routing that
    leaves experts a few tokens each (same total) pads a tile row per expert and costs
    more than balanced routing."""
    gpu = load_gpu("mi300x")
    balanced = costs.grouped_gemm_time((512,) * 8, 4096, 7168, gpu, "bf16")
    skewed = costs.grouped_gemm_time((4089, 1, 1, 1, 1, 1, 1, 1), 4096, 7168, gpu, "bf16")
    assert skewed > balanced
    assert costs.grouped_gemm_time((512,) * 8, 4096, 7168, gpu, "bf16", backward=True) > balanced


def _steps(dtype):
    model = load_model("llama3.1-8b")
    plan = ParallelPlan(tp=1, dp=1, mbs=1, gbs=1, seq=4096, dtype=dtype)
    b = LayerBuilder(model, plan)
    return b.layer_forward(0) + b.head_forward()


def test_fp8_steps_include_cast_overhead():
    bf16, fp8 = _steps("bf16"), _steps("fp8")
    casts = [s for s in fp8 if s.category == "fp8_cast"]
    assert casts and not [s for s in bf16 if s.category == "fp8_cast"]
    gemms = [s for s in fp8 if s.kind is OpKind.GEMM and dict(s.meta).get("dtype") != "bf16"]
    assert len(casts) == 2 * len(gemms)  # amax + cast-transpose in front of every FP8 GEMM
    assert all(c.bytes > 0 for c in casts)
    head = next(s for s in fp8 if s.name == "lm_head")
    assert dict(head.meta)["dtype"] == "bf16"  # FP8 recipes keep the LM head in BF16


def test_per_token_activation_quant_is_one_kernel():
    """A GEMM timed with vLLM's dynamic per-token activation quant (``cast_a``) carries one
    cast kernel (row amax and cast in one pass: BF16 read, FP8 written), not the
    current-scaling pair (amax pass, then cast-transpose) a ``cast`` row carries."""
    from perfsim.calibration.kernel_fit import _cast_time
    from perfsim.calibration.readers import KernelPoint

    gpu = load_gpu("h100")
    m, n, k = 128, 12288, 5376

    def point(kernel):
        return KernelPoint(kind="gemm", dtype="fp8", device="h100", time_s=30e-6, m=m, n=n, k=k,
                           direction="fwd", kernel=kernel)

    per_token = point("cast_a")
    one = costs.elementwise_time(m * k * 3, gpu)  # one kernel: 2 B read + 1 B written per element
    assert _cast_time(per_token, gpu) == pytest.approx(one)
    assert _cast_time(per_token, gpu) < costs.fp8_cast_time(m * k, gpu)  # fewer launches and bytes
    assert _cast_time(point("cast"), gpu) == pytest.approx(costs.fp8_cast_time(m * k, gpu) + costs.fp8_cast_time(k * n, gpu))


@pytest.mark.parametrize("name", ["mi300x", "mi325x", "mi350x", "mi355x", "h100", "h200"])
def test_fp8_expert_gemms_are_not_slower_than_bf16(name):
    """FP8 has twice BF16's peak: a shipped table must not price an MoE layer's expert
    GEMMs (forward or backward) slower in FP8 than in BF16 at training token counts. (A
    series that times a fallback path once made MI300X's FP8 grouped backward 5x slower.)"""
    gpu = load_gpu(name)
    for tokens in (1024, 4096):  # (H100 / H200 have no FP8 grouped rows: their BF16 grouped speed at the FP8 dense table)
        for backward in (False, True):
            bf16 = costs.grouped_gemm_time((tokens,) * 16, 2 * 1408, 2048, gpu, "bf16", backward=backward)
            fp8 = costs.grouped_gemm_time((tokens,) * 16, 2 * 1408, 2048, gpu, "fp8", backward=backward)
            assert fp8 < bf16, (tokens, backward)


def test_a_grouped_table_without_backward_rows_derives_its_backward():
    """Forward-only rows: the backward is the forward times the BF16 grouped table's
    measured backward/forward ratio, not whatever the fit's prior left there."""
    gpu = load_gpu("mi300x")
    fp8 = [p for p, _ in acc.pool("mi300x") if p.kind == "grouped_gemm" and p.dtype == "fp8"]
    assert fp8 and all(p.direction == "fwd" for p in fp8)
    fitted, fits = acc.kernel_fit.fit_kernels(fp8, gpu)
    table, ref = fitted.grouped_gemm["fp8"], fitted.grouped_gemm["bf16"]
    for t, f, b in zip(table.tokens, table.forward_speed, table.backward_speed):
        ratio = costs.interp_log(t, ref.tokens, ref.backward_speed) / costs.interp_log(t, ref.tokens, ref.forward_speed)
        assert b == pytest.approx(f * ratio, rel=1e-3)
    assert "backward derived" in next(f.note for f in fits if f.name == "grouped_gemm/fp8")


def test_fp8_series_slower_than_bf16_on_the_same_shapes_is_dropped_as_a_fallback():
    from validation.data.kernels import make_kernel_csvs as make

    def row(dtype, series, time_us, m):
        return make._row("grouped_gemm", dtype, "mi300x", series, "src", "lib", m=m, n=4096, k=2048, batch=8,
                         direction="bwd", time_us=time_us)

    bf16 = [row("bf16", "primus_turbo_bf16", 100, m) for m in (512, 1024, 2048)]
    slow = [row("fp8", "primus_turbo_fp8_slow", 400, m) for m in (512, 1024, 2048)]
    fast = [row("fp8", "primus_turbo_fp8_fast", 70, m) for m in (512, 1024, 2048)]
    few = [row("fp8", "primus_turbo_fp8_few", 400, m) for m in (512, 1024)]  # too few shapes to judge
    kept, notes = make.drop_fallbacks(bf16 + slow + fast + few)
    assert {r["meta_series"] for r in kept} == {"primus_turbo_bf16", "primus_turbo_fp8_fast", "primus_turbo_fp8_few"}
    assert len(notes) == 1 and "primus_turbo_fp8_slow bwd: 4.00x" in notes[0]


def test_fp8_and_bf16_gemm_tables_are_separate():
    gpu = load_gpu("mi300x")
    assert "fp8" in gpu.gemm_dtypes and gpu.gemm_table("fp8") != gpu.gemm_table("bf16")
    assert gpu.gemm_table("fp8").output_dtype == "bf16"  # FP8 GEMMs write BF16


def test_tile_quantization_counts_wasted_tile_area():
    gpu = load_gpu("mi300x")
    table = gpu.gemm_table("bf16")
    full = costs.tile_choice(4096, 4 * table.tile_n, table, gpu)[2]
    ragged = costs.tile_choice(4096, 4 * table.tile_n + table.tile_n // 4, table, gpu)[2]
    assert ragged < full


def test_attention_depends_on_sequence_and_direction():
    gpu = load_gpu("mi300x")
    assert costs.attention_efficiency(gpu, False, seq=4096) != costs.attention_efficiency(gpu, True, seq=4096)
    assert costs.attention_efficiency(gpu, False, seq=8192, causal=True) != costs.attention_efficiency(gpu, False, seq=8192)


def test_derived_profiles_say_so():
    for name, base in acc.DERIVED.items():
        gpu = load_gpu(name)
        assert is_assumed(gpu.gemm.source) and base in gpu.gemm.source
    assert not is_assumed(load_gpu("mi300x").gemm.source)


def test_mi350x_is_the_mi355x_die_at_its_own_clock():
    """MI350X takes MI355X's kernel tables (same gfx950 die, 256 CUs, same HBM) and keeps its
    own 2200 MHz peak clock and peaks (CDNA4 white paper), so a compute-bound GEMM costs it
    about the MI355X time x (MI355X / MI350X clock under load) and a copy the same."""
    a, b = load_gpu("mi350x"), load_gpu("mi355x")
    assert a.num_compute_units == b.num_compute_units == 256 and a.hbm_bw_GBps == b.hbm_bw_GBps
    assert (a.clock_peak_MHz, a.peak_flops("bf16"), a.peak_flops("fp8")) == (2200.0, 2300e12, 4600e12)
    for field in acc.TABLE_FIELDS:
        mine, base = getattr(a, field), getattr(b, field)
        if isinstance(base, dict):
            assert mine.keys() == base.keys()
            pairs = [(mine[k], base[k]) for k in base]
        else:
            pairs = [(mine, base)]
        for x, y in pairs:
            if y is not None:
                assert x.source.startswith("derived: the mi355x table") and x.source.endswith(y.source)
    big = Gemm(m=8192, n=8192, k=8192)
    for dtype in ("bf16", "fp8"):
        ratio = costs.gemm_time(big, a, dtype) / costs.gemm_time(big, b, dtype)
        want = (b.peak_flops(dtype) * b.clock_ratio) / (a.peak_flops(dtype) * a.clock_ratio)
        assert ratio == pytest.approx(want, rel=0.02) and ratio > 1.05
    assert costs.hbm_time(1e9, a) == pytest.approx(costs.hbm_time(1e9, b))


def test_capacity_padded_dispatch_computes_the_padding():
    """Dense (padded) dispatch runs every expert at its full capacity; dropless runs only
    the routed tokens, so with balanced routing and capacity factor 1.5 padded does 1.5x
    the expert FLOPs."""
    import dataclasses as dc

    from perfsim.plan.routing import RoutingSpec

    model = dc.replace(load_model("olmoe-1b-7b"), capacity_factor=1.5)
    plan = ParallelPlan(dp=8, ep=8, mbs=1, gbs=8, seq=4096)
    expert_flops = []
    for pad in (False, True):
        steps = LayerBuilder(model, plan, routing=RoutingSpec(pad_to_capacity=pad)).moe_forward()
        expert_flops.append(sum(s.flops for s in steps if s.kind is OpKind.GROUPED_GEMM))
    assert expert_flops[1] == pytest.approx(1.5 * expert_flops[0], rel=0.01)


def test_router_top_k_is_a_memory_bound_step():
    model = load_model("olmoe-1b-7b")
    steps = LayerBuilder(model, ParallelPlan(dp=8, ep=8, mbs=1, gbs=8, seq=4096)).moe_forward()
    topk = next(s for s in steps if s.name == "router_topk")
    assert topk.kind is OpKind.ELEMENTWISE and topk.bytes > 0


def test_roofline_exponent_joins_compute_and_hbm_time():
    """p = 0 is the plain roofline max; p = 1 adds the two (no overlap); larger p lies
    between; the profile rejects 0 < p < 1."""
    from perfsim.errors import ConfigError
    from perfsim.system.kernel_tables import GemmEfficiency

    assert costs.roofline(3.0, 4.0, 0.0) == 4.0
    assert costs.roofline(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert costs.roofline(3.0, 4.0, 2.0) == pytest.approx(5.0)
    with pytest.raises(ConfigError, match="roofline_exponent"):
        GemmEfficiency(source="x", tile_m=128, tile_n=128, gflop=(1.0,), efficiency=(0.5,), roofline_exponent=0.5)


def test_skinny_gemm_is_bound_by_its_tiles_serial_k_loop():
    """A skinny-M GEMM whose few output tiles each walk a long K takes at least K x the
    table's K-loop step (one wave), whatever its bytes; a big GEMM is untouched by it."""
    gpu = load_gpu("mi355x")
    table = gpu.gemm_table("fp8")
    assert table.k_step_ns > 0
    short, long_k = costs.Gemm(m=8, n=6144, k=1536), costs.Gemm(m=8, n=1536, k=6144)  # same weight bytes
    assert costs.k_loop_time(long_k, gpu, "fp8") == pytest.approx(6144 * table.k_step_ns * 1e-9)
    assert costs.gemm_time(long_k, gpu, "fp8") > 1.3 * costs.gemm_time(short, gpu, "fp8")
    off = dataclasses.replace(gpu, gemm_dtypes={**gpu.gemm_dtypes, "fp8": dataclasses.replace(table, k_step_ns=0.0)})
    big = costs.Gemm(m=8192, n=8192, k=8192)
    assert costs.gemm_time(big, gpu, "fp8") == costs.gemm_time(big, off, "fp8")
    assert costs.k_loop_time(long_k, off, "fp8") == 0.0


def test_memory_bound_steps_run_at_the_measured_kernels_speed_never_above_a_copy():
    """Elementwise steps take the GPU's fitted ``membound`` table (measured norm / rotary
    kernels), which on MI355X is well below the streaming copy; no size is priced faster
    than the copy, a GPU without the table falls back to the copy, and the optimizer
    step (long streaming passes) stays on the copy."""
    import dataclasses

    from perfsim.lowering.ops import Op, OpKind, Stream
    from perfsim.system.kernel_tables import table_provenance

    gpu = load_gpu("mi355x")
    assert gpu.membound is not None and gpu.membound.source.startswith("fitted by validation/accuracy_kernels.py")
    bare = dataclasses.replace(gpu, membound=None)
    for mb in (0.01, 1.0, 64.0, 512.0, 4096.0):
        b = mb * costs.MBYTE
        assert costs.membound_time(b, gpu) >= costs.hbm_time(b, gpu) * (1 - 1e-12)
        assert costs.membound_time(b, bare) == costs.hbm_time(b, bare)
    big = 1024 * costs.MBYTE
    assert costs.elementwise_time(big, gpu) > 1.8 * costs.elementwise_time(big, bare)  # 2.3-2.7 TB/s measured vs 6.2
    step = dict(op_id=0, stage=0, stream=Stream.COMPUTE, category="x", bytes=big)
    assert costs.compute_time(Op(name="norm", kind=OpKind.ELEMENTWISE, **step), gpu, "bf16") == costs.elementwise_time(big, gpu)
    assert costs.compute_time(Op(name="adam", kind=OpKind.OPTIMIZER, **step), gpu, "bf16") == costs.optimizer_time(big, gpu)
    assert costs.optimizer_time(big, gpu) == costs.hbm_time(big, gpu) + gpu.kernel_launch_s
    rows = {name: status for name, status, _ in table_provenance(gpu)}
    assert rows["membound"] == "measured" and rows["hbm"] == "assumed"
    assert {name: status for name, status, _ in table_provenance(bare)}["membound"] == "assumed"



def test_a_bad_membound_value_is_one_line_naming_the_membound_table(tmp_path):
    """The [membound] table shares the [hbm] table's curve type; its errors name it."""
    from perfsim.errors import ConfigError

    from perfsim.system.hardware import PROFILE_DIR

    text = (PROFILE_DIR / "gpus" / "mi300x.toml").read_text()
    head, _, tail = text.partition("[membound]")
    bad = tail.replace("efficiency = [", "efficiency = [1.5, ", 1)
    bad = bad.replace("mbytes = [", "mbytes = [0.001, ", 1)
    path = tmp_path / "bad.toml"
    path.write_text(head + "[membound]" + bad)
    with pytest.raises(ConfigError, match=r"membound: membound\.efficiency must be in \(0, 1\], got 1\.5"):
        load_gpu(str(path))


def test_grouped_rows_read_tokens_per_expert_from_every_stated_form():
    """The shared grouped sweeps state tokens three ways; each becomes tokens per expert,
    and a count the source leaves unstated (skewed routing of unknown shape) or under one
    token per expert (decode calls leaving most experts empty) is not a row."""
    from validation.data.kernels import make_kernel_csvs as make

    assert make.tokens_per_expert("4096 per expert", 8) == 4096
    assert make.tokens_per_expert("65536 tokens total (uniform routing)", 128) == 512
    assert make.tokens_per_expert("65536 tokens total (mild skew routing)", 128) is None
    assert make.tokens_per_expert("32768 tokens, topk=8", 128) == 2048
    assert make.tokens_per_expert("1024 tokens total, topk=8", 40) == 205  # the mean, rounded
    assert make.tokens_per_expert("8 tokens total, topk=8", 128) is None


def test_a_two_stage_fused_moe_row_becomes_its_two_grouped_gemms():
    """AITER's CK two-stage fused MoE prints each stage's time: gate_up [m, hidden] x
    [hidden, 2 width] and down [m, width] x [width, hidden], one grouped_gemm row each,
    the stage named in the library (the backend split sees it); a one-stage kernel (no
    split printed) gives no row; a VeOmni MoE forward timed whole is one moe_mlp row."""
    from validation.data.kernels import make_kernel_csvs as make

    base = {"series": "aiter_tuned_fmoe_x", "source_url": "src", "hidden": "4096", "expert_width": "384",
            "layout(fwd/wgrad/dgrad)": "fwd (inference fused gate_up+act+down)"}
    two = dict(base, library="AITER fused_moe (tuner log; 2-stage)", note="unit=us (total); us1=25.5 us2=9.25")
    up, down = make.fused_moe_rows(two, "mi355x", "bf16", 128, 64)
    assert (up["m"], up["n"], up["k"], up["batch"], up["time_us"]) == ("64", "768", "4096", "128", "25.5")
    assert (down["n"], down["k"], down["time_us"]) == ("4096", "384", "9.25")
    assert up["library"].startswith("AITER fused_moe stage 1") and down["library"].startswith("AITER fused_moe stage 2")
    assert up["kernel"] == down["kernel"] == "moe_stage"  # inference stages: priced, never fitted
    one = dict(base, library="AITER fused_moe (tuner log; 1-stage asm)", note="unit=us (total); us1=30.0")
    assert make.fused_moe_rows(one, "mi355x", "bf16", 128, 64) == []
    whole = dict(base, library="Torch Fused MoE", note="unit=TFLOPS; latency 10.218 ms",
                 **{"layout(fwd/wgrad/dgrad)": "fwd fused MoE (gate_up + act + down)"})
    (row,) = make.fused_moe_rows(whole, "h100", "bf16", 128, 2048)
    assert (row["kernel"], row["n"], row["k"], row["time_us"]) == ("moe_mlp", "384", "4096", "10218")


def test_inference_fused_moe_stages_inform_no_table_but_are_checked(summaries):
    """AITER's fused-MoE stages gather and scatter their tokens (work a training grouped
    GEMM does not do): a fit never reads them, so MI355X, whose only grouped rows they are,
    fits no grouped table of its own (every fold and the shipped fit) and takes MI300X's
    (``GROUPED_FROM``: speeds against its own dense price), each fold MI300X's fold without
    the held family; the accuracy report still prices the stages, as their own class."""
    stages = [p for p, _ in acc.pool("mi355x") if p.kernel == "moe_stage"]
    assert stages and not any(acc.in_fit_range(p) for p in stages)
    shipped, donor = load_gpu("mi355x"), load_gpu("mi300x")  # acc.refit's, fitted to every row
    assert set(shipped.grouped_gemm) == set(donor.grouped_gemm) == {"bf16", "fp8"}
    for dtype, table in shipped.grouped_gemm.items():
        assert table.source.startswith("derived: the mi300x table")
        assert (table.forward_speed, table.backward_speed) == (donor.grouped_gemm[dtype].forward_speed,
                                                               donor.grouped_gemm[dtype].backward_speed)
    for held in {f for _, f in acc.pool("mi355x")}:
        gpu, cells, _ = acc.fit_tables("mi355x", held)  # the folds summaries fitted
        assert ("grouped_gemm", "bf16") not in cells
        base = acc.fit_tables("mi300x", acc._root(held), root=True)[0]
        assert gpu.grouped_table("bf16").forward_speed == base.grouped_table("bf16").forward_speed
    assert ("fused_moe", "bf16") in summaries["mi355x"]


def test_a_borrowed_grouped_table_never_replaces_a_gpus_own():
    """``borrow_grouped`` fills only the dtypes a GPU fitted no grouped table for, and says
    where the borrowed one comes from; a GPU with all its own keeps them."""
    own, donor = load_gpu("h100"), load_gpu("mi300x")
    assert acc.borrow_grouped(own, donor).grouped_gemm["bf16"] is own.grouped_gemm["bf16"]
    bare = dataclasses.replace(own, grouped_gemm={})
    got = acc.borrow_grouped(bare, donor).grouped_gemm
    assert set(got) == set(donor.grouped_gemm) and got["bf16"].forward_speed == donor.grouped_gemm["bf16"].forward_speed
    assert got["bf16"].source.startswith("derived: the mi300x table") and donor.grouped_gemm["bf16"].source in got["bf16"].source


def test_a_moe_mlp_row_is_priced_as_its_layers_steps():
    """A MoE MLP forward timed whole: permute, gate_up and down grouped GEMMs, SwiGLU
    (unfused), unpermute -- more than its two grouped GEMMs, and its FLOPs count both."""
    from perfsim.calibration.kernel_fit import predict_kernel
    from perfsim.calibration.readers import KernelPoint

    gpu = load_gpu("h100")
    p = KernelPoint(kind="grouped_gemm", dtype="bf16", device="h100", time_s=1e-2, m=2048, n=768, k=2048,
                    batch=128, direction="fwd", kernel="moe_mlp")
    groups = (2048,) * 128
    gemms = (costs.grouped_gemm_time(groups, 2 * 768, 2048, gpu, "bf16")
             + costs.grouped_gemm_time(groups, 2048, 768, gpu, "bf16"))
    assert predict_kernel(p, gpu) > gemms
    assert p.flops == pytest.approx(2 * 128 * 2048 * (2048 * 2 * 768 + 768 * 2048))


def test_a_moe_mlp_row_is_checked_but_informs_no_table():
    """A MoE MLP forward timed whole holds the framework's routing-side work besides the
    expert GEMMs: priced and checked, never fitted (as an inference fused-MoE stage)."""
    rows = [p for p, _ in acc.pool("h100") if p.kernel == "moe_mlp"]
    assert rows and not any(acc.in_fit_range(p) for p in rows)


def test_a_gemm_timed_forward_and_backward_together_is_priced_as_both():
    """direction fwd_bwd: the forward launch plus the dgrad and wgrad launches; a
    ``sum_loss`` row (the op timed as a training step with output.sum() as the loss) adds
    one pass reading the output and one writing its gradient. FLOPs count three GEMMs."""
    from perfsim.calibration.kernel_fit import predict_kernel
    from perfsim.calibration.readers import KernelPoint

    gpu = load_gpu("h100")
    shape = dict(kind="grouped_gemm", dtype="bf16", device="h100", time_s=1e-3, m=512, n=1536, k=2048, batch=128)
    fwd, bwd, both = (predict_kernel(KernelPoint(**shape, direction=d), gpu) for d in ("fwd", "bwd", "fwd_bwd"))
    assert both == pytest.approx(fwd + bwd)
    step = predict_kernel(KernelPoint(**shape, direction="fwd_bwd", kernel="sum_loss"), gpu)
    out_bytes = 128 * 512 * 1536 * 2
    assert step == pytest.approx(both + 2 * costs.elementwise_time(out_bytes, gpu))
    assert KernelPoint(**shape, direction="fwd_bwd").flops == pytest.approx(3 * 2 * 128 * 512 * 1536 * 2048)
    assert KernelPoint(**shape, direction="bwd").flops == pytest.approx(2 * 2 * 128 * 512 * 1536 * 2048)
    dense = dict(shape, kind="gemm", batch=1)
    assert predict_kernel(KernelPoint(**dense, direction="fwd_bwd"), gpu) == pytest.approx(
        sum(predict_kernel(KernelPoint(**dense, direction=d), gpu) for d in ("fwd", "bwd")))


def test_tgale96_rows_are_whole_training_steps():
    """tgale96/grouped_gemm PR #37's TFLOPS are forward FLOPs over the whole step its
    benchmark times (forward, out.sum(), backward; the author's run.log prints "Time per
    step" beside them): its rows are fwd_bwd sum_loss rows at that step time."""
    rows = [r for r in csv.DictReader(open(acc.DATA / "check" / "h100.csv")) if r["meta_family"] == "tgale96"]
    assert rows and all((r["direction"], r["kernel"]) == ("fwd_bwd", "sum_loss") for r in rows)
    cooperative = next(r for r in rows if "cooperative" in r["library"])
    assert float(cooperative["time_us"]) == pytest.approx(2 * 65536 * 1536 * 2048 / 160.5e12 * 1e6, rel=1e-4)


def test_a_grouped_fit_does_not_start_from_the_table_it_replaces():
    """Step-timed rows alone leave the forward / backward split open: the fit must settle it
    from a fixed start, not from the profile's table (fitted to every family, it would carry a
    held-out family into its own fold)."""
    from perfsim.calibration import kernel_fit
    from perfsim.system.kernel_tables import GroupedGemmEfficiency

    rows = [p for p, f in acc.pool("h100") if f == "tgale96"]
    base = load_gpu("h100")
    speeds = []
    for start in (0.3, 1.5):
        table = GroupedGemmEfficiency(source="a start", tokens=(512.0,), forward_speed=(start,), backward_speed=(start,))
        gpu = dataclasses.replace(base, grouped_gemm={"bf16": table})
        fitted, _ = kernel_fit.fit_kernels(rows, gpu)
        speeds.append((fitted.grouped_gemm["bf16"].forward_speed, fitted.grouped_gemm["bf16"].backward_speed))
    assert speeds[0] == speeds[1]


def test_transformer_engine_grouped_rows_are_forward_calls_at_their_tflops():
    """Transformer Engine PR #2045's H100 table: g experts of m tokens each (g x m = 32,768 in
    both shapes), one forward grouped call, at the TFLOPS printed, as the family
    transformer-engine."""
    rows = [r for r in csv.DictReader(open(acc.DATA / "check" / "h100.csv")) if r["meta_family"] == "transformer-engine"]
    assert len(rows) == 8 and all(r["direction"] == "fwd" and r["kind"] == "grouped_gemm" for r in rows)
    assert {int(r["m"]) * int(r["batch"]) for r in rows} == {32768}
    te27 = next(r for r in rows if "TE 2.7" in r["library"] and "cuBLAS" in r["library"] and r["batch"] == "8")
    assert float(te27["time_us"]) == pytest.approx(2 * 8 * 4096 * 768 * 2048 / 627.903e12 * 1e6, rel=1e-4)


def test_flydsl_rows_are_aiter_family_at_their_printed_figures():
    """ROCm/FlyDSL's MI355X rows (public/flydsl.csv): GEMM shapes M x N x K at 2 M N K /
    TFLOPS; attention forwards at PR 629's printed time, or, CI rows, at the causal half of
    4 B H S^2 D over the TFLOPS (the convention PR 629's own time and TFLOPS reproduce);
    counted with aiter's family (same harness code and kernels); one row per shape kept."""
    from pathlib import Path

    from validation.data.kernels import make_kernel_csvs as make

    rows = make.flydsl_rows(Path(make.PUBLIC) / "flydsl.csv")
    assert {r["device"] for r in rows} == {"mi355x", "mi325x"} and {r["meta_family"] for r in rows} == {"aiter"}
    assert {r["dtype"] for r in rows} == {"bf16", "fp8"}  # its one FP16 row is not in the copy
    fp8 = [r for r in rows if r["kind"] == "gemm" and r["dtype"] == "fp8" and (r["m"], r["n"], r["k"]) == ("8192",) * 3]
    assert sorted(float(r["time_us"]) for r in fp8)[0] == pytest.approx(2 * 8192 ** 3 / 3082.59e12 * 1e6, rel=1e-5)
    pr = [r for r in rows if r["kind"] == "attention" and r["seq"] == "512"]
    assert {float(r["time_us"]) for r in pr} == {80.1, 81.7, 91.7, 80.4}
    # the printed TFLOPS of PR 629's 80.1 us row is the causal half of 4 B H S^2 D
    assert 4 * 8 * 64 * 512 ** 2 * 128 / 2 / 80.1e-6 / 1e12 == pytest.approx(429.1, rel=2e-3)
    ci = next(r for r in rows if r["kind"] == "attention" and r["batch"] == "16")
    assert float(ci["time_us"]) == pytest.approx(4 * 16 * 16 * 8192 ** 2 * 128 / 2 / 1172.1e12 * 1e6, rel=1e-5)
    kept = make.fastest(rows)
    assert len([r for r in kept if r["kind"] == "attention" and r["seq"] == "512"]) == 1
    assert next(r for r in kept if r["kind"] == "attention" and r["seq"] == "512")["time_us"] == "80.1"


def test_single_author_gemm_rows_keep_their_device_timing_and_family():
    """public/gemm_bf16_misc.csv: each author its own family, each row at its printed time (or
    2 m n k / TFLOPS) with its own timing method; kimi_k3's two runs of one shape leave one row."""
    from pathlib import Path

    from validation.data.kernels import make_kernel_csvs as make

    rows = make.misc_gemm_rows(Path(make.PUBLIC) / "gemm_bf16_misc.csv")
    assert {(r["device"], r["meta_family"], r["timing"]) for r in rows} == {
        ("mi300x", "gaunernst", "device"), ("mi355x", "kimik3", "host"), ("mi350x", "alfredyu24", "host")}
    cube = next(r for r in rows if r["meta_family"] == "gaunernst")
    assert float(cube["time_us"]) == pytest.approx(2 * 4096 ** 3 / 548.09e12 * 1e6, rel=1e-5)
    head = [r for r in make.fastest(rows) if r["meta_family"] == "kimik3" and r["n"] == "163840"]
    assert len(head) == 1 and head[0]["time_us"] == "14553.9"  # the faster of the two runs


def test_attn_dsl_bench_keeps_aiter_and_cudnn_training_one_row_per_pass():
    """attn-dsl-bench's MI300X sweep gives its AITER rows only (SDPA and Triton dropped), at the
    event-timed mean; cuDNN frontend's training results give forward and backward rows, causal
    for ``top_left``, and one row per shape and pass once the faster backend is kept."""
    from pathlib import Path

    from validation.data.kernels import make_kernel_csvs as make

    aiter = make.attn_dsl_bench_rows(Path(make.PUBLIC) / "attn_dsl_bench_mi300x.csv")
    assert len(aiter) == 10 and all(r["library"].startswith("AITER") for r in aiter)
    big = next(r for r in aiter if r["seq"] == "16384" and r["head_dim"] == "128")
    assert float(big["time_us"]) == pytest.approx(4 * 16 * 16 * 16384 ** 2 * 128 / 2 / 494.4313e12 * 1e6, rel=1e-5)
    training = make.cudnn_frontend_training_rows(Path(make.PUBLIC) / "cudnn_frontend_h200_training.csv")
    assert {r["direction"] for r in training} == {"fwd", "bwd"} and {r["meta_family"] for r in training} == {"cudnn-frontend"}
    assert len(training) == 104 and len(make.fastest(training)) == 52
    ltx = [r for r in make.fastest(training) if r["seq"] == "6144"]
    assert sorted(r["time_us"] for r in ltx) == ["2303", "835"]  # FlashAttention-4 faster both ways


def test_moonmath_rows_are_aiter_v3_at_rtne_as_their_own_family():
    """MoonMath's MI300X table gives one row a shape: AITER's v3 forward at round-to-nearest-even
    (its own kernel, Modular MAX and the other rounding modes not kept), non-causal MHA, the
    printed milliseconds; a family of its own whose rows the ``aiter_v3`` library table selects."""
    from pathlib import Path

    from validation import accuracy_kernels as ak
    from validation.data.kernels import make_kernel_csvs as make

    rows = make.moonmath_rows(Path(make.PUBLIC) / "moonmath_mi300x_attention.csv")
    assert len(rows) == 9 and {r["meta_family"] for r in rows} == {"moonmath"}
    assert all(r["library"].startswith("AITER") and r["causal"] == "0" and r["heads"] == r["kv_heads"] for r in rows)
    longest = next(r for r in rows if r["seq"] == "131072")
    assert (longest["batch"], longest["heads"], longest["time_us"]) == ("1", "16", "269278")  # AITER v3 RTNE 269.278 ms
    point = type("P", (), {"head_dim": 128})()
    assert ak.ATTENTION_LIBRARIES["aiter_v3"](longest, point)


def test_h200_grouped_rows_keep_production_kernels_only():
    """TileOPs PR 1567's H200 sweep gives rows for ``torch._grouped_mm`` and DeepGEMM only (its
    own and Triton's kernels dropped, as the rules drop research kernels), 256 experts of m
    tokens, at 2 g m n k / TFLOPS; PyTorch PR 156203's row at its printed time."""
    from pathlib import Path

    from validation.data.kernels import make_kernel_csvs as make

    rows = make.h200_grouped_rows(Path(make.PUBLIC) / "h200_grouped_bf16.csv")
    assert len(rows) == 9 and {r["meta_family"] for r in rows} == {"tileops", "pytorch"}
    assert not any("Triton" in r["library"] or "3wg" in r["library"] for r in rows)
    deep = next(r for r in rows if r["library"].startswith("DeepGEMM") and r["m"] == "2048")
    assert float(deep["time_us"]) == pytest.approx(2 * 256 * 2048 * 4096 * 6144 / 670e12 * 1e6, rel=1e-5)
    big = next(r for r in rows if r["meta_family"] == "pytorch")
    assert (big["m"], big["batch"], big["time_us"]) == ("128000", "16", "298667")


def test_primerl_rows_are_torch_grouped_mm_forwards_and_summed_backwards():
    """prime-rl's H200 sweep gives two rows a shape: the forward call at its printed time and
    the dgrad and wgrad calls, timed apart, summed as one ``bwd`` row; 32 experts of the
    balanced routing's tokens each, family ``prime-rl``, rows the ``torch_grouped_mm``
    library table selects."""
    from pathlib import Path

    from validation import accuracy_kernels as ak
    from validation.data.kernels import make_kernel_csvs as make

    rows = make.primerl_grouped_rows(Path(make.PUBLIC) / "primerl_h200_grouped.csv")
    assert len(rows) == 36 and {r["meta_family"] for r in rows} == {"prime-rl"} and {r["batch"] for r in rows} == {"32"}
    small = {r["direction"]: r for r in rows if (r["m"], r["k"]) == ("128", "4096")}
    assert (small["fwd"]["time_us"], small["bwd"]["time_us"]) == ("393.2", "850.5")  # 0.3932 ms; 0.3917 + 0.4588 ms
    down = next(r for r in rows if (r["m"], r["k"], r["direction"]) == ("8192", "2048", "fwd"))
    assert (down["n"], down["time_us"]) == ("4096", "6873.6")
    point = type("P", (), {"dtype": "bf16"})()
    assert ak.GROUPED_LIBRARIES["torch_grouped_mm"](down, point)


@pytest.mark.parametrize("cells, message", [
    (dict(kind="gemm", direction="both"), "direction 'both' is not one of fwd, bwd, fwd_bwd (or empty: fwd) for kind gemm"),
    (dict(kind="grouped_gemm", batch="8", direction="fwd_bwd", kernel="moe_mlp"),
     "kernel 'moe_mlp' times a forward; direction must be fwd, got 'fwd_bwd'"),
    (dict(kind="gemm", direction="fwd", kernel="sum_loss"),
     "kernel 'sum_loss' times forward and backward together; direction must be fwd_bwd, got 'fwd'"),
])
def test_a_gemm_direction_that_cannot_be_priced_is_one_clear_error(tmp_path, cells, message):
    from perfsim.calibration.readers import read_kernel_csv
    from perfsim.errors import ConfigError

    path = one_row_csv(tmp_path, **{"dtype": "bf16", "m": "64", "n": "64", "k": "64", "time_us": "5", **cells})
    with pytest.raises(ConfigError, match="k.csv:2: " + message.replace("(", r"\(").replace(")", r"\)")):
        read_kernel_csv(path)


def one_row_csv(tmp_path, **cells):
    """``tmp_path/k.csv``: a kernel CSV of one row of ``cells`` (the rest empty)."""
    return write_kernel_csv(tmp_path / "k.csv", [cells])


def test_a_pricing_label_on_the_wrong_kind_of_row_is_one_clear_error(tmp_path):
    from perfsim.calibration.readers import read_kernel_csv
    from perfsim.errors import ConfigError

    path = one_row_csv(tmp_path, kind="gemm", dtype="bf16", m="64", n="64", k="64", kernel="moe_mlp", time_us="5")
    with pytest.raises(ConfigError, match=r"k.csv:2: kernel 'moe_mlp' is for kind grouped_gemm rows, got kind gemm"):
        read_kernel_csv(path)


def test_a_grouped_table_written_before_speeds_is_refused_with_what_to_do(tmp_path):
    """A GPU profile whose grouped table still holds the old fraction-of-peak keys is one
    clear error naming the key and saying how to refit, not a silent misprice."""
    from perfsim.errors import ConfigError
    from perfsim.system.hardware import PROFILE_DIR

    text = (PROFILE_DIR / "gpus" / "mi300x.toml").read_text()
    assert "backward_speed" in text
    old = text.replace("forward_speed", "forward_efficiency").replace("backward_speed", "backward_efficiency")
    path = tmp_path / "old.toml"
    path.write_text(old)
    with pytest.raises(ConfigError, match=r"unknown key 'backward_efficiency'.*refit it with perfsim calibrate"):
        load_gpu(str(path))


def test_a_host_timed_series_fits_its_host_time_beside_the_table_not_into_it():
    """A harness timed by host wall clock over back-to-back calls (``timing = host``,
    Primus-Turbo's Timer.timeit) reads the longer of the GPU time and its host time per
    call: the fit takes that host time as a per-series number beside the table, so the
    table keeps pricing small GEMMs at their GPU time. The same rows read as GPU time
    teach the table a small-GEMM fall-off the kernel does not have."""
    from perfsim.calibration import kernel_fit
    from perfsim.calibration.readers import KernelPoint

    gpu = load_gpu("mi300x")
    floor = 80e-6

    def rows(shapes, timing, series):
        out = []
        for m, n, k in shapes:
            p = KernelPoint(kind="gemm", dtype="bf16", device="mi300x", time_s=1.0, m=m, n=n, k=k, direction="fwd",
                            timing=timing, series=series)
            t = kernel_fit.predict_kernel(p, gpu)
            out.append(dataclasses.replace(p, time_s=max(t, floor) if timing == "host" else t))
        return out

    device = rows([(s, s, s) for s in (2048, 4096, 8192, 16384)], "device", "events")
    host = rows([(s, s, s) for s in (512, 1024, 2048, 3072, 4096, 8192)], "host", "timer")
    assert sum(p.time_s == floor for p in host) >= 3  # the small calls time the harness
    small = Gemm(m=1024, n=1024, k=1024)
    truth = costs.gemm_time(small, gpu, "bf16")

    fitted, fits = kernel_fit.fit_kernels(device + host, gpu, regenerate_gemm=True)
    (fit,) = fits
    assert list(fit.host_floors.values()) == [pytest.approx(floor, rel=0.05)]
    assert "timer fwd: 80 us" in fit.note
    assert costs.gemm_time(small, fitted, "bf16") == pytest.approx(truth, rel=0.25)

    as_device = [dataclasses.replace(p, timing="device") for p in host]
    leaked, _ = kernel_fit.fit_kernels(device + as_device, gpu, regenerate_gemm=True)
    assert costs.gemm_time(small, leaked, "bf16") > 2 * truth


def test_a_bad_timing_is_one_clear_error(tmp_path):
    from perfsim.calibration.readers import read_kernel_csv
    from perfsim.errors import ConfigError

    row = dict(kind="gemm", dtype="bf16", m="64", n="64", k="64", time_us="5")
    with pytest.raises(ConfigError, match=r"k.csv:2: timing 'wall' is not one of device, host"):
        read_kernel_csv(one_row_csv(tmp_path, **row, timing="wall"))
    assert read_kernel_csv(one_row_csv(tmp_path, **row, timing="HOST"))[0].timing == "host"


def test_only_a_host_timed_series_whose_fastest_calls_read_flat_gets_a_host_time():
    """A host time per call is fitted only where the harness shows one: several of its
    fastest calls, of different work, reading the same time. Elsewhere it would be free to
    sit under any lone fast row and absorb the table's misfit."""
    from perfsim.calibration.kernel_fit import host_floors
    from perfsim.calibration.readers import KernelPoint

    def p(series, m, us, timing="host"):
        return KernelPoint(kind="gemm", dtype="fp8", device="mi300x", time_s=us * 1e-6, m=m, n=4096, k=4096,
                           timing=timing, series=series)

    flat = [p("flat", 256, 95), p("flat", 512, 99), p("flat", 1024, 101), p("flat", 8192, 400)]
    steep = [p("steep", 256, 40), p("steep", 512, 70), p("steep", 1024, 130), p("steep", 2048, 250)]
    same_work = [p("same", 1024, 95), p("same", 1024, 96), p("same", 1024, 97), p("same", 4096, 300)]
    events = [p("events", m, 95, timing="device") for m in (256, 512, 1024)]
    floors = host_floors(flat + steep + same_work + events)
    assert {key[0]: value for key, value in floors.items()} == {"flat": pytest.approx(95e-6)}


def test_interp_log_is_np_interp_in_log10_on_one_point():
    """The table reader the fits call millions of times does np.interp's arithmetic (same
    result to the bit: the held-out figures do not move), clamps at both ends, and passes a
    NaN through instead of failing."""
    import math
    import random

    import numpy as np

    xs, ys = (0.1, 1.0, 10.0, 100.0, 1000.0), (0.1, 0.3, 0.6, 0.8, 0.85)
    rng = random.Random(0)
    probes = [10 ** rng.uniform(-3, 5) for _ in range(2000)] + list(xs) + [1e-40, -5.0, math.inf]
    for x in probes:
        want = float(np.interp(math.log10(max(x, 1e-30)), np.log10(xs), ys))
        assert costs.interp_log(x, xs, ys) == want, x
    assert costs.interp_log(5.0, (1.0,), (0.7,)) == 0.7
    assert math.isnan(costs.interp_log(math.nan, xs, ys))
    assert costs.interp_log(3.0, list(xs), list(ys)) == costs.interp_log(3.0, xs, ys)  # lists read as tuples


def test_openxla_sm90_table_gives_bf16_rows_only_within_peak():
    """OpenXLA's sm_90 matmul table (validation/data/kernels/public/xla_sm90_matmul.csv, as
    published): every (b, m, n, k) of its sweep becomes one BF16 GEMM row of the h100 profile,
    batched b-fold, at a time no faster than the H100's dense BF16 peak; its FP8 column, whose
    large dots run faster than the dense FP8 peak, gives no row."""
    from pathlib import Path

    from validation.data.kernels import make_kernel_csvs as make

    rows = make.xla_rows(Path(make.PUBLIC) / "xla_sm90_matmul.csv")
    assert len(rows) == 3 * 5 ** 3 and {r["dtype"] for r in rows} == {"bf16"}
    assert {r["device"] for r in rows} == {"h100"} and {r["meta_family"] for r in rows} == {"openxla"}
    assert {r["batch"] for r in rows} == {"1", "2", "4"} and {r["meta_series"] for r in rows} == {
        "openxla_sm90_bf16_b1", "openxla_sm90_bf16_b2", "openxla_sm90_bf16_b4"}
    peak = load_gpu("h100").peak_flops("bf16")
    for r in rows:
        flops = 2.0 * int(r["batch"]) * int(r["m"]) * int(r["n"]) * int(r["k"])
        assert 0 < flops / (float(r["time_us"]) * 1e-6) <= peak
    fp8_peak = load_gpu("h100").peak_flops("fp8")
    published = list(csv.DictReader(open(Path(make.PUBLIC) / "xla_sm90_matmul.csv")))
    assert max(float(r["fp8"]) for r in published) > fp8_peak  # why the FP8 column is not read


def test_hipblaslt_bench_rows_are_host_timed_and_the_azure_series_shows_its_host_time():
    """hipblaslt-bench times its hot calls by host clock around a loop of back-to-back calls
    (as Primus-Turbo's Timer.timeit does): its rows are ``timing = host``, and the Azure
    guide's MI300X FP8 series, whose three smallest GEMMs (8x apart in work) all read about
    40 us, gets that host time per call fitted beside the table instead of bending the FP8
    table's fall-off; cuBLASLt's bench rows (events, no such plateau) stay device-timed."""
    from pathlib import Path

    from perfsim.calibration.kernel_fit import harness, host_floors
    from perfsim.calibration.readers import read_kernel_csv
    from validation.data.kernels import make_kernel_csvs as make

    assert make.timing_of("azure_ai_benchmarking_guide", "hipBLASLt (hipblaslt-bench)") == "host"
    assert make.timing_of("amd_maf_blog", "hipBLASLt-bench (commit db8e93b4fd6); ROCm 6.3.0") == "host"
    assert make.timing_of("azure_ai_benchmarking_guide", "cuBLASLt (cublasLt matmul bench)") == "device"
    assert make.timing_of("primus_turbo_gemm", "Primus-Turbo") == "host"
    folders = [Path(acc.__file__).parent / "data" / "kernels" / split for split in acc.SPLITS]  # either split file
    azure = [p for f in folders for p in read_kernel_csv(f / "mi300x.csv") if p.series == "azure_ai_benchmarking_guide"]
    assert len(azure) == 9 and {p.timing for p in azure} == {"host"}
    floors = host_floors(azure)
    assert list(floors) == [harness(azure[0])] and floors[harness(azure[0])] == pytest.approx(40.16e-6, rel=1e-3)
    nvidia = [p for f in folders for p in read_kernel_csv(f / "h100.csv") if p.series == "azure_ai_benchmarking_guide"]
    assert nvidia and {p.timing for p in nvidia} == {"device"}


def test_aiter_backward_rows_are_the_a32_variant_the_stacks_run(tmp_path):
    """AITER's asm v3 attention backward prints two numerics variants; the training stacks run
    a32 (dq in fp32 atomics: Transformer Engine ROCm's default, Primus' launchers on MI300X /
    MI325X), so the reader drops the faster a16 rows rather than keeping them as the fastest,
    and the committed MI300X rows of aiter's README are a32 backwards only."""
    from validation.data.kernels import make_kernel_csvs as make

    header = ("series,gpu,dtype,kernel,batch,seqlen,n_heads,n_kv_heads,head_dim,causal,direction(fwd/bwd),tflops,"
              "kind,source_url,note")
    lines = [header] + [f"s,MI300X,bf16,AITER mha asm v3 kernel (fmha_v3_fwd/fmha_v3_bwd) {v},1,4096,32,8,128,1,bwd,"
                        f"{t},measured,src," for v, t in (("a16 (dq accumulated in fp16/bf16 atomics)", "330"),
                                                          ("a32 (fp32 atomic dq accumulation)", "300"))]
    path = tmp_path / "attention.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = make.fastest(make.attention_rows(path))
    assert len(rows) == 1 and "a32" in rows[0]["library"]
    committed = [r for split in acc.SPLITS for r in csv.DictReader(open(acc.DATA / split / "mi300x.csv"))
                 if r["meta_series"] == "aiter_mha_asm_readme" and r["direction"] == "bwd"]
    assert committed and all("a32 (fp32 atomic" in r["library"] for r in committed)
