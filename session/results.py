"""The results document (schema ``nslab.results/1``) and its printed report.

Sections present now: ``scenario``, ``lab``, ``truth``, ``teardown``. ``sync``, ``owd_us``,
``collocation`` and ``jobs`` appear when a scenario runs agents and jobs; an absent section
means "not measured", never a placeholder.
"""
from __future__ import annotations

import datetime as dt
import json

from lab.capabilities import as_json
from lab.links import LINK_KEYS

SCHEMA = "nslab.results/1"


def lab_section(lab, caps: dict, fidelity: dict) -> dict:
    """``lab``: bring-up/teardown seconds, VMs, links, capabilities, fidelity."""
    topo = lab.topo
    vms = [{"name": vm, "ip": topo.nodeInfo(vm).get("ip", "").split("/")[0] or None,
            "leaf": topo.nodeInfo(vm).get("leaf"), "phys": lab.phys[vm]} for vm in topo.hosts()]
    links = [{"a": a, "b": b, **{k: info[k] for k in LINK_KEYS if k in info}}
             for a, b, info in topo.links(withInfo=True)]
    return {"name": lab.name, "bringup_s": round(lab.bringup_s or 0, 3),
            "teardown_s": round(lab.teardown_s or 0, 3), "nodes": len(topo.nodes()),
            "vms": vms, "links": links, "capabilities": as_json(caps), "fidelity": fidelity}


def truth_section(lab, placements_at_start: dict) -> dict:
    """``truth``: placements (at start and at the end), clocks, fault timeline."""
    return {"placements": placements_at_start, "placements_end": dict(lab.phys),
            "clocks": lab.clocks.truth(), "faults": lab.timeline}


def document(scenario, source: str, lab, caps: dict, fidelity: dict, placements: dict) -> dict:
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "scenario": {"name": scenario.name, "source": source, "seed": scenario.seed,
                     "duration_s": scenario.duration_s},
        "lab": lab_section(lab, caps, fidelity),
        "truth": truth_section(lab, placements),
        "teardown": {"clean": not lab.leftovers, "leftovers": lab.leftovers,
                     "seconds": round(lab.teardown_s or 0, 3)},
    }


