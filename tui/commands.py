"""Command palette (ctrl+p): every action of the keys, plus values the keys do not offer
(loss and rate levels, clock steps, migration targets, link and VM choice, scenarios)."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from contracts.events import ClockStep, Loss, Migrate, Queue, Rate


class NslabCommands(Provider):
    """Commands built from the app's current snapshot."""

    def _commands(self) -> list[tuple[str, object, str]]:
        app = self.app
        link = app.selected_link_name or "-"
        vm = app.selected_vm or "-"
        cmds: list[tuple[str, object, str]] = [
            (f"Link down ({link})", app.action_link_down, "take the selected link down"),
            (f"Link up ({link})", app.action_link_up, "bring the selected link up"),
            (f"Flap link ({link})", app.action_flap, "3 x 1 s down / 1 s up"),
            (f"CPU hog on/off ({vm})", app.action_hog, "noisy neighbour"),
            (f"Pause/resume VM ({vm})", app.action_pause_vm, "freezer"),
            (f"Migrate to next host ({vm})", app.action_migrate, "live migration"),
            ("Pause/resume timeline", app.action_toggle_timeline, "space"),
            ("Step: play next timeline event", app.action_step, "n"),
            ("Stop: tear the lab down", app.action_stop_lab, "x"),
            ("Pick scenario", app.action_pick_scenario, "o"),
            ("Help", app.action_help, "?"),
        ]
        for pct in (0, 1, 5, 20, 50):
            cmds.append((f"Loss {pct}% ({link})",
                         partial(app.inject_link, Loss, percent=float(pct)), "random loss"))
        for mbit in (10, 25, 50, 100):
            cmds.append((f"Rate {mbit} Mbit/s ({link})",
                         partial(app.inject_link, Rate, mbit=float(mbit)), "HTB rate"))
        for packets in (10, 50, 100):
            cmds.append((f"Queue {packets} packets ({link})",
                         partial(app.inject_link, Queue, packets=packets), "queue limit"))
        for ms in (-5, -1, 1, 2, 5):
            cmds.append((f"Clock step {ms:+d} ms ({vm})",
                         partial(app.inject_vm, ClockStep, step_ms=float(ms)), "clock"))
        snap = app.snap
        if snap is not None:
            for host in snap.hosts:
                cmds.append((f"Migrate {vm} to {host}",
                             partial(app.inject_vm, Migrate, to=host), "live migration"))
            for lk in snap.links:
                cmds.append((f"Select link {lk.key}", partial(app.select_link, lk.a, lk.b),
                             "target of link faults"))
            for v in snap.vms:
                cmds.append((f"Select VM {v.name}", partial(app.select_vm, v.name),
                             "target of VM faults"))
        for label, value in app.scenario_choices():
            cmds.append((f"Start scenario {label}", partial(app.restart, value),
                         "restarts the lab"))
        for name, title in app.exercise_choices():
            cmds.append((f"Exercise {name}: {title}", partial(app.start_exercise, name),
                         "its lab with a hidden truth (restarts the lab)"))
        cmds.append(("Exercise: task and answer", app.action_exercise,
                     "the running exercise's task; type the answer, ctrl+s checks it"))
        return cmds

    async def discover(self) -> Hits:
        for name, cb, help_ in self._commands()[:11]:
            yield DiscoveryHit(name, cb, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, cb, help_ in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), cb, help=help_)
