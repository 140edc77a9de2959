"""The VMs: physical host, leaf, CPU, injected clock against the agents' estimate."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from agents.owd import natural_key
from tui.backend import Snapshot, VMView
from tui.widgets.legend import HOG, PAUSED

COLUMNS = ("VM", "phys", "leaf", "CPU%", "offset ms", "ppm", "est ms", "err us", "est ppm",
           "err ppm", "state")


def num(v: float | None, fmt: str) -> str:
    """``v`` formatted with ``fmt``, "-" for None."""
    return "-" if v is None else format(v, fmt)


class VMTable(DataTable):
    """One row per VM in natural order (vm2 before vm10); the cursor row is the selected VM
    for VM faults (Enter opens its detail). The estimates are relative to the reference VM,
    whose row reads "ref"."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for c in COLUMNS:
            self.add_column(c, key=c)

    @property
    def selected_vm(self) -> str | None:
        if self.row_count == 0:
            return None
        return str(self.get_row_at(self.cursor_row)[0])

    def select_vm(self, name: str) -> bool:
        for i in range(self.row_count):
            if str(self.get_row_at(i)[0]) == name:
                self.move_cursor(row=i)
                return True
        return False

    def update_snapshot(self, snap: Snapshot) -> None:
        keep = self.cursor_row
        self.clear()
        for v in sorted(snap.vms, key=lambda v: natural_key(v.name)):
            self.add_row(*self._row(v, v.name == snap.reference), key=v.name)
        if self.row_count:
            self.move_cursor(row=min(keep, self.row_count - 1))

    @staticmethod
    def _row(v: VMView, reference: bool = False) -> list:
        """The row of ``v``; the reference VM of the estimates reads "ref" as its estimate."""
        state = Text("paused", PAUSED) if v.paused else (
            Text("hog", HOG) if v.hog else Text("ok", "green"))
        err = num(v.err_offset_us, ".1f")
        err_t = Text(err, "red" if v.err_offset_us is not None and abs(v.err_offset_us) > 100
                     else "green" if v.err_offset_us is not None else "")
        cpu = Text(f"{v.cpu_pct:.0f}", "red" if v.cpu_pct > 40 else "")
        return [v.name, v.phys, v.leaf, cpu, num(v.offset_ms, "+.3f"), num(v.drift_ppm, "+.2f"),
                Text("ref", "bold") if reference else num(v.est_offset_ms, "+.3f"), err_t,
                num(v.est_drift_ppm, "+.2f"),
                num(v.err_drift_ppm, "+.3f"), state]
