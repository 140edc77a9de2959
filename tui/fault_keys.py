"""The fault controls of ``tui.app.NslabApp`` (a mixin): the keys and palette entries that
inject a ``contracts.events`` fault into the selected link or VM through the backend.

A fault that does not validate, or with nothing selected, is refused in the app (the event
log and a notice); one the lab refuses comes back as the worker's error
(``lab.fault_rules``), logged the same way.
"""
from __future__ import annotations

from pydantic import ValidationError

from contracts.base import reasons
from contracts.events import (
    ClockStep,
    CpuHog,
    Fault,
    Flap,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Rate,
    Resume,
    kind_of,
)


class FaultKeys:
    """Needs the app's ``backend``, ``snap``, ``stopped``, ``w_fabric``, ``selected_vm``,
    ``rates`` (link -> its configured rate, Mbit/s), ``control`` and ``refuse``."""

    def inject(self, fault: Fault) -> None:
        """Apply ``fault`` through the backend (a worker); a refusal is logged."""
        self.control(f"{fault.kind} {fault.target}", self.backend.inject, fault)

    def inject_link(self, fault_type: type[Fault], **params) -> None:
        """Inject a link fault of ``fault_type`` (a ``contracts.events`` class) on the selected
        link, e.g. ``inject_link(Loss, percent=5.0)``."""
        lk = self.w_fabric.selected_link
        self._inject_on(fault_type, "link", (lk.a, lk.b) if lk else None, params)

    def inject_vm(self, fault_type: type[Fault], **params) -> None:
        """Inject a VM fault of ``fault_type`` (a ``contracts.events`` class) on the selected VM,
        e.g. ``inject_vm(Migrate, to="phys2")``."""
        self._inject_on(fault_type, "vm", self.selected_vm, params)

    def _inject_on(self, fault_type: type[Fault], field: str, target, params: dict) -> None:
        """Build ``fault_type(field=target, **params)`` and inject it; a fault that does not
        validate (pydantic) is refused with its reasons, as is one with nothing selected."""
        kind = kind_of(fault_type)
        if target is None or self.stopped:
            noun = "VM" if field == "vm" else field
            return self.refuse(f"{kind}: no {noun} selected or lab not running")
        try:
            fault = fault_type(**{field: target}, **params)
        except ValidationError as e:
            return self.refuse(f"{kind} refused: {reasons(e)}")
        self.inject(fault)

    def action_link_down(self) -> None:
        self.inject_link(LinkDown)

    def action_link_up(self) -> None:
        self.inject_link(LinkUp)

    def action_flap(self) -> None:
        self.inject_link(Flap, down_s=1.0, up_s=1.0, count=3)

    def action_loss(self) -> None:
        lk = self.w_fabric.selected_link
        self.inject_link(Loss, percent=0.0 if lk and lk.loss_percent else 5.0)

    def action_rate(self) -> None:
        """Halve the selected link's configured rate, or give it back."""
        lk = self.w_fabric.selected_link
        if lk is None:
            return self.refuse("rate: no link selected")
        if not lk.bw_mbit:
            return self.refuse(f"rate: {lk.key} is unshaped (no rate to change)")
        base = self.rates.setdefault(lk.key, lk.bw_mbit)
        self.inject_link(Rate, mbit=base / 2 if lk.bw_mbit >= base else base)

    def _selected_vm_view(self):
        return self.snap.vm(self.selected_vm) if self.snap and self.selected_vm else None

    def action_hog(self) -> None:
        v = self._selected_vm_view()
        self.inject_vm(CpuHog, enable=not (v and v.hog))

    def action_pause_vm(self) -> None:
        v = self._selected_vm_view()
        if v is None:
            return self.refuse("pause: no VM selected")
        self.inject_vm(Resume if v.paused else Pause)

    def action_clock_step(self) -> None:
        self.inject_vm(ClockStep, step_ms=2.0)

    def action_migrate(self) -> None:
        """Migrate the selected VM to the next physical host."""
        v = self._selected_vm_view()
        hosts = self.snap.hosts if self.snap else []
        if v is None or len(hosts) < 2:
            return self.refuse("migrate: needs a selected VM and two physical hosts")
        nxt = hosts[(hosts.index(v.phys) + 1) % len(hosts)] if v.phys in hosts else hosts[0]
        self.inject_vm(Migrate, to=nxt)
