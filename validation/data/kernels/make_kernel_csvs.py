"""Build ``fit/<gpu>.csv`` and ``check/<gpu>.csv`` (perfsim kernel CSV schema) from the
shared kernel sweeps (``../shared/data/calibration/kernels/*.csv`` and
``../shared/data/calibration/gemm_measured.csv``). Run once by hand; the outputs are
committed so a clone calibrates and validates without ``../shared``.

    .venv/bin/python validation/data/kernels/make_kernel_csvs.py ../shared/data/calibration

Rules (fixed before any fit; see SOURCES.md beside this file):

* device: a row goes to the perfsim GPU its ``gpu`` label names (``MI300X/MI325X (gfx942,
  304 CU)`` -> mi300x, ``MI355X/MI350X (gfx950, 256 CU)`` -> mi355x, ``MI350X`` alone
  -> mi350x, H800 -> h100 (same
  SXM5 compute); rows for other GPUs or with an unstated GPU are dropped.
* library: perfsim prices the production library a training stack calls (hipBLASLt,
  aiter/CK asm, Primus-Turbo, cuBLAS(Lt), CUTLASS, DeepGEMM, FlashAttention); research
  and experimental kernels (TLX, Gluon, HipKittens' own kernels, Triton tutorials,
  PyTorch SDPA / eager attention) are dropped, as are rows with an unstated direction,
  causal flag or FLOP convention, inference-fused MoE (gate_up+act+down in one call),
  suite averages and FP4/MXFP8.
* split by source family (the repository or publication a row comes from): in each
  (gpu, kind, dtype) cell the family whose fittable rows span the widest x range (then
  the most rows) is the fit set; every other family is the check set. A cell with one
  family splits by kernel backend within it instead, a weaker split that the accuracy
  report flags. Memory-bound rows and FP8 rows timed with their input casts are never
  fitted (checks only).
* fp8 means per-tensor / per-row / per-token scaling (Transformer Engine's default
  recipes); block-scaled FP8 is a different kernel class and is dropped.
* an FP8 series slower than its family's BF16 rows on the same shapes times a fallback
  path and is dropped (``drop_fallbacks``; added in round 4, SOURCES.md).
* one row per shape and family for GEMM and attention: the fastest kernel reported
  (perfsim prices the best tuned production kernel, not a superseded baseline), among the
  numerics variants the training stacks run (``NON_DEFAULT_NUMERICS``: AITER's a16 backward
  is dropped for its a32 twin).
* size: at most ``CAP`` rows per series and ``CELL_CAP`` per family in a cell, evenly spaced in time.

The accuracy figures (``validation/accuracy_kernels.py``) pool fit/ and check/ and hold out
one source family at a time (leave one family out); the split written here is kept for
reference (SOURCES.md, "Held-out protocol now used").
"""

import csv
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from perfsim.calibration.readers import KERNEL_CSV_COLUMNS  # noqa: E402

CAP = 60
MIN_MATCHED = 3  # shapes an FP8 series must share with BF16 rows of its family to be judged a fallback
CELL_CAP = 300
COLUMNS = KERNEL_CSV_COLUMNS + ("meta_series", "meta_family")
EXPERIMENTAL = ("tlx", "gluon", "hipkittens [", "triton(", "triton tutorial", "triton_tutorial", "pytorch sdpa",
                "standard attention", "triton grouped gemm (agent")  # matched on the kernel/library label
# AITER's asm v3 attention backward comes in two numerics variants: dq accumulated with fp32
# atomics (a32) or with 16-bit ones (a16: faster, a median 11% on aiter's MI300X README rows,
# less accurate). Transformer Engine ROCm's CK fused attention runs a32 unless told otherwise
# (fused_attn_ck.cpp: getenv NVTE_CK_IS_V3_ATOMIC_FP32, default 1) and Primus' launchers set it
# to 1 on MI300X / MI325X (with PRIMUS_TURBO_ATTN_V3_ATOMIC_FP32=1): the a16 rows are a variant
# the training stacks perfsim prices do not run, not a faster tuning of the same kernel, so
# ``fastest`` must not pick them over their a32 twins (session 49; until then it did)
NON_DEFAULT_NUMERICS = ("a16 (dq accumulated", "v3_atomic_fp32=0")  # matched on the kernel label


def gpu_of(label: str) -> str | None:
    low = label.lower()
    if "mi325x" in low and "mi300x" not in low:
        return "mi325x"
    if low.startswith(("mi300x", "mi300 (mi300x")) or "gfx942" in low:
        return "mi300x" if "1005mhz" not in low else None  # clock-pinned report: not a stock part
    if low.startswith("mi355x") or low.startswith("gfx950"):
        return "mi355x"
    if low.startswith("mi350x"):  # the air-cooled gfx950 SKU named as such (not "MI355X/MI350X")
        return "mi350x"
    if low.startswith("h100") or low.startswith("h800") or low.startswith("hopper"):
        return "h100"
    if low.startswith("h200"):
        return "h200"
    return None


BLOCK_SCALED = ("blockscale", "blockwise", "block-w", "1x128", "per_1x32", "abquant")  # per_1x32: MX scaling


def dtype_of(label: str) -> str | None:
    """perfsim's ``fp8`` is per-tensor / per-row / per-token scaled FP8 (Transformer
    Engine's default recipes); block-scaled FP8 (DeepSeek 1x128/128x128) is a different
    kernel class perfsim does not model, and is dropped with MXFP8, FP4 and INT8."""
    low = label.lower()
    if "mxfp8" in low or "fp4" in low or "int8" in low or any(tag in low for tag in BLOCK_SCALED):
        return None
    if "fp8" in low or "a8w8" in low or "f8" in low or "float8" in low:
        return "fp8"
    if low.startswith("bf16") or "bfloat16" in low:
        return "bf16"
    if low.startswith("fp16"):
        return "fp16"
    return None


def family_of(series: str) -> str:
    """The source family a series is held out with: one measurement campaign's harness and
    kernels. ROCm/FlyDSL's rows count as ``aiter``'s: its benchmark harness
    (tests/test_common.py) is a copy of aiter's ``perftest``, its GEMM kernels are the ones
    aiter's tuned-GEMM logs already time (``libtype=flydsl``), and its FMHA table times
    aiter's CK and asm kernels beside its own (decided with both splits' figures seen:
    validation/data/kernels/SOURCES.md, session 46). EmbeddedLLM/vllmtests' MI300X FP8 rows
    likewise: aiter's own tuner script timing aiter's CK kernels."""
    for prefix, fam in (("primus_turbo", "primus-turbo"), ("aiter", "aiter"), ("mamf", "mamf"), ("azure", "azure"),
                        ("deepgemm", "deepgemm"), ("vllm", "vllm"), ("fb_triton", "fb-triton"), ("hipkittens", "hipkittens"),
                        ("tgale96", "tgale96"), ("amd_maf", "amd-maf-blog"), ("pytorch_benchmark", "pytorch-benchmark"),
                        ("tritonbench", "tritonbench"), ("fa_issue", "flash-attention"), ("fa4", "flash-attention"),
                        ("perfsim_device", "perfsim-device"), ("openxla", "openxla"), ("te_pr2045", "transformer-engine"),
                        ("cudnn_frontend", "cudnn-frontend"), ("flydsl", "aiter"), ("embeddedllm", "aiter"),
                        ("primerl", "prime-rl")):
        if series.startswith(prefix):
            return fam
    return series.split("_")[0]


