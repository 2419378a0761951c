"""Readers for the measurement formats people already have (layer 7: file I/O allowed).

* ``read_rccl_log``: rccl-tests / nccl-tests stdout (any ``*_perf`` binary; ``-g`` multi-GPU
  or MPI launches; graph mode; ranks on several hosts). Columns are located by the
  header (``size count type redop root time algbw busbw #wrong ...``); the first
  time/algbw/busbw group is out-of-place, the second in-place. Rows that do not parse
  (truncated, interleaved with other ranks' output, ``nan`` everywhere) are skipped and
  counted; a log with no valid row raises ``ConfigError`` naming the file and line. A
  time printed as ``nan`` next to a finite busbw is recovered as
  ``size / (busbw / factor)`` (rccl-tests doc/PERFORMANCE.md busbw factors). A run that
  forced the library's algorithm or protocol says so where it ran with ``NCCL_DEBUG=INFO``
  (``NCCL INFO NCCL_ALGO set by environment to Ring``): the log then carries that path
  (``RcclLog.algorithm`` / ``protocol``) and is priced on it, not on the selector's pick.
* ``read_p2p``: point-to-point bandwidth, either the long CSV of
  ``validation/data/calibration/xgmi_p2p_measured.csv`` (columns ``src, dst, direction,
  transfer_bytes, value_GBps, kind``) or a TransferBench / rocm-bandwidth-test style
  matrix (a header row of destination labels, then one row per source label; ``N/A``
  or ``-`` on the diagonal; ``# concurrent`` in a comment marks all-pairs-at-once runs).
  Labels ``GPU3``/``3`` are GPUs, ``CPU0`` hosts, ``node1:GPU3`` a GPU on another node.
* ``read_kernel_csv``: kernel sweeps in the schema below (``KERNEL_CSV_COLUMNS``), the
  one ``validation/triton_*`` writes; documented in ``validation/KERNEL_CSV.md``.

Kernel CSV schema (one row per measured kernel; empty cell = not applicable):

====================  ==========================================================
column                meaning
====================  ==========================================================
kind                  gemm | grouped_gemm | attention | memory
dtype                 fp32 | tf32 | fp16 | bf16 | fp8 (GEMM/attention input type)
m, n, k               GEMM: [m,k] @ [k,n]; grouped_gemm: m = tokens per group
batch                 GEMM: batched count; grouped_gemm: number of groups;
                      attention: batch size
seq, heads, kv_heads  attention: sequence length, query heads, key/value heads
head_dim, causal      attention: head dimension, 1/0 (or true/false)
direction             attention: fwd | bwd | fwd_bwd; gemm / grouped_gemm: fwd (or empty) |
                      bwd (dgrad + wgrad) | fwd_bwd (forward and backward timed together)
bytes, kernel         memory: bytes moved (read + written), copy | mul | add | triad | dot;
                      FP8 GEMMs: cast | cast_a (timed with their input casts);
                      grouped_gemm: moe_mlp (a gated MoE MLP forward timed whole: m tokens
                      per expert, n = expert width, k = hidden, batch = experts), moe_stage
                      (one stage of an inference fused-MoE kernel: priced, never fitted),
                      sum_loss (direction fwd_bwd: the op timed as a training step on its own,
                      loss = output.sum(): one pass reading the output for the sum and one
                      writing its gradient, the expanded ones made contiguous)
time_us               measured time of one kernel call (microseconds)
tflops                GEMM/attention achieved TFLOPS (used when time_us is empty)
TBps                  memory achieved TB/s (used when time_us is empty)
device                e.g. MI300X
library, clock_MHz    metadata: kernel library/version, median clock under load
source, note          metadata: where the number comes from (URL, script), free text
====================  ==========================================================

FLOP conventions: GEMM ``2*m*n*k*batch`` per pass (bwd 2 passes, fwd_bwd 3; a ``moe_mlp`` row ``6*m*n*k*batch``); attention forward ``4*batch*heads*seq^2*head_dim``
(halved when causal), backward 2.5x forward (Dao'23), fwd_bwd 3.5x. Extra columns must
start with ``meta_``; anything else unknown is an error (typos should not pass silently).
"""

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from perfsim.cost.collectives import BUSBW_FACTOR
from perfsim.errors import ConfigError
from perfsim.lowering.ops import Coll
from perfsim.system.specio import as_path, read_text
from perfsim.calibration.readers_p2p import P2pPoint, _number, read_p2p  # noqa: F401 (re-exported)

