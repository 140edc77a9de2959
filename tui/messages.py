"""The messages the app's workers post back to the UI thread (``tui.app``)."""
from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from tui.backend import EventView, Snapshot


@dataclass
class SnapshotReady(Message):
    """A worker fetched a snapshot; ``past``: the frames before it when a replay jumped (its
    start, a seek, a loop), to rebuild the plots' history from."""

    snapshot: Snapshot
    past: list[Snapshot] | None = None


@dataclass
class ControlDone(Message):
    """A control finished: ``label``, the event it stamped (if any), or the ``error``."""

    label: str
    event: EventView | None = None
    error: str | None = None


@dataclass
class LabStopped(Message):
    """The backend tore the lab down; ``then_exit``: the app quits next."""

    then_exit: bool = False
