"""The results document of a finished run, built from its stopped ``Lab`` and the sections
the Session and its studies measured (``contracts.results`` defines it)."""
from __future__ import annotations

import datetime as dt

from contracts.results import OPTIONAL_SECTIONS, SCHEMA, Results, dump
from contracts.results.lab import LabSection
from contracts.results.truth import TruthSection
from lab.capabilities import as_json
from lab.links import LINK_KEYS


def lab_section(lab, caps: dict, fidelity: dict) -> LabSection:
    """``lab``: bring-up/teardown seconds, VMs, links, capabilities, fidelity."""
    topo = lab.topo
    vms = [{"name": vm, "ip": topo.nodeInfo(vm).get("ip", "").split("/")[0] or None,
            "leaf": topo.nodeInfo(vm).get("leaf"), "phys": lab.phys[vm]} for vm in topo.hosts()]
    links = [{"a": a, "b": b, **{k: info[k] for k in LINK_KEYS if k in info}}
             for a, b, info in topo.links(withInfo=True)]
    return LabSection(name=lab.name, bringup_s=round(lab.bringup_s or 0, 3),
                      teardown_s=round(lab.teardown_s or 0, 3), nodes=len(topo.nodes()),
                      fabric=lab.fabric, vms=vms, links=links, capabilities=as_json(caps),
                      fidelity=fidelity)


def truth_section(lab, placements_at_start: dict) -> TruthSection:
    """``truth``: placements (at start and at the end), host NICs, clocks, fault timeline,
    and for a lab split across servers the servers' clocks and their bound."""
    return TruthSection(placements=placements_at_start, placements_end=dict(lab.phys),
                        host_nics=lab.host_layer.read(), clocks=lab.clocks.truth(),
                        faults=list(lab.timeline), servers=lab.server_clocks,
                        server_sync_us=round(lab.server_sync_us, 3))


def build(scenario, source: str, lab, caps: dict, fidelity: dict, placements: dict,
          **sections) -> Results:
    """The typed document of a finished run.

    Args:
        scenario: the ``Scenario`` (name, seed, duration_s).
        source: the scenario file.
        lab: the stopped ``Lab`` (topo, phys, clocks, timeline, bring-up/teardown times).
        caps: ``lab.capabilities.probe()``.
        fidelity: ``FidelitySampler.summary()``.
        placements: VM -> physical host at the start.
        sections: optional sections by name (``OPTIONAL_SECTIONS``); None means absent.

    Raises:
        pydantic.ValidationError: a section that does not fit the model (field path named).
        TypeError: an unknown section name.
    """
    unknown = set(sections) - set(OPTIONAL_SECTIONS)
    if unknown:
        raise TypeError(f"unknown results sections: {', '.join(sorted(unknown))}")
    return Results.model_validate({
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "scenario": {"name": scenario.name, "source": source, "seed": scenario.seed,
                     "duration_s": scenario.duration_s},
        "lab": lab_section(lab, caps, fidelity),
        "truth": truth_section(lab, placements),
        "teardown": {"clean": not lab.leftovers, "leftovers": lab.leftovers,
                     "seconds": round(lab.teardown_s or 0, 3)},
        **sections,
    })


def document(scenario, source: str, lab, caps: dict, fidelity: dict, placements: dict,
             **sections) -> dict:
    """``build(...)`` as the JSON-ready dict (``dump``): validated by ``Results``; callers
    may still add optional sections to it, ``report`` and ``write`` validate again."""
    return dump(build(scenario, source, lab, caps, fidelity, placements, **sections))