def experimental(label: str) -> bool:
    low = label.lower()
    return any(tag in low for tag in EXPERIMENTAL)


def timing_of(series: str, library: str = "") -> str:
    """How a series was timed (the ``timing`` column): Primus-Turbo's benchmark harness
    times with torch.utils.benchmark's Timer.timeit, host wall clock over back-to-back
    calls (shared SOURCES.md, "Timing methods differ across sources"); so does hipBLASLt's
    benchmark client, hipblaslt-bench (clients/include/testing_matmul.hpp: the hot calls
    are issued back to back between two host clock reads, get_time_us_sync, and the time
    divided by the count; the Azure guide's runner adds --flush and rotating buffers per
    call, yosoyjay/AI-benchmarking-guide benchmarks/amd/hipBLAS_runner.sh), and its
    MI300X FP8 rows show the host time: 1024^3, 1024 x 2145 x 1024 and 2048^3, 8x apart in
    work, all read 40 us; the others with GPU events or do_bench."""
    if family_of(series) == "primus-turbo" or "hipblaslt-bench" in library.lower():
        return "host"
    return "device"


def _row(kind, dtype, device, series, source, library, **cells) -> dict:
    row = dict.fromkeys(COLUMNS, "")
    row.update(kind=kind, dtype=dtype, device=device, library=library.replace(",", ";"), source=source,
               timing=timing_of(series, library), meta_series=series, meta_family=family_of(series),
               **{k: str(v) for k, v in cells.items()})
    return row


def _time_us(printed: str, flops: float, tflops: str | float) -> str:
    """A row's time in microseconds: as printed, else its FLOPs at the printed TFLOPS."""
    return f"{float(printed) if printed else flops / (float(tflops) * 1e6):.6g}"


def _ms_as_us(ms: str | float) -> str:
    """A time printed in milliseconds, as a row's microseconds."""
    return f"{float(ms) * 1e3:.6g}"


def gemm_rows(path: Path) -> list[dict]:
    out = []
    for r in csv.DictReader(open(path)):
        gpu, dtype = gpu_of(r["gpu"]), dtype_of(r["dtype"] + " " + r["library"])
        if not (gpu and dtype) or experimental(r["library"]) or r["kind"].startswith("derived estimate"):
            continue
        try:
            m, n, k, tflops = int(r["m"]), int(r["n"]), int(r["k"]), float(r["tflops"])
        except ValueError:
            continue
        bwd = r["series"].endswith("_bwd")
        flops = (4 if bwd else 2) * m * n * k * int(r["batch"] or 1)
        act_quant = "incl. act quant" in r["library"].lower() or "incl. quant" in r["library"].lower()
        # Primus-Turbo's benchmark harness quantizes both bf16 inputs inside the timed FP8 call
        # (shared SOURCES.md: Timer.timeit, host wall-clock incl. launch and the casts): its
        # turbo.ops.gemm_fp8 series and the CK FP8 JSONs it benchmarks alike
        both = r["series"].startswith(("primus_turbo_gemm_fp8", "primus_turbo_ck_fp8_gemm"))
        quant = "cast" if both else "cast_a" if act_quant else ""
        out.append(_row("gemm", dtype, gpu, r["series"], r["source_url"], r["library"], m=m, n=n, k=k,
                        batch=r["batch"] or 1, direction="bwd" if bwd else "fwd", kernel=quant,
                        time_us=_time_us("", flops, tflops)))
    return out


def maf_rows(path: Path) -> list[dict]:
    out = []
    for r in csv.DictReader(open(path)):
        if not r["series"].startswith("amd_maf_blog") or not r["tflops"]:
            continue
        gpu, dtype = gpu_of(r["gpu"]), dtype_of(r["dtype"])
        if gpu and dtype:
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            out.append(_row("gemm", dtype, gpu, r["series"], r["source"], r["library"], m=m, n=n, k=k, batch=1,
                            direction="fwd", clock_MHz=r["clock_MHz"],
                            time_us=_time_us("", 2 * m * n * k, r["tflops"])))
    return out


_NK = re.compile(r"N=(\d+)[,\s]*K=(\d+)")
_UNIFORM_TOTAL = re.compile(r"^(\d+) tokens total \(uniform routing\)$")
_ROUTED = re.compile(r"^(\d+) tokens(?: total)?, topk=(\d+)$")
_STAGES = re.compile(r"us1=([\d.]+)\s+us2=([\d.]+)")
_LATENCY_MS = re.compile(r"latency ([\d.]+) ms")


# series whose TFLOPS are forward FLOPs over a whole training step of the op on its own
# (forward, loss = output.sum(), backward): tgale96/grouped_gemm PR #37's table comes from
# its author's benchmark.py, which times ``out = gmm(x, w); out.sum().backward()`` under the
# profiler (all kernels' device time per iteration) and divides the forward FLOPs by it; its
# run.log prints the same numbers as "Forward TFLOPs" beside "Time per step" (2.568 ms for
# SM90 cooperative, uniform) and "Fwd+Bwd TFLOPs (est)" = 3x (Knarf04/grouped_gemm at
# 514ad865, run.log and benchmark.py). Such a row is direction fwd_bwd, kernel sum_loss.
STEP_TIMED = ("tgale96_grouped_gemm_pr37_h100",)


def tokens_per_expert(tokens: str, experts: int) -> int | None:
    """Tokens each expert computes on, from the source's token column: ``N per expert`` /
    ``N per group`` as printed; ``N tokens total (uniform routing)`` as N / experts;
    ``N tokens[ total], topk=K`` as the mean N * K / experts, rounded (the routing the
    benchmark draws spreads the N * K routed rows over the experts). None where the
    per-expert count is not stated (skewed routing of unstated shape) or is under one
    token (a decode-size call that leaves most experts empty)."""
    if tokens.endswith(("per expert", "per group")):
        return int(tokens.split()[0])
    uniform = _UNIFORM_TOTAL.match(tokens)
    if uniform:
        total = int(uniform.group(1))
        return total // experts if total % experts == 0 else None
    routed = _ROUTED.match(tokens)
    if routed:
        rows = int(routed.group(1)) * int(routed.group(2))
        return round(rows / experts) if rows >= experts else None
    return None


