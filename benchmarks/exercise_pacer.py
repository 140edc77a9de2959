"""The pacer exercise's two claims, measured through its own check: the answer it starts from
(On-Ramp's rule as published, the exercise's ``answer`` template) fails, and the pacer's own
rules (the docs' answer) pass, alone and with the receivers' window clamp and ACK pacing.
Each round is one ``nslab exercise check`` of each answer, each check a lab of its own running
the Gather unpaced and then ``paced_runs`` times paced.

    sudo .venv/bin/python benchmarks/exercise_pacer.py [--rounds 3]

Per answer: the rounds it passed; per round the unpaced drops against the best paced run's
(None: a run failed, its error kept in the data; the data keep each paced run's by link), and
whether the check's lab was saturated (``lab.fidelity``).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from mininet.log import setLogLevel
from record import record

from session import exercise
from session.scenario import load
from session.session import Session

RIGHT = "threshold_us: 2000\nmax_hold_us: 20000\nprobe_us: 2000\n"
"""The pacer's own rules at the exercise's scale (docs/exercises.md)."""
ACK_PACED = RIGHT + "window_clamp: true\nthreshold_from: base\nack_pace: 0.9\n"
"""The same with the receivers' window clamp, T from the base OWD and their pure ACKs paced
(docs/how-it-works/pacer-datapath.md)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    setLogLevel("error")
    ex = exercise.load_exercise("pacer")
    answers = {"On-Ramp as published (the template)": ex.answer, "the pacer's own": RIGHT,
               "the pacer's own, ACK-paced": ACK_PACED}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        exercise.start(ex, 1, d, lab_name="bench_expacer")
        runs: dict[str, list[dict]] = {name: [] for name in answers}
        for r in range(args.rounds):
            for name, text in answers.items():
                path = d / "answer.yaml"
                path.write_text(text)
                rec, answer = exercise.read_record(d, ex.name), exercise.read_answer(ex, path)
                exercise.check_lab(ex, answer, rec, d)
                check = str(exercise.check_path(d, ex.name))
                results = Session(*load(check), check, "bench_expacer").run()
                v = exercise.judge(ex, answer, rec, results)
                jobs = {j["name"]: j for j in results["jobs"]}
                paced = [j["fabric_drops"] for n, j in jobs.items() if n.startswith("paced")]
                where = [j.get("drops_by_link") for n, j in jobs.items() if n.startswith("paced")]
                runs[name].append({"passed": v.passed, "unpaced": jobs["unpaced"]["fabric_drops"],
                                   "paced": paced, "paced_where": where,
                                   "errors": [j["error"] for j in jobs.values() if j["error"]],
                                   "saturated": bool((v.fidelity or {}).get("saturated"))})
                print(f"round {r + 1} {name}: {'PASSED' if v.passed else 'NOT YET'}; "
                      f"{runs[name][-1]}", flush=True)
    for name, rs in runs.items():
        rows.append({"answer": name, "passed": f"{sum(x['passed'] for x in rs)}/{len(rs)}",
                     "unpaced drops": [x["unpaced"] for x in rs],
                     "best paced drops": [min((p for p in x["paced"] if p is not None),
                                              default=None) for x in rs],
                     "failed checks": sum(bool(x["errors"]) for x in rs),
                     "saturated": f"{sum(x['saturated'] for x in rs)}/{len(rs)}"})
    record("exercise_pacer", "The pacer exercise's check on its template and on the pacer's own "
           "rules", ["answer", "passed", "unpaced drops", "best paced drops", "failed checks",
            "saturated"], rows,
           f"{args.rounds} checks per answer, alternating; each check a lab of its own",
           data={"runs": runs})


if __name__ == "__main__":
    main()
