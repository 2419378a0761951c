"""Point-to-point bandwidth tables for ``readers.read_p2p`` (see ``readers``' docstring):
the long CSV of ``validation/data/calibration/xgmi_p2p_measured.csv`` or a TransferBench /
rocm-bandwidth-test style matrix."""

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.system.specio import as_path, read_text


def _number(token: str) -> float | None:
    """A finite float, or None for nan / N/A / garbage."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True, kw_only=True)
class P2pPoint:
    src: str
    dst: str
    link: str  # xgmi (GPU-GPU, same node) | pcie (host-GPU) | nic (GPU-GPU, other node)
    GBps: float
    concurrent: bool  # measured while all pairs ran at once
    line: int = 0


_DEVICE_RE = re.compile(r"^(?:(node\w*)[:/])?\s*(gpu|cpu|host|device)?\s*(\d+)?$", re.IGNORECASE)


def _device(label: str) -> tuple[str, str, str] | None:
    """(node, 'gpu'|'cpu', index) of a label such as GPU3, 3, CPU0, host, node1:GPU2;
    None if the label is not one device ('all 7 peers')."""
    m = _DEVICE_RE.match(label.strip())
    if not m or (m.group(2) is None and m.group(3) is None):
        return None
    kind = (m.group(2) or "gpu").lower()
    return (m.group(1) or "node0").lower(), "cpu" if kind in ("cpu", "host") else "gpu", m.group(3) or ""


def _link(src: str, dst: str) -> str | None:
    a, b = _device(src), _device(dst)
    if a is None or b is None or a == b:  # a == b: a local copy, not a link
        return None
    if a[1] == "cpu" or b[1] == "cpu":
        return "pcie"
    return "xgmi" if a[0] == b[0] else "nic"


def _p2p_csv(path: Path, rows: list[dict]) -> list[P2pPoint]:
    points = []
    for lineno, row in enumerate(rows, 2):
        if not str(row.get("kind", "measured")).startswith("measured"):
            continue  # acceptance thresholds are floors, not typical values
        link = _link(row.get("src") or "", row.get("dst") or "")
        value = _number(row.get("value_GBps") or "")
        direction = (row.get("direction") or "").lower()
        if link is None or value is None or "bidirectional" in direction:
            continue
        points.append(P2pPoint(src=row["src"], dst=row["dst"], link=link, GBps=value,
                               concurrent="concurrent" in direction or "parallel" in direction, line=lineno))
    return points


def _p2p_matrix(path: Path, lines: list[str]) -> list[P2pPoint]:
    concurrent = any(line.startswith("#") and "concurrent" in line.lower() for line in lines)
    body = [(i, line) for i, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    header_at = next((k for k, (_, line) in enumerate(body) if _is_label_row(line)), None)
    if header_at is None:
        raise ConfigError(f"{path}:1: no matrix header (a row of destination labels such as 'GPU0 GPU1 ...')")
    dests = _labels(body[header_at][1])
    points = []
    for lineno, line in body[header_at + 1:]:
        cells = _split_cells(line)
        if len(cells) != len(dests) + 1 or _device(cells[0]) is None:
            raise ConfigError(f"{path}:{lineno}: expected a source label and {len(dests)} values, got {len(cells)} cells")
        for dst, cell in zip(dests, cells[1:]):
            value, link = _number(cell), _link(cells[0], dst)
            if value is not None and value > 0 and link is not None:
                points.append(P2pPoint(src=cells[0], dst=dst, link=link, GBps=value, concurrent=concurrent, line=lineno))
    return points


def _split_cells(line: str) -> list[str]:
    """Cells of a matrix row; 'GPU 00' (TransferBench) is one label."""
    return re.sub(r"\b(GPU|CPU)\s+(\d+)", r"\1\2", line, flags=re.IGNORECASE).replace(",", " ").split()


def _labels(line: str) -> list[str]:
    cells = _split_cells(line)
    return cells[1:] if _device(cells[0]) is None else cells


def _is_label_row(line: str) -> bool:
    cells = _labels(line)
    return bool(cells) and all(_device(c) is not None for c in cells) and len(cells) >= 2


def read_p2p(path: str | Path) -> list[P2pPoint]:
    """Point-to-point bandwidths from a long CSV (``src,dst,...,value_GBps``) or a matrix."""
    path = as_path(path, "point-to-point table")
    text = read_text(path, "point-to-point table")
    lines = text.splitlines()
    if not text.strip():
        raise ConfigError(f"{path}:1: empty point-to-point table")
    first = lines[0].split(",")
    if {"src", "dst", "value_GBps"} <= {c.strip() for c in first}:
        points = _p2p_csv(path, list(csv.DictReader(lines)))
    else:
        points = _p2p_matrix(path, lines)
    if not points:
        raise ConfigError(f"{path}:1: no measured point-to-point GPU/host bandwidth found")
    return points


