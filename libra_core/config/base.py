"""The base of every config model: frozen, and unknown keys are errors (so a typo never silently
falls back to a default). Section models in other files of this package inherit it.

Numbers are not booleans: pydantic's lax mode reads `iterations: yes` (YAML's true) as 1, a value
nobody meant; a number field given a boolean is an error naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # A model validator, not a per-field one: pydantic allows no `before` field validator on the
    # discriminator fields (`type`) of the tagged unions.
    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(name)
                if isinstance(value, bool) and field.annotation in (int, float):
                    raise ValueError(f"{name}: expected a number, got {str(value).lower()}")
        return data
