"""perfsim planner: `streamlit run app/planner.py`.

Navigation is the PAGES list: one line per page (file under views/, title, icon). A
page listed under "Planning" appears only once its file exists, so a later page
(sizing, goodput) is added by dropping its file in views/ and, if new, one line here.
"""

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

PAGES = {
    "Simulate": [
        ("views/plan.py", "Plan", ":material/tune:"),
        ("views/timeline.py", "Timeline", ":material/view_timeline:"),
        ("views/fabric.py", "Fabric", ":material/lan:"),
    ],
    "Explore": [
        ("views/search.py", "Search", ":material/travel_explore:"),
        ("views/calibrate.py", "Calibrate", ":material/straighten:"),
        ("views/runs.py", "Measured runs", ":material/fact_check:"),
        ("views/compare.py", "Compare", ":material/compare_arrows:"),
    ],
    "Planning": [
        ("views/sizing.py", "Sizing", ":material/straighten:"),
        ("views/moe_width.py", "MoE width", ":material/scatter_plot:"),
        ("views/goodput.py", "Goodput", ":material/health_and_safety:"),
    ],
}


def navigation() -> dict[str, list]:
    """st.Page objects per section, for the files that exist; the very first is the default."""
    out = {}
    for section, pages in PAGES.items():
        present = [p for p in pages if (HERE / p[0]).is_file()]
        if present:
            out[section] = [st.Page(path, title=title, icon=icon, default=not out and i == 0)
                            for i, (path, title, icon) in enumerate(present)]
    return out


st.set_page_config(page_title="perfsim planner", page_icon=":material/speed:", layout="wide")
st.navigation(navigation()).run()
