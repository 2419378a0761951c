"""How the planner shows text and numbers: Markdown-escaped user text, and every number with
its unit at a readable precision (no "21,044.1 ms", no "0.05 M", no raw bytes). Pure; tested
in tests/test_app_format.py."""

import math
import re

# CommonMark specials plus Streamlit's own (:shortcode: / :color[...] and $math$).
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~$:!])")


def md(text) -> str:
    """``text`` shown as typed in st.markdown/caption/error/...: `tp*pp*cp*dp = 3*1*1*1024`
    stays that, not italics; `plan.pp*vpp` keeps its star."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def _sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant figures, thousands separated, no exponent."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{places}f}"


def duration(seconds: float | None) -> str:
    """0.445 -> '445 ms', 21.04 -> '21.0 s', 3.2e-5 -> '32.0 µs', 5400 -> '1.50 h'."""
    if seconds is None:
        return "–"
    s = abs(seconds)
    for limit, scale, unit in ((1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (120.0, 1.0, "s"), (7200.0, 1 / 60, "min")):
        if s < limit:
            return f"{_sig(seconds * scale)} {unit}"
    return f"{_sig(seconds / 3600)} h"


_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float | None, unit: str = "") -> str:
    """49826 -> '49.8 k', 1.23e6 tok/s -> '1.23 M tok/s'; 3 significant figures."""
    if value is None:
        return "–"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{_sig(value / scale)} {prefix}{unit}".rstrip()
    return f"{_sig(value)} {unit}".rstrip()


def num_bytes(value: float | None) -> str:
    """Bytes in GB/MB/kB (1e9-based, as the profiles and rccl-tests count): '151 GB'."""
    return si(value, "B")


def tokens_per_s(value: float | None) -> str:
    return "–" if value is None else f"{si(value)} tok/s"


def percent(fraction: float | None, digits: int = 1) -> str:
    return "–" if fraction is None else f"{100 * fraction:.{digits}f}%"


def signed_percent(fraction: float | None, digits: int = 1) -> str:
    return "–" if fraction is None else f"{100 * fraction:+.{digits}f}%"


def params(count: float | None) -> str:
    """Parameter counts the way model cards write them: 8.30 B, 760 M."""
    if count is None:
        return "–"
    for scale, prefix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= scale:
            return f"{_sig(count / scale)} {prefix}"
    return _sig(count)


METRIC_FORMATS = {  # Report.to_dict() keys -> how to show them
    "step_time_s": duration, "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s,
    "mfu": percent, "tflops_per_gpu": lambda v: si(v * 1e12 if v is not None else None, "FLOP/s"),
    "peak_memory_bytes": num_bytes, "world_size": lambda v: "–" if v is None else f"{int(v):,}",
    "memory_headroom_bytes": num_bytes, "exposed_comm_s": duration, "bubble_s": duration,
    "usd_per_million_tokens": lambda v: "–" if v is None else f"${v:,.3f}",
}


def metric(key: str, value) -> str:
    """A Report/search value by its key, with its unit; unknown keys as 3 significant figures."""
    if value is None:
        return "–"
    fmt = METRIC_FORMATS.get(key)
    if fmt is not None:
        return fmt(value)
    if key.endswith("_s"):
        return duration(value)
    if key.endswith("_bytes"):
        return num_bytes(value)
    return _sig(value) if isinstance(value, float) else str(value)


# Ranked-plan tables keep numbers (so columns sort) in a readable unit: key -> (label, scale, format).
TABLE_COLUMNS = {
    "step_time_s": ("step time (ms)", 1e3, "%.1f"),
    "tokens_per_s": ("tokens/s", 1.0, "localized"),
    "tokens_per_s_per_gpu": ("tokens/s/GPU", 1.0, "localized"),
    "mfu": ("MFU", 1.0, "percent"),
    "tflops_per_gpu": ("TFLOPS/GPU", 1.0, "%.0f"),
    "peak_memory_bytes": ("peak memory (GB)", 1e-9, "%.1f"),
    "memory_headroom_bytes": ("free memory (GB)", 1e-9, "%.1f"),
    "exposed_comm_s": ("exposed comm (ms)", 1e3, "%.1f"),
    "usd_per_mtoken": ("$ per M tokens", 1.0, "dollar"),
    # MoE width rows (perfsim.moe_width_sweep)
    "active_params": ("active params (M)", 1e-6, "%.0f"),
    "total_params": ("total params (M)", 1e-6, "%.0f"),
    "train_step_time_s": ("train step (ms)", 1e3, "%.1f"),
    "train_tokens_per_s_per_gpu": ("train tokens/s/GPU", 1.0, "localized"),
    "train_mfu": ("train MFU", 1.0, "percent"),
    "decode_latency_ms": ("decode latency (ms/token)", 1.0, "%.2f"),
    "decode_tokens_per_s": ("decode tokens/s", 1.0, "localized"),
    "experts_hit": ("experts hit", 1.0, "%.1f"),
    "serve_memory_bytes": ("serving memory (GB)", 1e-9, "%.1f"),
}


def column_config(column_type) -> dict:
    """``{key: column_type(label, format=...)}`` for st.dataframe (pass st.column_config.NumberColumn)."""
    return {k: column_type(label, format=f) for k, (label, _, f) in TABLE_COLUMNS.items()}


def scaled_rows(rows: list[dict]) -> list[dict]:
    """``rows`` with the TABLE_COLUMNS values in their display unit (ms, GB); others as they are."""
    def scale(key, value):
        if key in TABLE_COLUMNS and isinstance(value, int | float) and not isinstance(value, bool):
            return value * TABLE_COLUMNS[key][1]
        return value
    return [{k: scale(k, v) for k, v in row.items()} for row in rows]


def compare_row(row: dict, key: str, names: list[str]) -> dict:
    """A derive.compare_rows row as text: each scenario's value with its unit, deltas signed %."""
    out = {"metric": row["metric"]}
    for name in names:
        out[name] = metric(key, row.get(name))
    for name in names[1:]:
        out[f"{name} vs {names[0]}"] = signed_percent(row.get(f"{name} vs {names[0]}"))
    return out
