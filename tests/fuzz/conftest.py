"""Print the fuzz corpus counts per surface and outcome at the end of the run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_harness import COUNTS  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if not COUNTS:
        return
    terminalreporter.section("fuzz corpus: cases per surface and outcome")
    surfaces = sorted({s for s, _ in COUNTS})
    outcomes = sorted({o for _, o in COUNTS})
    terminalreporter.write_line(f"{'surface':<18}" + "".join(f"{o:>11}" for o in outcomes) + f"{'total':>8}")
    for s in surfaces:
        row = [COUNTS.get((s, o), 0) for o in outcomes]
        terminalreporter.write_line(f"{s:<18}" + "".join(f"{n:>11}" for n in row) + f"{sum(row):>8}")
    total = [sum(COUNTS.get((s, o), 0) for s in surfaces) for o in outcomes]
    terminalreporter.write_line(f"{'all':<18}" + "".join(f"{n:>11}" for n in total) + f"{sum(total):>8}")
