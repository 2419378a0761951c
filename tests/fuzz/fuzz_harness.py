"""Run one fuzz case and classify what happened.

Outcomes: ``ok`` (exit 0, every number finite), ``error`` (exit 2 or ConfigError /
InfeasiblePlan: one line, no traceback), ``gate`` (exit 1: validate's accuracy gate), and
the failures the issue counts: ``traceback`` (an exception escaped), ``hang`` (past the
time limit), ``nonfinite`` (NaN/inf printed or written), ``multiline`` (an error that is
not one line), ``accepted`` (bad input answered as if it were good).
"""

import contextlib
import io
import json
import math
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass

from perfsim.errors import ConfigError, InfeasiblePlan

CASE_LIMIT_S = 10.0  # CPU seconds a case may use (issue 18: every case under 10 s)
WALL_FACTOR = 3  # wall-clock allowance on a shared, loaded machine
# informational stderr lines a command prints by design before it fails (not part of the error)
NOTE_PREFIXES = ("perfsim: megatron ", "perfsim: primus ", "perfsim: writing trace", "perfsim: simulating")
GOOD = ("ok", "error", "gate")
NONFINITE_RE = re.compile(r"(?<![\w.])-?(nan|inf|infinity)(?![\w])", re.IGNORECASE)
COUNTS: Counter = Counter()  # (surface, outcome) -> cases; printed by conftest at the end


class Hang(BaseException):
    """Raised by the alarm when a case runs past its limit (BaseException: nothing catches it)."""


@contextlib.contextmanager
def time_limit(seconds: float = CASE_LIMIT_S):
    """A case may use ``seconds`` of CPU (SIGPROF: other processes on a shared machine do
    not count) and WALL_FACTOR times that of wall time (SIGALRM: a blocked wait counts)."""
    def _alarm(signum, frame):
        raise Hang(f"ran past {seconds} s of CPU" if signum == signal.SIGPROF else
                   f"ran past {WALL_FACTOR * seconds} s of wall time")

    old = {sig: signal.signal(sig, _alarm) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, WALL_FACTOR * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)


@dataclass
class Result:
    outcome: str
    rc: int | None = None
    out: str = ""
    err: str = ""
    seconds: float = 0.0
    detail: str = ""

    def __str__(self):
        return f"{self.outcome} rc={self.rc} in {self.seconds:.2f}s: {self.detail or self.err.strip()[:300]}"


def nonfinite_text(text: str) -> str | None:
    m = NONFINITE_RE.search(text)
    return None if m is None else text[max(0, m.start() - 60): m.end() + 20]


def nonfinite_value(obj) -> bool:
    """True when a JSON-like object holds a NaN or an infinity anywhere."""
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(nonfinite_value(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(nonfinite_value(v) for v in obj)
    return False


def run_cli(argv: list[str], limit_s: float = CASE_LIMIT_S, files: tuple = ()) -> Result:
    """``perfsim.cli.main(argv)`` in process with captured output and a time limit.
    ``files``: paths the command may write, checked for NaN/inf afterwards."""
    from perfsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with time_limit(limit_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    except Hang as exc:
        return Result("hang", None, out.getvalue(), err.getvalue(), time.perf_counter() - t0, str(exc))
    except SystemExit as exc:  # argparse --help or a stray sys.exit
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001 -- the point is to see every escape
        return Result("traceback", None, out.getvalue(), err.getvalue(), time.perf_counter() - t0,
                      f"{type(exc).__name__}: {exc}"[:400])
    return classify(rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0, files)


def classify(rc: int, out: str, err: str, seconds: float, files: tuple = ()) -> Result:
    if "Traceback" in err:
        return Result("traceback", rc, out, err, seconds)
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(NOTE_PREFIXES)]
        return Result("error" if len(lines) == 1 else "multiline", rc, out, err, seconds)
    bad = nonfinite_text(out) or nonfinite_text(err)
    for path in files:
        with contextlib.suppress(OSError):
            bad = bad or nonfinite_text(open(path, encoding="utf-8", errors="replace").read())
    if bad:
        return Result("nonfinite", rc, out, err, seconds, bad)
    if rc == 1:
        return Result("gate", rc, out, err, seconds)
    return Result("ok" if rc == 0 else "traceback", rc, out, err, seconds)


def run_api(fn, limit_s: float = CASE_LIMIT_S) -> Result:
    """Call ``fn()``: ConfigError/InfeasiblePlan with one line is ``error``; a result with
    NaN/inf in it is ``nonfinite``; anything else raised is ``traceback``."""
    t0 = time.perf_counter()
    try:
        with time_limit(limit_s):
            value = fn()
    except Hang as exc:
        return Result("hang", seconds=time.perf_counter() - t0, detail=str(exc))
    except (ConfigError, InfeasiblePlan) as exc:
        text = str(exc)
        outcome = "error" if text and "\n" not in text.strip() else "multiline"
        return Result(outcome, seconds=time.perf_counter() - t0, err=text)
    except BaseException as exc:  # noqa: BLE001
        return Result("traceback", seconds=time.perf_counter() - t0, detail=f"{type(exc).__name__}: {exc}"[:400])
    if nonfinite_value(_plain(value)):
        return Result("nonfinite", seconds=time.perf_counter() - t0, detail=repr(value)[:300])
    return Result("ok", seconds=time.perf_counter() - t0)


def _plain(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return value


def json_is_strict(text: str) -> bool:
    """True when ``text`` parses as strict JSON (no NaN / Infinity tokens)."""
    def _reject(token):
        raise ValueError(token)

    try:
        json.loads(text, parse_constant=_reject)
    except ValueError:
        return False
    return True


def record(surface: str, result: Result) -> Result:
    COUNTS[(surface, result.outcome)] += 1
    return result


def print_counts(terminalreporter) -> None:
    """The corpus counts per surface and outcome (called by tests/conftest.py at the end)."""
    if not COUNTS:
        return
    terminalreporter.section("fuzz corpus: cases per surface and outcome")
    surfaces = sorted({s for s, _ in COUNTS})
    outcomes = sorted({o for _, o in COUNTS})
    terminalreporter.write_line(f"{'surface':<26}" + "".join(f"{o:>11}" for o in outcomes) + f"{'total':>8}")
    for s in surfaces:
        row = [COUNTS.get((s, o), 0) for o in outcomes]
        terminalreporter.write_line(f"{s:<26}" + "".join(f"{n:>11}" for n in row) + f"{sum(row):>8}")
    total = [sum(COUNTS.get((s, o), 0) for s in surfaces) for o in outcomes]
    terminalreporter.write_line(f"{'all':<26}" + "".join(f"{n:>11}" for n in total) + f"{sum(total):>8}")
