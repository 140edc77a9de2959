"""Validation errors in plain words: pydantic's errors of a model -> what is expected, with an
example, and "did you mean" for a misspelt key or value.

``explain(model, errors)`` takes ``ValidationError.errors()`` of ``model`` and returns one
``Explained`` per problem: the field path as in the file (union members' labels such as a
fault's kind left out), a message that says what is expected (``expected a list, e.g.
`[leaf1, spine1]`, got `leaf1```) and a hint (``did you mean `fabric_bw`?``). Examples come
from the fields' ``examples``; close matches from ``difflib.get_close_matches`` against the
model's field names or a ``Literal``'s values.
"""
from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

Path = tuple[str | int, ...]

# pydantic error type -> what was expected, and a value that would do
EXPECTED = {
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float", "int_parsing_size"),
                    ("a whole number", 3)),
    **dict.fromkeys(("float_type", "float_parsing", "finite_number"), ("a number", 2.5)),
    **dict.fromkeys(("bool_type", "bool_parsing"), ("true or false", True)),
    "string_type": ("text", None),
    **dict.fromkeys(("list_type", "tuple_type", "set_type", "iterable_type"), ("a list", None)),
    **dict.fromkeys(("dict_type", "model_type", "model_attributes_type"),
                    ("a mapping of `key: value`", None)),
}
BOUNDS = {"greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
          "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most")}
DESCRIBED_MAX = 40  # a type error quotes the field's description up to this length
LISTED_FIELDS_MAX = 12  # an unknown key without a close match lists the fields up to this many


@dataclass(frozen=True)
class Explained:
    """One problem: ``path`` in the file, ``message`` (what is wrong, what is expected),
    ``hint`` (a close match or the choices; ``""`` when none)."""

    path: Path
    message: str
    hint: str = ""


@dataclass(frozen=True)
class _Spot:
    path: Path                 # the loc without union labels
    owner: type[BaseModel] | None   # the model holding the last named field
    name: str | None           # that field's name
    info: FieldInfo | None     # and its definition (None: not a field of owner)
    annotation: Any            # the type expected at the end of the loc (None: unknown)


def explain(model: type[BaseModel], errors: list[dict]) -> list[Explained]:
    """Plain-words problems of ``errors`` (``ValidationError.errors()`` of ``model``), one per
    path: the alternatives of a union (text or a list) merge into one message."""
    out: dict[Path, tuple[list[str], Explained]] = {}
    for err in errors:
        spot = _locate(model, err["loc"])
        expected = EXPECTED.get(err["type"])
        if expected and spot.path in out and out[spot.path][0]:
            out[spot.path][0].append(expected[0])
            phrases = out[spot.path][0]
            out[spot.path] = (phrases, _type_problem(spot, " or ".join(phrases), None, err))
        elif spot.path not in out:
            problem = _type_problem(spot, *expected, err) if expected else _problem(spot, err)
            out[spot.path] = ([expected[0]] if expected else [], problem)
    return [problem for _, problem in out.values()]


def file_path(model: type[BaseModel], loc: tuple) -> Path:
    """The path in the file of a pydantic error's ``loc``: without union labels
    (``("faults", 0, "link_down", "link")`` -> ``("faults", 0, "link")``)."""
    return _locate(model, loc).path


def _locate(model: type[BaseModel], loc: tuple) -> _Spot:
    t: Any = model
    path: list[str | int] = []
    owner = name = info = None
    for part in loc:
        t = _unwrap(t)
        if _is_union(t):
            t = _member(t, part)  # a union's label, not a key of the file
            if t is not None or not isinstance(part, int):
                continue
        path.append(part)
        if _is_model(t):
            owner, name, info = t, part, t.model_fields.get(part)
            t = info.annotation if info else None
        elif get_origin(t) in (list, tuple, set) and isinstance(part, int):
            args = [a for a in get_args(t) if a is not Ellipsis]
            t = args[min(part, len(args) - 1)] if args else None
        elif get_origin(t) is dict:
            t = get_args(t)[1] if get_args(t) else None
        else:
            t = None
    return _Spot(tuple(path), owner, name, info, _unwrap(t))


def _unwrap(t: Any) -> Any:
    while True:
        if get_origin(t) is Annotated:
            t = get_args(t)[0]
        elif _is_union(t) and len([a for a in get_args(t) if a is not type(None)]) == 1:
            t = next(a for a in get_args(t) if a is not type(None))
        else:
            return t


def _is_union(t: Any) -> bool:
    return get_origin(t) in (Union, types.UnionType)


def _tag(member: Any) -> str | None:
    """The ``Literal`` tag of a union member model (a fault's ``kind``), or None."""
    member = _unwrap(member)
    if not _is_model(member):
        return None
    for f in member.model_fields.values():
        if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1:
            return get_args(f.annotation)[0]
    return None


def _member(union: Any, label: Any) -> Any:
    for m in get_args(union):
        if _tag(m) == label or getattr(_unwrap(m), "__name__", None) == label:
            return _unwrap(m)
    return None


