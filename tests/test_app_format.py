"""The planner's text and number formatting (app/fmt.py): Markdown shown as typed, every
number with a unit at a readable precision (issue 17, points 7 and 9)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))

import fmt  # noqa: E402


@pytest.mark.parametrize("text", ["tp*pp*cp*dp = 3*1*1*1024", "plan.pp*vpp", "my_cluster_v2.toml", "`x` <b> $5 :red[y]",
                                  "# not a heading", "a|b ~c~ [link](x) \\n"])
def test_md_escapes_every_markdown_special_so_the_text_reads_as_typed(text):
    escaped = fmt.md(text)
    # every special character is preceded by a backslash; removing the escapes gives the text back
    assert all(escaped[i - 1] == "\\" for i, ch in enumerate(escaped) if ch in "*_`<>$:#|~[]" and i > 0)
    assert escaped.replace("\\\\", "\0").replace("\\", "").replace("\0", "\\") == text


def test_md_leaves_plain_text_alone():
    assert fmt.md("Invalid plan 3 GPUs, 1024 nodes") == "Invalid plan 3 GPUs, 1024 nodes"


@pytest.mark.parametrize("seconds, shown", [(0.4453, "445 ms"), (21.044, "21.0 s"), (3.2e-5, "32.0 µs"),
                                            (9000.0, "2.50 h"), (5400.0, "90.0 min"), (0.0012, "1.20 ms"), (300.0, "5.00 min"),
                                            (None, "–")])
def test_duration_picks_the_unit(seconds, shown):
    assert fmt.duration(seconds) == shown


@pytest.mark.parametrize("value, shown", [(49826, "49.8 k tok/s"), (1.234e6, "1.23 M tok/s"), (512, "512 tok/s")])
def test_tokens_per_s_never_hides_small_rates(value, shown):
    assert fmt.tokens_per_s(value) == shown


def test_bytes_params_percent():
    assert fmt.num_bytes(151.3e9) == "151 GB" and fmt.num_bytes(2.5e6) == "2.50 MB"
    assert fmt.params(8.3e9) == "8.30 B" and fmt.params(760e6) == "760 M"
    assert fmt.percent(0.4186) == "41.9%" and fmt.signed_percent(-0.05) == "-5.0%"


def test_metric_by_key_and_suffix():
    assert fmt.metric("step_time_s", 0.445) == "445 ms" and fmt.metric("mfu", 0.25) == "25.0%"
    assert fmt.metric("exposed_dp_s", 0.01) == "10.0 ms" and fmt.metric("kv_bytes", 3e9) == "3.00 GB"
    assert fmt.metric("world_size", 1024) == "1,024" and fmt.metric("x", None) == "–"


def test_scaled_rows_and_compare_row():
    rows = fmt.scaled_rows([{"step_time_s": 0.5, "peak_memory_bytes": 2e9, "pareto": True, "label": "tp=2"}])
    assert rows == [{"step_time_s": 500.0, "peak_memory_bytes": 2.0, "pareto": True, "label": "tp=2"}]
    row = fmt.compare_row({"metric": "step time", "a": 0.5, "b": 0.25, "b vs a": -0.5}, "step_time_s", ["a", "b"])
    assert row == {"metric": "step time", "a": "500 ms", "b": "250 ms", "b vs a": "-50.0%"}


def test_moe_width_rows_are_shown_in_readable_units():
    row = {"train_step_time_s": 7.5, "serve_memory_bytes": 4.0e9, "active_params": 8.0e8, "experts": 8}
    assert fmt.scaled_rows([row]) == [{"train_step_time_s": 7500.0, "serve_memory_bytes": 4.0, "active_params": 800.0,
                                       "experts": 8}]
    configured = fmt.column_config(lambda label, format: (label, format))
    assert configured["train_step_time_s"] == ("train step (ms)", "%.1f") and "experts" not in configured