KERNEL_CSV_COLUMNS = (
    "kind", "dtype", "m", "n", "k", "batch", "seq", "heads", "kv_heads", "head_dim", "causal", "direction",
    "bytes", "kernel", "time_us", "tflops", "TBps", "device", "library", "clock_MHz", "source", "note", "timing",
)
# how a row's time was taken: ``device`` (GPU events, do_bench, a profiler: the kernel's own
# time; the default) or ``host`` (host wall clock over back-to-back calls, as
# torch.utils.benchmark's Timer.timeit: each call costs the longer of its GPU time and the
# host's time to issue it, so a small call times the harness, not the kernel)
KERNEL_TIMINGS = ("device", "host")
KERNEL_KINDS = ("gemm", "grouped_gemm", "attention", "memory")
# ``kernel`` labels that change how a row is priced: label -> (the kinds it applies to, the
# directions it allows (None: any), what it times where that restricts them)
KERNEL_LABELS = {
    "cast": (("gemm", "grouped_gemm"), None, ""),
    "cast_a": (("gemm", "grouped_gemm"), None, ""),
    "moe_mlp": (("grouped_gemm",), ("", "fwd"), "times a forward"),
    "moe_stage": (("grouped_gemm",), ("", "fwd"), "times a forward"),
    "sum_loss": (("gemm", "grouped_gemm"), ("fwd_bwd",), "times forward and backward together"),
}
ATTENTION_DIRECTIONS = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}  # x forward FLOPs (Dao'23)
# a GEMM row's direction -> the passes it times (False: the forward GEMM; True: its backward,
# dgrad + wgrad, twice the forward's FLOPs)
GEMM_PASSES = {"": (False,), "fwd": (False,), "bwd": (True,), "fwd_bwd": (False, True)}
_REQUIRED = {
    "gemm": ("m", "n", "k"),
    "grouped_gemm": ("m", "n", "k", "batch"),
    "attention": ("batch", "seq", "heads", "head_dim", "direction"),
    "memory": ("bytes",),
}
MAX_LOG_LINES = 100_000  # an rccl-tests log of one run prints ~100 lines; a bigger file is not one
MIN_TIME_US = 1e-3  # a time under 1 ns is not a measurement (a kernel launch alone takes microseconds)
_OP_ALIASES = {"alltoall": "all_to_all", "allreduce": "all_reduce", "allgather": "all_gather",
               "reducescatter": "reduce_scatter", "sendrecv": "send_recv", "bcast": "broadcast"}
_RANK_RE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)")
_START_RE = re.compile(r"Collective test starting:\s*(\S+)")
_GRAPH_RE = re.compile(r"graph:\s*(\d+)")
_LAUNCH_GRAPH_RE = re.compile(r"(?:^|\s)-G\s+(\d+)")
# NCCL's / RCCL's acknowledgement of a forced algorithm or protocol (init.cc / enqueue.cc:
# INFO(NCCL_ENV, "NCCL_ALGO set by environment to %s", ...)), printed under NCCL_DEBUG=INFO
_ENV_RE = re.compile(r"\bNCCL_(ALGO|PROTO) set by environment to (\S+)")
# the library's names -> perfsim's (perfsim.cost.collectives.ALGORITHMS, a profile's protocols);
# a library path perfsim does not price (CollNet, PAT) maps to None
ALGO_NAMES = {"ring": "ring", "tree": "tree", "nvls": "nvls", "collnetdirect": None, "collnetchain": None,
              "nvlstree": "nvls_tree", "pat": None}
PROTO_NAMES = {"ll": "ll", "ll128": "ll128", "simple": "simple"}


def check_files(name: str, files) -> tuple:
    """Argument check: ``files`` is a list or tuple of paths (str or os.PathLike)."""
    if not isinstance(files, list | tuple):
        raise ConfigError(f"{name}: expected a list of file paths, got {files!r}")
    return tuple(as_path(f, name) for f in files)


# ---- rccl-tests / nccl-tests logs ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RcclRow:
    size_bytes: int
    time_us_oop: float | None  # None: not printed or not recoverable
    time_us_ip: float | None
    busbw_GBps_oop: float | None = None
    busbw_GBps_ip: float | None = None
    line: int = 0

    def time_us(self, in_place: bool = False) -> float | None:
        return self.time_us_ip if in_place else self.time_us_oop


