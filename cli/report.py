"""``nslab report RESULTS.json [--html OUT]``: a results document as the printed report, or as
an HTML page with plots that opens offline (no root needed)."""
from __future__ import annotations

import json

from pydantic import ValidationError

from contracts import results
from lab.errors import LabError
from report import text


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="show a results document: text, or an HTML page with plots",
        description="Read a results document (nslab run --json PATH) and print its report, or "
                    "with --html write one HTML page a person can open in any browser, "
                    "offline (plotly's JavaScript is inside the file, about 4.7 MB): the run "
                    "and its fidelity line, the truth timeline of faults, clock offset error "
                    "over time per VM against the NTP-style baseline, the one-way delay "
                    "heatmap, job iteration times, link utilization and CPU over time, load, "
                    "and the CASSINI, two_step and pacer sections when present; hover a plot "
                    "for the values. No root needed.")
    p.add_argument("results", metavar="RESULTS.json", help="a results document "
                   f"({results.SCHEMA})")
    p.add_argument("--html", metavar="OUT", help="write the HTML report to OUT")
    p.set_defaults(func=main)


def load(path: str) -> results.Results:
    """The document at ``path``, validated.

    Raises:
        LabError: unreadable, not JSON, or not a valid document (the field paths named).
    """
    try:
        with open(path, encoding="utf-8") as f:
            return results.validate(json.load(f))
    except OSError as e:
        raise LabError(f"cannot read {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise LabError(f"{path}: not JSON ({e.msg} at line {e.lineno}); give the file "
                       "nslab run --json wrote") from e
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                          for err in e.errors()[:5])
        raise LabError(f"{path}: not a {results.SCHEMA} document ({e.error_count()} "
                       f"problems: {where})") from e


def main(args) -> int:
    doc = load(args.results)
    if not args.html:
        print(text.report(doc))
        return 0
    from report import page  # plotly is imported only here
    page.write(doc, args.html)
    print(f"nslab report: {args.html}")
    return 0
