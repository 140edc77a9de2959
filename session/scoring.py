"""Score what the agents estimated against the truth the lab injected (pure functions).

The coordinator reports, per window, each VM's offset and drift relative to a reference VM at
an instant ``t_ns`` read on the reference VM's clock (``agents/API.md``). The truth at that
instant comes from the published clock segments (``agents.clock.ClockSpec``):

    offset_truth = t_vm(t) - t_ref(t)                       (ns)
    drift_truth  = (y_vm(t) - y_ref(t)) / (1 + y_ref(t))    (ppm, slope against the ref clock)

where t is the true time at which the reference clock read ``t_ns``.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from agents.clock import ClockSpec
from agents.collocation import precision_recall
from agents.owd import natural_key
from lab.series import downsample
from session import stats

SYNC_SERIES_POINTS = 150
"""At most this many windows in ``sync.series`` (every k-th window when more)."""


def true_time(ref: ClockSpec, ref_ns: int) -> int:
    """True time (ns) at which the reference clock reads ``ref_ns`` (fixed-point, < 1 ns)."""
    t = ref_ns
    for _ in range(3):
        t = ref_ns - round(ref.offset_at(t))
    return t


def truth_at(clocks: dict[str, ClockSpec], reference: str, ref_ns: int) -> dict[str, tuple]:
    """``{vm: (offset_ns, drift_ppm)}`` relative to ``reference`` at reference time ``ref_ns``."""
    ref = clocks[reference]
    t = true_time(ref, ref_ns)
    y_ref = ref.frequency_ppm(t) * 1e-6
    out = {}
    for vm, spec in clocks.items():
        y = spec.frequency_ppm(t) * 1e-6
        out[vm] = (spec.offset_at(t) - ref.offset_at(t), (y - y_ref) / (1 + y_ref) * 1e6)
    return out


def _stats(errors: list[float], digits: int) -> dict:
    if not errors:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    a = np.abs(np.asarray(errors, dtype=float))
    return {"p50": round(float(np.percentile(a, 50)), digits),
            "p99": round(float(np.percentile(a, 99)), digits),
            "max": round(float(a.max()), digits), "n": int(a.size)}


def window_errors(history: list, clocks: dict[str, ClockSpec], reference: str
                  ) -> tuple[list[tuple[int, dict[str, list[float]]]], dict]:
    """Per coordinator window (``history`` entries): its centre in true time (ns) and the
    errors, estimate - truth, of every VM's offset (us) and drift (ppm), nslab's (``off``,
    ``drift``) and the NTP-style baseline's (``ntp_off``, ``ntp_drift``); and by VM the
    offset errors by window index (``off``, ``ntp_off``)."""
    per_window, by_vm = [], {"off": {}, "ntp_off": {}}
    for entry in history:
        truth = truth_at(clocks, reference, entry.t_ns)
        t_true = true_time(clocks[reference], entry.t_ns)
        errs: dict[str, list[float]] = {"off": [], "drift": [], "ntp_off": [], "ntp_drift": []}
        for vm, est in entry.vms.items():
            if vm == reference or vm not in truth or est.offset_ns is None:
                continue
            off, drift = truth[vm]
            errs["off"].append((est.offset_ns - off) / 1e3)
            errs["drift"].append(est.drift_ppm - drift)
            by_vm["off"].setdefault(vm, {})[len(per_window)] = errs["off"][-1]
            if est.ntp_offset_ns is not None:
                errs["ntp_off"].append((est.ntp_offset_ns - off) / 1e3)
                errs["ntp_drift"].append(est.ntp_drift_ppm - drift)
                by_vm["ntp_off"].setdefault(vm, {})[len(per_window)] = errs["ntp_off"][-1]
        per_window.append((t_true, errs))
    return per_window, by_vm


def span_p99(per_window: list, spans: int) -> tuple[dict[str, list[float | None]],
                                                   list[tuple[int, int]]]:
    """The windows cut into ``spans`` consecutive runs of (nearly) equal length: per run the
    p99 of |offset error| of nslab (``nslab``) and of the NTP-style baseline (``ntp``), us
    (None for a run without errors), and each run's first and last window centre (true ns):
    the samples of the sync comparison (``--repeat N``: N runs)."""
    out: dict[str, list[float | None]] = {"nslab": [], "ntp": []}
    bounds = []
    for part in np.array_split(np.arange(len(per_window)), spans):
        if not part.size:
            continue
        wins = [per_window[i] for i in part]
        bounds.append((wins[0][0], wins[-1][0]))
        for arm, key in (("nslab", "off"), ("ntp", "ntp_off")):
            errs = np.abs([e for _, w in wins for e in w[key]])
            out[arm].append(round(float(np.percentile(errs, 99)), 3) if errs.size else None)
    return out, bounds


def sync_section(history: list[dict], clocks: dict[str, ClockSpec], reference: str,
                 start_true_ns: int, converged_us: float = 10.0,
                 skip_windows: int = 1, window_s: float = 2.0,
                 provisional_windows: int = 0, t0_ns: int | None = None) -> dict:
    """The results' ``sync`` section.

    Args:
        history: the coordinator state's ``history`` entries (``t_ns``, ``vms`` with
            ``offset_ns``, ``drift_ppm``, ``ntp_offset_ns``, ``ntp_drift_ppm``;
            ``contracts.messages``).
        clocks: every VM's clock segments (truth).
        reference: the coordinator's reference VM.
        start_true_ns: when the agents started (true time), for ``converged_s``.
        converged_us: the error bound that defines convergence.
        skip_windows: first windows left out of the error statistics (start-up).
        window_s: window length, s: a window's estimate exists from its end, half a window
            after its centre ``t_ns``.
        provisional_windows: last windows whose drift the coordinator will still revise
            (``drift_windows // 2``, API.md): left out of the drift statistics.
        t0_ns: the lab's bring-up (true time, ns): with it, ``series`` too.

    Returns:
        ``offset_error_us``, ``drift_error_ppm`` (p50/p99/max/n of |error|; drift over the
        windows that are no longer provisional) for nslab's
        estimate and under ``baseline_ntp`` for the NTP-style one on the same probes;
        ``converged_s``: seconds from ``start_true_ns`` to the end of the first window from
        which every later window has all |offset errors| <= ``converged_us`` (None if
        never); with ``t0_ns``, ``series``: per window (at most ``SYNC_SERIES_POINTS``, the
        last of each run of windows) its centre ``t_s`` (true time, s after bring-up) and
        by VM the signed offset errors, estimate - truth (us), of nslab
        (``offset_error_us``) and of the baseline (``baseline_ntp_offset_error_us``).
    """
    per_window, by_vm = window_errors(history, clocks, reference)
    scored = per_window[skip_windows:]
    final = scored[:len(scored) - provisional_windows]
    pool = {k: [e for _, w in (final if "drift" in k else scored) for e in w[k]]
            for k in ("off", "drift", "ntp_off", "ntp_drift")}
    converged = None
    for i, (t_true, _) in enumerate(per_window):
        if all(w["off"] and max(abs(e) for e in w["off"]) <= converged_us
               for _, w in per_window[i:]):
            converged = round((t_true - start_true_ns) / 1e9 + window_s / 2, 2)
            break
    out = {"reference": reference, "windows": len(per_window),
           "offset_error_us": _stats(pool["off"], 3),
           "drift_error_ppm": _stats(pool["drift"], 4),
           "baseline_ntp": {"offset_error_us": _stats(pool["ntp_off"], 3),
                            "drift_error_ppm": _stats(pool["ntp_drift"], 4)},
           "converged_us": converged_us, "converged_s": converged}
    if t0_ns is not None:
        n, pts = len(per_window), SYNC_SERIES_POINTS

        def per_vm(errs: dict[str, dict[int, float]]) -> dict[str, list]:
            return {vm: downsample([e.get(i) for i in range(n)], pts, how="last", digits=3)
                    for vm, e in sorted(errs.items(), key=lambda kv: natural_key(kv[0]))}
        out["series"] = {"t_s": downsample([(t - t0_ns) / 1e9 for t, _ in per_window], pts,
                                           how="last", digits=2),
                         "offset_error_us": per_vm(by_vm["off"]),
                         "baseline_ntp_offset_error_us": per_vm(by_vm["ntp_off"])}
    return out


def truth_groups(phys: dict[str, str]) -> list[list[str]]:
    """VMs grouped by physical host (every host, singletons included), sorted."""
    groups: dict[str, list[str]] = {}
    for vm, host in sorted(phys.items()):
        groups.setdefault(host, []).append(vm)
    return sorted(sorted(g) for g in groups.values())


def collocation_section(groups: list, phys: dict[str, str],
                        detected_after_s: float | None) -> dict:
    """The results' ``collocation`` section: the agents' groups (``members``,
    ``confidence``) against the truth."""
    found = sorted(sorted(g.members) for g in groups)
    truth = truth_groups(phys)
    precision, recall = precision_recall(found, truth)
    return {"groups": [{"members": sorted(g.members),
                        "confidence": round(float(g.confidence or 0.0), 3)}
                       for g in sorted(groups, key=lambda g: sorted(g.members))],
            "truth_groups": truth, "precision": round(precision, 3),
            "recall": round(recall, 3), "detected_after_s": detected_after_s}


def sync_comparison(history: list, clocks: dict[str, ClockSpec], reference: str,
                    spans: int, saturated: Callable[[int, int], bool | None],
                    skip_windows: int = 1) -> dict:
    """The ``comparisons`` entry of the agents' sync against the NTP-style baseline on the same
    probes: p99 |offset error| over ``spans`` consecutive runs of windows (``span_p99``; the
    first ``skip_windows`` left out, as in ``sync_section``), each run flagged by
    ``saturated(first_ns, last_ns)``."""
    per_window, _ = window_errors(history, clocks, reference)
    samples, bounds = span_p99(per_window[skip_windows:], spans)
    flags = [bool(saturated(a, b)) for a, b in bounds]
    return stats.comparison("sync", "nslab", "ntp", "offset_p99_us",
                            {"nslab": samples["nslab"], "ntp": samples["ntp"]},
                            {"nslab": flags, "ntp": flags})


def agent_sections(lab, mesh, watcher, cost: dict, repeat: int = 1,
                   saturated: Callable[[int, int], bool | None] = lambda a, b: None) -> dict:
    """``agents`` (their ``cost``), and ``sync``, ``owd_us`` and ``collocation`` scored
    against the truth, from the coordinator's latest state; ``comparisons``: the sync
    comparison over ``repeat`` spans of the run (``sync_comparison``)."""
    state = watcher.latest
    if state is None:
        return {"agents": {**cost, "error": "the coordinator never answered"}}
    return {
        "comparisons": [sync_comparison(state.history, lab.clocks.specs, state.reference,
                                        repeat, saturated)],
        "agents": cost,
        "sync": sync_section(state.history, lab.clocks.specs, state.reference,
                             mesh.started_ns, window_s=state.window_s,
                             provisional_windows=state.drift_windows // 2,
                             t0_ns=lab.t0_ns),
        "owd_us": {"pairs": {k: v.model_dump() for k, v in state.owd_us.items()},
                   "asymmetry_us": dict(state.asymmetry_us)},
        "collocation": collocation_section(state.collocation.groups, lab.phys,
                                           watcher.detected_after_s),
    }


def placement_comparison(entries: list[dict]) -> dict | None:
    """Naive vs collocation-aware completion of the same collective, when both ran."""
    by = {e.get("placement", {}).get("policy"): e for e in entries if e.get("completion_s")}
    naive, aware = by.get("naive"), by.get("collocation_aware")
    if not naive or not aware:
        return None
    return {"naive_s": naive["completion_s"], "aware_s": aware["completion_s"],
            "ratio": round(aware["completion_s"] / naive["completion_s"], 3),
            "aware_avoided_shared_hosts": aware["placement"]["shared_host_ranks"] == 0,
            "naive_shared_host_ranks": naive["placement"]["shared_host_ranks"]}