@dataclass(frozen=True, kw_only=True)
class RcclLog:
    path: str
    op: str  # a perfsim Coll value: all_reduce, all_gather, ...
    num_ranks: int
    num_nodes: int
    gpus_per_node: int
    graph: bool
    rows: tuple[RcclRow, ...]
    skipped_lines: tuple[int, ...] = ()  # table lines that did not parse
    header: dict[str, str] = field(default_factory=dict)
    # the path the run forced (NCCL_ALGO / NCCL_PROTO, as perfsim names it), where the log says
    algorithm: str | None = None
    protocol: str | None = None
    env_notes: tuple[str, ...] = ()  # a forced setting the log shows that perfsim cannot price as one path

    @property
    def num_skipped(self) -> int:
        return len(self.skipped_lines)

    @property
    def launch(self) -> str:
        """How the run launched its ranks: ``single-process`` (rccl-tests -g N, N > 1) or ``mpi``."""
        try:
            return "single-process" if int(self.header.get("nGpus", "1") or 1) > 1 else "mpi"
        except ValueError:
            return "mpi"

    def series(self, in_place: bool = False) -> list[tuple[int, float]]:
        """(size_bytes, time_us) of every row with a time in the chosen placement."""
        return [(r.size_bytes, r.time_us(in_place)) for r in self.rows if r.time_us(in_place) is not None]


def _op_name(token: str, where: str) -> str:
    name = token.removesuffix("_perf").lower()
    name = _OP_ALIASES.get(name, name)
    try:
        return Coll(name).value
    except ValueError:
        raise ConfigError(f"{where}: unsupported collective {token!r} (known: {', '.join(c.value for c in Coll)})") from None


@dataclass(frozen=True)
class _Columns:
    count: int  # tokens per data row
    size: int
    groups: tuple[tuple[int, int], ...]  # (time, busbw) indices: out-of-place, in-place


def _columns(header: str) -> _Columns | None:
    names = header.lstrip("#").split()
    if not names or names[0] != "size" or "time" not in names:
        return None
    times = [i for i, n in enumerate(names) if n == "time"]
    groups = []
    for t in times[:2]:
        bus = names.index("busbw", t) if "busbw" in names[t:] else t + 2
        groups.append((t, bus))
    return _Columns(count=len(names), size=0, groups=tuple(groups))


def _recover_time(size: int, time: float | None, bus: float | None, op: str, ranks: int) -> float | None:
    if time is not None and time > 0:
        return time if time >= MIN_TIME_US else None
    factor = BUSBW_FACTOR[Coll(op)](ranks)
    if bus is not None and bus > 0 and size > 0 and factor > 0:
        recovered = size / (bus / factor * 1e9) * 1e6
        return recovered if MIN_TIME_US <= recovered < math.inf else None
    return None


def _parse_row(tokens: list[str], cols: _Columns, op: str, ranks: int, line: int) -> RcclRow | None:
    if len(tokens) != cols.count or not (tokens[0].isascii() and tokens[0].isdigit()):
        return None
    size = int(tokens[0])
    values = []
    for t, b in cols.groups:
        time, bus = _number(tokens[t]), _number(tokens[b])
        values.append((_recover_time(size, time, bus, op, ranks), bus))
    values += [(None, None)] * (2 - len(values))
    (t_oop, b_oop), (t_ip, b_ip) = values
    if t_oop is None and t_ip is None:
        return None
    return RcclRow(size_bytes=size, time_us_oop=t_oop, time_us_ip=t_ip, busbw_GBps_oop=b_oop,
                   busbw_GBps_ip=b_ip, line=line)


@dataclass
class _LogState:
    op: str | None = None
    graph: bool = False
    ranks: dict[int, str] = field(default_factory=dict)
    header: dict[str, str] = field(default_factory=dict)
    cols: _Columns | None = None
    header_line: int = 0
    env: dict[str, tuple[str, int]] = field(default_factory=dict)  # ALGO / PROTO -> (value, line)


def _environment(text: str, lineno: int, state: _LogState, where: str) -> None:
    if (m := _ENV_RE.search(text)) is None:
        return
    key, value = m.group(1), m.group(2)
    seen = state.env.get(key)
    if seen is not None and seen[0].lower() != value.lower():
        raise ConfigError(f"{where}:{lineno}: NCCL_{key} is {value!r} here and {seen[0]!r} at line {seen[1]}; "
                          f"one log holds one run (split the file per run)")
    state.env.setdefault(key, (value, lineno))


