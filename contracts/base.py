"""The base of the results' models."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """extra="forbid": a producer's new field is added to its model first; from_attributes:
    producers may hand in their own models or dataclasses (e.g. ``contracts.events``)."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)
