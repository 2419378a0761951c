"""The runtime a validation run needs, checked before any kernel is defined.

``setup()`` imports torch and triton (a clear ``EnvironmentProblem`` when missing), picks
the device, and on a machine without a GPU sets ``TRITON_INTERPRET=1`` so the kernels run
in the Triton interpreter (correct, not fast: timings there are never measurements).
It must run before ``validation.kernels`` is imported.
"""

import os
import platform
import sys
from dataclasses import dataclass


class EnvironmentProblem(RuntimeError):
    """Something the run needs is missing (GPU, torch, triton); the message is one line."""


@dataclass(frozen=True, kw_only=True)
class Runtime:
    device: str  # "cuda" or "cpu"
    interpret: bool
    device_name: str
    metadata: dict


def _import(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise EnvironmentProblem(
            f"validation needs torch and triton ({name} is not installed): pip install -e '.[validation]'"
        ) from None


def setup(require_gpu: bool = False) -> Runtime:
    """Check the stack, choose GPU or interpreter, and describe the machine.

    TRITON_INTERPRET is read when triton defines its own jit helpers (tl.cdiv, ...) and
    when ours are defined, so it is set before triton is first imported.
    """
    torch = _import("torch")
    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if require_gpu and not gpu:
        raise EnvironmentProblem("no GPU: torch.cuda.is_available() is False (timings need a CUDA/ROCm device)")
    if not gpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise EnvironmentProblem("triton was imported before validation.env.setup(); cannot switch to the interpreter")
        os.environ["TRITON_INTERPRET"] = "1"
    triton = _import("triton")
    meta = software_versions(torch, triton)
    if gpu:
        meta.update(gpu_metadata(torch))
    name = meta.get("device_name", f"cpu ({platform.processor() or platform.machine()}, Triton interpreter)")
    meta["device_name"] = name
    return Runtime(device="cuda" if gpu else "cpu", interpret=not gpu, device_name=name, metadata=meta)


def software_versions(torch, triton) -> dict:
    return {
        "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
        "cuda": torch.version.cuda or "", "hip": torch.version.hip or "",
    }


def gpu_metadata(torch) -> dict:
    """Device name, SM count, memory and clocks (clocks via NVML / amdsmi when present)."""
    props = torch.cuda.get_device_properties(0)
    meta = {
        "device_name": props.name, "num_compute_units": props.multi_processor_count,
        "memory_GB": round(props.total_memory / 1e9, 1),
        # gcnArchName is the ROCm gfx name; CUDA builds of torch fill it with the device name
        "arch": (getattr(props, "gcnArchName", "") if torch.version.hip else "") or f"sm_{props.major}{props.minor}",
    }
    mhz = clock_MHz()
    if mhz:
        meta["sm_clock_MHz"] = mhz
    return meta


def clock_MHz() -> int | None:
    """The SM clock now (MHz) through NVML / amdsmi via torch; None when unavailable."""
    try:
        import torch

        return int(torch.cuda.clock_rate(0)) or None
    except Exception:  # noqa: BLE001 - pynvml/amdsmi missing: clocks are optional metadata
        return None
