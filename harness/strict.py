"""The strict base of every model read from a file or a command line: an unknown key is an error
that names it (a typo in a recipe, a spec or a record is never dropped in silence)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FrozenStrict(Strict):
    """Strict and immutable (hashable): a plan or a spec that must not change once read."""

    model_config = ConfigDict(frozen=True)