def fused_moe_rows(r: dict, gpu: str, dtype: str, experts: int, m: int) -> list[dict]:
    """Two kinds of MoE-MLP measurement (gate_up GEMM, SwiGLU, down GEMM) in one row:

    * a two-stage tuner row (AITER fused_moe, CK 2-stage): its two printed stage times
      (``us1``: the gate_up grouped GEMM with the activation in its epilogue; ``us2``: the
      down grouped GEMM) become two grouped_gemm rows, [m, hidden] @ [hidden, 2 * width]
      and [m, width] @ [width, hidden] per expert, labelled ``kernel = moe_stage``: an
      inference kernel that gathers its tokens by index (stage 1) and scatters them
      weighted (stage 2), checked against the grouped pricing but never fitted
      (``kernel_tables_fit.in_fit_range``). One-stage kernels (a single asm kernel for the
      whole MLP) print no split and are dropped.
    * a training MoE forward timed whole (VeOmni: gather, gate_up, SwiGLU, down, scatter):
      one grouped_gemm row with ``kernel = moe_mlp`` (m tokens per expert, n = width,
      k = hidden), priced by perfsim as the permute, the two grouped GEMMs, the SwiGLU
      and the unpermute of its MoE layer (``kernel_fit.predict_kernel``)."""
    hidden, width = int(r["hidden"]), int(r["expert_width"])
    common = dict(m=m, batch=experts, direction="fwd")
    stages = _STAGES.search(r["note"])
    if stages and "2-stage" in r["library"]:
        if not all(float(t) > 0 for t in stages.groups()):
            return []
        lib, _, how = r["library"].partition(" (")  # the stage named before the "(": the backend split sees it
        return [_row("grouped_gemm", dtype, gpu, r["series"], r["source_url"], f"{lib} {name} ({how}",
                     n=n, k=k, kernel="moe_stage", time_us=t, **common)
                for name, n, k, t in (("stage 1 gate_up", 2 * width, hidden, stages.group(1)),
                                      ("stage 2 down", hidden, width, stages.group(2)))]
    latency = _LATENCY_MS.search(r["note"])
    if latency and r["layout(fwd/wgrad/dgrad)"].startswith("fwd fused MoE (gate_up + act + down)"):
        return [_row("grouped_gemm", dtype, gpu, r["series"], r["source_url"], r["library"], n=width, k=hidden,
                     kernel="moe_mlp", time_us=_ms_as_us(latency.group(1)), **common)]
    return []


def grouped_rows(path: Path) -> list[dict]:
    out = []
    for r in csv.DictReader(open(path)):
        gpu = gpu_of(r["gpu"])
        dtype = dtype_of(r["dtype"].replace("bf16 (not stated; grouped_gemm default)", "bf16") + " " + r["library"])
        layout = r["layout(fwd/wgrad/dgrad)"]
        if not (gpu and dtype) or experimental(r["library"]) or "masked" in layout:
            continue
        e = int(r["num_experts"])
        m = tokens_per_expert(r["tokens_per_expert_or_total"], e)
        if m is None:
            continue
        if "fused" in layout:
            out += fused_moe_rows(r, gpu, dtype, e, m)
            continue
        nk = _NK.search(r["note"]) or _NK.search(layout)
        if not nk or not r["note"].startswith("unit=TFLOPS") or not float(r["tflops_or_time_us"]) > 0:
            continue
        n, k = map(int, nk.groups())
        bwd = layout.startswith("bwd")
        flops = (4 if bwd else 2) * e * m * n * k  # what the TFLOPS count (forward FLOPs for a STEP_TIMED series)
        step = r["series"] in STEP_TIMED
        kernel = "sum_loss" if step else "cast" if "fp8_tensorwise" in r["series"] else ""
        out.append(_row("grouped_gemm", dtype, gpu, r["series"], r["source_url"], r["library"], m=m, n=n, k=k, batch=e,
                        direction="fwd_bwd" if step else "bwd" if bwd else "fwd", kernel=kernel,
                        time_us=_time_us("", flops, r["tflops_or_time_us"])))
    return out


def attention_rows(path: Path) -> list[dict]:
    out = []
    for r in csv.DictReader(open(path)):
        gpu = gpu_of(r["gpu"])
        dtype = dtype_of(r["dtype"].replace("fp16/bf16 (not stated)", "bf16").replace("bf16/fp16 (not stated)", "bf16"))
        direction, causal = r["direction(fwd/bwd)"], r["causal"].split()[0] if r["causal"] else ""
        if not (gpu and dtype) or experimental(r["kernel"]) or direction not in ("fwd", "bwd") or causal not in ("0", "1"):
            continue
        if any(tag in r["kernel"] for tag in NON_DEFAULT_NUMERICS):
            continue
        if "convention" in r["kind"] or not r["head_dim"].isdigit() or dtype != "bf16" or "check=FAIL" in r["note"]:
            continue
        b, s, h, d = int(r["batch"]), int(r["seqlen"]), int(r["n_heads"]), int(r["head_dim"])
        kv = int(r["n_kv_heads"].split()[0]) if r["n_kv_heads"] else h
        fwd = 4 * b * s * s * h * d * (0.5 if causal == "1" else 1)
        flops = fwd * (2.5 if direction == "bwd" else 1)
        out.append(_row("attention", dtype, gpu, r["series"], r["source_url"], r["kernel"], batch=b, seq=s, heads=h,
                        kv_heads=kv, head_dim=d, causal=causal, direction=direction,
                        time_us=_time_us("", flops, r["tflops"])))
    return out


_KV = re.compile(r"([A-Za-z]+)=(\d+)")


def _dims(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in _KV.findall(text)}


def memory_bytes(r: dict) -> float | None:
    """Bytes one memory-bound kernel moves, from the shape the source prints; None if unknown."""
    series, kernel, d = r["series"], r["kernel"].lower(), _dims(r["size"])
    if series.startswith("hipkittens_layernorm"):  # x and residual in, out and residual out, bf16
        return 4 * d["B"] * d["N"] * d["D"] * 2
    if series.startswith("hipkittens_rotary"):  # x in, x out, bf16 (cos/sin tables are small)
        return 2 * d["B"] * d["H"] * d["N"] * d["D"] * 2
    if "rmsnorm" in series or "rms_norm" in kernel:  # x in, out out, 16-bit (weight ignored, as aiter #335 counts)
        return 2 * d["M"] * d["H"] * 2
    if series.startswith("pytorch_issue132964_sum"):
        return 2 ** 30 * 4
    if series.startswith("sglang_pr29771_moe_router"):  # fp32 logits in; top-k fp32 weights + int32 ids out
        return d["M"] * d["N"] * 4 + d["M"] * 8 * 8
    return None


def memory_label(r: dict) -> str:
    return next((tag for tag in ("layernorm", "rotary", "rmsnorm", "sum", "router") if tag in r["series"]), "memory")


