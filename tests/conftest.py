"""Shared by the unit and integration tests. Pytest's default ``prepend`` import mode puts
this directory on ``sys.path``, so tests import the helpers beside it as top-level modules
(``from synthetic import simulate``). ``pytester`` runs the plugin's users' test files."""

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def compiled_parts() -> None:
    """Build the compiled parts (``lab.native.PARTS``) into the cache once, before tests start
    agents and pacers themselves, as the lab does before it starts them: not one build per
    xdist worker racing for the lock."""
    from lab import native
    for part in native.PARTS:
        native.ensure(part)
