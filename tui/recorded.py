"""Replay a recorded run (no root) and record a live one.

A recording is one JSON document ``{"schema": "nslab.tui-recording/1", "scenario": ...,
"frames": [Snapshot.to_dict(), ...]}``, one frame per ``snapshot()`` of the live run.

``RecordedBackend`` plays the frames in order (``speed`` frames per ``snapshot()``, 1 at
first, while the timeline runs; holding the last one, or starting over with ``loop``), seeks
(``seek``), and keeps the controls honest: an injected fault (a ``contracts.events`` model)
is stamped into its event list and changes what later frames show (a link taken down stays
down, a paused VM stays paused, ...), and what the lab would refuse it refuses in the lab's
words (``lab.fault_rules``, on what the frame shows), so Pilot tests can drive every control
without a lab.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from contracts.events import (
    VM_KINDS,
    ClockStep,
    CpuHog,
    Fault,
    LinkDown,
    LinkUp,
    Loss,
    Migrate,
    Pause,
    Rate,
    Resume,
)
from lab.fault_rules import LabFacts, check
from tui.backend import SCHEMA, Backend, EventView, Snapshot, hidden

RECORDINGS = Path(__file__).parent / "recordings"
DEFAULT_RECORDING = RECORDINGS / "tui_demo.json"


def facts_of(snap: Snapshot) -> LabFacts:
    """What ``lab.fault_rules`` reads of a lab, from what ``snap`` shows: running unless it
    is starting, stopped or failed; a link is shaped when it has a rate."""
    return LabFacts(snap.lab, running=snap.state not in ("starting", "stopped", "error"),
                    nodes=frozenset(n.name for n in snap.nodes),
                    links={frozenset((lk.a, lk.b)): bool(lk.bw_mbit) for lk in snap.links},
                    vms={v.name: v.phys for v in snap.vms},
                    paused=frozenset(v.name for v in snap.vms if v.paused))


def load_recording(path: str | Path) -> tuple[str, list[Snapshot]]:
    """(scenario name, frames) of a recording file.

    Raises:
        ValueError: not a recording (wrong schema or no frame).
    """
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA or not doc.get("frames"):
        raise ValueError(f"{path}: not an {SCHEMA} document with frames")
    return doc.get("scenario", ""), [Snapshot.from_dict(f) for f in doc["frames"]]


class RecordedBackend:
    """A ``tui.backend.Replay`` over recorded frames (see the module doc); no lab results."""

    replays = True
    lab_results = False

    def __init__(self, path: str | Path = DEFAULT_RECORDING, start_at: int = 0,
                 advance: bool = True):
        """``start_at``: first frame played (negative: from the end); ``advance``: False holds
        that frame (snapshot tests)."""
        self.path = Path(path)
        self.start_at, self.advance = start_at, advance
        self.scenario, self.frames = load_recording(self.path)
        self.hide: frozenset[str] = frozenset()
        self.error: str | None = None
        self.index = 0
        self.pos = 0.0  # the replay position, frames (fractional at speeds below 1)
        self.speed = 1.0  # frames per snapshot
        self.loop = False
        self.jumped = False  # the position jumped (start, seek, loop) since ``past()``
        self.started = False
        self.stopped = False
        self.paused = False
        self.injected: list[EventView] = []
        self.stepped: list[EventView] = []
        self.stepped_from: list[EventView] = []  # the pending entries they played early
        self.down: dict[frozenset, bool] = {}
        self.loss: dict[frozenset, float] = {}
        self.rate: dict[frozenset, float] = {}
        self.vm_state: dict[str, dict] = {}
        self.calls: list[str] = []

    # -- Backend ---------------------------------------------------------------------------
    def start(self, scenario: str | None = None) -> None:
        self.calls.append("start")
        if scenario:
            self.scenario = scenario
        self.started, self.stopped = True, False
        n = len(self.frames)
        self.index = max(0, min(self.start_at if self.start_at >= 0 else n + self.start_at,
                                n - 1))
        self.pos = float(self.index)
        self.jumped = True

    def _frame(self) -> Snapshot:
        return self.frames[min(self.index, len(self.frames) - 1)]

    def snapshot(self) -> Snapshot:
        frame = self._shown()
        if self.started and self.advance and not self.paused and not self.stopped:
            self._move(self.speed)
        return hidden(frame, self.hide)

    def _shown(self) -> Snapshot:
        """The frame now as the controls changed it (a copy)."""
        frame = copy.deepcopy(self._frame())
        played = {(e.kind, e.target, e.t_s) for e in self.stepped_from}
        frame.pending = [p for p in frame.pending if (p.kind, p.target, p.t_s) not in played]
        frame.events = sorted(self._unplayed(frame.events) + self.stepped + self.injected,
                              key=lambda e: e.t_s)
        for lk in frame.links:
            key = frozenset((lk.a, lk.b))
            if key in self.down:
                lk.up = not self.down[key]
            if key in self.loss:
                lk.loss_percent = self.loss[key]
            if key in self.rate:
                lk.bw_mbit = self.rate[key]
        for vm in frame.vms:
            for k, v in self.vm_state.get(vm.name, {}).items():
                if k == "step_ms":
                    vm.offset_ms += v
                else:
                    setattr(vm, k, v)
        if self.stopped:
            frame.state = "stopped"
        elif self.paused:
            frame.state = "paused"
        return frame

    def _unplayed(self, events: list[EventView]) -> list[EventView]:
        """``events`` without the recorded timeline events of the steps played early: each
        stepped entry removes the first timeline event of its kind and target at or after its
        planned time (the recording stamped it there; the step stamped it now)."""
        out = list(events)
        for p in self.stepped_from:
            for e in out:
                if (e.source, e.kind, e.target) == ("timeline", p.kind, p.target) \
                        and e.t_s >= p.t_s - 0.5:
                    out.remove(e)
                    break
        return out

    # -- replay controls -------------------------------------------------------------------
    def _move(self, frames: float) -> None:
        last = len(self.frames) - 1
        pos = self.pos + frames
        if pos > last:
            self.jumped = self.loop and self.pos >= last
            pos = 0.0 if self.jumped else float(last)
        self.pos = max(0.0, pos)
        self.index = int(self.pos)

    def seek(self, frames: int) -> int:
        """Jump ``frames`` frames forward (negative: back), within the recording; the frame
        index now."""
        self.pos = max(0.0, min(float(len(self.frames) - 1), self.pos + frames))
        self.index = int(self.pos)
        self.jumped = True
        return self.index

    def past(self) -> list[Snapshot]:
        """The recorded frames before the one played next (the plots' history after a jump:
        faults injected in the replay are not in them)."""
        self.jumped = False
        return self.frames[: self.index]

    def set_speed(self, factor: float) -> float:
        """Multiply the replay speed by ``factor`` (between 1/8 and 8 frames per snapshot);
        the speed now."""
        self.speed = max(0.125, min(8.0, self.speed * factor))
        return self.speed

    def toggle_loop(self) -> bool:
        """Loop (start over after the last frame) on or off; True when on."""
        self.loop = not self.loop
        return self.loop

    def inject(self, fault: Fault) -> EventView:
        """Record the fault and let its effect show in later frames.

        Raises:
            LabError: where the lab would refuse it (``lab.fault_rules.check``, on what the
                frame shows now).
        """
        frame = self._shown()
        check(fault, facts_of(frame))
        if fault.kind in VM_KINDS:
            self._apply_vm(fault)
        else:
            self._apply_link(fault)
        ev = EventView(t_s=frame.time_s, kind=fault.kind, target=fault.target,
                       params=fault.params(), source="tui")
        self.injected.append(ev)
        self.calls.append(f"inject {fault.kind} {fault.target}")
        return ev

    def _apply_link(self, fault: Fault) -> None:
        key = frozenset(fault.link)
        if isinstance(fault, (LinkDown, LinkUp)):
            self.down[key] = isinstance(fault, LinkDown)
        elif isinstance(fault, Loss):
            self.loss[key] = fault.percent
        elif isinstance(fault, Rate):
            self.rate[key] = fault.mbit
        # Flap and Queue: stamped only (no frame field shows them)

    def _apply_vm(self, fault: Fault) -> None:
        st = self.vm_state.setdefault(fault.vm, {})
        if isinstance(fault, CpuHog):
            st["hog"] = fault.enable
        elif isinstance(fault, (Pause, Resume)):
            st["paused"] = isinstance(fault, Pause)
        elif isinstance(fault, ClockStep):
            st["step_ms"] = st.get("step_ms", 0.0) + fault.step_ms
        elif isinstance(fault, Migrate):
            st["phys"] = fault.to

    def pause(self) -> None:
        self.calls.append("pause")
        self.paused = True

    def resume(self) -> None:
        self.calls.append("resume")
        self.paused = False

    def step(self) -> EventView | None:
        self.calls.append("step")
        played = {(e.kind, e.target, e.t_s) for e in self.stepped_from}
        frame = self._frame()
        for p in frame.pending:
            if (p.kind, p.target, p.t_s) not in played:
                ev = EventView(t_s=frame.time_s, kind=p.kind, target=p.target,
                               params=dict(p.params), source="step")  # played now
                self.stepped_from.append(p)
                self.stepped.append(ev)
                return ev
        return None

    def stop(self) -> None:
        if not self.stopped:
            self.calls.append("stop")
        self.stopped = True


class Recorder:
    """Wraps a ``Backend`` and keeps every snapshot; ``save(path)`` writes the recording.
    ``RecordedBackend(path)`` replays it. It offers the core ``Backend`` only (no replay
    controls, no lab results)."""

    replays = False
    lab_results = False

    def __init__(self, inner: Backend, path: str | Path):
        self.inner, self.path = inner, Path(path)
        self.frames: list[dict] = []

    @property
    def scenario(self) -> str:
        return self.inner.scenario

    @property
    def hide(self) -> frozenset[str]:
        return self.inner.hide

    @hide.setter
    def hide(self, value: frozenset[str]) -> None:
        self.inner.hide = value

    @property
    def error(self) -> str | None:
        return self.inner.error

    def start(self, scenario: str | None = None) -> None:
        self.inner.start(scenario)

    def snapshot(self) -> Snapshot:
        snap = self.inner.snapshot()
        self.frames.append(snap.to_dict())
        return snap

    def inject(self, fault: Fault) -> EventView:
        return self.inner.inject(fault)

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()

    def step(self) -> EventView | None:
        return self.inner.step()

    def stop(self) -> None:
        try:
            self.inner.stop()
        finally:
            self.save()

    def save(self) -> None:
        if not self.frames:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"schema": SCHEMA, "scenario": self.inner.scenario, "frames": self.frames}
        self.path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
