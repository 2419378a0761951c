"""The one prepared GPU validation run (< 10 min on one H100/H200/MI300X):

    python -m validation.gpu_check [--out validation-out] [--model zaya1-base]

0. the library kernels a training step calls (``--backend torch``: cuBLAS / hipBLASLt BF16
   and FP8 GEMM, grouped GEMM, SDPA flash and cuDNN attention, copy / triad) on the grid,
   the model's shapes and each ``--library-models`` model's GEMMs (``library.csv``), and
   ``perfsim validate`` of the shipped profile on them;
1. kernel sweeps with the Triton kernels: a bf16 GEMM grid (``grid.csv``, for calibration)
   and the model's own GEMM / grouped-GEMM / attention / memory shapes (``model.csv``);
2. ``perfsim validate`` of the shipped profile on both files: GEMM and attention
   prediction error before any fitting;
3. ``perfsim calibrate`` on the grid only, then ``perfsim validate`` of the calibrated
   profile on the model shapes it never saw (held-out error);
4. one MoE block forward+backward measured vs ``perfsim simulate`` (signed error).
Exits 2 with one line when there is no GPU or no torch/triton.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from validation.env import EnvironmentProblem, setup

PROFILES = {"H100": "h100-ib", "H200": "h200-ib", "MI300X": "mi300x-pollara", "MI325X": "mi325x-pollara",
            "MI350X": "mi350x-pollara", "MI355X": "mi355x-pollara"}


def profile_for(device_name: str) -> str:
    for key, cluster in PROFILES.items():
        if key in device_name.upper().replace(" ", ""):
            return cluster
    raise EnvironmentProblem(f"no perfsim profile for device {device_name!r} (known: {', '.join(PROFILES)}); pass --cluster")


def step(title: str, args: list[str]) -> int:
    print(f"\n## {title}\n$ {' '.join(args)}", flush=True)
    return subprocess.run(args).returncode


def merge_csvs(parts: list[Path], into: Path) -> None:
    """One CSV of every part that was written (a failed sweep leaves none); parts removed."""
    import csv

    from validation.csvout import write_rows

    rows = []
    for part in parts:
        if part.exists():
            with part.open(newline="") as handle:
                rows += [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(handle)]
            part.unlink()
    if rows:
        write_rows(into, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="validation-out")
    ap.add_argument("--model", default="zaya1-base")
    ap.add_argument("--cluster", help="perfsim profile of this GPU (default: from the device name)")
    ap.add_argument("--library-models", default="llama3.1-8b,llama3.1-70b",
                    help="comma-separated models whose GEMMs the library sweep also times (default: llama3.1-8b,llama3.1-70b)")
    ap.add_argument("--no-html", action="store_true", help="skip the HTML validation report")
    args = ap.parse_args(argv)
    try:
        runtime = setup(require_gpu=True)
        cluster = args.cluster or profile_for(runtime.device_name)
    except EnvironmentProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py, perfsim = sys.executable, [sys.executable, "-m", "perfsim.cli"]
    grid, model = str(out / "grid.csv"), str(out / "model.csv")
    calibrated = str(out / f"{cluster}-calibrated.toml")
    failed = 0
    parts = [str(out / "library-grid.csv"), str(out / "library-model.csv")]
    lib = [py, "-m", "validation.run", "--backend", "torch", "--dtypes", "bf16,fp8"]
    failed += step("library kernels: grid", [*lib, "--suite", "all", "--out", parts[0]]) != 0
    failed += step(f"library kernels: {args.model} shapes", [*lib, "--suite", "all", "--shapes", "from-model", args.model,
                                                             "--out", parts[1]]) != 0
    for name in filter(None, (m.strip() for m in args.library_models.split(","))):
        parts.append(str(out / f"library-{name}.csv"))
        failed += step(f"library kernels: {name} GEMMs", [*lib, "--suite", "gemm", "--shapes", "from-model", name,
                                                          "--out", parts[-1]]) != 0
    library = out / "library.csv"
    merge_csvs([Path(p) for p in parts], library)
    step(f"prediction error of the shipped {cluster} profile on the library kernels",
         [*perfsim, "validate", "--cluster", cluster, "--kernel-csv", str(library)])
    step("gap between dependent kernels (launch)", [py, "-m", "validation.launch", "--out", str(out / "launch.csv")])
    failed += step("GEMM grid (bf16)", [py, "-m", "validation.run", "--suite", "gemm", "--dtypes", "bf16", "--out", grid]) != 0
    failed += step(f"{args.model} shapes", [py, "-m", "validation.run", "--suite", "all", "--dtypes", "bf16",
                                             "--shapes", "from-model", args.model, "--out", model]) != 0
    html = [] if args.no_html else ["--html", str(out / "validate-shipped.html")]
    step(f"prediction error of the shipped {cluster} profile", [*perfsim, "validate", "--cluster", cluster,
                                                               "--kernel-csv", grid, "--kernel-csv", model, *html])
    step("calibrate on the GEMM grid", [*perfsim, "calibrate", "--cluster", cluster, "--gemm-csv", grid,
                                        "--out", calibrated, "--force"])
    step(f"held-out error: calibrated profile on the {args.model} shapes",
         [*perfsim, "validate", "--cluster", calibrated, "--kernel-csv", model])
    step("MoE block forward+backward vs perfsim simulate", [py, "-m", "validation.block", "--model", args.model,
                                                            "--cluster", cluster])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