def write(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def report(doc: dict) -> str:
    """A human-readable summary of a results document."""
    lab, truth = doc["lab"], doc["truth"]
    fid = lab["fidelity"]
    lines = [f"nslab run: {doc['scenario']['name']} (seed {doc['scenario']['seed']}, "
             f"{doc['scenario']['duration_s']} s)",
             f"  lab {lab['name']}: {lab['nodes']} nodes, {len(lab['vms'])} VMs, "
             f"{len(lab['links'])} links; up in {lab['bringup_s']} s, "
             f"down in {lab['teardown_s']} s",
             "  physical hosts:"]
    by_host: dict[str, list[str]] = {}
    for vm, host in truth["placements"].items():
        by_host.setdefault(host, []).append(vm)
    oscs = truth["clocks"]["oscillators"]
    for host, members in sorted(by_host.items()):
        drift = oscs.get(host, {}).get("base_ppm")
        lines.append(f"    {host:8s} drift {drift:+8.3f} ppm  VMs {' '.join(members)}")
    lines.append("  timeline:")
    for ev in truth["faults"]:
        params = " ".join(f"{k}={v}" for k, v in ev["params"].items() if k != "at_ns")
        lines.append(f"    {ev['t_s']:7.2f} s  {ev['kind']:11s} {ev['target']} {params}")
    if fid.get("samples"):
        lines.append(f"  fidelity: CPU busy p50 {fid['cpu_busy']['p50']:.0%} max "
                     f"{fid['cpu_busy']['max']:.0%}, softirq max {fid['softirq']['max']:.0%}"
                     f"{'  SATURATED: timing results not trustworthy' if fid['saturated'] else ''}")
    for f in doc.get("load", []):
        got = f"{f['mbit']} Mbit/s" if "mbit" in f else f"error: {f['error']}"
        lines.append(f"  load {f['protocol']} {f['src']}->{f['dst']} at {f['at_s']} s for "
                     f"{f['duration_s']} s: {got}")
    lines += _agents_report(doc)
    for j in doc.get("jobs", []):
        where = " ".join(j.get("placement", {}).get("vms", []))
        shared = j.get("placement", {}).get("shared_host_ranks")
        if j.get("error"):
            lines.append(f"  job {j['name']} ({j['collective']}) on {where or '-'}: "
                         f"ERROR {j['error']}")
            continue
        it = j["iteration_s"] or {}
        lines.append(f"  job {j['name']} ({j['collective']}, {j['bytes']} B) on {where} "
                     f"[{shared} ranks share a host]: completion {j['completion_s']:.3f} s, "
                     f"iteration p50 {it.get('p50', 0):.4f} s, verified {j['verified']}")
    cmp_ = doc.get("placement_comparison")
    if cmp_:
        lines.append(f"  collocation-aware placement: {cmp_['aware_s']:.3f} s vs naive "
                     f"{cmp_['naive_s']:.3f} s (ratio {cmp_['ratio']}); avoided shared hosts: "
                     f"{cmp_['aware_avoided_shared_hosts']}")
    td = doc["teardown"]
    state = "clean" if td["clean"] else "LEFTOVERS " + ", ".join(td["leftovers"])
    lines.append(f"  teardown: {state}")
    return "\n".join(lines)


def _fmt(stats: dict, unit: str) -> str:
    if not stats.get("n"):
        return "no data"
    return f"p50 {stats['p50']} p99 {stats['p99']} max {stats['max']} {unit}"


def _agents_report(doc: dict) -> list[str]:
    lines = []
    cost = doc.get("agents")
    if cost:
        cpu, bits = cost["agent_cpu_core"], cost["probe_bit_s"]
        if cpu["p50"] is not None:
            lines.append(f"  agents: CPU per agent p50 {cpu['p50']:.1%} max {cpu['max']:.1%} of "
                         f"a core, coordinator {cost['coordinator_cpu_core'] or 0:.1%}; probes "
                         f"p50 {(bits['p50'] or 0) / 1e3:.1f} kbit/s per agent; RSS agent p50 "
                         f"{cost['agent_rss_mb']['p50']} MiB, coordinator "
                         f"{cost['coordinator_rss_mb']} MiB")
        if cost.get("error"):
            lines.append(f"  agents: {cost['error']}")
    sync = doc.get("sync")
    if sync:
        conv = f"{sync['converged_s']} s" if sync["converged_s"] is not None else "not reached"
        lines += [f"  clock sync vs truth (reference {sync['reference']}, "
                  f"{sync['windows']} windows; within {sync['converged_us']} us after {conv}):",
                  f"    nslab (Huygens)  offset |err| {_fmt(sync['offset_error_us'], 'us')}",
                  f"                     drift  |err| {_fmt(sync['drift_error_ppm'], 'ppm')}",
                  f"    NTP-style        offset |err| "
                  f"{_fmt(sync['baseline_ntp']['offset_error_us'], 'us')}",
                  f"                     drift  |err| "
                  f"{_fmt(sync['baseline_ntp']['drift_error_ppm'], 'ppm')}"]
    owd = doc.get("owd_us")
    if owd and owd["pairs"]:
        vms = sorted({v for k in owd["pairs"] for v in k.split("->")},
                     key=lambda v: (len(v), v))
        lines.append("  one-way delay p50, us (row -> column):")
        lines.append("    " + "".join(f"{v:>8s}" for v in ["", *vms]))
        for a in vms:
            cells = []
            for b in vms:
                p = owd["pairs"].get(f"{a}->{b}")
                cells.append(f"{p['p50_us']:8.1f}" if p and p.get("p50_us") is not None
                             else f"{'-':>8s}")
            lines.append(f"    {a:>8s}" + "".join(cells))
    col = doc.get("collocation")
    if col:
        found = ", ".join("{" + " ".join(g["members"]) + f"}} {g['confidence']:.2f}"
                          for g in col["groups"] if len(g["members"]) > 1) or "none"
        truth = ", ".join("{" + " ".join(g) + "}" for g in col["truth_groups"] if len(g) > 1)
        lines += [f"  collocation: found {found}",
                  f"               truth {truth or 'none'}",
                  f"               precision {col['precision']} recall {col['recall']}, "
                  f"held since {col['detected_after_s']} s"]
    return lines
