"""A pinned baseline on the Plan page: pin the current plan, and every later result reads
as a delta against it (step time, throughput, MFU, memory in the metrics; the breakdown and
memory per part in a table), so a what-if is visible at a glance. The row functions are pure."""

import streamlit as st

import fmt
import inputs as planner_inputs

KEY = "plan.baseline"
MEMORY_PARTS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
                "fragmentation_bytes", "zero_buffers_bytes", "reused_bytes", "total_bytes")


def snapshot(inputs: dict, report) -> dict:
    """What a baseline keeps of a result (plain data, JSON-able)."""
    return {"label": planner_inputs.describe(inputs), "step_time_s": report.step_time_s,
            "tokens_per_s": report.tokens_per_s, "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
            "mfu": report.mfu, "tflops_per_gpu": report.tflops_per_gpu, "peak_memory_bytes": report.peak_memory_bytes,
            "breakdown": dict(report.breakdown), "memory": [dict(m) for m in report.memory]}


def relative(now: float, base: float | None) -> str | None:
    """'+12.3%' of ``now`` against ``base``; None without a baseline."""
    if base is None or not base:
        return None
    return fmt.signed_percent(now / base - 1)


def breakdown_rows(base: dict, now: dict) -> list[dict]:
    """Per category: baseline, now and the change in time, largest change first."""
    rows = [{"category": k, "baseline": fmt.duration(base.get(k, 0.0)), "now": fmt.duration(now.get(k, 0.0)),
             "change": fmt.duration(now.get(k, 0.0) - base.get(k, 0.0)), "_delta": now.get(k, 0.0) - base.get(k, 0.0)}
            for k in dict.fromkeys([*base, *now])]
    rows.sort(key=lambda r: -abs(r["_delta"]))
    return [{k: v for k, v in r.items() if k != "_delta"} for r in rows]


def _peak(memory: list[dict]) -> dict:
    return max(memory, key=lambda m: m.get("total_bytes", 0.0)) if memory else {}


def memory_rows(base: list[dict], now: list[dict]) -> list[dict]:
    """Memory of the fullest stage per part: baseline, now, change."""
    b, n = _peak(base), _peak(now)
    return [{"part": p.removesuffix("_bytes"), "baseline": fmt.num_bytes(b.get(p, 0.0)), "now": fmt.num_bytes(n.get(p, 0.0)),
             "change": ("+" if n.get(p, 0.0) >= b.get(p, 0.0) else "-") + fmt.num_bytes(abs(n.get(p, 0.0) - b.get(p, 0.0)))}
            for p in MEMORY_PARTS if p in b or p in n]


def pinned() -> dict | None:
    return st.session_state.get(KEY)


def controls(inputs: dict, report) -> None:
    a, b = st.columns([1, 4], vertical_alignment="center")
    if a.button("Pin as baseline", icon=":material/push_pin:", key="plan.pin"):
        st.session_state[KEY] = snapshot(inputs, report)
        st.rerun()
    base = pinned()
    if base is not None:
        b.caption(fmt.md(f"Deltas against the pinned baseline: {base['label']}"))
        if a.button("Unpin", icon=":material/close:", key="plan.unpin"):
            st.session_state.pop(KEY, None)
            st.rerun()


def show(report) -> None:
    base = pinned()
    if base is None:
        return
    with st.expander("Against the pinned baseline", expanded=True, icon=":material/compare_arrows:"):
        left, right = st.columns([3, 2])
        left.dataframe(breakdown_rows(base["breakdown"], report.breakdown), hide_index=True, width="stretch",
                       key="plan.base_breakdown")
        right.dataframe(memory_rows(base["memory"], report.memory), hide_index=True, width="stretch",
                        key="plan.base_memory")
