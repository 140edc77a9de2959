"""When the lab refuses a fault: one definition, pure (no kernel access).

The lab checks a fault (``contracts.events``) against ``LabFacts`` read from its network
before it changes anything (``lab.faults``); the TUI's recorded backend checks it against
facts read from a recorded snapshot (``tui.recorded``), so a replay refuses what a lab
would, in the same words. A fault's parameters are checked by its model already.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contracts.events import LINK_KINDS, Fault, Migrate, Rate
from lab.errors import LabError


@dataclass(frozen=True)
class LabFacts:
    """What the rules read of a lab now: its ``name`` (for the messages), whether it is
    ``running``, its ``nodes`` (names), its ``links`` (the two end nodes -> shaped: the link
    has a rate), its ``vms`` (VM -> the physical host it runs on) and the ``paused`` VMs.
    The physical hosts are those the VMs run on."""

    name: str
    running: bool = True
    nodes: frozenset[str] = frozenset()
    links: Mapping[frozenset[str], bool] = field(default_factory=dict)
    vms: Mapping[str, str] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()


def check(fault: Fault, lab: LabFacts) -> None:
    """Refuse ``fault`` where the lab would.

    Raises:
        LabError: the lab is not running; a link fault names an unknown node or no link, or
            a new rate for an unshaped link; a VM fault names an unknown VM; a migration to
            an unknown host, to the host the VM is on, or of a paused VM.
    """
    if not lab.running:
        raise LabError(f"lab {lab.name} is not running")
    if fault.kind in LINK_KINDS:
        a, b = fault.link
        check_link(lab, a, b)
        if isinstance(fault, Rate) and not lab.links[frozenset((a, b))]:
            raise LabError(f"link {a}-{b} has no rate limit to change; give it a bw")
        return
    if fault.vm not in lab.vms:
        raise LabError(f"no VM {fault.vm!r} in lab {lab.name}")
    if isinstance(fault, Migrate):
        hosts = sorted(set(lab.vms.values()))
        if fault.to not in hosts:
            raise LabError(f"no physical host {fault.to!r}; hosts: {hosts}")
        if fault.to == lab.vms[fault.vm]:
            raise LabError(f"{fault.vm} already runs on {fault.to}")
        if fault.vm in lab.paused:
            raise LabError(f"{fault.vm} is paused; resume it before migrating")


def check_link(lab: LabFacts, a: str, b: str) -> None:
    """Refuse a link the lab does not have.

    Raises:
        LabError: no node ``a`` or ``b``, or no link between them.
    """
    for n in (a, b):
        if n not in lab.nodes:
            raise LabError(f"no node {n!r} in lab {lab.name}")
    if frozenset((a, b)) not in lab.links:
        raise LabError(f"no link between {a} and {b}")
