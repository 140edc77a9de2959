"""The emulator: builds a topology into namespaces, shapes links, places VMs on physical hosts
(cgroups), runs their clocks, injects faults, runs scenarios and records the ground truth."""
from lab.errors import CapabilityError, LabError, NotRootError, ScenarioError
from lab.lab import Lab

__all__ = ["CapabilityError", "Lab", "LabError", "NotRootError", "ScenarioError"]
