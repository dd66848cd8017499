"""The base of every config model: frozen, and unknown keys are errors (so a typo never silently
falls back to a default). Section models in other files of this package inherit it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