def _choices(spot: _Spot) -> list[str]:
    """The values a ``Literal`` accepts, or the tags of a union's members."""
    t = spot.annotation
    if get_origin(t) is Literal:
        return [str(a) for a in get_args(t)]
    if _is_union(t):
        return [tag for tag in map(_tag, get_args(t)) if tag is not None]
    return []


def close_match(word: Any, choices: list[str]) -> str:
    """``did you mean `x`?`` for the closest of ``choices`` to ``word``, or ``""``."""
    found = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f"did you mean `{found[0]}`?" if found else ""


def shown(value: Any, key: str | None = None, limit: int = 40) -> str:
    """``value`` (as ``key: value`` when ``key`` is given) in YAML's flow style, between
    backticks, cut at ``limit`` characters."""
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    except yaml.YAMLError:
        text = repr(value)
    text = text.strip().removesuffix("...").strip()
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"`{key}: {text}`" if key else f"`{text}`"


def _example(spot: _Spot, fallback: Any = None, key: str | None = None) -> str:
    """``, e.g. `value``` from the field's ``examples`` (else ``fallback``), as ``key: value``
    when ``key`` is given; ``""`` when there is no example."""
    values = list(spot.info.examples or []) if spot.info else []
    if not values and fallback is not None:
        values = [fallback]
    if not values:
        return ""
    return ", e.g. " + " or ".join(shown(v, key) for v in values[:2])


def _type_problem(spot: _Spot, expected: str, fallback: Any, err: dict) -> Explained:
    about = _describe(spot)
    about = f" ({about})" if about and len(about) <= DESCRIBED_MAX else ""
    return Explained(spot.path, f"expected {expected}{about}{_example(spot, fallback)}, got "
                                f"{shown(err['input'])}")


def _problem(spot: _Spot, err: dict) -> Explained:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        names = list(spot.owner.model_fields) if spot.owner else []
        hint = close_match(spot.name, names) or (
            f"fields here: {', '.join(names)}" if 0 < len(names) <= LISTED_FIELDS_MAX else "")
        return Explained(spot.path, f"unknown field `{spot.name}`", hint)
    if kind == "missing":
        if isinstance(spot.path[-1], int):
            return Explained(spot.path[:-1], f"item {spot.path[-1] + 1} is missing"
                                             f"{_example(_parent(spot))}, got {shown(value)}")
        about = f" ({_describe(spot)})" if _describe(spot) not in ("", spot.name) else ""
        return Explained(spot.path, f"required field `{spot.name}`{about} is missing"
                                    f"{_example(spot, key=spot.name)}")
    if kind in BOUNDS:
        key, words = BOUNDS[kind]
        return Explained(spot.path, f"must be {words} {_number(ctx[key])}, got {shown(value)}")
    if kind in ("literal_error", "enum"):
        choices = _choices(spot)
        return Explained(spot.path, f"{shown(value)} is not one of {', '.join(choices)}",
                         close_match(value, choices))
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        choices, key = _choices(spot), ctx["discriminator"].strip("'")
        if kind == "union_tag_not_found":
            return Explained(spot.path, f"needs `{key}`: one of {', '.join(choices)}")
        return Explained(spot.path + (key,), f"unknown {key} {shown(ctx['tag'])}; expected one "
                                             f"of {', '.join(choices)}",
                         close_match(ctx["tag"], choices))
    if kind == "string_pattern_mismatch":
        rule = _describe(spot) or f"the pattern {ctx['pattern']}"
        return Explained(spot.path, f"{shown(value)} is not allowed ({rule}){_example(spot)}")
    if kind in ("too_short", "string_too_short", "too_long", "string_too_long"):
        unit = "item" if kind in ("too_short", "too_long") else "character"
        least = "short" in kind
        n = ctx["min_length"] if least else ctx["max_length"]
        return Explained(spot.path, f"takes {'at least' if least else 'at most'} {n} {unit}"
                                    f"{'s' if n != 1 else ''}, got {shown(value)}")
    message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    fields = spot.annotation.model_fields if _is_model(spot.annotation) else {}
    name, rest = field_prefix(message, [*fields, spot.name])
    path = spot.path + (name,) if name in fields else spot.path
    return Explained(path, rest + ("" if "e.g." in rest else _example(spot)))


def field_prefix(message: str, fields) -> tuple[str | None, str]:
    """``("bytes", "not used by ddp")`` for ``"bytes: not used by ddp"`` when ``bytes`` is one
    of ``fields`` (a message that names its field), else ``(None, message)``."""
    head, sep, rest = message.partition(": ")
    return (head, rest) if sep and head in fields else (None, message)


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _parent(spot: _Spot) -> _Spot:
    return _Spot(spot.path[:-1], spot.owner, spot.name, spot.info, None)


def _describe(spot: _Spot) -> str:
    return (spot.info.description or "") if spot.info else ""


def _number(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)
