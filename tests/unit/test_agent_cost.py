"""The agents' cost in the results (``session.daemons.AgentMesh.cost``): CPU per agent counted
from the end of start-up, start-up apart; with known CPU times (``usage`` replaced)."""
from __future__ import annotations

import time
from types import SimpleNamespace

from session.daemons import AgentMesh, AgentsSpec


def mesh_with(usages: list[dict]) -> AgentMesh:
    """A mesh (no lab) whose successive ``usage()`` calls return ``usages``."""
    mesh = AgentMesh(SimpleNamespace(name="unit"), AgentsSpec())
    calls = iter(usages)
    mesh.usage = lambda: next(calls)
    return mesh


def test_cost_counts_from_the_first_window_and_reports_start_up_apart():
    now = time.time_ns()
    mesh = mesh_with([{"agent-vm1": (0.6, 20.0), "agent-vm2": (0.8, 20.0)},
                      {"agent-vm1": (0.9, 21.0), "agent-vm2": (0.8, 22.0),
                       "coordinator": (1.0, 60.0)}])
    mesh.started_ns = now - 20_000_000_000
    mesh.mark_steady()
    mesh.mark_steady()  # once: a later call keeps the first mark
    mesh.steady = (now - 10_000_000_000, mesh.steady[1])  # marked 10 s before the end
    cost = mesh.cost(None)
    assert abs(cost["run_s"] - 20) < 0.5
    assert abs(cost["agent_cpu_core"]["max"] - 0.03) < 0.001  # 0.3 s over 10 s
    assert abs(cost["agent_cpu_core"]["p50"] - 0.015) < 0.001  # (0.0 + 0.03) / 2
    assert cost["agent_startup_cpu_s"] == {"p50": 0.7, "max": 0.8}
    assert abs(cost["coordinator_cpu_core"] - 0.05) < 0.002  # over the whole run


def test_cost_without_a_mark_counts_from_the_start():
    mesh = mesh_with([{"agent-vm1": (0.4, 20.0)}])
    mesh.started_ns = time.time_ns() - 20_000_000_000
    cost = mesh.cost(None)
    assert abs(cost["agent_cpu_core"]["p50"] - 0.02) < 0.001
    assert cost["agent_startup_cpu_s"] == {"p50": None, "max": None}
