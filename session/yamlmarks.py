"""YAML with line numbers: a document's data plus where each of its keys and items sits.

``parse(text)`` returns a ``MarkedDoc``: the data (as ``yaml.safe_load`` gives it), the line and
column of every mapping key and sequence item by path (``("faults", 0, "link")``), and the keys
given twice in one mapping (YAML keeps the last silently). A syntax error raises
``YamlSyntaxError`` with its line and column. Built on PyYAML's composer: its nodes carry
marks (PyYAML documentation, "Nodes").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

Path = tuple[str | int, ...]
Where = tuple[int, int]


class YamlSyntaxError(ValueError):
    """The text is not YAML: ``message`` in plain words, ``line``/``column`` from 1 (None when
    the parser gave no position), ``hint`` or ``""``."""

    def __init__(self, message: str, line: int | None, column: int | None, hint: str = ""):
        super().__init__(message)
        self.message, self.line, self.column, self.hint = message, line, column, hint


@dataclass
class MarkedDoc:
    """A parsed document: ``data``; ``marks``: path -> (line, column) of a mapping key or a
    sequence item, from 1 (the root is ``()``); ``duplicates``: (path, first line, line
    again) of keys given twice."""

    data: Any
    marks: dict[Path, Where] = field(default_factory=dict)
    duplicates: list[tuple[Path, int, int]] = field(default_factory=list)

    def where(self, path: Path) -> Where | tuple[None, None]:
        """(line, column) of ``path``, or of its nearest ancestor in the file (a missing
        field: the mapping that should hold it); (None, None) for an empty document."""
        for n in range(len(path), -1, -1):
            if path[:n] in self.marks:
                return self.marks[path[:n]]
        return None, None


def parse(text: str) -> MarkedDoc:
    """Parse one YAML document with the safe loader, keeping marks.

    Raises:
        YamlSyntaxError: not YAML (or more than one document).
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        raise _syntax(e) from e
    except yaml.YAMLError as e:
        raise YamlSyntaxError(f"not valid YAML: {e}", None, None) from e
    finally:
        loader.dispose()
    doc = MarkedDoc(data)
    if node is not None:
        doc.marks[()] = _at(node.start_mark)
        _index(node, (), doc, SafeConstructor())
    return doc


def _at(mark) -> Where:
    return mark.line + 1, mark.column + 1


def _index(node: yaml.Node, path: Path, doc: MarkedDoc, keys: SafeConstructor) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str | int, int] = {}  # key -> line, in this mapping
        for k, v in node.value:
            try:
                key = keys.construct_object(k, deep=True)
            except yaml.YAMLError:
                continue
            if not isinstance(key, str | int):
                continue
            here, line = path + (key,), _at(k.start_mark)[0]
            if key in seen:
                doc.duplicates.append((here, seen[key], line))
            seen[key] = line
            doc.marks[here] = _at(k.start_mark)
            _index(v, here, doc, keys)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.marks[path + (i,)] = _at(item.start_mark)
            _index(item, path + (i,), doc, keys)


def _syntax(e: yaml.MarkedYAMLError) -> YamlSyntaxError:
    mark = e.problem_mark or e.context_mark
    message = f"not valid YAML: {e.problem or e.context}"
    if e.context and e.problem and e.context_mark is not None:
        line, column = _at(e.context_mark)
        if e.context.startswith("while "):  # "while parsing a flow mapping"
            what = e.context.split(" ", 3)[-1]
            message += f" (in the {what} that starts at line {line}, column {column})"
        else:  # "expected a single document in the stream", "but found another document"
            message = f"not valid YAML: {e.context} (line {line}, column {column}), {e.problem}"
    hint = "indent with spaces: YAML does not allow tabs" if "'\\t'" in (e.problem or "") \
        else ""
    line, column = _at(mark) if mark is not None else (None, None)
    return YamlSyntaxError(message, line, column, hint)