def forced_path(value: str, op: str, kind: str) -> tuple[str | None, str]:
    """The single algorithm (``kind`` ALGO) or protocol (PROTO) an NCCL_ALGO / NCCL_PROTO value
    forces on collective ``op``, as perfsim names it, and a note where it forces none perfsim
    can price (a list or exclusion leaves the library's tuner a choice; CollNet and PAT are
    paths perfsim does not price). Values follow NCCL's syntax:
    ``[function:]name[,name...][;function:...]``, ``^`` excluding."""
    names = ALGO_NAMES if kind == "ALGO" else PROTO_NAMES
    chosen = None
    for entry in value.split(";"):
        prefix, _, items = entry.rpartition(":")
        if not prefix or prefix.lower() == op.replace("_", ""):  # NCCL names functions allreduce, allgather, ...
            chosen = items
    if chosen is None:
        return None, ""
    setting = f"NCCL_{kind}={value}"
    parts = [p for p in chosen.split(",") if p]
    if chosen.startswith("^") or len(parts) != 1:
        return None, f"{setting} leaves the library's tuner a choice; priced on perfsim's own pick"
    name = parts[0].lower()
    if name not in names:
        raise ConfigError(f"{setting}: {parts[0]!r} is not one of the library's "
                          f"{'algorithms' if kind == 'ALGO' else 'protocols'} ({', '.join(names)})")
    if names[name] is None:
        return None, f"{setting}: perfsim does not price the {parts[0]} path; priced on its own pick"
    return names[name], ""


def _comment(text: str, lineno: int, state: _LogState, where: str) -> None:
    if m := _START_RE.search(text):
        op = _op_name(m.group(1), f"{where}:{lineno}")
        if state.op is not None and op != state.op:
            raise ConfigError(f"{where}:{lineno}: a second collective ({op}) in one log; split the file per test")
        state.op = op
    elif m := _RANK_RE.match(text):
        state.ranks[int(m.group(1))] = m.group(2)
    elif (cols := _columns(text)) is not None:
        state.cols, state.header_line = cols, lineno
    if text.lstrip("# ").startswith("nThread"):
        tokens = text.lstrip("# ").split()
        state.header.update({tokens[i]: tokens[i + 1] for i in range(0, len(tokens) - 1, 2)})
        if m := _GRAPH_RE.search(text):
            state.graph = state.graph or int(m.group(1)) > 0
    if (m := _LAUNCH_GRAPH_RE.search(text)) and int(m.group(1)) > 0:
        state.graph = True
    if ":" in text and text.lstrip("# ").split(":")[0] in ("source", "software"):
        key, _, value = text.lstrip("# ").partition(":")
        state.header[key.strip()] = value.strip()


def _geometry(state: _LogState, where: str, ranks: int | None) -> tuple[int, int, int]:
    if ranks is None and not state.ranks:
        try:
            ranks = int(state.header.get("nGpus", "0")) * int(state.header.get("nThread", "1"))
        except ValueError:
            ranks = 0
        if ranks < 1:
            raise ConfigError(f"{where}: no '#  Rank N ... on HOST device D' lines; pass the rank count (--ranks)")
    hosts = list(state.ranks.values())
    num_ranks = ranks if ranks is not None else len(hosts)
    num_nodes = max(1, len(set(hosts)))
    per_node = max((hosts.count(h) for h in set(hosts)), default=num_ranks)
    return num_ranks, num_nodes, per_node


