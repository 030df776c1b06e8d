"""Whether data written with one Avro schema can be read with another, by Avro's schema
resolution rules (the specification's "Schema Resolution"; what Java's SchemaCompatibility
checks), and where it cannot, in words naming the field (pure: schemas as parsed JSON).

The registry's own compatibility endpoint says only yes or no on some registries (Apicurio
answers `{"is_compatible": false}` with no messages), so the control plane's gate asks this
module which field breaks the rule."""

from __future__ import annotations

from typing import Any

# Writer type -> the reader types it can be read as (besides itself).
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_NAMED = {"record", "error", "enum", "fixed"}
MAX_PROBLEMS = 20


def problems(reader: Any, writer: Any) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` ([] if it can)."""
    out: list[str] = []
    _check(reader, writer, "", _Names(reader), _Names(writer), out, set())
    return out[:MAX_PROBLEMS]


class _Names:
    """The named types (records, enums, fixed) a schema defines, by full name."""

    def __init__(self, schema: Any):
        self.types: dict[str, dict] = {}
        self._walk(schema, "")

    def _walk(self, t: Any, namespace: str) -> None:
        if isinstance(t, list):
            for member in t:
                self._walk(member, namespace)
        elif isinstance(t, dict):
            avro_type = t.get("type")
            if avro_type in _NAMED and isinstance(t.get("name"), str):
                full = _full_name(t, namespace)
                self.types.setdefault(full, t)
                namespace = full.rpartition(".")[0]
            for f in t.get("fields") or [] if avro_type in ("record", "error") else []:
                if isinstance(f, dict):
                    self._walk(f.get("type"), namespace)
            for inner in ("items", "values"):
                if inner in t:
                    self._walk(t[inner], namespace)
            if isinstance(avro_type, (dict, list)):
                self._walk(avro_type, namespace)

    def resolve(self, t: Any) -> Any:
        if isinstance(t, str) and t not in _PRIMITIVES:
            found = self.types.get(t)
            if found is None:  # a short name: the first type of that name
                found = next((v for k, v in self.types.items() if k.rpartition(".")[2] == t), None)
            return found if found is not None else t
        if isinstance(t, dict) and isinstance(t.get("type"), (dict, list)):
            return self.resolve(t["type"])
        if isinstance(t, dict) and t.get("type") in _PRIMITIVES and len(t) == 1:
            return t["type"]
        return t


def _full_name(t: dict, namespace: str) -> str:
    name = t["name"]
    if "." in name:
        return name
    space = t.get("namespace")
    space = space if isinstance(space, str) else namespace
    return f"{space}.{name}" if space else name


def _type_name(t: Any) -> str:
    if isinstance(t, list):
        return "union"
    if isinstance(t, dict):
        name = str(t.get("type"))
        return "record" if name in ("record", "error") else name
    return str(t)


def _describe(t: Any) -> str:
    name = _type_name(t)
    if name in _NAMED and isinstance(t, dict):
        return f"{name} {t.get('name')}"
    if isinstance(t, list):
        return "a union of " + ", ".join(_describe(m) for m in t)
    if isinstance(t, dict) and t.get("logicalType"):
        return f"{name} ({t['logicalType']})"
    return name


def _check(
    reader: Any,
    writer: Any,
    at: str,
    rnames: _Names,
    wnames: _Names,
    out: list[str],
    seen: set[tuple[str, str]],
) -> None:
    if len(out) >= MAX_PROBLEMS:
        return
    reader, writer = rnames.resolve(reader), wnames.resolve(writer)
    rtype, wtype = _type_name(reader), _type_name(writer)
    where = at or "the record"
    if wtype == "union":
        # Each branch the writer may have written must be readable.
        for member in writer:
            _check(reader, member, at, rnames, wnames, out, seen)
        return
    if rtype == "union":
        if not any(_matches(member, writer, rnames, wnames) for member in reader):
            out.append(
                f"{where}: written as {_describe(writer)}, which no branch of the"
                f" reader's {_describe(reader)} can read"
            )
            return
        match = next(m for m in reader if _matches(m, writer, rnames, wnames))
        _check(match, writer, at, rnames, wnames, out, seen)
        return
    if rtype != wtype:
        if rtype not in _PROMOTIONS.get(wtype, set()):
            out.append(f"{where}: written as {_describe(writer)}, read as {_describe(reader)}")
        return
    compare = _COMPARE.get(rtype)
    if compare is not None:
        compare(reader, writer, at, rnames, wnames, out, seen)


def _records(reader, writer, at, rnames, wnames, out, seen) -> None:
    where = at or "the record"
    key = (str(reader.get("name")), str(writer.get("name")))
    if key in seen:
        return  # a recursive type already being compared
    seen = {*seen, key}
    if _short(reader) != _short(writer):
        out.append(
            f"{where}: written as record {writer.get('name')}, read as record"
            f" {reader.get('name')} (names must match)"
        )
        return
    written = {}
    for f in writer.get("fields") or []:
        written[f.get("name")] = f
        for alias in f.get("aliases") or []:
            written.setdefault(alias, f)
    for f in reader.get("fields") or []:
        name = f.get("name")
        path = f"{at}.{name}" if at else str(name)
        source = written.get(name) or next(
            (written[a] for a in f.get("aliases") or [] if a in written), None
        )
        if source is None:
            if "default" not in f:
                out.append(
                    f"field {path}: the reader has no default for it, and the writer does"
                    " not write it"
                )
            continue
        _check(f.get("type"), source.get("type"), path, rnames, wnames, out, seen)


def _enums(reader, writer, at, rnames, wnames, out, seen) -> None:
    where = at or "the record"
    if _short(reader) != _short(writer):
        out.append(
            f"{where}: written as enum {writer.get('name')}, read as enum"
            f" {reader.get('name')} (names must match)"
        )
        return
    symbols = reader.get("symbols") or []
    missing = [x for x in writer.get("symbols") or [] if x not in symbols]
    if missing and "default" not in reader:
        out.append(
            f"{where}: the writer's symbols {', '.join(map(str, missing))} are not the"
            " reader's, and it has no default symbol"
        )


def _fixed(reader, writer, at, rnames, wnames, out, seen) -> None:
    if _short(reader) != _short(writer) or reader.get("size") != writer.get("size"):
        out.append(
            f"{at or 'the record'}: written as fixed {writer.get('name')} of"
            f" {writer.get('size')} bytes, read as fixed {reader.get('name')} of"
            f" {reader.get('size')}"
        )


def _arrays(reader, writer, at, rnames, wnames, out, seen) -> None:
    _check(reader.get("items"), writer.get("items"), f"{at}[]", rnames, wnames, out, seen)


def _maps(reader, writer, at, rnames, wnames, out, seen) -> None:
    _check(reader.get("values"), writer.get("values"), f"{at}{{}}", rnames, wnames, out, seen)


# How two types of the same kind are compared, by the reader's type (primitives: equal).
_COMPARE = {
    "record": _records,
    "enum": _enums,
    "fixed": _fixed,
    "array": _arrays,
    "map": _maps,
}


def _short(t: dict) -> str:
    return str(t.get("name", "")).rpartition(".")[2]


def _matches(reader: Any, writer: Any, rnames: _Names, wnames: _Names) -> bool:
    """Whether a reader's union branch is the one Avro picks for this writer type: the same
    kind (and name, for named types), else the first it can be promoted to."""
    reader, writer = rnames.resolve(reader), wnames.resolve(writer)
    rtype, wtype = _type_name(reader), _type_name(writer)
    if rtype == wtype:
        if rtype in ("record", "enum", "fixed"):
            return _short(reader) == _short(writer)
        return True
    return rtype in _PROMOTIONS.get(wtype, set())
