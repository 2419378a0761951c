"""Streamlit glue shared by the pages: session inputs, cached perfsim calls, safe runs.

Canonical inputs live in ``st.session_state["inputs"]`` (a plain dict, see inputs.py);
widgets hold their own keys and are re-seeded from it, so a plan opened from the Search
page or a scenario shows up on the Plan page with every widget set.
"""

import gzip
import importlib
import json
import os
import traceback
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

import fmt
import inputs as planner_inputs
import perfsim
from perfsim.system import hardware
from perfsim.model import io as modelio
from perfsim.report import chrome_trace
from scenarios import ScenarioStore

ROOT = Path(__file__).resolve().parent.parent
# public measurements shipped in the repo (validation/data/calibration/SOURCES.md); $PERFSIM_DATA moves them
DATA_DIR = Path(os.environ.get("PERFSIM_DATA", ROOT / "validation" / "data"))
EXPECTED = (perfsim.ConfigError, perfsim.InfeasiblePlan, perfsim.PerfsimError, ValueError, KeyError)


def get_inputs() -> dict:
    if "inputs" not in st.session_state:
        st.session_state["inputs"] = planner_inputs.default_inputs()
    return st.session_state["inputs"]


def set_inputs(new: dict) -> None:
    """Replace the canonical inputs and drop widget state so widgets re-seed from them."""
    st.session_state["inputs"] = planner_inputs.normalize(new)
    for key in [k for k in st.session_state if str(k).startswith("w.")]:
        del st.session_state[key]


def seed(key: str, value) -> str:
    """Widget key ``w.<key>``, seeded with ``value`` when the widget has no state yet."""
    wkey = f"w.{key}"
    if wkey not in st.session_state:
        st.session_state[wkey] = value
    return wkey


@contextmanager
def shown_errors(what: str):
    """Expected perfsim errors become one st.error line; anything else an error with its type."""
    try:
        yield
    except EXPECTED as exc:
        st.error(fmt.md(f"{what}: {exc}"), icon=":material/error:")
    except Exception as exc:  # the page must survive whatever the model raises
        st.error(fmt.md(f"{what}: unexpected {type(exc).__name__}: {exc}"), icon=":material/bug_report:")
        with st.expander("details"):
            st.code(traceback.format_exc())


@st.cache_data(max_entries=64, show_spinner=False)
def _simulate(key: str):
    return planner_inputs.simulate(json.loads(key))


def simulate(inputs: dict):
    """The Report for ``inputs`` (cached per input); raises perfsim errors."""
    with st.spinner("Simulating the step..."):
        return _simulate(planner_inputs.cache_key(inputs))


@st.cache_data(max_entries=16, show_spinner=False)
def _trace_json(key: str) -> str:
    return json.dumps(chrome_trace(_simulate(key)))


def trace_json(inputs: dict) -> str:
    return _trace_json(planner_inputs.cache_key(inputs))


@st.cache_data(max_entries=16, show_spinner=False)
def _trace_gz(key: str) -> bytes:
    return gzip.compress(_trace_json(key).encode(), compresslevel=6)


def trace_gz(inputs: dict) -> bytes:
    """The Perfetto trace of ``inputs``, gzip-compressed (as `simulate --trace step.json.gz`)."""
    return _trace_gz(planner_inputs.cache_key(inputs))


@st.cache_data(max_entries=16, show_spinner=False)
def _html_report(key: str) -> str:
    from perfsim.cli import html_report

    return html_report.render(_simulate(key))


def html_report(inputs: dict) -> str:
    """The `perfsim simulate --html` report of ``inputs`` (cached per input)."""
    return _html_report(planner_inputs.cache_key(inputs))


@st.cache_data(max_entries=256, show_spinner=False)
def collective_rows(op: str, ranks: int, cluster: str, sizes: tuple[int, ...]) -> list[dict]:
    return [perfsim.collective(op, size, ranks, cluster) for size in sizes]


@st.cache_data(ttl=60, show_spinner=False)
def model_names() -> list[str]:
    return modelio.list_models()


@st.cache_data(max_entries=64, show_spinner=False)
def _model_facts(model: str, config: str | None) -> dict:
    spec = planner_inputs.model_spec({"model": model, "model_config": config})
    return {"total": spec.total_params(False), "active": spec.active_params(False), "total_emb": spec.total_params(),
            "active_emb": spec.active_params(), "layers": spec.num_layers,
            "experts": spec.num_experts, "top_k": spec.top_k, "hidden": spec.hidden_size,
            "shared_experts": spec.has_shared_experts}


def model_facts(inputs: dict) -> dict:
    """Parameter counts and shape of the inputs' model (cached)."""
    return _model_facts(inputs["model"], inputs.get("model_config"))


def refit_widgets() -> None:
    """on_change of the model, cluster and node-count widgets: knob widgets that no longer
    fit (dp for another GPU count, ep beyond the experts, pp/vpp that do not split the
    layers) are reset, and the page says which (issue 17.14)."""
    ss, current = st.session_state, get_inputs()
    model = ss.get("w.model", current["model"]) if ss.get("w.model_source", "preset") == "preset" else current["model"]
    config = None if ss.get("w.model_source", "preset") == "preset" else current.get("model_config")
    try:
        facts = _model_facts(model, config)
        per_node = cluster_info(ss.get("w.cluster", current["cluster"]))["gpus_per_node"]
    except EXPECTED:
        return  # the page shows the error itself
    knobs = {k: ss.get(f"w.{k}", current["knobs"][k]) for k in planner_inputs.KNOBS}
    num_gpus = int(ss.get("w.nodes", current["nodes"])) * per_node
    new, notes = planner_inputs.refit(knobs, num_gpus, facts["layers"], facts["experts"])
    for key, value in new.items():
        ss[f"w.{key}"] = value
    ss["plan.refit_notes"] = notes


def profile_dir() -> Path:
    """Where the Calibrate page saves profiles: $PERFSIM_PROFILES or ~/.perfsim/profiles."""
    return Path(os.environ.get("PERFSIM_PROFILES") or "~/.perfsim/profiles").expanduser()


def cluster_names() -> list[str]:
    """Shipped cluster profiles plus calibrated ones saved by the Calibrate page."""
    folder = profile_dir()
    saved = sorted(str(p) for p in folder.glob("*.toml")) if folder.is_dir() else []
    return hardware.list_profiles("cluster") + saved


@st.cache_data(max_entries=32, show_spinner=False)
def cluster_info(name: str) -> dict:
    spec = perfsim.load_cluster(name)
    return {"gpus_per_node": spec.gpus_per_node, "num_nodes": spec.num_gpus // spec.gpus_per_node,
            "gpu": spec.gpu.name}


def store() -> ScenarioStore:
    """The scenario database ($PERFSIM_DB or ~/.perfsim/scenarios.db)."""
    return ScenarioStore()


def plan_caption(inputs: dict) -> None:
    st.caption(fmt.md(f"Plan: {planner_inputs.describe(inputs)} · change it on the Plan page"))


def optional_api(module: str, name: str):
    """``perfsim.<name>`` or ``perfsim.<module>.<name>`` when that part of perfsim exists, else None."""
    value = getattr(perfsim, name, None)
    if callable(value):
        return value
    try:
        return getattr(importlib.import_module(f"perfsim.{module}"), name, None)
    except ImportError:
        return None


def unavailable(feature: str, module: str) -> None:
    st.warning(f"{feature} unavailable: this perfsim has no `perfsim.{module}` yet (it is being written). "
               "The rest of the planner works.", icon=":material/construction:")
