"""``nslab schema scenario|results|api|report``: print the JSON Schema of a contract, generated from
the typed models that are its one definition (no root needed)."""
from __future__ import annotations

import json


def _scenario() -> dict:
    from session.scenario import Scenario
    return Scenario.model_json_schema()


def _results() -> dict:
    from contracts.results import results_schema
    return results_schema()


def _api() -> dict:
    from contracts.messages import CoordinatorState
    return CoordinatorState.model_json_schema()


def _report() -> dict:
    from pydantic import TypeAdapter

    from contracts.messages import AgentMessage
    return TypeAdapter(AgentMessage).json_schema()


SCHEMAS = {"scenario": (_scenario, "scenario YAML files (nslab run SCENARIO)"),
           "results": (_results, "the results document (nslab run --json PATH)"),
           "api": (_api, "the coordinator's GET /api/v1/state (agents/API.md)"),
           "report": (_report, "a line an agent or a pacer sends the coordinator's --port: "
                      "Hello, Report or PacerReport by its type (agents/API.md, Agent reports)")}


def add_parser(sub) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a contract",
                       description="Print the JSON Schema of: " + "; ".join(
                           f"{k}: {doc}" for k, (_, doc) in SCHEMAS.items()) + ".")
    p.add_argument("contract", choices=sorted(SCHEMAS))
    p.set_defaults(func=main)


def main(args) -> int:
    print(json.dumps(SCHEMAS[args.contract][0](), indent=1))
    return 0
