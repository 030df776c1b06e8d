"""JSON text from an untrusted client, parsed into what the rest of the control plane can hold.

Python's `json` accepts more than JSON, and more than the control plane can store or recurse
through (most of these reached a view and were answered 500):

- nesting: `json.loads` recurses once per level and raises RecursionError at ~1,000 levels;
  below that, serializers, the spec's validators, `copy.deepcopy`, JSON merge patches and the
  audit diff are recursive too. A document nested deeper than MAX_DEPTH is refused, so
  nothing after the parser has to think about depth;
- `NaN`, `Infinity`, `-Infinity` (not JSON) and numbers beyond a double's range (about
  ±1.8e308; RFC 8259 §6: not interoperable): `1e999999` parses as infinity, which jsonb
  cannot store, and a 400-digit integer overflows the first float() it meets. Narrower
  ranges (a 64-bit offset, a positive interval) are each field's own validation;
- U+0000 in a string (PostgreSQL's text and jsonb cannot hold it) and lone UTF-16 surrogates
  (`"\\ud800"`: a Python string no UTF-8 encoder takes, answer rendering included);
- a key named twice in one object: Python keeps the last, other JSON readers the first, so a
  reviewer and the control plane could read two different documents.

`loads` raises `Refused` with field errors in the API's shape (`{"spec.source.topics[0]":
["..."]}`, dotted paths as `controlplane.api.errors.flatten` writes them). Pure: no Django.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

MAX_DEPTH = 200  # arrays and objects inside one another; a pipeline spec needs fewer than 10
# The largest finite double, as an integer: a JSON integer beyond it converts to no float.
LARGEST = int(sys.float_info.max)
LARGEST_DIGITS = len(str(LARGEST))  # 309
MAX_ERRORS = 10  # fields named at most for one document (the walk stops there)
_SURROGATE = re.compile("[\ud800-\udfff]")
# Only on the failure path (RecursionError): strings (whose brackets do not count) and the
# structural characters, to find where the document goes too deep.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]')


class Refused(ValueError):
    """The document is not acceptable; `errors` maps dotted paths to messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


