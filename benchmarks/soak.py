"""Soak: what the lab leaves on the machine after many bring-ups and teardowns, and after a
crash mid bring-up followed by ``nslab clean``.

    sudo .venv/bin/python benchmarks/soak.py [--cycles 100] [--kills 10]

``--cycles`` labs (1 spine, 2 leaves, 2 VMs per leaf, 2 VMs per physical host) are brought up
and torn down one after another; after each, every trace of it is looked for, independently of
the lab's own bookkeeping (``leftovers``): network namespaces ``nslab-NAME-*``, the lab's
cgroups in every mounted hierarchy, its state directory, processes whose cgroup names the lab,
pinned BPF objects naming it, and interfaces of the root namespace that were not there before.
Then ``--kills`` times a lab is brought up in a child process that is killed with SIGKILL at a
random moment of its bring-up (its shells are left running, as after a crash), then
``lab.clean.clean(NAME)`` (``nslab clean NAME``) runs and the same search follows. The
process's resident memory before and after the cycles says whether bring-up leaks.

Prints and records (``benchmarks/results/soak.json``) one row per part.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import subprocess
import sys
import time

from record import record

from lab import Lab
from lab.clean import clean
from lab.names import PREFIX, state_dir
from topo import LeafSpine

CHILD = """
import sys
from lab import Lab
from topo import LeafSpine
lab = Lab(LeafSpine(spines=1, leaves=2, vms_per_leaf=2, vms_per_host=2), name=sys.argv[1])
print("start", flush=True)
lab.start()
print("up", flush=True)
"""


def root_links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def leftovers(name: str, links_before: set[str]) -> list[str]:
    """Every trace of lab ``name`` on the machine, found without the lab's own records."""
    prefix = f"{PREFIX}-{name}"
    found = [f"netns {n}" for n in os.listdir("/run/netns")
             if n.startswith(prefix + "-")] if os.path.isdir("/run/netns") else []
    for hierarchy in ("/sys/fs/cgroup", *(f"/sys/fs/cgroup/{c}" for c in
                                          ("cpu", "cpuacct", "cpuset", "freezer", "memory",
                                           "pids"))):
        if os.path.isdir(os.path.join(hierarchy, prefix)):
            found.append(f"cgroup {hierarchy}/{prefix}")
    if os.path.exists(state_dir(name)):
        found.append(f"state {state_dir(name)}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                paths = [line.split(":", 2)[-1] for line in f.read().splitlines()]
            if any(prefix in path.split("/") for path in paths):
                found.append(f"process {pid}")
        except OSError:
            continue
    if os.path.isdir("/sys/fs/bpf"):
        found += [f"bpf {p}" for p in os.listdir("/sys/fs/bpf") if name in p]
    found += [f"link {link}" for link in root_links() - links_before]
    return found


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cycles(n: int, name: str) -> dict:
    topo = LeafSpine(spines=1, leaves=2, vms_per_leaf=2, vms_per_host=2)
    links = root_links()
    up, down, dirty, rss0 = [], [], [], rss_mb()
    for i in range(n):
        t = time.perf_counter()
        lab = Lab(topo, name=name, seed=i)
        with lab:
            up.append(time.perf_counter() - t)
            t = time.perf_counter()
        down.append(time.perf_counter() - t)
        left = leftovers(name, links) + lab.leftovers
        if left:
            dirty.append((i, left))
            clean(name)
    return {"part": f"{n} bring-up/teardown cycles", "runs": n,
            "runs with leftovers": len(dirty),
            "leftovers": "; ".join(f"#{i}: {', '.join(x)}" for i, x in dirty[:3]) or "none",
            "bring-up s p50": round(sorted(up)[n // 2], 2),
            "teardown s p50": round(sorted(down)[n // 2], 2),
            "RSS growth MB": round(rss_mb() - rss0, 1)}


def kills(n: int, name: str, rng: random.Random, bringup_s: float) -> dict:
    """``n`` children killed at a uniform moment of a bring-up (``bringup_s`` long) after it
    started (imports done)."""
    links = root_links()
    dirty, cleaned, killed_at = [], [], []
    for i in range(n):
        child = subprocess.Popen([sys.executable, "-c", CHILD, name], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().strip() == "start"
        at = rng.uniform(0, bringup_s)
        time.sleep(at)
        child.send_signal(signal.SIGKILL)   # only the lab's process: its shells live on
        child.wait()
        child.stdout.close()
        killed_at.append(at)
        cleaned.append(len(clean(name)))
        time.sleep(0.2)
        left = leftovers(name, links)
        if left:
            dirty.append((i, left))
            clean(name)
    return {"part": f"SIGKILL mid bring-up, then nslab clean ({n} times)", "runs": n,
            "runs with leftovers": len(dirty),
            "leftovers": "; ".join(f"#{i}: {', '.join(x)}" for i, x in dirty[:3]) or "none",
            "bring-up s p50": "", "teardown s p50": "",
            "RSS growth MB": "",
            "note": f"killed {min(killed_at):.2f}-{max(killed_at):.2f} s into bring-up; "
                    f"clean removed {min(cleaned)}-{max(cleaned)} objects"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("soak: needs root (sudo)")
    name = "soak"
    clean(name)
    soak = cycles(args.cycles, name)
    rows = [soak, kills(args.kills, name, random.Random(args.seed), soak["bring-up s p50"])]
    cols = ["part", "runs", "runs with leftovers", "leftovers", "bring-up s p50",
            "teardown s p50", "RSS growth MB"]
    for row in rows:
        print("  ".join(f"{c}: {row[c]}" for c in cols))
    record("soak", "Soak: what labs leave behind", cols, rows,
           "Searched after each run, without the lab's own records: namespaces, cgroups, the "
           "state directory, processes in the lab's cgroups, pinned BPF objects, root "
           "interfaces. " + rows[1]["note"] + ".")


if __name__ == "__main__":
    main()
