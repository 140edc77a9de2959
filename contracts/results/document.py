"""``Results``: the whole ``nslab.results/1`` document, its validation and its JSON."""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Literal

from pydantic import ConfigDict, Field, create_model

from contracts.base import Model
from contracts.comparisons import Comparison
from contracts.results.agents import AgentsCost, CollocationSection, OwdSection, SyncSection
from contracts.results.jobs import JobEntry, LoadEntry
from contracts.results.lab import LabSection, ScenarioSection, Teardown
from contracts.results.truth import TruthSection
from contracts.studies import SECTIONS

SCHEMA = "nslab.results/1"


class _Core(Model):
    """The sections every scenario may have; the studies' follow (``contracts.studies``)."""

    # ``schema`` would shadow a BaseModel attribute: the field is ``schema_``, written
    # ``schema`` (its alias); both names are accepted on input.
    model_config = ConfigDict(title="nslab.results/1", populate_by_name=True)

    schema_: Literal["nslab.results/1"] = Field(alias="schema",
                                                description="document schema and version")
    created: str = Field(description="ISO 8601 time (UTC) the document was made")
    scenario: ScenarioSection
    lab: LabSection
    truth: TruthSection
    teardown: Teardown
    load: list[LoadEntry] | None = Field(None, description="per iperf3 flow")
    agents: AgentsCost | None = None
    sync: SyncSection | None = None
    owd_us: OwdSection | None = None
    collocation: CollocationSection | None = None
    jobs: list[JobEntry] | None = Field(None, description="per job, in scenario order")
    comparisons: list[Comparison] | None = Field(None, description="every compared pair of "
                                                 "arms, over the run's repetitions")


Results = create_model(
    "Results", __base__=_Core, __doc__="The ``nslab.results/1`` document. Optional sections "
    "are absent when not measured.",
    **{key: (model | None, Field(None, description=(model.__doc__ or "").strip()))
       for key, model in SECTIONS.items()})

OPTIONAL_SECTIONS = tuple(k for k, f in Results.model_fields.items() if not f.is_required())
"""Top-level sections present only when measured (absent otherwise, never null)."""


def results_schema() -> dict:
    """The JSON Schema of ``nslab.results/1`` (``nslab schema results``)."""
    return Results.model_json_schema(by_alias=True)


def validate(doc: Results | Mapping) -> Results:
    """``doc`` as a ``Results``.

    Raises:
        pydantic.ValidationError: a field missing or of the wrong type (with its path).
    """
    return doc if isinstance(doc, Results) else Results.model_validate(dict(doc))


def dump(results: Results | Mapping) -> dict:
    """The JSON-ready document: every field (None as null), minus absent optional sections."""
    res = validate(results)
    absent = {k for k in OPTIONAL_SECTIONS if getattr(res, k) is None}
    return res.model_dump(mode="json", by_alias=True, exclude_none=False, exclude=absent)


def write(results: Results | Mapping, path: str) -> None:
    """Write the document as JSON to ``path`` (``-``: stdout).

    Raises:
        pydantic.ValidationError: a dict that is not a valid document.
    """
    text = json.dumps(dump(results), indent=1) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w") as f:
        f.write(text)