class _Bad:
    """Put in the parsed document where a value was not acceptable; the walk reports it with
    its path (the parser's hooks do not know where they are)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class _Duplicated(dict):
    """An object in which some key was given more than once (the last value kept)."""

    __slots__ = ("names",)


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    twice = _Duplicated(out)
    seen: set[str] = set()
    twice.names = [k for k, _ in pairs if k in seen or seen.add(k)]
    return twice


def _number_text(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...{text[-10:]} ({len(text)} characters)"


def _int(text: str) -> int | _Bad:
    # Digits are counted first: int() of thousands of digits is slow, and refused past 4,300.
    digits = len(text) - (text[0] == "-")
    if digits > LARGEST_DIGITS or abs(value := int(text)) > LARGEST:
        return _out_of_range(text)
    return value


def _float(text: str) -> float | _Bad:
    value = float(text)
    return _out_of_range(text) if math.isinf(value) else value


def _out_of_range(text: str) -> _Bad:
    return _Bad(
        f"{_number_text(text)} is out of range: JSON numbers must fit in a double-precision "
        "number (at most about ±1.8e308)"
    )


def _constant(name: str) -> _Bad:
    return _Bad(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def _shown(key: str) -> str:
    """A key as a path part, escaped where it holds what it is refused for: a lone surrogate
    could not be written in the answer, a NUL should not reach a log line."""
    if _SURROGATE.search(key):
        key = key.encode("utf-8", "backslashreplace").decode()
    return key.replace("\x00", "\\x00")


def _path(node: tuple | None) -> str:
    """A path as `flatten` writes it: `spec.sinks[0].table`. (A node is (parent, key or
    index): built for every value, so it is only turned into text for an error.)"""
    parts: list[str | int] = []
    while node is not None:
        node, part = node
        parts.append(part)
    out = ""
    for part in reversed(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{_shown(part)}" if out else _shown(part)
    return out


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains U+0000 (a NUL character), which cannot be stored"
    if not text.isascii() and (found := _SURROGATE.search(text)):
        return (
            f"contains a lone UTF-16 surrogate (U+{ord(found.group()):04X}), "
            "which is not a character"
        )
    return None


def check(document: Any) -> None:
    """Raise Refused if the parsed document breaks any rule above. Iterative (a stack of
    containers, not recursion), so it is safe on any depth; it stops descending past
    MAX_DEPTH. Scalars are looked at where they are met (most of a document)."""
    errors: dict[str, list[str]] = {}

    def refuse(node: tuple | None, message: str) -> None:
        errors.setdefault(_path(node) or "non_field_errors", []).append(message)

    def scalar(value: Any, node: tuple | None) -> None:
        if isinstance(value, str):
            if ("\x00" in value or not value.isascii()) and (problem := _string_problem(value)):
                refuse(node, problem)
        elif isinstance(value, _Bad):
            refuse(node, value.message)

    if not isinstance(document, dict | list):
        scalar(document, None)
    stack: list[tuple[dict | list, tuple | None, int]] = (
        [(document, None, 0)] if isinstance(document, dict | list) else []
    )
    while stack and len(errors) < MAX_ERRORS:
        container, node, depth = stack.pop()
        if depth >= MAX_DEPTH:
            refuse(_head(node), _too_deep())
            continue
        if isinstance(container, dict):
            if isinstance(container, _Duplicated):
                for name in dict.fromkeys(container.names):
                    refuse((node, name), "is given more than once in the same object")
            items = container.items()
        else:
            items = enumerate(container)
        nested = []
        for key, value in items:
            suspect = isinstance(key, str) and ("\x00" in key or not key.isascii())
            if suspect and (problem := _string_problem(key)):
                refuse(node, f"the key {key!a} {problem}")
            if isinstance(value, dict | list):
                nested.append((value, (node, key), depth + 1))
            else:
                scalar(value, (node, key))
        stack.extend(reversed(nested))
    if errors:
        raise Refused(errors)


def _too_deep() -> str:
    return (
        f"nests arrays and objects more than {MAX_DEPTH} levels deep "
        f"(counted from the top of the document); at most {MAX_DEPTH} are accepted"
    )


def _head(node: tuple | None, keep: int = 3) -> tuple | None:
    """The first `keep` parts of a path: where a too-deep document goes deep is named by the
    field it starts in (e.g. `spec.source.avro_schema`), not by 200 levels of path."""
    parts: list[tuple | None] = []
    while node is not None:
        parts.append(node)
        node = node[0]
    return parts[-keep] if len(parts) >= keep else (parts[0] if parts else None)


def _where_too_deep(text: str) -> tuple | None:
    """The path of the first place `text` nests deeper than MAX_DEPTH (text that made the
    parser itself run out of stack). Tracks, per open array or object, the current key or
    index; returns None if the text never goes that deep."""
    frames: list[list] = []  # [is_object, key or index, node of this container]
    node: tuple | None = None
    pending_key: str | None = None
    for match in _TOKEN.finditer(text):
        mark = match.group()
        if mark in ("[", "{"):
            if frames:
                is_object, key, parent = frames[-1]
                node = (parent, key if not is_object else (key or ""))
            else:
                node = None
            if len(frames) >= MAX_DEPTH:
                return _head(node)
            frames.append([mark == "{", None if mark == "{" else 0, node])
        elif mark in ("]", "}"):
            if frames:
                frames.pop()
        elif mark == ",":
            if frames and not frames[-1][0]:
                frames[-1][1] += 1
        elif mark == ":":
            if frames and frames[-1][0]:
                frames[-1][1] = pending_key
        else:  # a string: a key if a ':' follows
            try:
                pending_key = json.loads(mark)
            except ValueError:
                pending_key = mark
    return None


def loads(text: str) -> Any:
    """`text` as a JSON value the control plane can hold; Refused (field errors) if it is
    not one, ValueError if it is not JSON at all (the message says where)."""
    try:
        document = json.loads(
            text,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
            object_pairs_hook=_pairs,
        )
    except RecursionError:
        # The C scanner recurses once per level: the document is far deeper than MAX_DEPTH.
        raise Refused({_path(_where_too_deep(text)) or "non_field_errors": [_too_deep()]}) from None
    check(document)
    return document
