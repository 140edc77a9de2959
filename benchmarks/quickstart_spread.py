"""How stable quickstart's headline is: the naive / collocation-aware AllReduce over several
runs of the default scenario, each run's ratio next to its fidelity, and the spread.

    sudo .venv/bin/python benchmarks/quickstart_spread.py [--runs 5] [--scenario quickstart]
        [--lock /tmp/nslab-lab.lock] [--detail]

Per run: the two jobs' completion times, ``aware_s / naive_s`` (below 1: the aware choice was
faster), the same ratio of their median iterations (``p50``: what the completion ratio would
be without its slowest iterations), whether the agents' groups were right (precision,
recall), the clock figures (|offset error| p99, us; |drift error| p99, ppm), the agents' CPU
(p50 over agents, share of a core, after start-up) and the fidelity line. Then per scenario
the spread of both ratios (max - min, in points of 100 %) and the smallest gain. Goal
(issue 14): every run's aware job at least 8 % faster (ratio <= 0.92), a spread under 5
points, no run flagged SATURATED. ``--scenario a,b`` runs several scenarios (built-in names
or YAML files) in turn, run by run, so that a change is compared with what it changes under
the same load of the machine.

``--lock PATH`` holds an flock on PATH during each run only (a shared machine's lab lock, so
others' labs can run between two runs). ``--detail`` also prints, per job, where its time
went: its iteration times and the collective's part of each (ms; the slowest rank's), their
coefficient of variation, the fabric's drops, and for every physical host over the job's
timed iterations (the last ``completion_s`` before its end) the CPU its cgroup used (cores),
the time its tasks waited for CFS quota (``Cgroups.throttling``: throttled time / window,
summed over the CPUs' run queues, so it can pass 100 %) and the CPU the agent daemons in its
VMs took (ms, in all and per VM; the coordinator's separately), sampled every 50 ms
(psutil's CPU times count in 10 ms ticks).
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import fcntl
import statistics
import threading
import time

from mininet.log import setLogLevel

from contracts.results.lab import Fidelity
from report.text import fidelity_line
from session.scenario import load
from session.session import Session

SAMPLE_S = 0.05


@contextlib.contextmanager
def locked(path: str | None):
    """Hold an exclusive flock on ``path`` (nothing when None)."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class HostSampler(threading.Thread):
    """Every ``SAMPLE_S``: (true ns, {host: (periods, throttled, throttled_ns, usage_ns)},
    {daemon key: cpu_s}) of a running session's lab."""

    def __init__(self, session: Session):
        super().__init__(daemon=True, name="spread-sampler")
        self.session = session
        self.samples: list[tuple[int, dict, dict]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        cg, hosts = self.session.lab.cgroups, sorted(set(self.session.lab.phys.values()))
        mesh = self.session.mesh
        while not self.halt.wait(SAMPLE_S):
            try:
                per_host = {h: (*cg.throttling(h), cg.cpu_usage_ns(h)) for h in hosts}
            except OSError:  # torn down meanwhile
                return
            cpu = {k: v[0] for k, v in mesh.usage().items()} if mesh else {}
            self.samples.append((time.time_ns(), per_host, cpu))

    def between(self, t0_ns: int, t1_ns: int) -> tuple[float, dict, dict] | None:
        """(seconds, per host deltas, per daemon CPU s) between the samples nearest to two
        instants; None without two samples there."""
        times = [s[0] for s in self.samples]
        i = min(bisect.bisect_left(times, t0_ns), len(times) - 1)
        j = min(bisect.bisect_left(times, t1_ns), len(times) - 1)
        if j <= i:
            return None
        (ta, ha, ca), (tb, hb, cb) = self.samples[i], self.samples[j]
        hosts = {h: tuple(b - a for a, b in zip(ha[h], hb[h], strict=True)) for h in ha}
        return (tb - ta) / 1e9, hosts, {k: cb[k] - ca.get(k, 0.0) for k in cb}


def detail(name: str, entry: dict, end_ns: int, sampler: HostSampler, phys: dict) -> None:
    """Print where job ``name``'s timed iterations spent their time (module doc)."""
    its = entry.get("iteration_times_s") or []
    if not its or entry.get("completion_s") is None:
        print(f"    {name}: no timing ({entry.get('error')})")
        return
    mean = statistics.fmean(its)
    cv = statistics.pstdev(its) / mean
    comm = entry.get("comm_times_s") or []
    print(f"    {name}: iterations ms {' '.join(f'{1000 * t:.0f}' for t in its)}  "
          f"(mean {1000 * mean:.0f}, CV {cv:.2f}; on {' '.join(entry['placement']['vms'])}; "
          f"fabric drops {entry.get('fabric_drops')})")
    print(f"      of which collective ms {' '.join(f'{1000 * t:.0f}' for t in comm)}")
    got = sampler.between(end_ns - int(entry["completion_s"] * 1e9), end_ns)
    if got is None:
        return
    span, hosts, cpu = got
    for h, (_, thr, thr_ns, use_ns) in sorted(hosts.items()):
        agents = {k[6:]: v for k, v in sorted(cpu.items())
                  if k.startswith("agent-") and phys.get(k[6:]) == h}
        each = " ".join(f"{vm} {1000 * v:.0f}" for vm, v in agents.items())
        print(f"      {h}: cpu {use_ns / 1e9 / span:.3f} cores, throttled "
              f"{thr_ns / 1e9 / span:5.1%} of {span:.2f} s ({thr} periods), agents "
              f"{1000 * sum(agents.values()):.0f} ms ({each})")
    print(f"      coordinator {1000 * cpu.get('coordinator', 0.0):.0f} ms")


def run_once(name: str, lock: str | None, show_detail: bool) -> tuple[float, float] | None:
    """One run of scenario ``name`` (holding ``lock``): its line (and ``--detail``); the
    ratios of completions and of median iterations (None when a job failed)."""
    sc, topo = load(name)
    session = Session(sc, topo, name)
    ends: dict[str, int] = {}
    session.subscribe(lambda ev: ev.kind == "job_end" and ends.update({ev.target: ev.true_ns}))
    with locked(lock):
        session.start()
        sampler = HostSampler(session)
        sampler.start()
        try:
            session.wait()
        finally:
            sampler.halt.set()
            sampler.join()
            session.stop()
    res = session.results()
    cmp_ = res.get("placement_comparison") or {}
    col, sync, cost = (res.get(k) or {} for k in ("collocation", "sync", "agents"))
    fid = fidelity_line(Fidelity.model_validate(res["lab"]["fidelity"]))
    ratio = cmp_.get("ratio")
    p50 = {e["placement"].get("policy"): (e.get("iteration_s") or {}).get("p50")
           for e in res.get("jobs", [])}
    mid = (p50["collocation_aware"] / p50["naive"]
           if p50.get("collocation_aware") and p50.get("naive") else None)
    nan = float("nan")
    print(f"{sc.name:>12s} {cmp_.get('naive_s', nan):8.3f} {cmp_.get('aware_s', nan):8.3f} "
          f"{ratio if ratio is not None else nan:6.3f} {mid if mid is not None else nan:6.3f} "
          f"{col.get('precision')!s:>5s} {col.get('recall')!s:>6s} "
          f"{sync.get('offset_error_us', {}).get('p99', nan):6.3f} "
          f"{sync.get('drift_error_ppm', {}).get('p99', nan):7.4f} "
          f"{(cost.get('agent_cpu_core') or {}).get('p50') or 0:6.1%}  {fid}", flush=True)
    if show_detail:
        for entry in res.get("jobs", []):
            if entry["name"] in ends:
                detail(entry["name"], entry, ends[entry["name"]], sampler, session.placements)
    return (ratio, mid) if ratio is not None and mid is not None else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenario", default="quickstart",
                    help="a built-in name or a YAML file; several, comma-separated, run in "
                         "turn (side by side)")
    ap.add_argument("--lock", metavar="PATH", help="flock PATH during each run")
    ap.add_argument("--detail", action="store_true", help="per job: iterations, hosts' CPU "
                                                          "quota, daemons' CPU")
    args = ap.parse_args()
    setLogLevel("error")
    names = args.scenario.split(",")
    print(f"{'scenario':>12s} {'naive s':>8s} {'aware s':>8s} {'ratio':>6s} {'p50':>6s} "
          f"{'prec':>5s} "
          f"{'recall':>6s} {'off99':>6s} {'drift99':>7s} {'cpu/ag':>6s}  fidelity")
    ratios: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for _ in range(args.runs):
        for name in names:
            got = run_once(name, args.lock, args.detail)
            if got is not None:
                ratios[name].append(got)
    for name, rs in ratios.items():
        if not rs:
            continue
        done, mid = [r[0] for r in rs], [r[1] for r in rs]
        print(f"{name}: aware/naive over {len(rs)} runs: completion min {min(done):.3f} max "
              f"{max(done):.3f}, spread {100 * (max(done) - min(done)):.1f} points (goal < 5); "
              f"smallest gain {100 * (1 - max(done)):.1f} % (goal >= 8 %); median iteration "
              f"spread {100 * (max(mid) - min(mid)):.1f} points")

if __name__ == "__main__":
    main()
