"""The emulator: builds a topology into namespaces, shapes links, places VMs on physical hosts
(cgroups), runs their clocks, injects faults, runs scenarios and records the ground truth.

``Lab`` is imported lazily, so processes that run inside VMs (``workloads``) start without
loading Mininet and pyroute2.
"""
from lab.errors import CapabilityError, LabError, NotRootError, ScenarioError

__all__ = ["CapabilityError", "Lab", "LabError", "NotRootError", "ScenarioError"]


def __getattr__(name: str):
    if name == "Lab":
        from lab.lab import Lab
        return Lab
    raise AttributeError(f"module 'lab' has no attribute {name!r}")
