"""perfsim planner: `streamlit run app/planner.py`.

Navigation is the PAGES list: one line per page (file under pages/, title, icon). A
page listed under "Planning" appears only once its file exists, so a later page
(sizing, goodput) is added by dropping its file in pages/ and, if new, one line here.
"""

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

PAGES = {
    "Simulate": [
        ("pages/plan.py", "Plan", ":material/tune:"),
        ("pages/timeline.py", "Timeline", ":material/view_timeline:"),
        ("pages/fabric.py", "Fabric", ":material/lan:"),
    ],
    "Explore": [
        ("pages/search.py", "Search", ":material/travel_explore:"),
        ("pages/calibrate.py", "Calibrate", ":material/straighten:"),
        ("pages/compare.py", "Compare", ":material/compare_arrows:"),
    ],
    "Planning": [
        ("pages/sizing.py", "Sizing", ":material/straighten:"),
        ("pages/moe_width.py", "MoE width", ":material/scatter_plot:"),
        ("pages/goodput.py", "Goodput", ":material/health_and_safety:"),
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
