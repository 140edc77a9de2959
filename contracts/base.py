"""The base of the results' models, and the words of a model's validation errors."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Model(BaseModel):
    """extra="forbid": a producer's new field is added to its model first; from_attributes:
    producers may hand in their own models or dataclasses (e.g. ``contracts.events``)."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)


def reasons(error: ValidationError) -> str:
    """Every problem of ``error`` as ``field.path: message``, joined by "; "."""
    return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in error.errors())
