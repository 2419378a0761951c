"""Sweep the Triton kernels on a GPU and write the kernel CSV ``perfsim calibrate`` reads.

    python -m validation.run --suite gemm|moe|attention|memory|all [--shapes from-model zaya1-base] --out results.csv
    python -m validation.run --suite all --check      # correctness only (works without a GPU)
    python -m validation.run --backend torch --suite all --out library.csv   # the libraries, not our kernels

``--backend triton`` (default) times the project's Triton kernels; ``--backend torch`` the
library kernels a training step calls (cuBLAS / hipBLASLt GEMM and FP8 GEMM, torch's
grouped GEMM, SDPA's flash and cuDNN attention, copy / triad: ``validation.library``).
A shape the library refuses is reported as skipped, not failed.

Every case is checked against torch before it is timed (warm-up, then the median of
repeats with CUDA/HIP events). Without a GPU there is nothing to measure: ``--out`` exits
2 with one line, and ``--check`` runs tiny shapes in the Triton interpreter instead.
"""

import argparse
import sys

from validation.env import EnvironmentProblem, setup

SUITES = ("gemm", "moe", "attention", "memory")
BACKENDS = ("triton", "torch")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m validation.run", description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=(*SUITES, "all"), default="all")
    p.add_argument("--shapes", nargs="+", default=["grid"], metavar="grid | from-model MODEL",
                   help="'grid' (default) or 'from-model NAME' (a preset, TOML or HF config.json)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per GEMM / attention batch (mbs x seq)")
    p.add_argument("--dtypes", default="bf16,fp16,fp8", help="GEMM input dtypes; fp8 is skipped with a note where unsupported")
    p.add_argument("--out", help="kernel CSV to write (GPU only)")
    p.add_argument("--check", action="store_true", help="correctness only, no timing; tiny shapes without a GPU")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--backend", choices=BACKENDS, default="triton",
                   help="triton: the project's kernels (default); torch: the library kernels through torch")
    args = p.parse_args(argv)
    if args.shapes[0] == "from-model" and len(args.shapes) != 2 or args.shapes[0] not in ("grid", "from-model"):
        p.error("--shapes: 'grid' or 'from-model MODEL'")
    if not args.out and not args.check:
        p.error("give --out FILE (GPU) or --check")
    return args


def _dtypes(text: str, runtime) -> tuple[tuple[str, ...], list[str]]:
    from validation.cases import DTYPES
    from validation.kernels import fp8_supported

    notes, keep = [], []
    for name in (d.strip() for d in text.split(",") if d.strip()):
        if name not in DTYPES:
            raise EnvironmentProblem(f"--dtypes: {name!r} is not one of {', '.join(DTYPES)}")
        if name == "fp8":
            import torch
            ok, why = fp8_supported(torch.device(runtime.device))
            if not ok:
                notes.append(f"fp8 skipped: {why}")
                continue
        keep.append(name)
    return tuple(keep) or ("bf16",), notes


def cases_for(args, runtime, dtypes) -> list:
    from validation import shapes

    suites = SUITES if args.suite == "all" else (args.suite,)
    if runtime.interpret:
        return [c for s in suites for c in shapes.interpreter_cases(s, args.backend)]
    model = args.shapes[1] if args.shapes[0] == "from-model" else None
    return [c for s in suites for c in shapes.build(s, model, args.tokens, dtypes, args.backend)]


def run_case(case, runtime, repeats: int, timed: bool):
    """(error, timing or None, extra CSV cells); the error check runs before any timing.
    Raises validation.library.Unsupported where a library has no kernel for the case."""
    from validation.timing import time_fn

    prepared = case.prepare(runtime.device)
    run, error = prepared[:2]
    extra = prepared[2] if len(prepared) > 2 else {}
    err = error()
    if err > case.tolerance or err != err:
        return err, None, extra
    return err, (time_fn(run, gpu=not runtime.interpret, repeats=repeats) if timed else None), extra


def sweep(args, runtime, cases) -> tuple[list[dict], int]:
    from validation.csvout import measured_row
    from validation.library import Unsupported

    rows, failures, skipped = [], 0, 0
    for case in cases:
        try:
            err, timing, extra = run_case(case, runtime, args.repeats, timed=bool(args.out))
        except Unsupported as exc:
            skipped += 1
            print(f"skip {' ' * 13}  {exc}  ({case.label})", flush=True)
            continue
        ok = err <= case.tolerance
        failures += not ok
        shown = f"{timing.median_s * 1e6:10.1f} us" if timing is not None and timing.valid else " " * 13
        print(f"{'ok  ' if ok else 'FAIL'} {shown}  rel err {err:.1e} (tol {case.tolerance:.0e})  {case.label}", flush=True)
        if ok and timing is not None:
            rows.append(measured_row({**case.row, **_clock(runtime)}, timing, runtime.metadata, err,
                                     backend=case.backend, extra=extra))
    if skipped:
        print(f"# {skipped} case(s) skipped: the library has no kernel for them here")
    return rows, failures


def _clock(runtime) -> dict:
    from validation.env import clock_MHz

    mhz = clock_MHz()
    return {"clock_MHz": mhz} if mhz else {}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        runtime = setup(require_gpu=bool(args.out))
        dtypes, notes = _dtypes(args.dtypes, runtime)
    except EnvironmentProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# device: {runtime.device_name} ({'Triton interpreter, correctness only' if runtime.interpret else 'GPU'})")
    print("# " + " ".join(f"{k}={v}" for k, v in runtime.metadata.items()))
    for note in notes:
        print(f"# {note}")
    rows, failures = sweep(args, runtime, cases_for(args, runtime, dtypes))
    if args.out:
        from validation.csvout import write_rows
        write_rows(args.out, rows)
        print(f"# wrote {len(rows)} rows to {args.out}")
    if failures:
        print(f"error: {failures} case(s) differ from torch beyond tolerance", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
