"""Shared by the unit and integration tests. Pytest's default ``prepend`` import mode puts
this directory on ``sys.path``, so tests import the helpers beside it as top-level modules
(``from synthetic import simulate``). ``pytester`` runs the plugin's users' test files."""

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def agents_datagram_path() -> None:
    """Build the agents' compiled datagram path and the pacer's loop when missing or stale, as
    the lab does before it starts them (``make setup`` builds them ahead): tests start agents
    themselves."""
    from agents import pacerio, probeio
    from lab import native
    native.make(probeio.NATIVE_DIR, probeio.LIBRARY, probeio.SOURCE, "the agents' datagram path")
    native.make(pacerio.NATIVE_DIR, pacerio.LIBRARY, pacerio.SOURCE, "the pacer's loop")
