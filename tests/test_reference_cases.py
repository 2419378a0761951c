"""End-to-end reference cases (validation/reference_cases.csv): perfsim's signed error
on published, measured training throughput it was never fitted to.

Tolerance: |error| <= 50% on tokens/s/GPU for cases marked gate=yes. Defence: perfsim's
compute efficiency comes from kernel microbenchmarks (GEMM table, one flash-attention
point), not from the frameworks; it does not model Transformer Engine's FP8 casts, the
frameworks' fused kernels or their host overheads, and the published configurations
leave knobs unstated (recompute, optimizer sharding). A stack profile calibrated on a
framework's own runs (perfsim calibrate --runs) closes that gap; an uncalibrated
cross-framework prediction within a factor
of 1.5 is what this gate can promise, and it catches gross errors (2x) in FLOP counting,
pipeline bubbles or communication. The errors are printed (-s) whether or not gated.
MI300X: the only citable MI300X training throughputs found are FP8 Transformer Engine
runs reported in ROCm/TransformerEngine issues (Oct 2024, TFLOP/s/GPU by the reporter's
script); perfsim over-predicts them about 2.5-3x (it does not model TE's FP8 cast and
transpose kernels or that stack's immaturity; the same threads show FP8 slower than BF16
there). They are recorded ungated as a known miss, not hidden and not fitted to.
A case without tokens/s is compared on TFLOP/s/GPU (formulas may differ by a few %).
"""

import csv
from pathlib import Path

import pytest

import perfsim

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "validation" / "reference_cases.csv"
TOLERANCE_PCT = 50.0
INTS = ("gpus", "tp", "pp", "vpp", "cp", "zero", "mbs", "gbs", "seq")


def load_cases() -> list[dict]:
    with open(CASES, newline="") as handle:
        return list(csv.DictReader(handle))


def _metric(case: dict) -> str:
    return "tokens_per_s_per_gpu" if case["measured_tokens_per_s_per_gpu"] else "tflops_per_gpu"


def predict(case: dict) -> float:
    knobs = {k: int(case[k]) for k in INTS}
    gpus = knobs.pop("gpus")
    if knobs["vpp"] == 1:
        knobs.pop("vpp")
    model = str(ROOT / case["model"]) if case["model"].endswith(".toml") else case["model"]
    report = perfsim.estimate(model, case["cluster"], gpus=gpus, dtype=case["dtype"],
                              recompute=case["recompute"], check_memory=False, **knobs)
    return getattr(report, _metric(case))


def test_table_is_complete():
    cases = load_cases()
    assert cases
    for case in cases:
        assert case["source"].startswith("https://") and case["confidence"] and case["gate"] in ("yes", "no")
        assert float(case["measured_tokens_per_s_per_gpu"] or case["measured_tflops_per_gpu"]) > 0


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c["case"])
def test_signed_error(case):
    measured = float(case["measured_" + _metric(case)])
    predicted = predict(case)
    error = 100 * (predicted - measured) / measured
    unit = "tok/s/GPU" if _metric(case).startswith("tokens") else "TFLOP/s/GPU"
    print(f"\n{case['case']}: measured {measured:,.0f} {unit}, perfsim {predicted:,.0f}, "
          f"error {error:+.1f}% (gate {case['gate']}, confidence {case['confidence'].split(' ')[0]})")
    if case["gate"] == "yes":
        assert abs(error) <= TOLERANCE_PCT
