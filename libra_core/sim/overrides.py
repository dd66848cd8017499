"""`FIELD=VALUE` what-if changes to a dataclass of numbers and flags (`ScenarioSpec`, `SimSettings`).

`libra simulate --spec/--setting` and `benchmarks/sim_table.py` read them the same way: only the
int, float and bool fields can change, each value is parsed to its field's type, and anything else
is a ValueError that names the pair and the valid fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def editable_fields(cls: type) -> dict[str, type]:
    """The fields of dataclass `cls` that a `FIELD=VALUE` pair may change, with their types."""
    kinds = {f.name: _TYPES.get(str(f.type), f.type) for f in fields(cls)}
    return {k: t for k, t in kinds.items() if t in (int, float, bool)}


def parse_overrides(pairs: Iterable[str], cls: type, flag: str) -> dict[str, Any]:
    """`FIELD=VALUE` pairs for dataclass `cls` as `{field: typed value}`; ValueError on a bad pair."""
    allowed = editable_fields(cls)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or key not in allowed:
            raise ValueError(f"{flag} {pair!r}: expected FIELD=VALUE with FIELD one of {sorted(allowed)}")
        kind = allowed[key]
        out[key] = _parse(pair, flag, text, kind)
    return out


def _parse(pair: str, flag: str, text: str, kind: type) -> int | float | bool:
    if kind is bool:
        low = text.lower()
        if low not in _TRUE + _FALSE:
            raise ValueError(f"{flag} {pair!r}: {text!r} is not true or false")
        return low in _TRUE
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {pair!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag} {pair!r}: {text!r} is not a finite number")
    if kind is int:
        if value != int(value):
            raise ValueError(f"{flag} {pair!r}: {text!r} is not a whole number")
        return int(value)
    return value
