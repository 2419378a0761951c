"""Convert the MI300X rows of validation/data/calibration/gemm_measured.csv into the
kernel CSV schema (perfsim.calibration.readers.KERNEL_CSV_COLUMNS) -> validation/data/gemm_mi300x_measured.csv.

Kept: MI300X rows measured per call with m, n, k and TFLOPS: the Azure ND MI300X v5
hipBLASLt FP8 sweep (run1) and AMD's max-achievable-FLOPS table (FP16, BF16, FP8).
Dropped: acceptance thresholds (floors, not typical values), the RVS GST stress-loop
sample log (peak of a back-to-back loop, not one call), the MAF "sample output" line
(the same measurement as the MAF BF16 row) and rows without a shape or a TFLOPS value.
Usage: python validation/make_gemm_csv.py [--force]
"""

import csv
import sys
from pathlib import Path

from perfsim.calibration.readers import KERNEL_CSV_COLUMNS

SRC = Path(__file__).resolve().parent / "data" / "calibration" / "gemm_measured.csv"  # repo copy (SOURCES.md)
OUT = Path(__file__).resolve().parent / "data" / "gemm_mi300x_measured.csv"
KEEP = ("azure_ndmi300xv5_hipblaslt_fp8_run1", "amd_maf_blog")
COLUMNS = KERNEL_CSV_COLUMNS + ("meta_series",)


def dtype(text: str) -> str:
    return text.split()[0].lower()


def convert(row: dict) -> dict:
    out = dict.fromkeys(COLUMNS, "")
    out.update(kind="gemm", dtype=dtype(row["dtype"]), m=row["m"], n=row["n"], k=row["k"], batch=row["batch"] or "1",
               tflops=row["tflops"], device=row["gpu"], library=row["library"], clock_MHz=row["clock_MHz"],
               source=row["source"], note=row["note"], meta_series=row["series"])
    return out


def main() -> int:
    with open(SRC, newline="") as handle:
        rows = [r for r in csv.DictReader(handle)
                if r["series"] in KEEP and r["gpu"] == "MI300X" and r["m"] and r["tflops"]]
    if OUT.exists() and "--force" not in sys.argv:
        print(f"{OUT} exists; pass --force to rewrite", file=sys.stderr)
        return 1
    tmp = OUT.with_suffix(".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(convert(r) for r in rows)
    tmp.replace(OUT)
    print(f"wrote {len(rows)} rows to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
