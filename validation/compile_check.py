"""Compile every kernel for a GPU target without a GPU (frontend + ptxas in the triton
wheel): catches code that the interpreter accepts but the compiler rejects.

    python -m validation.compile_check [--arch 90]     # sm_90 = H100/H200
"""

import argparse
import importlib
import inspect
import sys
import time


def _compile(module: str, name: str, types: dict, consts: dict, arch: int, **options) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), name)
    params = list(inspect.signature(fn.fn).parameters)
    sig = {p: ("constexpr" if p in consts else types.get(p, "i32")) for p in params}
    src = ASTSource(fn=fn, signature=sig, constexprs={(params.index(k),): v for k, v in consts.items()})
    t0 = time.perf_counter()
    triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return time.perf_counter() - t0


def kernels(dt: str) -> list[tuple]:
    g = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, UPCAST=False)
    a = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, CAUSAL=True, UPCAST=False)
    p = {k: f"*{dt}" for k in ("a_ptr", "b_ptr", "x_ptr", "w_ptr", "q_ptr", "k_ptr", "v_ptr", "do_ptr", "h_ptr", "dout_ptr")}
    out = "bf16" if dt.startswith("fp8") else dt
    p.update({k: f"*{out}" for k in ("c_ptr", "y_ptr", "o_ptr", "dh_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "out_ptr")})
    p.update({k: "*i32" for k in ("tile_expert_ptr", "tile_row_ptr", "offsets_ptr")})
    p.update({k: "*fp32" for k in ("lse_ptr", "delta_ptr", "rstd_ptr", "dw_ptr")})
    p.update(qk_scale="fp32", sm_scale="fp32", eps="fp32", scalar="fp32")
    items = [("validation.kernels.gemm", "gemm_kernel", {**g, "GROUP_M": 8}),
             ("validation.kernels.moe", "grouped_gemm_kernel", g)]
    if dt.startswith("fp8"):
        return [(m, n, p, c) for m, n, c in items]
    p32 = {**p, "dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "dx_ptr": f"*{dt}"}
    items += [("validation.kernels.moe", "grouped_wgrad_kernel", dict(BLOCK_K=128, BLOCK_N=128, BLOCK_T=64, UPCAST=False)),
              ("validation.kernels.attention", "attn_fwd_kernel", a),
              ("validation.kernels.attention", "attn_bwd_dkdv_kernel", a),
              ("validation.kernels.attention", "attn_bwd_dq_kernel", a),
              ("validation.kernels.pointwise", "swiglu_fwd_kernel", dict(BLOCK=1024)),
              ("validation.kernels.pointwise", "swiglu_bwd_kernel", dict(BLOCK=1024)),
              ("validation.kernels.pointwise", "rmsnorm_fwd_kernel", dict(BLOCK=4096)),
              ("validation.kernels.pointwise", "rmsnorm_bwd_kernel", dict(BLOCK=4096)),
              ("validation.kernels.pointwise", "copy_kernel", dict(BLOCK=1024)),
              ("validation.kernels.pointwise", "triad_kernel", dict(BLOCK=1024))]
    return [(m, n, p32, c) for m, n, c in items]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args(argv)
    failed = 0
    for dt in ("bf16", "fp16", "fp8e4nv"):
        for module, name, types, consts in kernels(dt):
            try:
                secs = _compile(module, name, types, consts, args.arch, num_warps=4, num_stages=2)
                print(f"ok   {secs:5.1f} s  sm_{args.arch} {dt:8s} {name}")
            except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
                failed += 1
                print(f"FAIL sm_{args.arch} {dt:8s} {name}: {str(exc).splitlines()[0][:200]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
