"""Saved planner scenarios (name, inputs, results) in an embedded SQLite database.

One file, WAL journal (readers never block the writer, a crash leaves no half-written
row), one short ``BEGIN IMMEDIATE`` transaction per save so two browser tabs saving at
once serialize instead of losing a row, and unique names: saving ``"base"`` twice keeps
both, the second as ``"base (2)"``, unless ``overwrite=True``.

The path comes from ``PERFSIM_DB`` when set, else ``~/.perfsim/scenarios.db``.
"""

import json
import os
import sqlite3
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "PERFSIM_DB"
DEFAULT_PATH = Path("~/.perfsim/scenarios.db")
BUSY_TIMEOUT_S = 30.0
MAX_NAME_CHARS = 120

SCHEMA = """
CREATE TABLE IF NOT EXISTS scenarios (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_s REAL NOT NULL,
    inputs TEXT NOT NULL,
    results TEXT NOT NULL
)
"""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    created_s: float
    inputs: dict
    results: dict


def default_path() -> Path:
    """``$PERFSIM_DB`` or ``~/.perfsim/scenarios.db``."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH).expanduser()


def clean_name(name: str) -> str:
    """A scenario name stripped of surrounding blanks; empty or overlong is a ValueError."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"scenario name: must be a non-empty string, got {name!r}")
    name = " ".join(name.split())
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"scenario name: at most {MAX_NAME_CHARS} characters, got {len(name)}")
    return name


class ScenarioStore:
    """Scenarios in the SQLite file at ``path`` (created with its folder on first use)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)

    @contextmanager
    def _connect(self):
        """A connection in autocommit mode; callers open their own transactions."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            yield db
        finally:
            db.close()

    @contextmanager
    def _write(self):
        """One write transaction: taken up front (IMMEDIATE), committed or rolled back whole."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def save(self, name: str, inputs: dict, results: dict, *, overwrite: bool = False) -> str:
        """Store a scenario and return the name it got (``"name (2)"`` when taken)."""
        name = clean_name(name)
        payload = (json.dumps(inputs, sort_keys=True), json.dumps(results, sort_keys=True))
        with self._write() as db:
            if overwrite:
                db.execute("DELETE FROM scenarios WHERE name = ?", (name,))
            final = _free_name(db, name)
            db.execute(
                "INSERT INTO scenarios (name, created_s, inputs, results) VALUES (?, ?, ?, ?)",
                (final, time.time(), *payload),
            )
        return final

    def names(self) -> list[str]:
        """Names, oldest first."""
        with self._connect() as db, closing(db.execute("SELECT name FROM scenarios ORDER BY id")) as cur:
            return [row[0] for row in cur]

    def get(self, name: str) -> Scenario:
        found = self.find(name)
        if found is None:
            raise KeyError(f"scenario {name!r} not found")
        return found

    def find(self, name: str) -> Scenario | None:
        """``name``'s scenario, or None when there is none (another session may have deleted it)."""
        with self._connect() as db:
            row = db.execute(
                "SELECT name, created_s, inputs, results FROM scenarios WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else _scenario(row)

    def all(self) -> list[Scenario]:
        """Every scenario, oldest first, read in one query (a delete from another session
        between listing and reading cannot fail it)."""
        with self._connect() as db, closing(db.execute(
                "SELECT name, created_s, inputs, results FROM scenarios ORDER BY id")) as cur:
            return [_scenario(row) for row in cur]

    def delete(self, name: str) -> bool:
        """Remove ``name``; False when there was no such scenario."""
        with self._write() as db:
            return db.execute("DELETE FROM scenarios WHERE name = ?", (name,)).rowcount > 0

    def __len__(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM scenarios").fetchone()[0]


def _scenario(row) -> Scenario:
    return Scenario(name=row[0], created_s=row[1], inputs=json.loads(row[2]), results=json.loads(row[3]))


def _free_name(db: sqlite3.Connection, name: str) -> str:
    """``name`` if unused, else the first free ``"name (k)"``, k >= 2 (inside the write lock)."""
    rows = db.execute(
        "SELECT name FROM scenarios WHERE name = ? OR substr(name, 1, ?) = ?", (name, len(name) + 2, name + " (")
    )
    taken = {row[0] for row in rows}
    if name not in taken:
        return name
    k = 2
    while f"{name} ({k})" in taken:
        k += 1
    return f"{name} ({k})"
