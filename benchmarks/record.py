"""What every benchmark writes beside its figures: the machine (CPU model, cores, memory,
kernel, cgroup version, Python) and the commit, and the JSON file itself, so that runs on two
machines compare (``docs``' tables are made from these files).

    path = record.write("stories", {"scenario": ..., "comparisons": [...]})
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
"""Where the benchmarks' JSON files go (one per run)."""


def machine() -> dict:
    """CPU model and cores, memory (GiB), kernel, cgroup version (1 or 2) and Python."""
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    return {"cpu_model": model, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "cgroup": 2 if Path("/sys/fs/cgroup/cgroup.controllers").exists() else 1}


def commit() -> str | None:
    """The checkout's commit (with ``-dirty`` for uncommitted changes), or None outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                             cwd=Path(__file__).parent, capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def write(name: str, figures: dict, directory: Path = RESULTS) -> Path:
    """``figures`` with the machine, the commit and the time, as
    ``DIRECTORY/NAME-<time>.json``; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    doc = {"benchmark": name, "created": now.isoformat(timespec="seconds"),
           "machine": machine(), "commit": commit(), **figures}
    path = directory / f"{name}-{now.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
