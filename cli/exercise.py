"""``nslab exercise list|start NAME|check NAME ANSWER``: teaching exercises with automatic
checks (``session.exercise``)."""
from __future__ import annotations

import json
import secrets
import textwrap

from cli.run import progress_printer
from lab.capabilities import require_root
from session.exercise import DEFAULT_DIR, check, load_exercise, names, start


def add_parser(sub) -> None:
    p = sub.add_parser(
        "exercise", help="teaching exercises with automatic checks",
        description="Teaching exercises: each builds a lab with a hidden truth (a seed "
                    "chooses, e.g., which VMs share a host or which link is congested), "
                    "shows the student what they can measure, and checks their answer "
                    "file against the truth. NAME is a built-in exercise "
                    f"({', '.join(names())}) or an exercise YAML file (the docs: Exercises). "
                    "The same from the TUI: ctrl+p, 'Exercise'.",
        epilog="Example: sudo nslab exercise start colocated; write answer.yaml as it "
               "says; nslab exercise check colocated answer.yaml (exit 0: right, 1: wrong).")
    ex = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = ex.add_parser("list", help="one exercise a line: name, title")
    ls.set_defaults(func=main_list)
    st = ex.add_parser("start", help="build and run the exercise's lab (root), print the "
                       "task, what was measured and the answer's format",
                       description="Draw the hidden truth from a seed, run the exercise's "
                                   "lab to its end (with agents: until every VM has an "
                                   "estimate in their last settled window, at most 60 s "
                                   "more), and write the record (the truth, mode 0600) and "
                                   "the observations into --dir.")
    st.add_argument("name", metavar="NAME")
    st.add_argument("--seed", type=int, help="the seed that hides the truth (default: "
                    "random, printed)")
    st.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    ck = ex.add_parser("check", help="check an answer file: exit 0 right, 1 wrong",
                       description="Check ANSWER (YAML, the format start printed) against "
                                   "the truth start recorded in --dir; print what was right "
                                   "and what was not. The pacer exercise runs its own lab "
                                   "(root, about a minute).")
    ck.add_argument("name", metavar="NAME")
    ck.add_argument("answer", metavar="ANSWER_FILE")
    ck.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    for q in (st, ck):
        q.add_argument("--dir", default=DEFAULT_DIR, help="where the records live (default: "
                       f"./{DEFAULT_DIR})")
        q.add_argument("--name", dest="lab_name", metavar="LAB",
                       help="lab name (default: the exercise scenario's)")
        q.set_defaults(func=main_start if q is st else main_check)


def main_list(args) -> int:
    width = max(len(n) for n in names())
    for n in names():
        print(f"{n:<{width}}  {load_exercise(n).title}")
    return 0


def main_start(args) -> int:
    ex = load_exercise(args.name)
    require_root()
    seed = args.seed if args.seed is not None else secrets.randbelow(1_000_000)
    print(f"exercise {ex.name}: {ex.title} (seed {seed})\n")
    print(textwrap.indent(ex.task.rstrip(), "  "), "\n", flush=True)
    record = start(ex, seed, args.dir, args.lab_name, progress_printer(args.quiet))
    print("What was measured (also in "
          f"{args.dir}/{ex.name}.observations.json):")
    print(shown(record["observations"]))
    print(f"\nAnswer in a YAML file, e.g.:\n{textwrap.indent(ex.answer.rstrip(), '  ')}\n"
          f"then: nslab exercise check {args.name} ANSWER_FILE --dir {args.dir}")
    return 0


def shown(observations: dict) -> str:
    """The observations in YAML's flow style, one entry (a VM, a pair, a flow) a line."""
    lines = []
    for key, value in observations.items():
        if isinstance(value, dict):
            lines += [f"{key}:"] + [f"  {k}: {json.dumps(v)}" for k, v in value.items()]
        elif isinstance(value, list):
            lines += [f"{key}:"] + [f"  - {json.dumps(v)}" for v in value]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines)


def main_check(args) -> int:
    ex = load_exercise(args.name)
    verdict = check(ex, args.answer, args.dir, args.lab_name, progress_printer(args.quiet))
    print(f"exercise {ex.name}: {ex.title}")
    print(verdict.text())
    return 0 if verdict.passed else 1
