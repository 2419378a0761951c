"""Triton kernels for validation runs. Import only after ``validation.env.setup()``
(it sets TRITON_INTERPRET=1 on a machine without a GPU, before the kernels are defined)."""

from validation.kernels._common import INTERPRET, UnsupportedDtype, fp8_supported
from validation.kernels.attention import attention_backward, attention_forward
from validation.kernels.gemm import gemm
from validation.kernels.moe import expert_offsets, grouped_gemm, grouped_wgrad
from validation.kernels.pointwise import copy, rmsnorm, rmsnorm_backward, swiglu, swiglu_backward, triad

__all__ = [
    "INTERPRET", "UnsupportedDtype", "attention_backward", "attention_forward", "copy", "expert_offsets",
    "fp8_supported", "gemm", "grouped_gemm", "grouped_wgrad", "rmsnorm", "rmsnorm_backward", "swiglu",
    "swiglu_backward", "triad",
]