def memory_rows(path: Path) -> list[dict]:
    out = []
    for r in csv.DictReader(open(path)):
        gpu, kernel = gpu_of(r["gpu"]), r["kernel"]
        if not gpu or experimental(kernel) or kernel.lower().startswith(("hipkittens", "pytorch eager")):
            continue  # HipKittens' own kernels are research; eager runs several kernels
        if r["series"].startswith("azure_ai_benchmarking_guide_babelstream"):
            continue  # the HBM tables' own source (hbm_bandwidth_measured.csv): not a check
        moved, unit = memory_bytes(r), r["note"].split(";")[0].removeprefix("unit=").strip()
        try:
            value = float(r["achieved_GBps_or_time_us"].lstrip("~"))
        except ValueError:
            continue
        time_us = {"ms": value * 1e3, "us": value}.get(unit.split()[0]) if moved else None
        if time_us is None and moved:
            rate = {"TB/s": 1e12, "GB/s": 1e9}.get(unit.split()[0].replace("(1e9)", ""))
            time_us = moved / (value * rate) * 1e6 if rate else None
        if time_us:
            out.append(_row("memory", "", gpu, r["series"], r["source_url"], kernel, bytes=f"{moved:.6g}",
                            kernel=memory_label(r), time_us=f"{time_us:.6g}"))
    return out


PUBLIC = HERE / "public"  # public measurements found outside ../shared, copied here with their source
LIGER_SOURCE = ("https://github.com/linkedin/Liger-Kernel/blob/3534d4461ca89319e29c890c1a4c20cb2a615d5f/"
                "benchmark/data/h100_all_benchmark_data.csv")
# H100 NVL (94 GB HBM3, 3.9 TB/s) and the h100 profile's H100 SXM5 (80 GB, 3.35 TB/s) are the
# same GH100 die; a row is carried to SXM5 at the same fraction of peak HBM bandwidth
# (time x 3.9 / 3.35): derived, as the notes say.
NVL_TO_SXM = 3.9 / 3.35
LIGER_KERNELS = {"rms_norm": "rmsnorm", "layer_norm": "layernorm", "rope": "rotary"}


