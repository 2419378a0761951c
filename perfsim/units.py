"""SI units and the only converters between file units and SI.

Inside perfsim everything is SI: seconds, bytes, FLOP, bytes per second.
Profile files carry units in key names (``hbm_bw_GBps``, ``nic_bw_Gbps``).
"""

import re

from perfsim.errors import ConfigError

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3
TERA = 1e12
MEGA = 1e6  # a million of a count (tokens)
US = 1e-6
NS = 1e-9
BITS_PER_BYTE = 8


def gbps_to_Bps(gigabits_per_s: float) -> float:
    """Gb/s (network convention, 1e9 bit/s) -> B/s."""
    return gigabits_per_s * 1e9 / BITS_PER_BYTE


def GBps_to_Bps(gigabytes_per_s: float) -> float:
    """GB/s (1e9 B/s, as rccl-tests prints) -> B/s."""
    return gigabytes_per_s * GB


def TBps_to_Bps(terabytes_per_s: float) -> float:
    return terabytes_per_s * TB


def tflops_to_flops(tflops: float) -> float:
    return tflops * TERA


def us_to_s(microseconds: float) -> float:
    return microseconds * US


def s_to_us(seconds: float) -> float:
    return seconds / US


def GB_to_bytes(gigabytes: float) -> float:
    return gigabytes * GB


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024**4}


def parse_size(text: str, field: str = "size") -> int:
    """Parse an rccl-tests style size: '8', '64K', '8G' (K/M/G are powers of 1024)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ConfigError(f"{field}: cannot read size {text!r} (use e.g. 8, 64K, 8M, 8G)")
    value = float(match.group(1)) * _SIZE_MULT[match.group(2).upper()]
    if value <= 0:
        raise ConfigError(f"{field}: size must be positive, got {text!r}")
    return int(value)


def format_bytes(num_bytes: float) -> str:
    """Human-readable bytes in powers of 1000 (GB = 1e9 B)."""
    for unit, scale in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"
