"""ARCHITECTURE.md's layer table, enforced by parsing imports: a folder imports only from
itself and the floors below it (top-level modules of one floor may use each other); simpy only in estimators/engine.py, networkx only in
system/network.py; no torch/triton/streamlit inside perfsim/; no print() outside cli/;
nothing outside perfsim/ reaches into a private module of it."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "perfsim"

# floor -> units (a folder of perfsim/ or a top-level module); ARCHITECTURE.md's table
FLOORS = {
    0: ("units", "errors"),
    1: ("system",),
    2: ("model",),
    3: ("plan",),
    4: ("lowering",),
    5: ("cost",),
    6: ("estimators", "calibration"),  # side by side: neither imports the other
    7: ("report",),
    8: ("api",),
    9: ("search", "design"),
    10: ("__init__",),  # the facade re-exports the public API
    11: ("cli",),
    12: ("__main__",),
}
FLOOR = {name: level for level, names in FLOORS.items() for name in names}
TOP_LEVEL = {"__init__", "__main__", "api", "report", "units", "errors"}
FOLDERS = {name for name in FLOOR if name not in TOP_LEVEL}
ONLY_IN = {"simpy": {"estimators/engine.py"}, "networkx": {"system/network.py"}}
FORBIDDEN = ("torch", "triton", "streamlit")
PRINTS_ALLOWED = {"cli", "__main__"}


def unit_of(path: Path, root: Path = PACKAGE) -> str:
    """Layer-table name of a file: its top folder, or a top-level module's name."""
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
            if module == "perfsim":  # from perfsim import api, ...
                found += [(f"perfsim.{a.name}", node.lineno) for a in node.names]
    return found


def layer_violations(path: Path, root: Path = PACKAGE) -> list[str]:
    me = unit_of(path, root)
    out = []
    for module, line in imports(path, root):
        parts = module.split(".")
        if parts[0] != "perfsim" or len(parts) < 2 or parts[1] not in FLOOR or parts[1] == me:
            continue
        mine, theirs = FLOOR.get(me, -1), FLOOR[parts[1]]
        beside = theirs == mine and (me in FOLDERS or parts[1] in FOLDERS)  # e.g. estimators -> calibration
        if theirs > mine or beside:
            out.append(f"{path.relative_to(root)}:{line}: floor {FLOOR.get(me)} {me} imports floor "
                       f"{FLOOR[parts[1]]} {parts[1]}")
    return out


def quarantine_violations(path: Path, root: Path = PACKAGE) -> list[str]:
    rel = path.relative_to(root).as_posix()
    out = []
    for module, line in imports(path, root):
        top = module.split(".")[0]
        if top in FORBIDDEN:
            out.append(f"{rel}:{line}: {top} must stay outside perfsim/")
        if top in ONLY_IN and rel not in ONLY_IN[top]:
            out.append(f"{rel}:{line}: {top} is only for {', '.join(sorted(ONLY_IN[top]))}")
    return out


def print_calls(path: Path, root: Path = PACKAGE) -> list[int]:
    if unit_of(path, root) in PRINTS_ALLOWED:
        return []
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


PRIVATE = re.compile(r"\bperfsim(?:\.[a-z0-9_]+)*\._[A-Za-z0-9]\w*|from perfsim(?:\.[a-z0-9_]+)* import [^\n]*\b_[A-Za-z]\w*")


def private_reaches(path: Path) -> list[str]:
    """Lines outside perfsim/ that import or use a private (underscore) name of it."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if PRIVATE.search(line.split("#")[0]):
            out.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))
IDS = [str(p.relative_to(PACKAGE)) for p in SOURCES]
OUTSIDE = sorted(p for d in ("app", "validation") for p in (ROOT / d).rglob("*.py"))  # tests may test privates


def test_tree_shows_the_layers():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == FOLDERS
    assert not (PACKAGE / "estimators" / "fastcost.py").exists()


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_module_is_in_layer_table(path):
    assert unit_of(path) in FLOOR, f"{unit_of(path)}: add it to ARCHITECTURE.md's layer table and FLOORS here"


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_imports_only_lower_floors(path):
    assert layer_violations(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_third_party_quarantine(path):
    assert quarantine_violations(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_no_print_in_library(path):
    assert print_calls(path) == [], f"{path.name}: print() in library code; use logging"


def test_nothing_outside_reaches_into_private_modules():
    found = [hit for p in OUTSIDE for hit in private_reaches(p)]
    assert found == []


def test_checks_catch_violations(tmp_path):
    """Planted bad modules trip every check (so the checks can fail)."""
    root = tmp_path / "perfsim"
    for folder in ("system", "cost", "estimators", "calibration"):
        (root / folder).mkdir(parents=True)
    bad = root / "units.py"
    bad.write_text("from perfsim import api\nfrom .report import Report\nimport simpy\nimport torch\nprint(1)\n")
    assert len(layer_violations(bad, root)) == 2  # api (8) and report (7) from floor 0
    assert len(quarantine_violations(bad, root)) == 2  # simpy outside the engine, torch at all
    assert print_calls(bad, root) == [5]
    upward = root / "system" / "hardware.py"
    upward.write_text("import networkx\nfrom ..lowering.graph import OpGraph\nfrom . import specio\n")
    assert unit_of(upward, root) == "system"
    assert ("perfsim.lowering.graph", 2) in imports(upward, root)
    assert quarantine_violations(upward, root) == ["system/hardware.py:1: networkx is only for system/network.py"]
    assert len(layer_violations(upward, root)) == 1  # lowering (4) from system (1); its own folder is fine
    sibling = root / "estimators" / "analytic.py"
    sibling.write_text("from perfsim.calibration.readers import read_rccl_log\nfrom perfsim.cost import kernels\n")
    assert len(layer_violations(sibling, root)) == 1  # beside, not below
    engine = root / "estimators" / "engine.py"
    engine.write_text("import simpy\n")
    assert quarantine_violations(engine, root) == []


def test_private_reach_is_caught(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("from perfsim.lowering.graph import _Builder\nimport perfsim\nperfsim.api._inputs(1)\n"
                       "from perfsim.api import simulate\n")
    bad = [line for line in planted.read_text().splitlines() if PRIVATE.search(line)]
    assert len(bad) == 2
