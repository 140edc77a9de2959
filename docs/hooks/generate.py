"""mkdocs hook: the pages made from what the code says, at every build, so that they cannot
drift from it (``mkdocs build`` is the one command that regenerates them):

- ``reference/*.md``: the scenario file, the results document, the coordinator's API and the
  agents' report lines, from the JSON Schemas ``nslab schema`` prints (``cli.schema``);
- ``cli/*.md``: a page per command, from its ``--help`` (``cli.main.parser``);
- ``benchmarks.md``'s tables, from the JSON files the benchmarks write
  (``benchmarks/results/*.json``, ``benchmarks/record.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REFERENCES = {  # page -> (contract of `nslab schema`, title, what it is)
    "scenario": ("scenario", "Scenario files",
                 "Every field of a scenario YAML file (`nslab run SCENARIO`, the TUI, "
                 "`nslab_lab`), with its type, default and meaning. Units are in the names "
                 "(`_s`, `_ms`, `_us`, `_ppm`, `_mbit`) or the descriptions."),
    "results": ("results", "Results document",
                "The `nslab.results/1` document `nslab run --json PATH` writes. Optional "
                "sections are absent when their part did not run; a value that could not be "
                "measured is null. `contracts.results.validate(doc)` checks a document."),
    "api": ("api", "Coordinator API",
            "`GET /api/v1/state` of the agents' coordinator (`python -m agents coordinator`): "
            "what the TUI and users' scripts read. Wire rules and examples: "
            "[the agents](../how-it-works/agents.md)."),
    "report-lines": ("report", "Agent report lines",
                     "One JSON line an agent or a pacer sends the coordinator's `--port`: "
                     "`Hello`, `Report` or `PacerReport`, by its `type`."),
}


def on_files(files, config):
    """Add the generated pages to the site."""
    from cli import schema
    for page, (contract, title, intro) in REFERENCES.items():
        text = schema_page(schema.SCHEMAS[contract][0](), title, intro, contract)
        files.append(File.generated(config, f"reference/{page}.md", content=text))
    for name, text in cli_pages().items():
        files.append(File.generated(config, f"cli/{name}.md", content=text))
    return files


def on_page_markdown(markdown, page, config, files):
    """``<!-- benchmark tables -->`` in a page becomes the benchmarks' current tables."""
    if "<!-- benchmark tables -->" in markdown:
        markdown = markdown.replace("<!-- benchmark tables -->", benchmark_tables())
    return markdown


# --- JSON Schema -> tables ------------------------------------------------------------------

def schema_page(schema: dict, title: str, intro: str, contract: str) -> str:
    defs = schema.get("$defs", {})
    out = [f"# {title}", "", intro, "",
           f"Generated from `nslab schema {contract}` (the typed models are the one definition); "
           f"`nslab schema {contract} > {contract}.schema.json` gives it to editors and "
           "validators.", ""]
    order, seen = [], set()   # the models in the order a reader meets them (breadth first)
    queue = [{k: v for k, v in schema.items() if k != "$defs"}]
    while queue:
        for ref in refs(queue.pop(0)):
            if ref not in seen and ref in defs:
                seen.add(ref)
                order.append(ref)
                queue.append(defs[ref])

    if "properties" in schema:
        out += ["## " + schema.get("title", title), "", model_table(schema, defs), ""]
    else:
        out += ["One of: " + ", ".join(type_of(s, defs) for s in schema.get("oneOf", [])), ""]
    for name in order:
        d = defs[name]
        out += [f"## {name} {{#{anchor(name)}}}", ""]
        if d.get("description"):
            out += [clean(d["description"]), ""]
        if "properties" in d:
            out += [model_table(d, defs), ""]
        elif "enum" in d:
            out += ["One of: " + ", ".join(f"`{v}`" for v in d["enum"]), ""]
        else:
            out += [f"Type: {type_of(d, defs)}", ""]
    return "\n".join(out)


def refs(node):
    """Every ``$defs`` name referenced under ``node``, in document order."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v.rsplit("/", 1)[-1]
            elif k != "discriminator":
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def model_table(model: dict, defs: dict) -> str:
    required = set(model.get("required", []))
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, prop in model.get("properties", {}).items():
        if name in required:
            default = "required"
        elif "default" not in prop:
            default = ""
        elif isinstance(prop["default"], dict) and prop["default"] and "$ref" in prop:
            default = "its fields' defaults"
        else:
            default = f"`{short(prop['default'])}`"
        meaning = prop.get("description") or defs.get(
            prop.get("$ref", "").rsplit("/", 1)[-1], {}).get("description", "")
        rows.append(f"| `{name}` | {type_of(prop, defs)} | {default} | "
                    f"{clean(meaning.split(chr(10) + chr(10))[0])} |")
    return "\n".join(rows)


def type_of(prop: dict, defs: dict) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{anchor(name)})"
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return " \\| ".join(type_of(p, defs) for p in prop[key])
    t = prop.get("type")
    if t == "array":
        items = prop.get("items")
        if isinstance(items, dict) and items:
            return f"list of {type_of(items, defs)}"
        if "prefixItems" in prop:
            return "[" + ", ".join(type_of(p, defs) for p in prop["prefixItems"]) + "]"
        return "list"
    if t == "object":
        extra = prop.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"map of {type_of(extra, defs)}"
        return "object"
    if isinstance(t, list):
        return " \\| ".join(t)
    return t or "any"


def anchor(name: str) -> str:
    return name.lower()


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def clean(text: str) -> str:
    return " ".join(text.replace("|", "\\|").replace("``", "`").split())


# --- the CLI --------------------------------------------------------------------------------

def cli_pages() -> dict[str, str]:
    """``{page name: markdown}``: ``index`` (the commands) and one page per command."""
    from cli.main import parser
    os.environ["COLUMNS"] = "100"   # argparse wraps --help at the terminal's width
    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    index = ["# Command line", "", "`nslab COMMAND --help` prints what these pages show.", "",
             "```text", top.format_help().rstrip(), "```", "", "| command | |", "|---|---|"]
    pages = {}
    for name, p in sub.choices.items():
        page = name.replace("_", "-")
        index.append(f"| [`nslab {name}`]({page}.md) | {helps.get(name, '')} |")
        pages[page] = "\n".join([f"# nslab {name}", "", helps.get(name, "").capitalize() + ".",
                                 "", "```text", p.format_help().rstrip(), "```", ""])
    index += ["", "Exit codes: 0 success, 1 a lab or scenario error (the message says what to "
                  "do), 2 a usage error or not root. `nslab --traceback COMMAND ...` shows the "
                  "full exception.", ""]
    pages["index"] = "\n".join(index)
    return pages


# --- benchmarks -----------------------------------------------------------------------------

def benchmark_tables() -> str:
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    if not files:
        return "No benchmark has recorded a table yet."
    out = []
    for path in files:
        doc = json.loads(path.read_text())
        m = doc["machine"]
        out += [f"### {doc['title']}", "", f"`{doc['command']}`", "",
                f"{m['cpu']}, {m['cores']} cores, kernel {m['kernel']}, cgroup "
                f"{m['cgroup']}, load average {m['load1']} at the end; commit "
                f"`{doc['commit']}`; {doc['date']}.", ""]
        cols = doc["columns"]
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(str(row.get(c, "")) for c in cols) + " |"
                for row in doc["rows"]]
        if doc.get("note"):
            out += ["", doc["note"]]
        out.append("")
    return "\n".join(out)
