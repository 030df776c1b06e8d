"""Where a files sink writes, as one canonical location, whatever the spelling.

No two pipelines (and no two sinks of one) may write to the same directory or to one inside
the other, and none may write into the control plane's own directories. Comparing the strings
people type misses the same place spelled twice: `HDFS://NN:8020/a` and `hdfs://nn/a/`,
`s3a://b/x/./y` and `s3a://b/x/y`, `%61` and `a`, `a//b` and `a/b`, a symbolic link and its
target. Every such check goes through `location()` here and compares the results with
`Location.overlaps()`; nothing compares paths as text.

The rules lean towards "the same place" when in doubt: a false "overlaps" costs an operator a
different path, a false "apart" lets two pipelines mix their files (and their `_cp_staging`,
`_cp_manifest` and `_cp_dead_letters` bookkeeping).

- Scheme and host are compared lower-case (Hadoop's FileSystem cache keys on them so too).
- Schemes that reach the same store are one: `s3`, `s3n` and `s3a` (a bucket); `abfs`,
  `abfss`, `wasb` and `wasbs` (a container of an account, `.blob.` and `.dfs.` endpoints
  alike). `viewfs`, `webhdfs` and `hdfs` are not merged: which cluster a mount table or an HTTP
  port leads to is configuration this module cannot see.
- Default ports are explicit: `hdfs://nn/` is `hdfs://nn:8020/` (the NameNode's default RPC
  port), `webhdfs` 9870, `swebhdfs` 9871. Buckets and containers are found by name, so a port
  on `s3a`, `gs` or `abfs` is dropped.
- A directory is percent-decoded once. An encoded `/` (`%2F`), an encoded `.` or `..`, or a
  `%` left after decoding (encoded twice, or malformed) is refused: each would mean one
  directory to one reader and another to the next.
- `.` and `..` are resolved and empty directories (`//`, a trailing `/`) dropped; a `..` that
  climbs above the top of the file system, or above the root a path is relative to, is
  refused.
- Local (`file:`) paths are made absolute real paths: symbolic links are followed where they
  exist (`realpath` is a parameter, so that unit tests need no file system).

Plain Python: no Django (it runs in the control plane and could run in the job).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

Realpath = Callable[[str], str]


class LocationError(ValueError):
    """A root or path whose meaning is ambiguous or that leaves where it must stay."""


# Schemes that reach one store, by the name the canonical form uses.
SCHEME_ALIASES = {
    "file": "file",
    "hdfs": "hdfs",
    "viewfs": "viewfs",
    "webhdfs": "webhdfs",
    "swebhdfs": "swebhdfs",
    "s3": "s3a",
    "s3n": "s3a",
    "s3a": "s3a",
    "gs": "gs",
    "abfs": "abfs",
    "abfss": "abfs",
    "wasb": "abfs",
    "wasbs": "abfs",
}
# A missing port means this one (Hadoop 3's defaults).
DEFAULT_PORTS = {"hdfs": 8020, "webhdfs": 9870, "swebhdfs": 9871}
# Stores addressed by a bucket or container name: a port, if any, plays no part.
NAMED_STORES = ("s3a", "gs", "abfs")

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")
_HOST_RE = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9._-]*[a-z0-9])?)$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_CONTAINER_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# An Azure storage account's endpoints: `<account>.blob.<suffix>` and `<account>.dfs.<suffix>`
# reach the same containers (the blob and the Data Lake APIs of one account).
_AZURE_ENDPOINT_RE = re.compile(r"^([a-z0-9]+)\.(blob|dfs)\.(.+)$")


@dataclass(frozen=True, order=True)
class Location:
    """A directory: a store (`scheme://authority`) and the directories down to it."""

    scheme: str
    authority: str
    segments: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/" + "/".join(self.segments)

    def contains(self, other: Location) -> bool:
        """Whether `other` is this directory or inside it."""
        return (self.scheme, self.authority) == (other.scheme, other.authority) and other.segments[
            : len(self.segments)
        ] == self.segments

    def overlaps(self, other: Location) -> bool:
        """The same directory, or one inside the other: a reader of one sees the other's
        files."""
        return self.contains(other) or other.contains(self)

    def child(self, segments: Iterable[str]) -> Location:
        return Location(self.scheme, self.authority, self.segments + tuple(segments))


def location(root: str, path: str = "", *, realpath: Realpath = os.path.realpath) -> Location:
    """Where `path` (relative, under `root`) is: `root` a files connection's root URI
    (`file:///srv/lake`, `hdfs://nn:8020/lake`, `s3a://bucket`). Raises LocationError."""
    base = parse_root(root, realpath=None)
    here = base.child(relative(path))
    if here.scheme == "file":
        return _real(here, realpath)
    return here


def parse_root(root: str, *, realpath: Realpath | None = os.path.realpath) -> Location:
    """A root URI as a canonical Location (symbolic links resolved when `realpath` is given
    and the root is local). Raises LocationError."""
    if not isinstance(root, str) or not root:
        raise LocationError("is empty")
    if any(c.isspace() or not c.isprintable() for c in root):
        raise LocationError("has spaces or control characters")
    raw_scheme, sep, rest = root.partition(":")
    if not sep or not _SCHEME_RE.fullmatch(raw_scheme):
        raise LocationError(f"{root!r} is not a URI (scheme://host/path)")
    scheme = SCHEME_ALIASES.get(raw_scheme.lower())
    if scheme is None:
        raise LocationError(f"scheme {raw_scheme.lower()!r} is not a file system this compares")
    if "?" in rest or "#" in rest:
        raise LocationError("has a ?query or #fragment")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        path = slash + path
    else:
        authority, path = "", rest  # file:/srv/lake, as Hadoop writes local paths
    if not path.startswith("/") and path:
        raise LocationError("has a relative path")
    if scheme == "file":
        if authority.lower() not in ("", "localhost"):
            raise LocationError(f"a local path names no host, not {authority!r}")
        if not path:
            raise LocationError("has no path")
        here = Location("file", "", _resolve(path.split("/"), _TOP))
        return _real(here, realpath) if realpath is not None else here
    return Location(scheme, _authority(scheme, authority), _resolve(path.split("/"), _TOP))


def local(path: str | os.PathLike[str], *, realpath: Realpath = os.path.realpath) -> Location:
    """A local absolute path (a directory of the control plane's own) as a Location."""
    text = os.fspath(path)
    if not text.startswith("/"):
        raise LocationError(f"{text!r} is not an absolute path")
    return _real(Location("file", "", _resolve(text.split("/"), _TOP)), realpath)


def relative(path: str) -> tuple[str, ...]:
    """The directories of a path relative to a root, canonical: decoded once, `.` and `..`
    resolved, empty ones dropped. A `..` above the root, or an absolute path, is refused."""
    if not isinstance(path, str):
        raise LocationError("is not a string")
    if path.startswith("/") or "://" in path:
        raise LocationError(f"{path!r} is not relative")
    if any(c.isspace() or not c.isprintable() for c in path):
        raise LocationError("has spaces or control characters")
    return _resolve(path.split("/"), "the root it is under")


def overlapping(a: Location, b: Location) -> bool:
    return a.overlaps(b)


def files_sinks(spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """(field of its path, sink) for each files sink of a stored spec (`sink` or `sinks`),
    as the API names the field: `sink.path`, `sinks[1].path`. Tolerates any shape (specs
    stored by older versions)."""
    if not isinstance(spec, Mapping):
        return []
    if isinstance(spec.get("sinks"), list) and spec["sinks"]:
        found = [(f"sinks[{j}].path", s) for j, s in enumerate(spec["sinks"])]
    else:
        found = [("sink.path", spec.get("sink"))]
    return [(f, s) for f, s in found if isinstance(s, dict) and s.get("kind") == "files"]


_TOP = "the top of the file system"


def _resolve(parts: list[str], top: str) -> tuple[str, ...]:
    out: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise LocationError(f"has a '..' that climbs above {top}")
            out.pop()
            continue
        out.append(_decode(part))
    return tuple(out)


def _decode(part: str) -> str:
    if "%" not in part:
        return part
    try:
        decoded = unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise LocationError(f"directory {part!r} is not percent-encoded UTF-8") from None
    if "/" in decoded:
        raise LocationError(f"directory {part!r} encodes a '/' (%2F)")
    if decoded in (".", ".."):
        raise LocationError(f"directory {part!r} encodes {decoded!r}")
    if "%" in decoded:
        raise LocationError(f"directory {part!r} is encoded twice or has a stray '%'")
    if not decoded or any(c.isspace() or not c.isprintable() for c in decoded):
        raise LocationError(f"directory {part!r} encodes spaces or control characters")
    return decoded


def _authority(scheme: str, authority: str) -> str:
    if not authority:
        raise LocationError(f"names no host: {scheme}://host/path")
    text = authority.lower()
    if "%" in text:
        raise LocationError(f"host {authority!r} is percent-encoded")
    user, at, hostport = text.rpartition("@")
    if at and (scheme != "abfs" or not _CONTAINER_RE.fullmatch(user)):
        raise LocationError(f"host {authority!r} carries credentials (user@)")
    host, port = hostport, None
    if hostport.startswith("["):
        end = hostport.find("]")
        host, rest = hostport[: end + 1], hostport[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise LocationError(f"host {authority!r} is not host[:port]")
            port = rest[1:]
    elif ":" in hostport:
        host, _, port = hostport.partition(":")
    if not _HOST_RE.fullmatch(host) or (
        port is not None and (not _PORT_RE.fullmatch(port) or not 0 < int(port) < 65536)
    ):
        raise LocationError(f"host {authority!r} is not host[:port]")
    if scheme in NAMED_STORES:
        port = None
        if scheme == "abfs" and (m := _AZURE_ENDPOINT_RE.fullmatch(host)):
            host = f"{m[1]}.dfs.{m[3]}"
    elif port is None and scheme in DEFAULT_PORTS:
        port = str(DEFAULT_PORTS[scheme])
    elif port is not None:
        port = str(int(port))  # 08020 is 8020
    hostport = f"{host}:{port}" if port is not None else host
    return f"{user}@{hostport}" if at else hostport


def _real(here: Location, realpath: Realpath) -> Location:
    """A local Location with symbolic links resolved (where the directories exist)."""
    real = realpath("/" + "/".join(here.segments))
    # The real path's names are the file system's own: taken as they are, never decoded.
    return Location("file", "", tuple(x for x in os.path.normpath(real).split("/") if x))
