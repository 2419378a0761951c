"""Strict conversion between TOML-shaped dicts and frozen spec dataclasses.

Keys map one-to-one onto dataclass fields; unknown or missing keys are errors that
name the place (``file: table.key``) and the value.
"""

import dataclasses
import json
import math
import os
import tempfile
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from perfsim.errors import ConfigError


def _hint_origin(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def _convert(value: Any, hint: Any, where: str) -> Any:
    if isinstance(hint, types.UnionType):  # ``X | None``: a present key is an X (TOML has no null)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            hint = args[0]
    origin = _hint_origin(hint)
    if dataclasses.is_dataclass(origin):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return from_dict(origin, value, where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_hint = typing.get_args(hint)[0]
        return tuple(_convert(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        val_hint = typing.get_args(hint)[1]
        return {str(k): _convert(v, val_hint, f"{where}.{k}") for k, v in value.items()}
    return _scalar(value, hint, where)


def _scalar(value: Any, hint: Any, where: str) -> Any:
    if isinstance(hint, types.UnionType):
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number, got {value!r}")
        return float(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, str):  # StrEnum
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(m.value for m in hint)
            raise ConfigError(f"{where}: {value!r} is not one of {choices}") from None
    return value


def from_dict(cls: type, data: dict, where: str) -> Any:
    """Build dataclass ``cls`` from ``data``; strict about keys and types."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        hint = getattr(cls, "RETIRED_KEYS", {}).get(unknown[0], "")
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(fields))}){hint}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, field in fields.items():
        key_where = f"{where}.{name}" if where else name
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key_where}: missing required key")
            continue
        kwargs[name] = _convert(data[name], hints[name], key_where)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def to_dict(spec: Any) -> dict:
    """Dataclass -> TOML-ready dict (tuples become lists, enums plain strings)."""
    out = {}
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if value is None and field.default is None:  # an absent optional table: left out, read back as None
            continue
        out[field.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, str):
        return str(value)
    return value


def check_positive(owner: str, **values: float) -> None:
    """Raise ConfigError naming the first value that is not > 0."""
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{owner}.{name} must be > 0, got {value!r}")


def check_fraction(owner: str, **values: float) -> None:
    """Raise ConfigError naming the first value outside (0, 1]."""
    for name, value in values.items():
        if not 0 < value <= 1:
            raise ConfigError(f"{owner}.{name} must be in (0, 1], got {value!r}")


# ---- files: strict UTF-8 in, atomic and checked out ------------------------------------

MAX_JSON_DEPTH = 64  # deepest nesting accepted in a JSON input (config.json nests 3 deep)
MAX_INPUT_BYTES = 64 << 20  # the largest input file read (profiles, models and logs are kilobytes)


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of ``path``; ConfigError naming the file (and the byte offset of a
    bad byte) when it cannot be read or is not UTF-8 text."""
    try:
        if Path(path).stat().st_size > MAX_INPUT_BYTES:
            raise ConfigError(f"{path}: {what} is larger than {MAX_INPUT_BYTES >> 20} MiB; not an input perfsim reads")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: {what} is binary (NUL byte at offset {text.index(chr(0))})")
    return text


def read_toml(path: str | Path) -> dict:
    """A profile's TOML table; unreadable, non-UTF-8 or invalid TOML -> one ConfigError line."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: profile is not UTF-8 text (bad byte at offset {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


def json_depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a linear scan: no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _reject_constant(token: str):
    raise ValueError(f"{token} is not a finite number")


def load_json(text: str, where: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON: nesting at most ``max_depth`` deep, no NaN/Infinity tokens."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ConfigError(f"{where}: JSON nested {depth} deep (at most {max_depth})")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: invalid JSON ({exc})") from None


def check_output(path: str | Path, force: bool, flag: str) -> Path:
    """Before any work: ``path`` can be written (its folder exists and is writable, it is
    not a folder) and does not exist unless ``force``. Returns it as a Path."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ConfigError(f"{flag}: expected a file path, got {path!r}")
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{flag}: {str(path)!r} is a directory; give a file name")
    if not folder.is_dir():
        raise ConfigError(f"{flag}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: folder {str(folder)!r} is not writable")
    if path.exists() and not force:
        raise ConfigError(f"{flag}: {str(path)!r} exists; pass --force to replace it")
    return path


def write_atomic(path: str | Path, text: str | bytes, flag: str) -> Path:
    """Write ``text`` through a temporary file unique to this writer, then rename: readers
    see the old file or the new one, never half of one; nothing is left behind on failure."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                                   suffix=".tmp")
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write {str(path)!r} ({exc.strerror or exc})") from None
    try:
        os.fchmod(fd, _file_mode())  # mkstemp makes 0600; the output gets the mode open() would give it
        binary = isinstance(text, bytes)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise ConfigError(f"{flag}: cannot write {str(path)!r} ({exc.strerror or exc})") from None
    except BaseException:
        _unlink(tmp)
        raise
    return path


def _file_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def first_nonfinite(value: Any, where: str = "") -> str | None:
    """The dotted place of the first NaN or infinity in a JSON-like value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "value"
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_nonfinite(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def check_finite_output(value: Any, what: str) -> None:
    """Refuse to print or write ``value`` when it holds a NaN or an infinity."""
    place = first_nonfinite(value)
    if place is not None:
        raise ConfigError(f"{what}: the result is not finite at {place}; an input is out of range")


# ---- arguments of public functions -----------------------------------------------------


def check_int(name: str, value: Any, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi], else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        span = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name}: must be an integer {span}, got {value!r}")
    return value


def check_number(name: str, value: Any, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] ((lo, hi] with ``lo_open``)."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > lo if lo_open else value >= lo) and value <= hi)
    if not ok:
        raise ConfigError(f"{name}: must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def check_type(name: str, value: Any, types: type | tuple, what: str) -> Any:
    """``value`` when it is one of ``types``, else ConfigError saying ``what`` was expected."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{name}: expected {what}, got {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{name}: expected {what}, got {value!r}")
    return value


def as_path(path: Any, what: str = "file") -> Path:
    """``path`` as a Path; ConfigError when it is not a str or os.PathLike."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ConfigError(f"{what}: expected a file path, got {path!r}")
    return Path(path)


def resolve_profile(kind: str, name_or_path, folder: Path) -> Path:
    """The file of a profile given by name (``folder/NAME.toml``) or by path; ConfigError
    naming the shipped ones when there is no such profile."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"{kind}: profile file {str(path)!r} does not exist")
        return path
    candidate = folder / f"{name_or_path}.toml"
    if not candidate.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.toml"))) or "none"
        raise ConfigError(f"{kind}: unknown profile {str(name_or_path)!r} (known: {known})")
    return candidate

