"""The printed report of a results document (what ``nslab run`` and ``nslab report`` print):
the lab, the truth, the agents' estimates, the jobs, then each study's lines
(``contracts.studies``). Imports only the contracts.
"""
from __future__ import annotations

from collections.abc import Mapping

from contracts import comparisons
from contracts.events import describe
from contracts.results import Results, validate
from contracts.results.agents import Stats
from contracts.results.lab import fidelity_line
from contracts.studies import VIEWS


def report(results: Results | Mapping) -> str:
    """A human-readable summary of a results document (what ``nslab run`` prints).

    Raises:
        pydantic.ValidationError: a dict that is not a valid document.
    """
    doc = validate(results)
    lab, truth, sc = doc.lab, doc.truth, doc.scenario
    fid = lab.fidelity
    lines = [f"nslab run: {sc.name} (seed {sc.seed}, {sc.duration_s} s)",
             f"  lab {lab.name}: {lab.nodes} nodes, {len(lab.vms)} VMs, "
             f"{len(lab.links)} links; up in {lab.bringup_s} s, "
             f"down in {lab.teardown_s} s",
             "  physical hosts:"]
    by_host: dict[str, list[str]] = {}
    for vm, host in truth.placements.items():
        by_host.setdefault(host, []).append(vm)
    oscs = truth.clocks.oscillators
    for host, members in sorted(by_host.items()):
        osc = oscs.get(host)
        drift = f"{osc.base_ppm:+8.3f}" if osc else f"{'?':>8s}"
        lines.append(f"    {host:8s} drift {drift} ppm  VMs {' '.join(members)}")
    for nic in truth.host_nics:
        rate = f"{nic.bw_mbit:g} Mbit/s" if nic.bw_mbit else "unshaped"
        lines.append(f"    {nic.host:8s} NIC to {nic.leaf} {rate}: sent "
                     f"{nic.to_leaf.sent_bytes / 1e6:.1f} MB up, "
                     f"{nic.from_leaf.sent_bytes / 1e6:.1f} MB down, drops "
                     f"{nic.to_leaf.drops} up, {nic.from_leaf.drops} down")
    if truth.servers:
        lines.append(f"  servers: {len(truth.servers)}, clocks against {truth.servers[0].server}: "
                     + ", ".join(f"{c.server} {c.offset_us:+.1f} us (round trip "
                                 f"{c.rtt_us:.1f} us)" for c in truth.servers[1:])
                     + f"; scores across servers good to {truth.server_sync_us:g} us")
    lines.append("  timeline:")
    for ev in truth.faults:
        lines.append(f"    {ev.t_s:7.2f} s  {ev.kind:11s} {describe('', ev.target, ev.params)}")
    if fid.samples and fid.cpu_busy and fid.softirq:
        lines.append("  " + fidelity_line(fid))
    for f in doc.load or []:
        got = f"{f.mbit} Mbit/s" if f.mbit is not None else f"error: {f.error}"
        lines.append(f"  load {f.protocol} {f.src}->{f.dst} at {f.at_s} s for "
                     f"{f.duration_s} s: {got}")
    lines += _agents_report(doc)
    for j in doc.jobs or []:
        where = " ".join(j.placement.vms) if j.placement else ""
        shared = j.placement.shared_host_ranks if j.placement else None
        if j.error:
            lines.append(f"  job {j.name} ({j.collective}) on {where or '-'}: "
                         f"ERROR {j.error}")
            continue
        p50 = j.iteration_s.p50 if j.iteration_s else 0
        completion = f"{j.completion_s:.3f}" if j.completion_s is not None else "-"
        what = (f"{j.trace.file}, exposed communication p50 "
                f"{j.comm_s.p50 if j.comm_s else 0:.4f} s" if j.trace else f"{j.bytes} B")
        lines.append(f"  job {j.name} ({j.collective}, {what}) on {where} "
                     f"[{shared} ranks share a host]: completion {completion} s, "
                     f"iteration p50 {p50:.4f} s, verified {j.verified}")
    for view in VIEWS:
        lines += view.report_lines(doc)
    lines += comparisons.report_lines(doc)
    td = doc.teardown
    state = "clean" if td.clean else "LEFTOVERS " + ", ".join(td.leftovers)
    lines.append(f"  teardown: {state}")
    return "\n".join(lines)


