"""Typed errors of the lab. Every message says what to do."""


class LabError(Exception):
    """Base class of nslab errors (the CLI turns them into exit code 1)."""


class NotRootError(LabError):
    """The operation needs root (network namespaces, tc, cgroups)."""


class CapabilityError(LabError):
    """A requested parameter needs a kernel or machine feature that is missing."""


class ScenarioError(LabError):
    """A scenario file is invalid; ``errors`` lists ``(field path, message)`` pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        self.source = source
        self.errors = errors
        lines = "\n".join(f"  {path}: {msg}" for path, msg in errors)
        super().__init__(f"{source}: {len(errors)} error(s); nothing was built\n{lines}")
