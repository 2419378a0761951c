"""Readers for multi-node collective and MoE dispatch/combine tables.

``read_collective_table``: the long CSV of ``validation/data/multinode/collectives_multinode.csv``
(columns series, gpu, nic, n_nodes, n_ranks, collective, size_bytes, time_us, algbw_GBps,
busbw_GBps, in_place, software, launch_mode, source_url, note): one row per measured
point, as rccl-tests/nccl-tests printed it. Rows of one series become one
``CollectiveSeries``; ``NCCL_ALGO=Ring`` / ``NCCL_PROTO=...`` / ``RCCL_LL128_FORCE_ENABLE``
and ``-g N`` single-process launches in the launch column are recorded so the fit prices
the point as it ran. Rows with another ``collective`` (moe_dispatch, p2p) are left to
``read_dispatch_table``.

``read_dispatch_table``: the ``moe_dispatch`` / ``moe_combine`` rows of the same CSV
(MORI-EP, DeepEP): the implementation's own reported bandwidth (RDMA, XGMI or NVLink
figure, named in the note), optional latency, and the token configuration parsed from
the note (tokens per rank, hidden, top-k, FP8 dispatch / BF16 combine).
"""

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from perfsim.calibration.collective_fit import CollectivePoint
from perfsim.errors import ConfigError
from perfsim.lowering.ops import Coll
from perfsim.plan.parallel import GroupShape
from perfsim.system.specio import as_path, read_text

COLUMNS = ("series", "gpu", "nic", "n_nodes", "n_ranks", "collective", "size_bytes", "time_us", "algbw_GBps",
           "busbw_GBps", "in_place", "software", "launch_mode", "source_url", "note")
_ALGO_RE = re.compile(r"NCCL_ALGO=(\w+)", re.I)
_PROTO_RE = re.compile(r"NCCL_PROTO=(\w+)", re.I)
_GPUS_RE = re.compile(r"(?:^|\s)-g\s+(\d+)")
_TOKENS_RE = re.compile(r"(\d+)\s*(?:tokens|tok)\b")
_HIDDEN_RE = re.compile(r"(\d+)\s*hidden|hidden\s*(\d+)")
_TOPK_RE = re.compile(r"top-?(\d+)(?!\s*groups)")


