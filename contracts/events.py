"""The fault vocabulary and the truth timeline: one definition each.

``Fault`` is a discriminated union by ``kind``: the scenario YAML's ``faults:`` entries, the
TUI's controls, ``Lab.inject`` and the recorded backend all take these models; ``FAULT_KINDS``
lists the kinds. Every fault the lab applies, and every other thing it notes (a job starting, a
load flow, a flap's transitions), becomes an ``Event`` in the lab's ground-truth timeline
(``Lab.timeline``, the results' ``truth.faults``).

Units: ``at_s`` and ``t_s`` seconds after bring-up (true time), ``true_ns`` ns of the machine's
CLOCK_REALTIME, rates Mbit/s, loss percent, queue limits packets, clock steps ms.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["lab", "timeline", "step", "tui", "test"]
"""Who caused an event: the lab itself (notes, a flap's transitions, jobs, load), the scenario
timeline at its time, a timeline step played early, a person in the TUI, or a test
(``nslab_pytest.inject``)."""


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at_s: float = Field(0.0, ge=0, description="when a scenario timeline plays it: seconds "
                                               "after bring-up (ignored by Lab.inject)")

    @property
    def target(self) -> str:
        """``a-b`` for a link, the VM's name for a VM."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The fault's parameters besides its kind, time and target."""
        return self.model_dump(exclude={"kind", "at_s", "link", "vm"})


class _LinkFault(_Fault):
    link: tuple[str, str] = Field(description="the link's two end nodes",
                                   examples=[["leaf1", "spine1"]])

    @property
    def target(self) -> str:
        return f"{self.link[0]}-{self.link[1]}"


class _VmFault(_Fault):
    vm: str = Field(description="the VM", examples=["vm1"])

    @property
    def target(self) -> str:
        return self.vm


class LinkDown(_LinkFault):
    """Take a link down; fabric routes converge around it."""

    kind: Literal["link_down"] = "link_down"


class LinkUp(_LinkFault):
    """Bring a link back up."""

    kind: Literal["link_up"] = "link_up"


class Flap(_LinkFault):
    """Down for ``down_s``, up for ``up_s``, ``count`` times (each transition is an event)."""

    kind: Literal["flap"] = "flap"
    down_s: float = Field(1.0, gt=0, description="s")
    up_s: float = Field(1.0, gt=0, description="s")
    count: int = Field(3, gt=0)


class Loss(_LinkFault):
    """Random loss in both directions (0 removes it)."""

    kind: Literal["loss"] = "loss"
    percent: float = Field(ge=0, le=100, description="percent", examples=[5])


class Rate(_LinkFault):
    """A new rate for a shaped link."""

    kind: Literal["rate"] = "rate"
    mbit: float = Field(gt=0, description="Mbit/s", examples=[50])


class Queue(_LinkFault):
    """A new queue limit for a link."""

    kind: Literal["queue"] = "queue"
    packets: int = Field(gt=0, description="packets", examples=[20])


class CpuHog(_VmFault):
    """Start (or stop) a busy loop in a VM: a noisy neighbour for its physical host."""

    kind: Literal["cpu_hog"] = "cpu_hog"
    enable: bool = Field(True, description="start (true) or stop (false)")


class Pause(_VmFault):
    """Freeze a VM and silence its vNIC."""

    kind: Literal["pause"] = "pause"


class Resume(_VmFault):
    """Thaw a paused VM."""

    kind: Literal["resume"] = "resume"


class ClockStep(_VmFault):
    """Step a VM's clock."""

    kind: Literal["clock_step"] = "clock_step"
    step_ms: float = Field(description="ms, either sign", examples=[2])


class Migrate(_VmFault):
    """Live-migrate a VM to another physical host (CPU and clock follow it)."""

    kind: Literal["migrate"] = "migrate"
    to: str = Field(description="destination physical host", examples=["phys2"])


Fault = Annotated[LinkDown | LinkUp | Flap | Loss | Rate | Queue | CpuHog | Pause | Resume
                  | ClockStep | Migrate, Field(discriminator="kind")]
FAULT_TYPES: dict[str, type[_Fault]] = {
    t.model_fields["kind"].default: t for t in get_args(get_args(Fault)[0])}
FAULT_KINDS = tuple(FAULT_TYPES)


def kind_of(fault_type: type[_Fault]) -> str:
    """The ``kind`` of a fault class (``LinkDown`` -> "link_down")."""
    return fault_type.model_fields["kind"].default

LINK_KINDS = tuple(k for k, t in FAULT_TYPES.items() if issubclass(t, _LinkFault))
VM_KINDS = tuple(k for k, t in FAULT_TYPES.items() if issubclass(t, _VmFault))


class Event(BaseModel):
    """One entry of the truth timeline (``Lab.timeline``, results ``truth.faults[]``)."""

    t_s: float = Field(description="s after bring-up (true time)")
    true_ns: int = Field(description="ns, the machine's CLOCK_REALTIME")
    kind: str = Field(description="a fault kind, or a note: job_start, job_end, load, ...")
    target: str = Field("", description="a-b for a link, a VM, a job or a flow")
    params: dict[str, Any] = Field(default_factory=dict)
    source: Source = "lab"

    def describe(self) -> str:
        """The event in words, for logs (``describe``)."""
        return describe(self.kind, self.target, self.params)


UNITS = (("_ms", "ms"), ("_us", "us"), ("_s", "s"), ("mbit", "Mbit/s"), ("percent", "%"),
         ("_ppm", "ppm"))
"""Parameter-name suffix -> the unit its value is written with (``duration_s`` -> "s")."""
BOOL_WORDS = {"enable": ("on", "off"), "udp": ("UDP", "TCP")}
"""Booleans said as one word each way; any other is its name, or "not" and its name."""
NAME_WORDS = {"phys": "on", "src": "from", "dst": "to"}
"""Parameter names said as another word (``phys phys1`` reads "on phys1")."""
HIDDEN = ("at_ns", "true_ns")


def describe(kind: str, target: str, params: dict[str, Any]) -> str:
    """An event in words: ``load vm1->vm3: duration 8 s, TCP``.

    Parameters left out: None (not set) and the clock stamps (``HIDDEN``). Units come from the
    name's suffix (``UNITS``), some names are words (``NAME_WORDS``), booleans become words
    (``BOOL_WORDS``), list items are space-separated, numbers drop trailing zeros (``2.0`` ->
    ``2``).
    """
    parts = [_param(k, v) for k, v in params.items() if v is not None and k not in HIDDEN]
    head = f"{kind} {target}".strip()
    return f"{head}: {', '.join(parts)}" if parts else head


def _param(name: str, value: Any) -> str:
    if isinstance(value, bool):
        yes, no = BOOL_WORDS.get(name, (name, f"not {name}"))
        return yes if value else no
    if isinstance(value, list | tuple):
        value = " ".join(map(str, value))
    elif isinstance(value, float):
        value = f"{value:g}"
    for suffix, unit in UNITS:
        if name.endswith(suffix):
            word = name[: -len(suffix)].strip("_").replace("_", " ")
            return f"{word} {value} {unit}".strip()
    return f"{NAME_WORDS.get(name, name.replace('_', ' '))} {value}"
