"""Strict conversion between TOML-shaped dicts and frozen spec dataclasses.

Keys map one-to-one onto dataclass fields; unknown or missing keys are errors that
name the place (``file: table.key``) and the value.
"""

import dataclasses
import types
import typing
from typing import Any

from perfsim.errors import ConfigError


def _hint_origin(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def _convert(value: Any, hint: Any, where: str) -> Any:
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
        return float(value)
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
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(fields))})")
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
        out[field.name] = _plain(getattr(spec, field.name))
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
