"""The interface every study implements: it reads its section of the scenario, runs on a
``Session`` and gives its results sections (their models and report lines are its view in
``contracts.studies``).

A Session makes one instance of each enabled study and calls, in this order:
``check(capabilities)`` before bring-up, ``start()`` once the agents run, ``run()`` in the
jobs' turn (studies in registry order, after the timeline), ``stop()`` before teardown, and
``sections(out)`` when the results are made. ``live`` is what the study has finished so far
and ``comparisons()`` its compared pairs so far, for the TUI.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from session.scenario import Scenario
    from session.session import Session


class Study:
    """A study (subclass it and register it in ``session.studies.STUDIES``).

    Class attributes:
        key: the study's name (``Session.live(key)``).
        turn: it runs in the jobs' turn (``run``); False for a study of daemons that run
            beside the agents for the whole timeline.
    """

    key: ClassVar[str]
    turn: ClassVar[bool] = True

    def __init__(self, session: Session):
        self.session = session
        self.live: Any = []

    @staticmethod
    def enabled(sc: Scenario) -> bool:
        """Whether the scenario asks for this study."""
        raise NotImplementedError

    def check(self, capabilities: dict) -> None:
        """Refuse, before anything is built, what this machine cannot run (``LabError``)."""

    def start(self) -> None:
        """Start what runs beside the agents (on the lab thread, after bring-up)."""

    def run(self) -> None:
        """Run in the jobs' turn (on the timeline's thread; ``session.halted`` says stop)."""

    def stop(self) -> None:
        """Stop what ``start`` started (on the lab thread, before teardown)."""

    def comparisons(self) -> list[dict]:
        """Its compared pairs so far (``contracts.comparisons.Comparison`` as JSON, made by
        ``session.stats.comparison``): the results' and the TUI's."""
        return []

    def sections(self, out: dict) -> None:
        """Add this study's results sections to ``out`` (key -> JSON-ready value), its
        ``comparisons`` included."""
