"""Compare: saved scenarios side by side with deltas against the first one; open or
delete a scenario. Scenarios are saved from the Plan page into SQLite ($PERFSIM_DB)."""

import streamlit as st

import charts
import common
import derive
import fmt

st.title("Compare scenarios")
store = None
with common.shown_errors("Cannot open the scenario database"):
    store = common.store()
if store is None:
    st.stop()
st.caption(fmt.md(f"Database: {store.path}"))

names = store.names()
if not names:
    st.info("No saved scenarios yet: save one from the Plan page.", icon=":material/info:")
    st.stop()

# names picked earlier that another session (or tab) has since deleted leave the selection
kept = st.session_state.get("w.cmp_names") or []
gone = [n for n in kept if n not in names]
if gone:
    st.session_state["w.cmp_names"] = [n for n in kept if n in names]
chosen = st.multiselect("Scenarios (the first is the baseline)", names, key="w.cmp_names",
                        default=None if "w.cmp_names" in st.session_state else names[-2:])
scenarios = {name: found for name in chosen if (found := store.find(name)) is not None}
gone += [n for n in chosen if n not in scenarios]  # deleted between the listing and the read
if gone:
    st.info(fmt.md(f"No longer saved: {', '.join(gone)}"), icon=":material/info:")
chosen = list(scenarios)
if not chosen:
    st.stop()
results = {name: s.results for name, s in scenarios.items()}

st.dataframe([fmt.compare_row(row, key, chosen) for row, (key, _, _) in zip(derive.compare_rows(results), derive.METRICS)],
             hide_index=True, width="stretch", key="cmp.table")
if len(chosen) >= 2:
    metrics = tuple((k, label) for k, label, _ in derive.METRICS if k != "world_size")
    st.plotly_chart(charts.compare_bars(results, metrics), width="stretch", key="chart.compare")
    differences = derive.plan_differences({n: s.results.get("plan", {}) for n, s in scenarios.items()})
    if differences:
        st.markdown("**Plan knobs that differ**")
        st.dataframe(differences, hide_index=True, width="stretch", key="cmp.diff")
else:
    st.caption("Pick two or more scenarios to see deltas.")

with st.container(border=True):
    a, b, c = st.columns([3, 1, 1], vertical_alignment="bottom")
    target = a.selectbox("Scenario", chosen, key="w.cmp_target")
    if b.button("Open in Plan", icon=":material/open_in_new:", key="cmp.open", width="stretch"):
        common.set_inputs(scenarios[target].inputs)
        st.switch_page("views/plan.py")
    if c.button("Delete", icon=":material/delete:", key="cmp.delete", width="stretch"):
        store.delete(target)
        st.session_state.pop("w.cmp_names", None)
        st.rerun()
