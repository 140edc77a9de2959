"""nslab in pytest: test your own network agents on an emulated cluster.

The plugin (``nslab_pytest.plugin``, registered by the entry point ``pytest11`` ``nslab``)
gives the fixture ``nslab_lab``, the marker ``nslab(needs=[...])`` and keeps a failing test's
logs and captures. These helpers act on a lab ``nslab_lab`` started (``nslab_pytest.labrun``):

    spawn(lab, vms, argv)          a command in VMs -> {vm: Proc}
    inject(lab, fault)             a fault now, stamped in the truth
    truth(lab)                     placements, clocks, fault timeline
    agents_state(lab)              the coordinator's API (contracts.messages.CoordinatorState)
    wait_agents(lab, until)        poll it until a condition holds

They load the lab's code on first use, so the plugin costs a test run nothing until a test
builds a lab.
"""
from __future__ import annotations

__all__ = ["agents_state", "inject", "run_of", "spawn", "truth", "wait_agents"]


def __getattr__(name: str):
    if name in __all__:
        from nslab_pytest import labrun
        return getattr(labrun, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