@dataclass(frozen=True, kw_only=True)
class CollectiveSeries:
    series: str
    gpu: str
    nic: str
    coll: Coll
    num_ranks: int
    num_nodes: int
    algorithm: str | None
    protocol: str | None
    launch: str
    source: str
    rows: tuple[tuple[float, float], ...]  # (size_bytes, time_us)

    def points(self, gpus_per_node: int = 8) -> list[CollectivePoint]:
        # the ranks spread over the nodes the series names (2 nodes x 2 GPUs is 2 a node, not 4 on one)
        per = min(gpus_per_node, self.num_ranks, -(-self.num_ranks // max(1, self.num_nodes)))
        shape = GroupShape(size=self.num_ranks, per_node=per, num_nodes=max(self.num_nodes, -(-self.num_ranks // per)))
        return [CollectivePoint(coll=self.coll, size_bytes=s, shape=shape, time_s=t * 1e-6, label=self.series,
                                algorithm=self.algorithm, protocol=self.protocol, launch=self.launch)
                for s, t in self.rows]


@dataclass(frozen=True, kw_only=True)
class DispatchPoint:
    series: str
    gpu: str
    phase: str  # dispatch | combine
    num_ranks: int
    num_nodes: int
    metric: str  # rdma | xgmi | nvlink: which bandwidth the source printed
    bw_GBps: float
    latency_us: float | None
    tokens: int
    hidden: int
    topk: int
    source: str
    stale: bool = False  # the source marks the row as stale data from a previous kernel version

    @property
    def bytes_per_token(self) -> float:
        """FP8 dispatch (1 B per element + a 4-B scale per 128 elements), BF16 combine."""
        return self.hidden * (1 + 4 / 128) if self.phase == "dispatch" else 2 * self.hidden


def _rows(path: str | Path) -> list[dict]:
    reader = csv.DictReader(read_text(as_path(path, "collective table"), "collective table").splitlines())
    missing = [c for c in ("series", "collective", "n_ranks", "n_nodes") if c not in (reader.fieldnames or ())]
    if missing:
        raise ConfigError(f"{path}: missing column {missing[0]!r} (expected {', '.join(COLUMNS)})")
    return list(reader)


def _int(text: str, where: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {text!r}") from None


def _forced(text: str) -> tuple[str | None, str | None, str]:
    algo = m.group(1).lower() if (m := _ALGO_RE.search(text)) else None
    proto = m.group(1).lower() if (m := _PROTO_RE.search(text)) else None
    single = (m := _GPUS_RE.search(text)) is not None and int(m.group(1)) > 1
    return algo, proto, "single-process" if single else "mpi"


def read_collective_table(path: str | Path, in_place: bool = False, series: str | None = None) -> list[CollectiveSeries]:
    """Every collective series of the table (all_reduce, reduce_scatter, ...) with timed rows."""
    groups: dict[str, list[dict]] = {}
    for i, row in enumerate(_rows(path), start=2):
        name = row["collective"].strip()
        if name not in {c.value for c in Coll} or (series is not None and row["series"] != series):
            continue
        if not row.get("time_us") or not row.get("size_bytes") or row.get("in_place", "0") != ("1" if in_place else "0"):
            continue
        groups.setdefault(row["series"], []).append(row)
    if series is not None and series not in groups:
        raise ConfigError(f"series: {series!r} has no timed collective rows in {path}")
    out = []
    for name, rows in groups.items():
        first = rows[0]
        algo, proto, launch = _forced(" ".join(first.get(k, "") for k in ("launch_mode", "software", "note")))
        out.append(CollectiveSeries(
            series=name, gpu=first.get("gpu", ""), nic=first.get("nic", ""), coll=Coll(first["collective"]),
            num_ranks=_int(first["n_ranks"], f"{path}: {name}.n_ranks"),
            num_nodes=_int(first["n_nodes"], f"{path}: {name}.n_nodes"), algorithm=algo, protocol=proto,
            launch=launch, source=first.get("source_url", ""),
            rows=tuple(sorted((float(r["size_bytes"]), float(r["time_us"])) for r in rows))))
    return out


def _config(note: str) -> tuple[int, int, int]:
    tokens = _TOKENS_RE.search(note)
    hidden = _HIDDEN_RE.search(note)
    topk = _TOPK_RE.search(note.replace("top-4 groups", ""))
    if not (tokens and hidden and topk):
        return 0, 0, 0
    return int(tokens.group(1)), int(hidden.group(1) or hidden.group(2)), int(topk.group(1))


def read_dispatch_table(path: str | Path) -> list[DispatchPoint]:
    """MoE dispatch/combine points whose note names the token configuration."""
    out = []
    for row in _rows(path):
        phase = row["collective"].removeprefix("moe_")
        if phase not in ("dispatch", "combine") or not row.get("algbw_GBps"):
            continue
        note = row.get("note", "")
        tokens, hidden, topk = _config(note)
        if not tokens:
            continue
        metric = "rdma" if "RDMA" in note else "nvlink" if "NVLink" in note else "xgmi"
        if int(row["n_nodes"] or 1) == 1 and metric == "rdma":
            metric = "xgmi" if row["gpu"].startswith("MI") else "nvlink"  # LL EP8 runs inside one node
        out.append(DispatchPoint(
            series=row["series"], gpu=row["gpu"], phase=phase, num_ranks=int(row["n_ranks"]),
            num_nodes=int(row["n_nodes"] or 1), metric=metric, bw_GBps=float(row["algbw_GBps"]),
            latency_us=float(row["time_us"]) if row.get("time_us") else None, tokens=tokens, hidden=hidden,
            topk=topk, source=row.get("source_url", ""), stale="stale data" in note.lower()))
    return out
