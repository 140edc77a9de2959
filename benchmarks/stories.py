"""The built-in stories' comparisons, repeated: each scenario run with ``repeat`` N (its arms
interleaved, rotated per round, on one lab), every comparison's ratio of medians with its 95 %
interval and verdict (``session.stats``), the fidelity flags, the machine and the commit, in
one JSON file per scenario (``benchmarks/results/stories-NAME.json``, its table in the docs).

    sudo .venv/bin/python benchmarks/stories.py [quickstart two_step ...] [--repeat 5]
        [--seed N]

The same machinery as ``nslab run SCENARIO --repeat N``: this script only runs the scenarios
in turn and keeps their comparisons with the machine, so that two machines compare.
"""
from __future__ import annotations

import argparse

from mininet.log import setLogLevel
from record import record  # benchmarks/: on sys.path when run as a script

from contracts.results import validate
from contracts.results.lab import fidelity_line
from session.scenario import load
from session.session import Session


def run(scenario: str, repeat: int, seed: int | None) -> dict:
    """One scenario with ``repeat`` rounds: its comparisons and fidelity."""
    sc, topo = load(scenario)
    sc = sc.model_copy(update={"repeat": repeat, **({"seed": seed} if seed is not None else {})})
    doc = validate(Session(sc, topo, scenario, progress=lambda m: print("  ..", m, flush=True)
                           ).run())
    return {"scenario": scenario, "seed": sc.seed, "repeat": repeat,
            "fidelity": {"saturated": doc.lab.fidelity.saturated,
                         "line": fidelity_line(doc.lab.fidelity)
                         if doc.lab.fidelity.samples else None},
            "comparisons": [c.model_dump(mode="json") for c in doc.comparisons or []]}


COLUMNS = ["study", "arm", "baseline", "metric", "n", "ratio", "95 % interval", "verdict",
           "saturated", "reference"]


def rows(got: dict) -> list[dict]:
    """The table's rows: one per comparison."""
    return [{"study": c["study"], "arm": c["arm"], "baseline": c["baseline"],
             "metric": c["metric"], "n": c["n"], "ratio": c["ratio_median"],
             "95 % interval": " - ".join("?" if x is None else f"{x:.3f}"
                                         for x in c["ratio_ci95"]),
             "verdict": c["verdict"], "saturated": c["saturated_n"],
             "reference": "" if c["reference"] is None
             else f"{c['reference_source']} {c['reference']}"}
            for c in got["comparisons"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", default=["quickstart", "two_step"],
                    help="built-in names or YAML files (default: quickstart two_step)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds per scenario (default 5)")
    ap.add_argument("--seed", type=int, help="override the scenarios' seeds")
    args = ap.parse_args()
    setLogLevel("error")
    for name in args.scenarios:
        got = run(name, args.repeat, args.seed)
        short = name.rsplit("/", 1)[-1].removesuffix(".yaml")
        table = rows(got)
        path = record(f"stories-{short}", f"{short}: its comparisons over {args.repeat} "
                      "interleaved rounds (ratio of medians, 95 % interval, verdict)",
                      COLUMNS, table, note=got["fidelity"]["line"] or "", data=got)
        print(f"{name} (repeat {args.repeat}): {got['fidelity']['line']}")
        for r in table:
            print("  " + "  ".join(f"{r[c]}" for c in COLUMNS))
        print(f"  written: {path}")


if __name__ == "__main__":
    main()
