"""A trace job's results per operation, layer and pass, from its ranks' reports.

``summarize(docs, config)`` returns the ``trace`` entry of a job (``nslab.job/1`` and the
results' ``jobs[].trace``; model ``session.trace_results.TraceResult``). Times of an op are
relative to its pass's start on the rank's own VM clock (the ranks' clocks are not compared):

    file, format, parallelism, model_parallel_group, layers (count), clock_ghz,
    compute_scale, bytes_scale, compute_s_per_pass (rank 0's scaled compute of one pass, s);
    passes: per timed pass, over the ranks: iteration_s (the slowest rank's), compute_s,
        exposed_comm_s (the largest: communication not hidden behind compute, s);
    ops: per op of one pass, in id order: name, kind, layer, phase, collective, bytes
        (nccl-tests size), group_size, peer, start_s and end_s (medians over the timed
        passes of the earliest start and the latest end over the ranks), duration_s (median
        over passes of the slowest rank's duration), algbw_bit_s and busbw_bit_s
        (collectives: bytes / duration_s, and times nccl-tests' bus factor of the group);
    by_layer: per layer in first-seen order: layer, compute_s (its compute ops' durations),
        comm_s (its communication ops' durations), bytes (its communication's sizes);
    timeline: the last timed pass per rank: rank, then [op index in ``ops``, start_s, end_s]
        for every op.

Source of the bandwidths: nccl-tests, doc/PERFORMANCE.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workloads import collectives as coll


def _median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def summarize(docs: Sequence[dict], trace: str, clock_ghz: float, compute_scale: float,
              bytes_scale: float) -> dict:
    """The ``trace`` entry of a job whose every rank reported (see the module docstring).

    Raises:
        ValueError: a rank without its ``trace`` report or reports of different passes.
    """
    reports = [d.get("trace") for d in docs]
    if not docs or any(r is None or not r["times"] for r in reports):
        raise ValueError("a rank has no trace report")
    ops = reports[0]["ops"]
    passes = len(reports[0]["times"])
    if any(len(r["times"]) != passes or len(r["ops"]) != len(ops) for r in reports):
        raise ValueError("the ranks replayed different passes or graphs")
    # t[rank, pass, op, 0|1]: seconds from the rank's pass start
    t = np.array([r["times"] for r in reports], dtype=float)
    t -= t[:, :, :, 0].min(axis=2)[:, :, None, None]
    t /= 1e9
    durations = (t[:, :, :, 1] - t[:, :, :, 0]).max(axis=0)  # [pass, op]
    out_ops = []
    for i, op in enumerate(ops):
        duration = _median(durations[:, i])
        entry = {k: op[k] for k in ("name", "kind", "layer", "phase", "collective", "bytes",
                                    "group_size", "peer")}
        entry |= {"start_s": _median(t[:, :, i, 0].min(axis=0)),
                  "end_s": _median(t[:, :, i, 1].max(axis=0)), "duration_s": duration,
                  "algbw_bit_s": None, "busbw_bit_s": None}
        if op["kind"] == "collective" and duration > 0:
            entry["algbw_bit_s"] = 8.0 * op["bytes"] / duration
            entry["busbw_bit_s"] = entry["algbw_bit_s"] * coll.bus_factor(op["collective"],
                                                                          op["group_size"])
        out_ops.append(entry)
    layers: dict[str, dict] = {}
    for e in out_ops:
        if e["layer"] is None or e["kind"] == "delay":
            continue
        row = layers.setdefault(e["layer"], {"layer": e["layer"], "compute_s": 0.0,
                                             "comm_s": 0.0, "bytes": 0})
        if e["kind"] == "compute":
            row["compute_s"] += e["duration_s"]
        else:
            row["comm_s"] += e["duration_s"]
            row["bytes"] += e["bytes"]
    info = reports[0]["info"]
    return {
        "file": Path(trace).name, "format": info["format"], "parallelism": info["parallelism"],
        "model_parallel_group": info["model_parallel_group"], "layers": info["layers"],
        "clock_ghz": clock_ghz, "compute_scale": compute_scale, "bytes_scale": bytes_scale,
        "compute_s_per_pass": info["compute_s_per_pass"],
        "passes": [{"iteration_s": max(d["iteration_s"][k] for d in docs),
                    "compute_s": max(d["compute_s"][k] for d in docs),
                    "exposed_comm_s": max(d["comm_s"][k] for d in docs)}
                   for k in range(passes)],
        "ops": out_ops, "by_layer": list(layers.values()),
        "timeline": [{"rank": d["rank"], "ops": [[i, round(a, 6), round(b, 6)]
                                                 for i, (a, b) in enumerate(t[r, -1])]}
                     for r, d in enumerate(docs)],
    }
