"""ARCHITECTURE.md's layer table, enforced by parsing imports: a module imports only
from its own or lower layers; simpy only in engine, networkx only in network; no
torch/triton/streamlit inside perfsim/; no print() outside the CLI."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "perfsim"

LAYERS = {
    0: ("units", "errors", "specio"),
    1: ("hardware", "model", "modelio", "ops"),
    2: ("parallel", "costs", "collectives", "network", "routing", "schedules", "sharding", "stragglers"),
    3: ("graph", "layers", "memory", "pricing"),
    4: ("engine", "analytic", "fastcost", "fastmem"),
    5: ("report",),
    6: ("api",),
    7: ("search", "calibrate", "sizing", "goodput", "readers", "readers_p2p", "collective_fit", "kernel_fit", "validate",
        "moe_width", "checkpoint", "search_space", "search_exec", "search_rank", "__init__"),  # __init__ re-exports the public API, layer-7 entry points included
    8: ("cli", "cli_design", "cli_search", "__main__"),
}
LAYER = {name: level for level, names in LAYERS.items() for name in names}
ONLY_IN = {"simpy": {"engine"}, "networkx": {"network"}}
FORBIDDEN = ("torch", "triton", "streamlit")
PRINTS_ALLOWED = {"cli", "cli_design", "__main__", "cli_search"}


def unit_of(path: Path, root: Path = PACKAGE) -> str:
    """Layer-table name of a file: its module, or for a subpackage its top folder."""
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path, root: Path = PACKAGE) -> list[tuple[str, int]]:
    """(absolute dotted module, line) of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = list(path.relative_to(root.parent).parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, node.lineno))
            if module == "perfsim":  # from perfsim import engine, ...
                found += [(f"perfsim.{a.name}", node.lineno) for a in node.names]
    return found


def layer_violations(path: Path, root: Path = PACKAGE) -> list[str]:
    me = unit_of(path, root)
    out = []
    for module, line in imports(path, root):
        parts = module.split(".")
        if parts[0] == "perfsim" and len(parts) > 1 and parts[1] in LAYER and me in LAYER:
            if LAYER[parts[1]] > LAYER[me]:
                out.append(f"{path.name}:{line}: layer {LAYER[me]} {me} imports layer {LAYER[parts[1]]} {parts[1]}")
    return out


def quarantine_violations(path: Path, root: Path = PACKAGE) -> list[str]:
    me = unit_of(path, root)
    out = []
    for module, line in imports(path, root):
        top = module.split(".")[0]
        if top in FORBIDDEN:
            out.append(f"{path.name}:{line}: {top} must stay outside perfsim/")
        if top in ONLY_IN and me not in ONLY_IN[top]:
            out.append(f"{path.name}:{line}: {top} is only for {', '.join(sorted(ONLY_IN[top]))}")
    return out


def print_calls(path: Path, root: Path = PACKAGE) -> list[int]:
    if unit_of(path, root) in PRINTS_ALLOWED:
        return []
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


SOURCES = sorted(PACKAGE.rglob("*.py"))
IDS = [str(p.relative_to(PACKAGE)) for p in SOURCES]


def test_sources_found():
    assert {"api", "engine", "cli", "graph"} <= {unit_of(p) for p in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_module_is_in_layer_table(path):
    assert unit_of(path) in LAYER, f"{unit_of(path)}: add it to ARCHITECTURE.md's layer table and LAYERS here"


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_imports_only_equal_or_lower_layers(path):
    assert layer_violations(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_third_party_quarantine(path):
    assert quarantine_violations(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_no_print_in_library(path):
    assert print_calls(path) == [], f"{path.name}: print() in library code; use logging"


def test_checks_catch_violations(tmp_path):
    """A planted bad module trips every check (so the checks can fail)."""
    root = tmp_path / "perfsim"
    (root / "network").mkdir(parents=True)
    bad = root / "units.py"
    bad.write_text("from perfsim import engine\nfrom .report import Report\nimport simpy\nimport torch\nprint(1)\n")
    nested = root / "network" / "topology.py"
    nested.write_text("import networkx\nfrom ..graph import OpGraph\nfrom . import routes\n")
    assert len(layer_violations(bad, root)) == 2  # engine (4) and report (5) from layer 0
    assert len(quarantine_violations(bad, root)) == 2  # simpy outside engine, torch at all
    assert print_calls(bad, root) == [5]
    assert unit_of(nested, root) == "network"
    assert ("perfsim.graph", 2) in imports(nested, root) and ("perfsim.network", 3) in imports(nested, root)
    assert quarantine_violations(nested, root) == []
    assert len(layer_violations(nested, root)) == 1  # graph (3) from network (2)
