"""What every kernel wrapper shares: interpreter detection and dtype checks.

``TRITON_INTERPRET=1`` must be in the environment before this package is imported
(``validation.env.setup`` does that when there is no GPU): ``@triton.jit`` decides at
definition time whether a kernel is compiled or interpreted.
"""

import os

import torch

# In the interpreter a bf16/fp8 tl.dot returns garbage (numpy has no bf16 matmul), so the
# kernels upcast their tiles to fp32 before tl.dot when interpreting. On a GPU they feed
# the tensor cores the native dtype.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32, *FP8_DTYPES)


class UnsupportedDtype(RuntimeError):
    """The device cannot run this dtype (e.g. fp8 before Hopper/Ada or CDNA3)."""


def fp8_supported(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` has fp8 tensor cores, and why not."""
    if device.type == "cpu":
        return INTERPRET, "fp8 on CPU runs only in the Triton interpreter"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        ok = any(arch.startswith(a) for a in ("gfx94", "gfx95"))
        return ok, f"fp8 needs CDNA3+ (gfx94x/gfx95x); this GPU is {arch}"
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor) >= (8, 9), f"fp8 needs compute capability >= 8.9 (Ada/Hopper); this GPU is sm_{major}{minor}"


def check_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in GEMM_DTYPES:
        raise UnsupportedDtype(f"{what}: dtype {t.dtype} is not one of {', '.join(map(str, GEMM_DTYPES))}")
    if t.dtype in FP8_DTYPES:
        ok, why = fp8_supported(t.device)
        if not ok:
            raise UnsupportedDtype(f"{what}: {why}")


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp8 GEMMs write bf16 (fp8 outputs would need a scale); others keep their dtype."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype
