"""The hypervisor side of VM clocks: draws each physical host's oscillator and each VM's offset
deterministically from (lab seed, name), and publishes one ``nslab.clock/3`` file per VM (the
formula and the file are ``agents.clock``). The files are the truth: a VM's own corrections
(``adjtimex`` and ``settimeofday`` through ``vmclock``) are segments in them too.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agents.clock import ClockSpec, Oscillator, Segment, update


class ClockConfig(BaseModel):
    """How clocks are drawn (also the scenario's ``clocks:`` section)."""

    model_config = ConfigDict(extra="forbid")

    drift_ppm: float = Field(50.0, ge=0, description="a host's base drift is uniform in "
                                                     "+-drift_ppm, ppm")
    offset_ms: float = Field(10.0, ge=0, description="a VM's initial offset is uniform in "
                                                     "+-offset_ms, ms")
    wander_ppm: float = Field(0.2, ge=0, description="bound of the oscillator wander (sum of "
                                                     "3 cosines' amplitudes, periods 20-200 s), "
                                                     "ppm")
    host_drift_ppm: dict[str, float] = Field(default_factory=dict, description="explicit base "
                                             "drift of named hosts (overrides the draw), ppm")
    vm_offset_ms: dict[str, float] = Field(default_factory=dict, description="explicit initial "
                                           "offset of named VMs (overrides the draw), ms")


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def oscillator(cfg: ClockConfig, seed: int, host: str, epoch_ns: int) -> Oscillator:
    """Host ``host``'s oscillator: the same for every call with the same (seed, host)."""
    rng = _rng(seed, "osc:" + host)
    base = float(rng.uniform(-cfg.drift_ppm, cfg.drift_ppm))
    base = float(cfg.host_drift_ppm.get(host, base))
    weights = rng.dirichlet(np.ones(3))
    wander = tuple((float(cfg.wander_ppm * w), float(rng.uniform(20, 200)),
                    float(rng.uniform(0, 2 * np.pi))) for w in weights)
    return Oscillator(epoch_ns=epoch_ns, base_ppm=base, wander=wander)


def initial_offset_ns(cfg: ClockConfig, seed: int, vm: str) -> float:
    """VM ``vm``'s offset theta_v at lab start, ns."""
    drawn = float(_rng(seed, "offset:" + vm).uniform(-cfg.offset_ms, cfg.offset_ms))
    return float(cfg.vm_offset_ms.get(vm, drawn)) * 1e6


class ClockBook:
    """All VM clocks of a lab: create, publish, step, migrate; the truth for scoring."""

    def __init__(self, cfg: ClockConfig, seed: int, directory: str, epoch_ns: int):
        self.cfg, self.seed, self.dir, self.epoch_ns = cfg, seed, directory, epoch_ns
        self._specs: dict[str, ClockSpec] = {}
        self._osc: dict[str, Oscillator] = {}
        os.makedirs(directory, exist_ok=True)

    def host_oscillator(self, host: str) -> Oscillator:
        if host not in self._osc:
            self._osc[host] = oscillator(self.cfg, self.seed, host, self.epoch_ns)
        return self._osc[host]

    def path(self, vm: str) -> str:
        """The file passed to the VM's processes in ``NSLAB_CLOCK``."""
        return os.path.join(self.dir, f"{vm}.clock")

    @property
    def specs(self) -> dict[str, ClockSpec]:
        """Every VM's clock as published now (with the VM's own corrections); after teardown
        (the files are gone) as last read."""
        for vm in self._specs:
            try:
                self._specs[vm] = ClockSpec.read(self.path(vm))
            except FileNotFoundError:
                pass
        return dict(self._specs)

    def add_vm(self, vm: str, host: str) -> str:
        """Create and publish ``vm``'s clock on ``host``; returns its file path."""
        seg = Segment(self.epoch_ns, initial_offset_ns(self.cfg, self.seed, vm), host,
                      self.host_oscillator(host))
        self._specs[vm] = ClockSpec(vm=vm, segments=[seg])
        self._specs[vm].write(self.path(vm))
        return self.path(vm)

    def step(self, vm: str, at_ns: int, step_ns: float) -> None:
        """Step ``vm``'s clock by ``step_ns`` at true time ``at_ns``."""
        self._specs[vm] = update(self.path(vm), lambda spec: spec.append(at_ns, step_ns=step_ns))

    def migrate(self, vm: str, at_ns: int, host: str) -> None:
        """From ``at_ns`` on, ``vm`` follows ``host``'s oscillator (continuous time)."""
        osc = self.host_oscillator(host)
        self._specs[vm] = update(self.path(vm),
                                 lambda spec: spec.append(at_ns, host=host, oscillator=osc))

    def truth(self) -> dict:
        """Oscillator parameters and every VM's segments, for the results' ``truth``."""
        return {
            "oscillators": {h: {"base_ppm": o.base_ppm,
                                "wander": [{"amplitude_ppm": a, "period_s": p, "phase_rad": ph}
                                           for a, p, ph in o.wander]}
                            for h, o in sorted(self._osc.items())},
            "vms": {vm: [{"start_ns": s.start_ns, "offset_ns": s.offset_ns, "host": s.host,
                          "kind": s.kind, "corr_ppm": s.corr_ppm}
                         for s in spec.segments] for vm, spec in sorted(self.specs.items())},
        }
