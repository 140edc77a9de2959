"""Typed errors of the lab. Every message says what to do."""
from __future__ import annotations

from dataclasses import dataclass


class LabError(Exception):
    """Base class of nslab errors (the CLI turns them into exit code 1)."""


class NotRootError(LabError):
    """The operation needs root (network namespaces, tc, cgroups)."""


class CapabilityError(LabError):
    """A requested parameter needs a kernel or machine feature that is missing."""


@dataclass(frozen=True)
class ScenarioProblem:
    """One problem of a scenario file, for people (``str()``: one line) and scripts (fields).

    Attributes:
        path: the field path, ``faults[0].link`` (``""``: the file as a whole).
        message: what is wrong and what is expected, in plain words.
        hint: a suggestion (``did you mean `fabric_bw`?``, the names that exist), or ``""``.
        file: the scenario file (or the name that was asked for).
        line, column: where in the file, from 1; None when unknown.
    """

    path: str
    message: str
    hint: str = ""
    file: str = ""
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = ":".join(str(x) for x in (self.file, self.line, self.column) if x)
        text = f"{self.path}: {self.message}" if self.path else self.message
        return (f"{where}: " if where else "") + text + (f"; {self.hint}" if self.hint else "")


class ScenarioError(LabError):
    """A scenario file (or another YAML file of nslab: an exercise, an answer) is invalid;
    ``errors`` lists every ``ScenarioProblem`` found, in file order; ``str()`` is a header line
    ("FILE: N errors, ``outcome``:") and one line per problem."""

    def __init__(self, source: str, errors: list[ScenarioProblem],
                 outcome: str = "nothing was built"):
        self.source = source
        self.errors = errors
        n = len(errors)
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{source}: {n} error{'s' if n != 1 else ''}, {outcome}:\n{lines}")