def liger_bytes(kernel: str, x_name: str, x: int, cfg: dict) -> float:
    """HBM bytes of one Liger benchmark forward call (benchmark/scripts/benchmark_<kernel>.py shapes)."""
    if kernel == "rms_norm":  # x [M, H] in, y out, bf16 (weight ignored, as the other rmsnorm rows count)
        return 2 * cfg["M"] * x * 2
    if kernel == "layer_norm":  # x [M, N] in, y out, fp32
        return 2 * cfg["M"] * x * 4
    hidden = cfg.get("hidden_size", x if x_name == "H" else None)  # rope: q [T, 32, H/32] and k [T, 8, H/32] in and out
    seq = cfg.get("seq_len", x if x_name == "T" else None)
    heads = cfg["num_q_heads"] + cfg["num_kv_heads"]
    return 2 * seq * heads * (hidden // cfg["num_q_heads"]) * 2


def liger_rows(path: Path) -> list[dict]:
    """Liger-Kernel's published H100 NVL forward timings of its memory-bound kernels (the
    liger and torch.compile providers; the Hugging Face eager baseline runs several kernels
    per call, as the pytorch-eager rows dropped above), carried to the h100 profile."""
    out = []
    for r in csv.DictReader(open(path)):
        if r["kernel_operation_mode"] != "forward" or r["metric_name"] != "speed" or r["kernel_provider"] == "huggingface":
            continue
        cfg, x = json.loads(r["extra_benchmark_config_str"]), int(r["x_value"])
        moved = liger_bytes(r["kernel_name"], r["x_name"], x, cfg)
        series = f"liger_h100nvl_{r['kernel_name']}_{r['kernel_provider']}"
        library = (f"Liger-Kernel {r['liger_version']} {r['kernel_name']} ({r['kernel_provider']}); {r['gpu_name']}; "
                   f"derived: time x 3.9/3.35 TB/s (H100 NVL -> SXM5 at the same fraction of peak HBM bandwidth)")
        time_us = float(r["y_value_50"]) * 1e3 * NVL_TO_SXM
        out.append(_row("memory", "", "h100", series, LIGER_SOURCE, library, bytes=f"{moved:.6g}",
                        kernel=LIGER_KERNELS[r["kernel_name"]], time_us=f"{time_us:.6g}"))
    return out


XLA_SOURCE = ("https://github.com/tensorflow/tensorflow/blob/a305421c45a1ea5117c170b8d8a00a51f9dcee8f/"
              "third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h")
# columns of public/xla_sm90_matmul.csv: FLOP/s of bf16 x bf16 -> bf16 and f8e4m3fn x f8e4m3fn -> bf16
# dots. Only bf16 is read: the fp8 column's large dots exceed any Hopper part's dense FP8 peak (up to
# 2,593 TFLOP/s against 1,979; 4096^3 in 56.7 us where cuBLASLt takes 106-110 us on this project's
# H200), so its time is not the dot's whole GPU time (XLA's FP8 dot runs more than one kernel and the
# table keeps a median kernel time); its bf16 column matches this project's H200 cuBLAS rows on the
# five shapes both have within 1-10%
XLA_DTYPES = {"bf16": "bf16"}


def xla_rows(path: Path) -> list[dict]:
    """OpenXLA's default matmul performance table for ``sm_90`` (XLA's matmul_perf_table_gen:
    each dot [b, m, k] x [b, k, n] compiled by XLA's GPU backend and timed as the median kernel
    time of its traced kernels), every b in {1, 2, 4} and m, n, k in {256, ..., 4096}. The table
    names the compute capability, not the part: taken as the h100 profile's H100 SXM (an
    assumption, SOURCES.md). One series per dtype and batch."""
    out = []
    for r in csv.DictReader(open(path)):
        b, m, n, k = (int(r[c]) for c in ("b", "m", "n", "k"))
        for column, dtype in XLA_DTYPES.items():
            if not r[column]:
                continue
            seconds = 2.0 * b * m * n * k / float(r[column])
            label = "XLA GPU dot (bf16 x bf16 -> bf16)" if dtype == "bf16" else "XLA GPU dot (f8e4m3fn x f8e4m3fn -> bf16)"
            out.append(_row("gemm", dtype, "h100", f"openxla_sm90_{dtype}_b{b}", XLA_SOURCE,
                            f"{label}; sm_90 (part not stated)", m=m, n=n, k=k, batch=b, direction="fwd",
                            time_us=f"{seconds * 1e6:.6g}"))
    return out


TE_GROUPED_SOURCE = "https://github.com/NVIDIA/TransformerEngine/pull/2045"


def te_grouped_rows(path: Path) -> list[dict]:
    """Transformer Engine PR #2045's H100 (SM90) BF16 grouped-GEMM table: ``general_grouped_gemm``
    on (groups, m, n, k) = g experts of m tokens each, [m, k] @ [k, n] (Qwen3-30B-A3B's gate / up
    projection shape, k = hidden 2048, n = expert width 768), in TFLOPS of 2 g m n k, for TE's
    default multi-stream cuBLAS path and the CUTLASS grouped kernel the PR adds
    (NVTE_USE_CUTLASS_GROUPED_GEMM), from the PR's two tables (TE 2.2 and TE 2.7 with CUDA 12.9).
    Its timing harness (tests/pytorch/test_group_gemm.py in the PR) is not in the merged tree;
    read as one forward grouped call (an assumption, SOURCES.md round 16). One series per table
    and backend."""
    out = []
    for r in csv.DictReader(open(path)):
        g, m, n, k = (int(r[c]) for c in ("groups", "m", "n", "k"))
        seconds = 2.0 * g * m * n * k / (float(r["tflops"]) * 1e12)
        backend = "cutlass" if r["backend"].startswith("CUTLASS") else "multistream"
        version = "te27" if "TE 2.7" in r["backend"] else "te22"
        out.append(_row("grouped_gemm", "bf16", "h100", f"te_pr2045_h100_{backend}_{version}", TE_GROUPED_SOURCE,
                        f"Transformer Engine general_grouped_gemm, {r['backend']}", m=m, n=n, k=k, batch=g,
                        direction="fwd", time_us=f"{seconds * 1e6:.6g}"))
    return out


CUDNN_FRONTEND_SOURCE = ("https://github.com/NVIDIA/cudnn-frontend/blob/0af834f0f53a2a8e33cce2a108429016da14aab4/"
                         "benchmark/attention_inference/results/prefill_sweep/h200/prefill_sweep_20260928_142443.csv")


def cudnn_frontend_rows(path: Path) -> list[dict]:
    """cuDNN frontend's H200 prefill sweep (cuDNN 9.27.0, BF16 causal GQA forward through the
    frontend's SDPA graph with a paged KV cache of 16-token pages; CUDA events, median of 20):
    the rows whose query and key lengths are equal, a training forward's shape. Its TFLOPS
    column counts 4 S^2 H D / 2 (causal), which the committed copy's rows reproduce; the
    time is taken as printed. Rows of a short query over a long cache (chunked prefill) are
    not in the copy: perfsim's attention prices equal lengths."""
    out = []
    for r in csv.DictReader(open(path)):
        if r["success"] != "True" or r["q_tokens"] != r["kv_len"] or r["head_dim_qk"] != r["head_dim_vo"]:
            continue
        series = f"cudnn_frontend_h200_{r['model_name']}"
        library = (f"cuDNN fused attention ({r['backend_detail']} via cudnn-frontend SDPA; paged KV cache "
                   f"page {r['page_size']}); {r['gpu_name']}")
        out.append(_row("attention", "bf16", "h200", series, CUDNN_FRONTEND_SOURCE, library,
                        batch=r["batch_size"], seq=r["q_tokens"], heads=r["num_q_heads"], kv_heads=r["num_kv_heads"],
                        head_dim=r["head_dim_qk"], causal=1, direction="fwd",
                        time_us=_ms_as_us(r["time_ms"])))
    return out


FLYDSL_SOURCES = {
    "ci": "https://github.com/ROCm/FlyDSL/blob/e2e6dfcb2630172dd46825246861e906b23747d6/ci-dashboard/data/history.json",
    "pr629": "https://github.com/ROCm/FlyDSL/pull/629",
    "ci_mi325": "https://github.com/ROCm/FlyDSL/blob/4d6d98249b7d0f9edac9c387d67e4612b8ee021e/ci-dashboard/data/history.json",
}
FLYDSL_RUNNERS = {"ci": "CI benchmark run 27262780228, runner linux-flydsl-mi355-1",
                  "ci_mi325": "CI benchmark run 36435015445, runner linux-flydsl-mi325-1", "pr629": "PR 629 FMHA bench"}
FLYDSL_ATTENTION = re.compile(r"B(\d+)S(\d+)H(\d+)Hkv(\d+)D(\d+)_(causal|noncausal)")


def flydsl_rows(path: Path) -> list[dict]:
    """ROCm/FlyDSL (AMD's kernel DSL, whose GEMMs aiter's tuner also dispatches), mostly MI355X,
    device-timed (its harness: torch.profiler, rotating input copies): (1) one CI benchmark
    run of its dashboard data (run 27262780228, runner linux-flydsl-mi355-1, gfx950), dense
    GEMM shapes ``MxNxK`` of its preshuffle / async / row-scaled FP8 kernels, its BF16
    GEMMs and BF16 causal flash-attention forwards, in TFLOPS (its one FP16 row, a 2048^3
    split-K kernel, is not in the copy: a single row would make a whole FP16 table of one
    kernel's efficiency, where the profile has none; attention counts causal
    as half of 4 B H S^2 D, which PR 629's printed times reproduce); (2) PR 629's MI355X
    FMHA table (FlyDSL, OPUS, aiter CK and aiter asm kernels side by side, time and TFLOPS;
    the time as printed). FP8 inputs are quantized before the timed call (no cast); one row
    per shape is kept (``fastest``). Also the four flash-attention forwards of a later
    main-branch CI run on its MI325X runner (gfx942)."""
    out = []
    for r in csv.DictReader(open(path)):
        table, dtype = r["table"], r["dtype"]
        device = r["device"]
        library = f"FlyDSL {r['op']}" if table.startswith("ci") else r["op"]
        library += f" (ROCm/FlyDSL {FLYDSL_RUNNERS[table]}; {device.upper()})"
        found = FLYDSL_ATTENTION.fullmatch(r["shape"])
        if found:
            b, s, h, hkv, d = (int(x) for x in found.groups()[:5])
            causal = found.group(6) == "causal"
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
            out.append(_row("attention", dtype, device, f"flydsl_{table}_{device}_attention_{dtype}", FLYDSL_SOURCES[table],
                            library, batch=b, seq=s, heads=h, kv_heads=hkv, head_dim=d, causal=int(causal),
                            direction="fwd", time_us=_time_us(r["time_us"], flops, r["tflops"])))
            continue
        m, n, k = (int(x) for x in r["shape"].split("_")[0].split("x"))
        out.append(_row("gemm", dtype, device, f"flydsl_{table}_{device}_gemm_{dtype}", FLYDSL_SOURCES[table], library,
                        m=m, n=n, k=k, direction="fwd", time_us=_time_us("", 2.0 * m * n * k, r["tflops"])))
    return out


ATTN_DSL_BENCH_SOURCE = ("https://github.com/midiareshadi/attn-dsl-bench/blob/603819b3cf24d11caef2a852c89ccabde4ab5b4a/"
                         "results/raw/sweep_v1.csv")


def attn_dsl_bench_rows(path: Path) -> list[dict]:
    """midiareshadi/attn-dsl-bench's MI300X forward sweep (its README names the GPU; ROCm 7.2.2,
    PyTorch 2.10): B 16, 16 heads, causal, head dim 64 / 128, 1k-16k tokens, each call timed by
    events between synchronizes (mean of 30 after 50 warmup; its TFLOPS count causal as half of
    4 B H S^2 D). Only ``aiter.flash_attn_func`` is kept (asm v3 at head dim 128, CK tile at 64,
    per its own rocprofv3 kernel names; its timed call also copies the output once to transpose
    it); its PyTorch SDPA and Triton rows are dropped as the rules drop SDPA and Triton kernels."""
    out = []
    for r in csv.DictReader(open(path)):
        if r["implementation"] != "aiter":
            continue
        out.append(_row("attention", "bf16", "mi300x", "attndslbench_mi300x_aiter", ATTN_DSL_BENCH_SOURCE,
                        "AITER aiter.flash_attn_func (asm v3 fmha_fwd at head dim 128; CK tile at 64); ROCm 7.2.2",
                        batch=r["batch"], seq=r["seq"], heads=r["heads"], kv_heads=r["kv_heads"], head_dim=r["head_dim"],
                        causal=r["causal"], direction="fwd", time_us=_ms_as_us(r["avg_time_ms"])))
    return out


MOONMATH_SOURCE = "https://github.com/moonmath-ai/amd-kernels/blob/dc7e9c4f4597ebe608aa89c9df95f907eeaee172/README.md"


def moonmath_rows(path: Path) -> list[dict]:
    """moonmath-ai/amd-kernels' MI300X table (README 'Results - MI300X, bf16, head_dim = 128'):
    non-causal MHA forwards, query and key lengths equal, 8K-131K tokens, each shape timed with
    CUDA events over 30 back-to-back calls after 8 warm-ups, the median of 5 passes
    (benchmark/bench_table.py), for three kernels on the same inputs and three bf16 rounding
    modes. Kept: AITER's v3 asm forward (``flash_attn_func``, the kernel Transformer Engine
    ROCm and Primus run) at round-to-nearest-even, one row a shape. Not kept, decided before
    any fit: MoonMath's own kernel (a gfx942-only research kernel no stack perfsim models
    calls) and Modular MAX's (not a training stack; its figures carried from an earlier run),
    and the RTNA / RTZ rounding variants of the same kernel."""
    out = []
    for r in csv.DictReader(open(path)):
        if r["round"] != "RTNE":
            continue
        h = r["heads"]
        out.append(_row("attention", "bf16", "mi300x", "moonmath_mi300x_aiter_v3", MOONMATH_SOURCE,
                        "AITER flash_attn_func (v3 asm fmha forward; RTNE bf16 rounding), timed by moonmath-ai/amd-kernels",
                        batch=r["batch"], seq=r["seq"], heads=h, kv_heads=h, head_dim=r["head_dim"], causal=0,
                        direction="fwd", time_us=_ms_as_us(r["aiter_v3_ms"])))
    return out


VLLMTESTS_SOURCE = ("https://github.com/EmbeddedLLM/vllmtests/blob/397fac706ad9c56ed623e5e1a8aaf0e21a834572/kernels/ptpc/"
                    "mi300x_tuned_configs/a8w8_bpreshuffle_tuned_gemm.csv")


def vllmtests_rows(path: Path) -> list[dict]:
    """EmbeddedLLM/vllmtests' MI300X tuning run of aiter's CK ``gemm_a8w8_bpreshuffle`` (FP8
    e4m3fnuz, per-token x per-channel scales, BF16 out; ``cu_num`` 304 = MI300X, its README:
    "on MI300X"), made with aiter's own tuner script: Y[M, N] = X[M, K] W[N, K]^T at the best
    kernel's time (``us``), inputs quantized before the timed call. The committed copy holds
    the rows of 1,024 tokens and more (the file's larger-M end; rows whose tuning failed,
    ``us`` -1, are not rows)."""
    out = []
    for r in csv.DictReader(open(path)):
        if float(r["us"]) <= 0:
            continue
        out.append(_row("gemm", "fp8", "mi300x", "embeddedllm_vllmtests_ptpc_bpreshuffle_mi300x", VLLMTESTS_SOURCE,
                        f"aiter CK gemm_a8w8_bpreshuffle ({r['kernelName'].split('_')[2]} tile; EmbeddedLLM tuner run)",
                        m=r["M"], n=r["N"], k=r["K"], direction="fwd", time_us=r["us"]))
    return out


H200_GROUPED_SOURCES = {"tileops_pr1567": "https://github.com/tile-ai/TileOPs/pull/1567",
                        "pytorch_pr156203": "https://github.com/pytorch/pytorch/pull/156203"}
H200_GROUPED_LIBRARIES = {"torch": "torch._grouped_mm", "deepgemm": "DeepGEMM BF16 m-grouped GEMM"}  # production kernels


def h200_grouped_rows(path: Path) -> list[dict]:
    """H200 BF16 grouped-GEMM forwards: TileOPs PR 1567's kernel-only (CUPTI) sweep of the GLM
    expert up projection (256 experts, n 4096, k 6144, 1,024-8,192 tokens per expert, split
    evenly as its benchmark does), of which the production kernels (``torch._grouped_mm``,
    DeepGEMM) are kept (TileOPs' own and Triton's dropped, as HipKittens' and TLX's are), in
    TFLOPS of 2 g m n k; the PR notes its H200 ran at about 1.4 GHz under the 700 W board
    limit; and PyTorch PR 156203's ``torch._grouped_mm`` on 16 groups of 128,000 x 7,168 x
    7,168 (CUDA events, mean of 50 calls)."""
    out = []
    for r in csv.DictReader(open(path)):
        library = H200_GROUPED_LIBRARIES.get(r["library"])
        if library is None:
            continue
        g, m, n, k = (int(r[c]) for c in ("groups", "m", "n", "k"))
        table = r["table"]
        out.append(_row("grouped_gemm", "bf16", "h200", f"{table}_h200_{r['library']}", H200_GROUPED_SOURCES[table],
                        f"{library} ({table.replace('_', ' ')})", m=m, n=n, k=k, batch=g, direction="fwd",
                        time_us=_time_us(r["time_us"], 2.0 * g * m * n * k, r["tflops"])))
    return out


PRIMERL_SOURCE = ("https://github.com/PrimeIntellect-ai/prime-rl/blob/47e24bb29b9260d30838574ff27ccc695806cb96/"
                  "benchmarks/fp8_grouped_gemm/results-base-prime-nebius-puku-h200-gpu-064-NVIDIA_H200-sm90.txt")


def primerl_grouped_rows(path: Path) -> list[dict]:
    """PrimeIntellect prime-rl's H200 BF16 ``torch._grouped_mm`` sweep (benchmarks/fp8_grouped_gemm,
    its ``base`` run: PyTorch 2.13.0+cu130, Triton's do_bench with L2 flushed, the fastest of three
    repeats of the minimum): 32 experts of exactly ``rows_per_expert`` tokens each (its balanced
    routing; the ragged blocks, uneven per expert, not kept), the gate_up ([m, 4096] @ [4096, 4096])
    and down ([m, 2048] @ [2048, 4096]) expert GEMMs, 128-8,192 tokens per expert. Its printed
    milliseconds: the forward call as a ``fwd`` row, and the dgrad (dy @ W^T) and wgrad (x^T @ dy)
    calls, timed apart, summed as one ``bwd`` row (perfsim's backward is dgrad + wgrad). Its FP8
    arm times the casts, a layout build and host syncs with each GEMM (not a kernel time), so it is
    not read."""
    out = []
    for r in csv.DictReader(open(path)):
        g, m, n, k = (int(r[c]) for c in ("experts", "rows_per_expert", "n", "k"))
        series = f"primerl_h200_{r['shape']}"
        library = "torch._grouped_mm (PyTorch 2.13.0+cu130; prime-rl benchmarks/fp8_grouped_gemm)"
        for direction, ms in (("fwd", float(r["fwd_ms"])), ("bwd", float(r["dgrad_ms"]) + float(r["wgrad_ms"]))):
            out.append(_row("grouped_gemm", "bf16", "h200", series, PRIMERL_SOURCE, library, m=m, n=n, k=k, batch=g,
                            direction=direction, time_us=_ms_as_us(f"{ms:.4f}")))
    return out


def misc_gemm_rows(path: Path) -> list[dict]:
    """Dense BF16 GEMM points of single authors, each its own family (the ``table`` column):
    gau-nernst's MI300X 4096^3 (``do_bench``), ROCm/Megatron-LM kimi_k3's roofline runs on
    MI355X (two runs of the same shapes; the faster kept, ``fastest``), alfredyu24's MI350X
    sweep and Z-Y00's MI350X hipblaslt-bench sweep (its ``zy00_hipblaslt_mi350x_bf16.csv``: the
    stock client's default-heuristic kernels, GPU-timed), at the printed time (or 2 m n k / TFLOPS) and each row's own timing method (host:
    wall clock around the calls); the source and how it was read in each row."""
    out = []
    for r in csv.DictReader(open(path)):
        m, n, k = (int(r[c]) for c in ("m", "n", "k"))
        row = _row("gemm", "bf16", r["device"], f"{r['table']}_{r['device']}_gemm_bf16", r["source"], r["library"],
                   m=m, n=n, k=k, direction="fwd", time_us=_time_us(r["time_us"], 2.0 * m * n * k, r["tflops"]))
        row.update(note=r["note"].replace(",", ";"), timing=r["timing"])
        out.append(row)
    return out


def cudnn_frontend_training_rows(path: Path) -> list[dict]:
    """cuDNN frontend's H200 attention-training results (benchmark/attention_training, four
    model configs run 2026-09-28: cuDNN 9.27.0 through the frontend's sdpa / sdpa_backward
    graphs and FlashAttention-4's CuTe-DSL SM90 kernels, side by side), BF16 forward and
    backward, causal (``top_left``) or unmasked, equal query and key lengths; device time
    (torch.profiler / CUPTI), median of 10; its TFLOPS count causal as half and the backward
    as 2.5x the forward, which the committed copy's times reproduce. The copy keeps the rows
    of the default (non-deterministic) backward; one row per shape (``fastest``)."""
    out = []
    for r in csv.DictReader(open(path)):
        if r["data_type"] != "bfloat16" or r["deterministic_bwd"] != "False" or r["success"] != "True":
            continue
        cudnn = r["backend"] == "cudnn"
        library = (f"cuDNN fused attention (cudnn {r['cudnn_version']} frontend, backend {r['cudnn_backend_version'].split('.')[0]}; "
                   f"attention_training harness); {r['gpu_name']}" if cudnn else
                   f"FlashAttention-4 (flash_attn.cute CuTe-DSL SM90; cudnn-frontend attention_training harness); {r['gpu_name']}")
        series = f"cudnn_frontend_training_h200_{r['model_name']}_{r['backend']}"
        out.append(_row("attention", "bf16", "h200", series, r["source_url"], library, batch=r["batch_size"],
                        seq=r["q_seqlen"], heads=r["num_q_heads"], kv_heads=r["num_kv_heads"], head_dim=r["head_dim_qk"],
                        causal=int(r["attn_mask"] == "top_left"), direction=r["profile_pass"],
                        time_us=_ms_as_us(r["time_ms"])))
    return out


DEVICE = HERE.parent / "device"  # this project's own runs on a lent GPU (validation.gpu_check), each with a README
DEVICE_GPUS = {"h200": "NVIDIA H200"}
DEVICE_COPY = ("kind", "dtype", "m", "n", "k", "batch", "seq", "heads", "kv_heads", "head_dim", "causal", "direction",
               "bytes", "kernel", "time_us")


def device_rows(gpu: str) -> list[dict]:
    """The library-kernel rows of this project's own run on ``gpu`` (validation/data/device/<gpu>/
    library.csv, measured by ``validation.run --backend torch``): GEMM, grouped GEMM with
    every expert given the same tokens (the kernel CSV carries tokens per expert as one mean),
    attention (both SDPA backends, each kept: ``fastest``) and copy / triad."""
    path = DEVICE / gpu / "library.csv"
    if not path.exists():
        return []
    out = []
    for r in csv.DictReader(open(path)):
        if r["device"] != DEVICE_GPUS[gpu]:
            continue
        if r["kind"] == "grouped_gemm" and len(set(r["meta_counts"].split())) != 1:
            continue
        dtype = "" if r["kind"] == "memory" else r["dtype"]
        series = f"perfsim_device_{gpu}_{r['kind']}_{dtype or r['kernel']}"
        source = f"validation/data/device/{gpu}/library.csv (this project's validation.gpu_check run, {r['device']}; README beside it)"
        cells = {k: r[k] for k in DEVICE_COPY if r[k] != "" and k not in ("kind", "dtype")}
        name, _, software = r["library"].rpartition(" (triton=")  # "<library> (<software>)" -> "<library>; <software>"
        library = f"{name.replace(', ', ' ')}; triton={software.rstrip(')')}" if name else r["library"]
        out.append(_row(r["kind"], dtype, gpu, series, source, library, **cells))
    return out


def drop_fallbacks(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """An FP8 series slower than the same family's BF16 rows on the same shapes (same GPU,
    kernel class, direction; median time ratio over at least ``MIN_MATCHED`` shapes) times
    a fallback path, not an FP8 kernel: FP8 has twice BF16's peak, and a training stack
    would not run it where BF16 is faster. Its rows of that direction are dropped (the notes
    say what was compared); a grouped table left without backward rows derives its
    backward from its forward (``kernel_fit.derive_backward``)."""
    def shape(r):
        return r["device"], r["kind"], r["direction"], r["meta_family"], r["m"], r["n"], r["k"], r["batch"] or "1"

    bf16 = defaultdict(list)
    for r in rows:
        if r["kind"] in ("gemm", "grouped_gemm") and r["dtype"] == "bf16":
            bf16[shape(r)].append(float(r["time_us"]))
    series = defaultdict(list)
    for r in rows:
        if r["kind"] in ("gemm", "grouped_gemm") and r["dtype"] == "fp8" and shape(r) in bf16:
            series[(r["device"], r["kind"], r["direction"], r["meta_series"])].append(
                float(r["time_us"]) / min(bf16[shape(r)]))
    slow = {key for key, ratios in series.items() if len(ratios) >= MIN_MATCHED and np.median(ratios) > 1.0}
    notes = [f"{key[3]} {key[2]}: {np.median(series[key]):.2f}x the time of the same family's BF16 rows on "
             f"{len(series[key])} matched shapes" for key in sorted(slow)]
    return [r for r in rows if (r["device"], r["kind"], r["direction"], r["meta_series"]) not in slow], notes


def cap(rows: list[dict]) -> list[dict]:
    """At most ``CAP`` rows per (gpu, kind, dtype, series), evenly spaced in time."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["device"], r["kind"], r["dtype"], r["meta_series"])].append(r)
    out = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: float(r["time_us"]))
        if len(group) > CAP:
            step = (len(group) - 1) / (CAP - 1)
            group = [group[round(i * step)] for i in range(CAP)]
        out += group
    return out


SHAPE = ("device", "kind", "dtype", "meta_family", "m", "n", "k", "batch", "seq", "heads", "kv_heads", "head_dim",
         "causal", "direction", "bytes", "kernel")


def fastest(rows: list[dict]) -> list[dict]:
    """GEMM and attention: where one source family reports several kernels or versions
    for one shape (a baseline and its optimized successor, two backends), keep the
    fastest -- perfsim prices the best tuned production kernel. Grouped GEMM keeps all
    (its split is by kernel library within a family), and so do the attention rows of this
    project's own device runs (``device_rows``): they time SDPA's backends side by side on
    purpose, each a kernel library a stack may name (``GpuSpec.attention_libraries``: cuDNN,
    which Transformer Engine prefers on Hopper; FlashAttention-2, SDPA's flash backend, which
    torchtitan called)."""
    best = {}
    for r in rows:
        own = r["kind"] == "attention" and r["meta_family"].startswith("perfsim-device")
        key = tuple(r[c] for c in SHAPE) + ((r["library"],) if r["kind"] == "grouped_gemm" or own else ())
        if key not in best or float(r["time_us"]) < float(best[key]["time_us"]):
            best[key] = r
    return list(best.values())


def thin(rows: list[dict]) -> list[dict]:
    """At most ``CELL_CAP`` rows per (gpu, kind, dtype, family), evenly spaced in time."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["device"], r["kind"], r["dtype"], r["meta_family"])].append(r)
    out = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: float(r["time_us"]))
        if len(group) > CELL_CAP:
            step = (len(group) - 1) / (CELL_CAP - 1)
            group = [group[round(i * step)] for i in range(CELL_CAP)]
        out += group
    return out


def _x(r: dict) -> float:
    """The x of the table a row informs: GEMM FLOPs, tokens per expert, sequence length."""
    if r["kind"] == "gemm":
        return 2.0 * int(r["m"]) * int(r["n"]) * int(r["k"])
    return float(r["m"] if r["kind"] == "grouped_gemm" else r["seq"])


def _decades(xs: list[float]) -> float:
    return math.log10(max(xs) / min(xs))


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Fit = the family whose fittable rows span the widest range of the table's x (decades
    of FLOPs, tokens or sequence length; then the most rows) in each (gpu, kind, dtype)
    cell -- a curve fitted to a narrow range leaves its plateau or fall-off unidentified
    -- check = the other families. A cell with a single family falls back to the kernel backend
    within it (flagged ``family/backend``: a weaker split). Never fitted: memory-bound
    kernels (the HBM tables come from BabelStream, hbm_bandwidth_measured.csv), FP8
    rows timed with their input casts (``kernel`` cast / cast_a: they check GEMM + cast
    pricing; in the fit family's own cell they are dropped, being from the same source)
    and inference fused-MoE stages (``moe_stage``)."""
    def cell(r):
        return r["device"], r["kind"], r["dtype"]

    def fittable(r):
        return r["kind"] != "memory" and r["kernel"] not in ("cast", "cast_a", "moe_stage")

    families = defaultdict(set)
    for r in rows:
        if r["kernel"] != "moe_stage":  # checks only: they do not make a second family of a cell's fit
            families[cell(r)].add(r["meta_family"])
    for r in rows:
        if len(families[cell(r)]) == 1 and r["kernel"] != "moe_stage":
            r["meta_family"] = f"{r['meta_family']}/{r['library'].split(';')[0].strip()}"  # backend, not kernel name
    spans = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if fittable(r):
            spans[cell(r)][r["meta_family"]].append(_x(r))
    fit_family = {c: max(sorted(fams), key=lambda f: (_decades(fams[f]), len(fams[f]))) for c, fams in spans.items()}
    fit = [r for r in rows if fittable(r) and r["meta_family"] == fit_family.get(cell(r))]
    check = [r for r in rows if r["meta_family"] != fit_family.get(cell(r))]
    return fit, check


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(shared: Path) -> None:
    kernels = shared / "kernels"
    rows, notes = drop_fallbacks(gemm_rows(kernels / "gemm.csv") + maf_rows(shared / "gemm_measured.csv")
                                 + grouped_rows(kernels / "grouped_gemm.csv") + xla_rows(PUBLIC / "xla_sm90_matmul.csv")
                                 + te_grouped_rows(PUBLIC / "te_pr2045_h100_grouped.csv"))
    for note in notes:
        print(f"dropped as a fallback path: {note}")
    rows = cap(fastest(rows + attention_rows(kernels / "attention.csv") + memory_rows(kernels / "membound.csv")
                       + liger_rows(PUBLIC / "liger_h100nvl.csv") + device_rows("h200")
                       + cudnn_frontend_rows(PUBLIC / "cudnn_frontend_h200_prefill.csv")
                       + cudnn_frontend_training_rows(PUBLIC / "cudnn_frontend_h200_training.csv")
                       + flydsl_rows(PUBLIC / "flydsl.csv") + attn_dsl_bench_rows(PUBLIC / "attn_dsl_bench_mi300x.csv")
                       + moonmath_rows(PUBLIC / "moonmath_mi300x_attention.csv")
                       + vllmtests_rows(PUBLIC / "vllmtests_mi300x_fp8_tuned.csv") + h200_grouped_rows(PUBLIC / "h200_grouped_bf16.csv")
                       + primerl_grouped_rows(PUBLIC / "primerl_h200_grouped.csv")
                       + misc_gemm_rows(PUBLIC / "gemm_bf16_misc.csv")
                       + misc_gemm_rows(PUBLIC / "zy00_hipblaslt_mi350x_bf16.csv")))
    fit, check = split(rows)
    fit, check = thin(fit), thin(check)
    for gpu in sorted({r["device"] for r in rows}):
        write([r for r in fit if r["device"] == gpu], HERE / "fit" / f"{gpu}.csv")
        write([r for r in check if r["device"] == gpu], HERE / "check" / f"{gpu}.csv")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[3] / "shared" / "data" / "calibration")
