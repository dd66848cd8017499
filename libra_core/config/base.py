"""The base of every config model: frozen, and unknown keys are errors (so a typo never silently
falls back to a default). Section models in other files of this package inherit it.

Numbers are not booleans: pydantic's lax mode reads `iterations: yes` (YAML's true) as 1, a value
nobody meant; a number field given a boolean is an error naming the field.
"""

from __future__ import annotations

import types
import typing
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator

_NUMBERS = (int, float)


def _number_shape(annotation: Any) -> str | None:
    """ "scalar" for a number field (`int`, `float | None`), "items" for a sequence of numbers
    (`tuple[float, float]`, `list[int]`), else None."""
    args = get_args(annotation)
    if get_origin(annotation) in (typing.Union, types.UnionType):
        shapes = {_number_shape(arm) for arm in args if arm is not type(None)}
        return shapes.pop() if len(shapes) == 1 else None
    if get_origin(annotation) is typing.Annotated:  # `Annotated[float, Field(ge=0)]`
        return _number_shape(args[0])
    if annotation in _NUMBERS:
        return "scalar"
    # items may be Annotated numbers too (`tuple[LatencyMs, LatencyMs]`: until 2026-12-06 their
    # booleans were read as 1/0)
    numbers = args and all(arg is Ellipsis or _number_shape(arg) == "scalar" for arg in args)
    return "items" if get_origin(annotation) in (tuple, list) and numbers else None


class Frozen(BaseModel):
    # No inf or NaN in a config: `lr: .inf`, `temperature: .nan` or `aging_half_life_versions: .inf`
    # passed the `gt=0` bounds and failed later (a NaN update, a C-MLFQ tree that the next iteration
    # refuses to load) or never (an infinite timeout hides a hang).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # A model validator, not a per-field one: pydantic allows no `before` field validator on the
    # discriminator fields (`type`) of the tagged unions.
    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(name)
                shape = _number_shape(field.annotation) if value is not None else None
                if shape == "scalar" and isinstance(value, bool):
                    raise ValueError(f"{name}: expected a number, got {str(value).lower()}")
                if shape == "items" and isinstance(value, (list, tuple)):
                    flags = [str(v).lower() for v in value if isinstance(v, bool)]
                    if flags:
                        raise ValueError(f"{name}: expected numbers, got {', '.join(flags)}")
        return data
