"""The emulator: builds a topology into namespaces, shapes links, places VMs on physical hosts
(cgroups), runs their clocks, injects faults and records the ground truth. Scenarios run one
layer up, in ``session``.

``Lab`` is imported lazily, so ``import lab.errors`` does not load Mininet and pyroute2.
"""
from lab.errors import CapabilityError, LabError, NotRootError, ScenarioError

__all__ = ["CapabilityError", "Lab", "LabError", "NotRootError", "ScenarioError"]


def __getattr__(name: str):
    if name == "Lab":
        from lab.lab import Lab
        return Lab
    raise AttributeError(f"module 'lab' has no attribute {name!r}")