def read_rccl_log(path: str | Path, op: str | None = None, ranks: int | None = None) -> RcclLog:
    """Parse one rccl-tests/nccl-tests log; ``op`` overrides the detected collective and
    ``ranks`` the rank count read from the '# Rank' lines."""
    path = as_path(path, "rccl-tests log")
    lines = read_text(path, "rccl-tests log").splitlines()
    if len(lines) > MAX_LOG_LINES:
        raise ConfigError(f"{path}: {len(lines):,} lines (limit {MAX_LOG_LINES:,}); one rccl-tests run prints ~100")
    if not any(line.strip() for line in lines):
        raise ConfigError(f"{path}:1: empty log (no rccl-tests output)")
    state, data = _LogState(), []
    for lineno, text in enumerate(lines, 1):
        _environment(text, lineno, state, str(path))
        if text.lstrip().startswith("#"):
            _comment(text, lineno, state, str(path))
        elif text.strip() and state.cols is not None:
            data.append((lineno, text.split()))
    if state.cols is None:
        raise ConfigError(f"{path}:1: no rccl-tests column header ('#  size  count  type ... time algbw busbw')")
    op = _op_name(op, str(path)) if op is not None else state.op
    if op is None:
        raise ConfigError(f"{path}:1: no 'Collective test starting: X_perf' line; pass the collective (--op)")
    num_ranks, num_nodes, per_node = _geometry(state, str(path), ranks)
    rows, skipped = [], []
    for lineno, tokens in data:
        row = _parse_row(tokens, state.cols, op, num_ranks, lineno)
        (rows.append(row) if row is not None else skipped.append(lineno))
    if not rows:
        first = skipped[0] if skipped else state.header_line
        raise ConfigError(f"{path}:{first}: no valid data row ({_why(data, state.cols)})")
    forced, notes = {}, []
    for key, (value, lineno) in sorted(state.env.items()):
        try:
            forced[key], note = forced_path(value, op, key)
        except ConfigError as exc:
            raise ConfigError(f"{path}:{lineno}: {exc}") from None
        notes += [f"{path}: {note}"] if note else []
    return RcclLog(path=str(path), op=op, num_ranks=num_ranks, num_nodes=num_nodes, gpus_per_node=per_node,
                   graph=state.graph, rows=tuple(rows), skipped_lines=tuple(skipped), header=state.header,
                   algorithm=forced.get("ALGO"), protocol=forced.get("PROTO"), env_notes=tuple(notes))


def _why(data: list[tuple[int, list[str]]], cols: _Columns) -> str:
    if not data:
        return "the table under the header is empty"
    tokens = data[0][1]
    if len(tokens) != cols.count:
        return f"expected {cols.count} columns as in the header, got {len(tokens)}"
    return "times and bus bandwidths are nan or not numbers"


# ---- kernel sweeps -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KernelPoint:
    kind: str
    dtype: str
    device: str
    time_s: float
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    seq: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    causal: bool = False
    direction: str = ""
    bytes: float = 0.0
    kernel: str = ""
    source: str = ""
    line: int = 0
    timing: str = "device"  # KERNEL_TIMINGS
    series: str = ""  # the measured series (``meta_series``; else the source): one harness timing one op

    @property
    def work(self) -> float:
        """What the row's rate counts: bytes moved for a memory-bound row, FLOPs otherwise."""
        return self.bytes if self.kind == "memory" else self.flops

    @property
    def gemm_passes(self) -> tuple[bool, ...]:
        """A GEMM row's timed passes (``GEMM_PASSES``): False the forward, True the backward."""
        return GEMM_PASSES.get(self.direction, (False,))

    @property
    def flops(self) -> float:
        if self.kind == "grouped_gemm" and self.kernel == "moe_mlp":  # gate_up (2n wide) + down
            return 6.0 * self.m * self.n * self.k * self.batch
        if self.kind in ("gemm", "grouped_gemm"):
            passes = sum(2.0 if backward else 1.0 for backward in self.gemm_passes)
            return 2.0 * self.m * self.n * self.k * self.batch * passes
        if self.kind == "attention":
            fwd = 4.0 * self.batch * self.heads * self.seq ** 2 * self.head_dim * (0.5 if self.causal else 1.0)
            return fwd * ATTENTION_DIRECTIONS[self.direction]
        return 0.0


def _cell_int(row: dict, key: str, where: str, default: int = 0) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value != int(value) or value <= 0:
        raise ConfigError(f"{where}: column {key!r} must be a positive integer, got {text!r}")
    return int(value)


