"""Real chronyd in every VM beside the agents (``session.chrony``), scored against the truth
into ``sync.chrony``."""
from __future__ import annotations

from session.chrony import ChronyMesh
from session.studies.base import Study


class Chrony(Study):
    key = "chrony"
    turn = False

    def __init__(self, session):
        super().__init__(session)
        self.mesh: ChronyMesh | None = None

    @staticmethod
    def enabled(sc) -> bool:
        return sc.chrony.enabled

    def start(self) -> None:
        s = self.session
        s.progress(f"starting chronyd in {len(s.lab.vms)} VMs")
        self.mesh = ChronyMesh(s.lab, s.sc.chrony)
        self.mesh.start()
        s.lab.stamp("chrony_up", self.mesh.server)

    def stop(self) -> None:
        if self.mesh is not None:
            self.mesh.stop()

    def sections(self, out: dict) -> None:
        if self.mesh is not None and "sync" in out:
            out["sync"]["chrony"] = self.mesh.section()
