"""What a benchmark leaves behind besides what it prints: its current table as JSON, with the
machine, the commit and the date, in ``benchmarks/results/NAME.json``. The docs' benchmarks page
is made from these files (``docs/hooks/generate.py``), one table per benchmark: a rerun
replaces the table, and history stays in git.

    from record import record
    record("vmclock", "A clock read in a VM against the machine's", ["call", "machine ns"],
           [{"call": "gettimeofday", "machine ns": 21.3}])
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def machine() -> dict:
    """CPU model, cores, kernel release and cgroup version of this machine, and its load
    average over the last minute (other work on a shared machine moves timings)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cgroup = "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1"
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "cgroup": cgroup, "load1": round(os.getloadavg()[0], 2)}


def commit() -> str:
    """This tree's commit, ``+dirty`` when it has uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def record(name: str, title: str, columns: list[str], rows: list[dict],
           note: str = "", data: dict | None = None) -> Path:
    """Write ``results/NAME.json``: ``title``, the command that ran, the machine, commit and
    date, ``columns`` and ``rows`` (dicts keyed by column; numbers as printed), ``note``, and
    ``data``: what the table was made from, for scripts (e.g. every comparison's samples)."""
    RESULTS.mkdir(exist_ok=True)
    doc = {"name": name, "title": title,
           "command": " ".join(["python", os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
           "machine": machine(), "commit": commit(),
           "date": datetime.date.today().isoformat(), "columns": columns, "rows": rows,
           "note": note, **({"data": data} if data else {})}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def show(columns: list[str], rows: list[dict], path: Path) -> None:
    """Print a recorded table (``record``'s ``columns`` and ``rows``) and where it went."""
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    print(f"wrote {path}")


def fmt(x: float | None) -> str:
    """A table's number: 3 significant digits, ``-`` for none."""
    return "-" if x is None else f"{x:.3g}"


def median_columns(case: str, estimator: str, m: dict) -> dict:
    """A table row's first columns from one estimator's medians over the runs (``m``: its
    ``p50`` and ``p99``, each ``{"median", "ci"}``, us)."""
    ci = m["p99"]["ci"]
    return {"case": case, "estimator": estimator, "p50 us": fmt(m["p50"]["median"]),
            "p99 us": fmt(m["p99"]["median"]), "p99 95 % interval": f"[{fmt(ci[0])}, {fmt(ci[1])}]"}