def _cell_float(row: dict, key: str, where: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    value = _number(text)
    if value is None or value <= 0 or (key == "time_us" and value < MIN_TIME_US):
        raise ConfigError(f"{where}: column {key!r} must be a positive finite number, got {text!r}")
    return value


def _kernel_point(row: dict, where: str, lineno: int) -> KernelPoint:
    kind = (row.get("kind") or "").strip()
    if kind not in KERNEL_KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KERNEL_KINDS)}")
    for key in _REQUIRED[kind]:
        if not (row.get(key) or "").strip():
            raise ConfigError(f"{where}: column {key!r} is required for kind {kind}")
    direction = (row.get("direction") or "").strip()
    label = (row.get("kernel") or "").strip()
    kinds, directions, times = KERNEL_LABELS.get(label, (KERNEL_KINDS, None, ""))
    if kind not in kinds:
        raise ConfigError(f"{where}: kernel {label!r} is for kind {' or '.join(kinds)} rows, got kind {kind}")
    if kind == "attention" and direction not in ATTENTION_DIRECTIONS:
        raise ConfigError(f"{where}: direction {direction!r} is not one of {', '.join(ATTENTION_DIRECTIONS)}")
    if kind in ("gemm", "grouped_gemm") and direction not in GEMM_PASSES:
        raise ConfigError(f"{where}: direction {direction!r} is not one of fwd, bwd, fwd_bwd (or empty: fwd) for kind {kind}")
    if directions is not None and direction not in directions:
        allowed = " or ".join(d for d in directions if d)
        raise ConfigError(f"{where}: kernel {label!r} {times}; direction must be {allowed}, got {direction!r}")
    timing = (row.get("timing") or "device").strip().lower()
    if timing not in KERNEL_TIMINGS:
        raise ConfigError(f"{where}: timing {timing!r} is not one of {', '.join(KERNEL_TIMINGS)}")
    causal = (row.get("causal") or "0").strip().lower()
    if causal not in ("0", "1", "true", "false"):
        raise ConfigError(f"{where}: causal must be 0/1/true/false, got {causal!r}")
    ints = {key: _cell_int(row, key, where) for key in ("m", "n", "k", "seq", "heads", "head_dim")}
    ints["batch"] = _cell_int(row, "batch", where, default=1)
    ints["kv_heads"] = _cell_int(row, "kv_heads", where, default=ints["heads"])
    partial = KernelPoint(kind=kind, dtype=(row.get("dtype") or "bf16").strip().lower(), device=(row.get("device") or "").strip(),
                          time_s=1.0, causal=causal in ("1", "true"), direction=direction,
                          bytes=_cell_float(row, "bytes", where) or 0.0, kernel=(row.get("kernel") or "").strip(),
                          source=(row.get("source") or "").strip(), line=lineno, timing=timing,
                          series=(row.get("meta_series") or row.get("source") or "").strip(), **ints)
    return KernelPoint(**{**partial.__dict__, "time_s": _kernel_time(row, partial, where)})


def _kernel_time(row: dict, point: KernelPoint, where: str) -> float:
    time_us = _cell_float(row, "time_us", where)
    if time_us is not None:
        return time_us * 1e-6
    rate_key = "TBps" if point.kind == "memory" else "tflops"
    rate = _cell_float(row, rate_key, where)
    if rate is None:
        raise ConfigError(f"{where}: needs time_us or {rate_key}")
    return point.work / (rate * 1e12)


def read_kernel_csv(path: str | Path) -> list[KernelPoint]:
    """Kernel measurements in the ``KERNEL_CSV_COLUMNS`` schema; strict: a bad cell is a
    ConfigError naming file, line and column (these files are written by tools)."""
    path = as_path(path, "kernel CSV")
    text = read_text(path, "kernel CSV")
    lines = [line for line in text.splitlines()]
    if len(lines) > MAX_LOG_LINES:
        raise ConfigError(f"{path}: {len(lines):,} rows (limit {MAX_LOG_LINES:,})")
    if not any(line.strip() for line in lines):
        raise ConfigError(f"{path}:1: empty kernel CSV (expected a header: {','.join(KERNEL_CSV_COLUMNS)})")
    reader = csv.DictReader(lines)
    columns = [c.strip() for c in reader.fieldnames or []]
    unknown = [c for c in columns if c not in KERNEL_CSV_COLUMNS and not c.startswith("meta_")]
    if unknown or "kind" not in columns:
        bad = unknown[0] if unknown else "kind (missing)"
        raise ConfigError(f"{path}:1: unknown column {bad!r} (schema: {','.join(KERNEL_CSV_COLUMNS)}; extras start with meta_)")
    points = []
    for lineno, row in enumerate(reader, 2):
        if None in row or any(v is None for v in row.values()):
            raise ConfigError(f"{path}:{lineno}: expected {len(columns)} cells as in the header")
        points.append(_kernel_point({k.strip(): v for k, v in row.items()}, f"{path}:{lineno}", lineno))
    if not points:
        raise ConfigError(f"{path}:2: no data rows under the header")
    return points