def _clock_daemons(m) -> list[str]:
    """``sync.clock_daemons`` as lines: daemons as rows."""
    lines = [f"    clock daemons against {m.server} (converged: every later sample within "
             f"{m.converged_us} us)",
             f"      {'vm':6s} {'daemon':8s} {'p50 us':>9s} {'p99 us':>9s} "
             f"{'|freq| p99 ppm':>15s} {'converged s':>12s}"]
    for r in m.rows:
        conv = "never" if r.converged_s is None else f"{r.converged_s:.1f}"
        lines.append(f"      {r.vm:6s} {r.daemon:8s} {_num(r.offset_error_us.p50)} "
                     f"{_num(r.offset_error_us.p99)} {_num(r.drift_error_ppm.p99, 15, 3)} "
                     f"{conv:>12s}")
    return lines


def _num(x: float | None, width: int = 9, digits: int = 2) -> str:
    """``x`` right-aligned in ``width`` with ``digits`` decimals; "-" for None."""
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}s}"


def _fmt(stats: Stats, unit: str) -> str:
    if not stats.n:
        return "no data"
    return f"p50 {stats.p50} p99 {stats.p99} max {stats.max} {unit}"


def _vm_order(name: str) -> tuple:
    return len(name), name


def _agents_report(doc: Results) -> list[str]:
    lines = []
    cost = doc.agents
    if cost:
        cpu, bits = cost.agent_cpu_core, cost.probe_bit_s
        if cpu.p50 is not None:
            boot = cost.agent_startup_cpu_s.p50
            after = f" after start-up ({boot:.2f} s)" if boot is not None else ""
            lines.append(f"  agents: CPU per agent p50 {cpu.p50:.1%} max {cpu.max:.1%} of "
                         f"a core{after}, coordinator {cost.coordinator_cpu_core or 0:.1%}; "
                         f"probes p50 {(bits.p50 or 0) / 1e3:.1f} kbit/s per agent; RSS agent p50 "
                         f"{cost.agent_rss_mb.p50} MiB, coordinator "
                         f"{cost.coordinator_rss_mb} MiB")
        if cost.error:
            lines.append(f"  agents: {cost.error}")
    sync = doc.sync
    if sync:
        conv = f"{sync.converged_s} s" if sync.converged_s is not None else "not reached"
        lines += [f"  clock sync vs truth (reference {sync.reference}, "
                  f"{sync.windows} windows; within {sync.converged_us} us after {conv}):",
                  f"    nslab (Huygens)  offset |err| {_fmt(sync.offset_error_us, 'us')}",
                  f"                     drift  |err| {_fmt(sync.drift_error_ppm, 'ppm')}",
                  f"    NTP-style        offset |err| "
                  f"{_fmt(sync.baseline_ntp.offset_error_us, 'us')}",
                  f"                     drift  |err| "
                  f"{_fmt(sync.baseline_ntp.drift_error_ppm, 'ppm')}"]
        if sync.chrony:
            c = sync.chrony
            conv = f"{c.converged_s} s" if c.converged_s is not None else "not reached"
            lines += [f"    chrony (server {c.server}; within {c.converged_us} us after "
                      f"{conv})",
                      f"                     offset |err| {_fmt(c.offset_error_us, 'us')}",
                      f"                     drift  |err| {_fmt(c.drift_error_ppm, 'ppm')}"]
        if sync.clock_daemons:
            lines += _clock_daemons(sync.clock_daemons)
    owd = doc.owd_us
    if owd and owd.pairs:
        vms = sorted({v for k in owd.pairs for v in k.split("->")}, key=_vm_order)
        lines.append("  one-way delay p50, us (row -> column):")
        lines.append("    " + "".join(f"{v:>8s}" for v in ["", *vms]))
        for a in vms:
            cells = []
            for b in vms:
                p = owd.pairs.get(f"{a}->{b}")
                cells.append(f"{p.p50_us:8.1f}" if p and p.p50_us is not None
                             else f"{'-':>8s}")
            lines.append(f"    {a:>8s}" + "".join(cells))
    col = doc.collocation
    if col:
        found = ", ".join("{" + " ".join(g.members) + f"}} {g.confidence:.2f}"
                          for g in col.groups if len(g.members) > 1) or "none"
        truth = ", ".join("{" + " ".join(g) + "}" for g in col.truth_groups if len(g) > 1)
        lines += [f"  collocation: found {found}",
                  f"               truth {truth or 'none'}",
                  f"               precision {col.precision} recall {col.recall}, "
                  f"held since {col.detected_after_s} s"]
    return lines
