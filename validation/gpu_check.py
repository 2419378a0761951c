"""The one prepared GPU validation run (< 10 min on one H100/H200/MI300X):

    python -m validation.gpu_check [--out validation-out] [--model zaya1-base]

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="validation-out")
    ap.add_argument("--model", default="zaya1-base")
    ap.add_argument("--cluster", help="perfsim profile of this GPU (default: from the device name)")
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
    failed += step("GEMM grid (bf16)", [py, "-m", "validation.run", "--suite", "gemm", "--dtypes", "bf16", "--out", grid]) != 0
    failed += step(f"{args.model} shapes", [py, "-m", "validation.run", "--suite", "all", "--dtypes", "bf16",
                                             "--shapes", "from-model", args.model, "--out", model]) != 0
    step(f"prediction error of the shipped {cluster} profile", [*perfsim, "validate", "--cluster", cluster,
                                                               "--kernel-csv", grid, "--kernel-csv", model,
                                                               "--html", str(out / "validate-shipped.html")])
    step("calibrate on the GEMM grid", [*perfsim, "calibrate", "--cluster", cluster, "--gemm-csv", grid,
                                        "--out", calibrated, "--force"])
    step(f"held-out error: calibrated profile on the {args.model} shapes",
         [*perfsim, "validate", "--cluster", calibrated, "--kernel-csv", model])
    step("MoE block forward+backward vs perfsim simulate", [py, "-m", "validation.block", "--model", args.model,
                                                            "--cluster", cluster])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
