"""The clock-daemon matrix beside the agents (``session.clockd``): chrony, ntpsec and ptp4l
unmodified in VMs against one reference VM, scored against the truth into
``sync.clock_daemons``."""
from __future__ import annotations

from session.clockd import DaemonMatrix
from session.studies.base import Study


class ClockDaemons(Study):
    key = "clock_daemons"
    turn = False

    def __init__(self, session):
        super().__init__(session)
        self.matrix: DaemonMatrix | None = None

    @staticmethod
    def enabled(sc) -> bool:
        return sc.clock_daemons.enabled

    def start(self) -> None:
        s = self.session
        self.matrix = DaemonMatrix(s.lab, s.sc.clock_daemons)
        s.progress(f"starting clock daemons {self.matrix.clients}")
        self.matrix.start()
        s.lab.stamp("clock_daemons_up", self.matrix.server)

    def stop(self) -> None:
        if self.matrix is not None:
            self.matrix.stop()

    def sections(self, out: dict) -> None:
        if self.matrix is not None and "sync" in out:
            out["sync"]["clock_daemons"] = self.matrix.section()
