"""Where checkpoints and restore points live: one interface over the local disk, HDFS and S3.

Spark writes checkpoints through Hadoop's FileSystem (`/path` or `file:`, `hdfs://`,
`s3a://`); the control plane and the drivers' Python side read and change them through this
module, without a JVM, on fsspec:

* local paths: fsspec's local file system; a copy shares the files' data through hard links
  (checkpoint files are written once and never changed);
* `hdfs://`: WebHDFS, over `requests` (already ours), one NameNode HTTP address from the
  settings (`hdfs_http`); every request has a connect and a read timeout, so a slow or
  stopped NameNode fails a call in bounded time instead of hanging a request or a reconcile
  tick. Chosen over hdfs-native (native RPC, a Rust wheel) because it needs nothing native
  and its timeouts are plain HTTP ones; its cost is that data goes through the DataNodes'
  HTTP port, which the control plane must reach (it is small: a checkpoint's log files);
* `s3a://`: s3fs (botocore), the bucket from the URI, endpoint and keys from the settings,
  bounded timeouts and retries; copies are server-side (CopyObject), never through here.

Paths in and out are URIs as Spark spells them (`hdfs://nn:8020/a/b`, `s3a://bucket/a/b`,
or a local path), so what the control plane stores is what a driver is given.

Errors: a store that cannot be reached or does not answer in time raises StorageError (an
OSError) naming the store; a missing file raises FileNotFoundError. Plain Python: no Django.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import requests

# A file the control plane reads whole (a log entry, a pin, metadata) is small; one larger
# than this is not a checkpoint's and is not read into memory.
MAX_READ_BYTES = 16 * 1024 * 1024
# How long a store that did not answer is left alone (calls fail at once meanwhile).
UNREACHABLE_SECONDS = 10.0
DID_NOT_ANSWER = "did not answer in time"
COULD_NOT_CONNECT = "could not connect"
LOCAL_SCHEMES = ("", "file")
HDFS_SCHEMES = ("hdfs",)
S3_SCHEMES = ("s3a", "s3", "s3n")


class StorageError(OSError):
    """The store could not be reached, or did not answer in time, or refused the request."""


@dataclass(frozen=True)
class StorageSettings:
    """How to reach the stores a checkpoint root may name (the control plane's settings)."""

    hdfs_http: str | None = None  # host:port of the NameNode's HTTP server (WebHDFS)
    hdfs_user: str | None = None  # the user name WebHDFS acts as (simple authentication)
    s3_endpoint: str | None = None  # http(s)://host:port; None: AWS's own
    s3_region: str = "us-east-1"
    s3_access_key: str | None = field(default=None, repr=False)
    s3_secret_key: str | None = field(default=None, repr=False)
    s3_path_style: bool = True
    timeout: float = 10.0  # seconds, per request (connect and read each)

    def for_driver(self, checkpoint_root: str) -> dict:
        """What a driver is given (in its 0600 run.json/app.json, never on a command line):
        jobs.hadoop turns it into its Spark session's Hadoop settings, and the driver's
        Python side opens the same stores with it (from_driver_config)."""
        return {
            "checkpoint_root": checkpoint_root,
            "hdfs": {"http": self.hdfs_http, "user": self.hdfs_user} if self.hdfs_http else None,
            "s3": (
                {
                    "endpoint": self.s3_endpoint,
                    "region": self.s3_region,
                    "path_style": self.s3_path_style,
                    "access_key": self.s3_access_key,
                    "secret_key": self.s3_secret_key,
                }
                if self.s3_access_key or self.s3_endpoint
                else None
            ),
            "timeout_seconds": self.timeout,
        }

    @classmethod
    def from_driver_config(cls, data: dict | None) -> StorageSettings:
        data = data or {}
        hdfs = data.get("hdfs") or {}
        s3 = data.get("s3") or {}
        return cls(
            hdfs_http=hdfs.get("http"),
            hdfs_user=hdfs.get("user"),
            s3_endpoint=s3.get("endpoint"),
            s3_region=s3.get("region") or "us-east-1",
            s3_access_key=s3.get("access_key"),
            s3_secret_key=s3.get("secret_key"),
            s3_path_style=bool(s3.get("path_style", True)),
            timeout=float(data.get("timeout_seconds") or 10.0),
        )


@dataclass(frozen=True)
class Entry:
    path: str  # a URI (or local path), as given to Storage
    name: str
    is_dir: bool
    size: int
    mtime: datetime | None


def scheme_of(uri: str | os.PathLike) -> str:
    """The store a location is on: "file", "hdfs" or "s3a" (raises ValueError for others)."""
    text = os.fspath(uri)
    scheme = urlsplit(text).scheme.lower() if "://" in text or text.startswith("file:") else ""
    if scheme in LOCAL_SCHEMES:
        return "file"
    if scheme in HDFS_SCHEMES:
        return "hdfs"
    if scheme in S3_SCHEMES:
        return "s3a"
    raise ValueError(f"{text!r}: checkpoints may be on a local path, hdfs:// or s3a://")


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base` with `parts` appended, '/'-separated, whatever the store."""
    text = os.fspath(base).rstrip("/") or "/"
    for part in parts:
        text = f"{text.rstrip('/')}/{part.strip('/')}"
    return text


def parent(uri: str) -> str:
    head, _, _ = uri.rstrip("/").rpartition("/")
    return head


def basename(uri: str) -> str:
    return uri.rstrip("/").rpartition("/")[2]


class Storage:
    """One store. Every method takes locations as the URIs (or local paths) Spark uses.

    A store that did not answer (or refused the connection) is not asked again for
    UNREACHABLE_SECONDS: every call meanwhile fails at once with the same words, so that a
    round over many pipelines (the metrics collector, the reconciler) is not held up by one
    timeout per pipeline while HDFS or S3 is down."""

    scheme = "file"

    def __init__(self, settings: StorageSettings):
        self.settings = settings
        self._down_until = 0.0
        self._down_because = ""

    def _check_reachable(self) -> None:
        if self._down_until and time.monotonic() < self._down_until:
            raise StorageError(errno.EHOSTDOWN, self._down_because)

    def _unreachable(self, message: str) -> StorageError:
        """Remember that the store is down (message said), for UNREACHABLE_SECONDS."""
        self._down_until = time.monotonic() + UNREACHABLE_SECONDS
        self._down_because = f"{message} (not asked again for {UNREACHABLE_SECONDS:g} s)"
        return StorageError(errno.EHOSTDOWN, message)

    # -- reading ---------------------------------------------------------------------------
    def exists(self, uri: str) -> bool:
        raise NotImplementedError

    def is_dir(self, uri: str) -> bool:
        raise NotImplementedError

    def list(self, uri: str) -> list[Entry]:
        """The entries directly in directory `uri`; [] if it does not exist."""
        raise NotImplementedError

    def read_bytes(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes:
        raise NotImplementedError

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode()

    def walk(self, uri: str) -> Iterator[Entry]:
        """Every file under `uri`, at any depth (none if it does not exist)."""
        for entry in self.list(uri):
            if entry.is_dir:
                yield from self.walk(entry.path)
            else:
                yield entry

    def tree_size(self, uri: str) -> tuple[int, int]:
        """Bytes and files under `uri`."""
        total = files = 0
        for entry in self.walk(uri):
            total += entry.size
            files += 1
        return total, files

    # -- writing ---------------------------------------------------------------------------
    def write_text(self, uri: str, text: str) -> None:
        """Write a small file whole, replacing it: readers see the old or the new content
        (local and HDFS: a temporary file renamed into place; S3: one PUT)."""
        raise NotImplementedError

    def makedirs(self, uri: str) -> None:
        raise NotImplementedError

    def remove(self, uri: str) -> None:
        """Remove a file (gone already: fine)."""
        raise NotImplementedError

    def remove_tree(self, uri: str) -> None:
        """Remove a directory and everything in it (gone already: fine)."""
        raise NotImplementedError

    def move_tree(self, source: str, target: str) -> None:
        """Move directory `source` to `target` (which must not exist; its parent is
        created). Local and HDFS: one rename. S3: server-side copies, then deletes."""
        raise NotImplementedError

    def copy_tree(self, source: str, target: str, *, skip=None) -> None:
        """Copy the files under `source` to `target` (created), leaving out those whose name
        `skip(name)` is true; files gone meanwhile are passed over (the running query
        cleans up old batches). As cheap as the store allows: hard links (local),
        server-side copies (S3), streams through the DataNodes (HDFS)."""
        raise NotImplementedError


# -- the local file system -------------------------------------------------------------------


def _local(uri: str) -> str:
    text = os.fspath(uri)
    if text.startswith("file:"):
        return urlsplit(text).path or "/"
    return text


def _from_timestamp(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds is not None else None


class LocalStorage(Storage):
    scheme = "file"

    def exists(self, uri: str) -> bool:
        return os.path.exists(_local(uri))

    def is_dir(self, uri: str) -> bool:
        return os.path.isdir(_local(uri))

    def list(self, uri: str) -> list[Entry]:
        out = []
        try:
            scanned = list(os.scandir(_local(uri)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        for item in scanned:
            try:
                stat = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            is_dir = item.is_dir(follow_symlinks=False)
            if not is_dir and not item.is_file(follow_symlinks=False):
                continue  # no symbolic links or devices: Spark writes neither
            out.append(
                Entry(
                    path=join(uri, item.name),
                    name=item.name,
                    is_dir=is_dir,
                    size=0 if is_dir else stat.st_size,
                    mtime=_from_timestamp(stat.st_mtime),
                )
            )
        return sorted(out, key=lambda e: e.name)

    def read_bytes(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes:
        with open(_local(uri), "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise StorageError(errno.EFBIG, f"{uri}: larger than {limit} bytes")
        return data

    def write_text(self, uri: str, text: str) -> None:
        path = Path(_local(uri))
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)

    def makedirs(self, uri: str) -> None:
        os.makedirs(_local(uri), exist_ok=True)

    def remove(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_local(uri))

    def remove_tree(self, uri: str) -> None:
        shutil.rmtree(_local(uri), ignore_errors=True)

    def move_tree(self, source: str, target: str) -> None:
        os.makedirs(os.path.dirname(_local(target)), exist_ok=True)
        os.rename(_local(source), _local(target))

    def copy_tree(self, source: str, target: str, *, skip=None) -> None:
        _link_tree(Path(_local(source)), Path(_local(target)), skip)


def _link_tree(source: Path, target: Path, skip) -> None:
    target.mkdir(mode=0o700, parents=True)
    # Files before directories, and RocksDB's shared SST files last: a snapshot (V.zip) that
    # appears while the tree is walked then finds the SST files it refers to.
    try:
        entries = sorted(
            os.scandir(source),
            key=lambda e: (e.is_dir(follow_symlinks=False), e.name == "SSTs", e.name),
        )
    except FileNotFoundError:
        return
    for entry in entries:
        if skip is not None and skip(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            _link_tree(Path(entry.path), target / entry.name, skip)
        elif entry.is_file(follow_symlinks=False):
            try:
                _link(Path(entry.path), target / entry.name)
            except FileNotFoundError:
                continue  # cleaned up by the running query meanwhile (an old batch)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(source, target)


# -- HDFS, over WebHDFS ------------------------------------------------------------------------


class _TimedSession(requests.Session):
    """A requests session whose every request has the store's timeouts (requests has no
    default: a NameNode that accepts and never answers would hang the caller)."""

    def __init__(self, timeout: float):
        super().__init__()
        self.timeout = timeout

    def request(self, method, url, **kwargs):
        kwargs.setdefault("timeout", (self.timeout, self.timeout))
        return super().request(method, url, **kwargs)


class HdfsStorage(Storage):
    """HDFS through the NameNode's WebHDFS REST API (fsspec's webhdfs), every request timed.
    Locations are `hdfs://authority/path` as Spark uses them; the authority is Spark's (RPC)
    and the HTTP address comes from the settings (one HDFS cluster per control plane)."""

    scheme = "hdfs"

    def __init__(self, settings: StorageSettings):
        super().__init__(settings)
        if not settings.hdfs_http:
            raise StorageError(
                errno.EINVAL,
                "hdfs:// locations need the NameNode's HTTP address"
                " (CONTROLPLANE_HDFS_HTTP_ADDRESS)",
            )
        from fsspec.implementations.webhdfs import WebHDFS

        host, _, port = settings.hdfs_http.rpartition(":")
        self.fs = WebHDFS(
            host=host,
            port=int(port),
            user=settings.hdfs_user or _os_user(),
            skip_instance_cache=True,
        )
        self.fs.session = _TimedSession(settings.timeout)
        self.address = settings.hdfs_http

    def _path(self, uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme.lower() not in HDFS_SCHEMES:
            raise ValueError(f"{uri!r} is not an hdfs:// location")
        return parts.path or "/"

    def _call(self, op: str, uri: str, method: str = "get", **params) -> requests.Response:
        self._check_reachable()
        try:
            return self.fs._call(op, method=method, path=self._path(uri), **params)
        except FileNotFoundError:
            raise
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise self._unreachable(
                f"HDFS at {self.address}: {op} {self._path(uri)}: {_brief(exc)}"
            ) from None
        except (requests.RequestException, RuntimeError, ValueError) as exc:
            raise StorageError(
                errno.EIO, f"HDFS at {self.address}: {op} {self._path(uri)}: {_brief(exc)}"
            ) from None
        except PermissionError as exc:
            raise StorageError(errno.EACCES, f"HDFS at {self.address}: {_brief(exc)}") from None

    def _status(self, uri: str) -> dict | None:
        try:
            return self._call("GETFILESTATUS", uri).json()["FileStatus"]
        except FileNotFoundError:
            return None

    def exists(self, uri: str) -> bool:
        return self._status(uri) is not None

    def is_dir(self, uri: str) -> bool:
        status = self._status(uri)
        return status is not None and status.get("type") == "DIRECTORY"

    def list(self, uri: str) -> list[Entry]:
        try:
            statuses = self._call("LISTSTATUS", uri).json()["FileStatuses"]["FileStatus"]
        except FileNotFoundError:
            return []
        out = []
        for status in statuses:
            name = status["pathSuffix"]
            out.append(
                Entry(
                    path=join(uri, name),
                    name=name,
                    is_dir=status.get("type") == "DIRECTORY",
                    size=int(status.get("length") or 0),
                    mtime=_from_timestamp(status["modificationTime"] / 1000)
                    if status.get("modificationTime")
                    else None,
                )
            )
        return sorted(out, key=lambda e: e.name)

    def read_bytes(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes:
        response = self._call("OPEN", uri, length=limit + 1)
        if len(response.content) > limit:
            raise StorageError(errno.EFBIG, f"{uri}: larger than {limit} bytes")
        return response.content

    def _create(self, uri: str, data: bytes) -> None:
        """One file, written in one request pair (CREATE, then its data to the DataNode)."""
        response = self._call("CREATE", uri, method="put", overwrite="true", redirect=False)
        location = response.headers.get("Location")
        try:
            if location:
                self.fs.session.put(
                    location, data=data, headers={"content-type": "application/octet-stream"}
                ).raise_for_status()
        except requests.RequestException as exc:
            raise StorageError(
                errno.EIO, f"HDFS at {self.address}: writing {self._path(uri)}: {_brief(exc)}"
            ) from None

    def _rename(self, source: str, target: str) -> None:
        answer = self._call("RENAME", source, method="put", destination=self._path(target))
        if not answer.json().get("boolean"):
            raise StorageError(
                errno.EEXIST,
                f"HDFS at {self.address}: could not rename {self._path(source)} to "
                f"{self._path(target)} (the target exists, or the source is gone)",
            )

    def write_text(self, uri: str, text: str) -> None:
        temporary = join(parent(uri), f".{basename(uri)}.{uuid.uuid4().hex[:8]}.tmp")
        self._create(temporary, text.encode())
        # WebHDFS's RENAME does not overwrite: the old file goes first (a reader in between
        # finds none, as it would before the first write).
        self.remove(uri)
        self._rename(temporary, uri)

    def makedirs(self, uri: str) -> None:
        self._call("MKDIRS", uri, method="put")

    def remove(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("DELETE", uri, method="delete", recursive="false")

    def remove_tree(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("DELETE", uri, method="delete", recursive="true")

    def move_tree(self, source: str, target: str) -> None:
        # HDFS renames a directory onto an existing one into it: refused here instead.
        if self.exists(target):
            raise StorageError(errno.EEXIST, f"HDFS at {self.address}: {self._path(target)} exists")
        self.makedirs(parent(target))
        self._rename(source, target)

    def copy_tree(self, source: str, target: str, *, skip=None) -> None:
        self.makedirs(target)
        entries = sorted(self.list(source), key=lambda e: (e.is_dir, e.name == "SSTs", e.name))
        for entry in entries:
            if skip is not None and skip(entry.name):
                continue
            if entry.is_dir:
                self.copy_tree(entry.path, join(target, entry.name), skip=skip)
                continue
            try:
                data = self._call("OPEN", entry.path).content
            except FileNotFoundError:
                continue
            self._create(join(target, entry.name), data)

    # -- snapshots (restore points that cost the NameNode a few bytes) -----------------------
    def allow_snapshots(self, uri: str) -> None:
        """Make directory `uri` snapshottable (an HDFS superuser's right)."""
        self._call("ALLOWSNAPSHOT", uri, method="put")

    def create_snapshot(self, uri: str, name: str) -> str:
        """Snapshot directory `uri`; returns the snapshot's location (read-only)."""
        self._call("CREATESNAPSHOT", uri, method="put", snapshotname=name)
        return join(uri, ".snapshot", name)

    def snapshots(self, uri: str) -> list[str]:
        """The names of directory `uri`'s snapshots ([] if it is not snapshottable)."""
        status = self._status(uri)
        if not status or not status.get("snapshotEnabled"):
            return []
        return [entry.name for entry in self.list(join(uri, ".snapshot"))]

    def delete_snapshot(self, uri: str, name: str) -> None:
        """Delete snapshot `name` of directory `uri` (gone already: fine)."""
        if self.exists(join(uri, ".snapshot", name)):
            self._call("DELETESNAPSHOT", uri, method="delete", snapshotname=name)


def _os_user() -> str:
    import getpass

    return getpass.getuser()


def _brief(exc: BaseException) -> str:
    """An exception in one line, without a stack trace or a URL's query (WebHDFS puts the
    user name there; S3's presigned forms, keys)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    timeouts: tuple[type[BaseException], ...] = (requests.Timeout, TimeoutError)
    refused: tuple[type[BaseException], ...] = (requests.ConnectionError, ConnectionError)
    with contextlib.suppress(ImportError):
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError
        from botocore.exceptions import ReadTimeoutError as BotoReadTimeout

        timeouts += (ConnectTimeoutError, BotoReadTimeout)
        refused += (EndpointConnectionError,)
    if isinstance(exc, timeouts):
        return DID_NOT_ANSWER
    if isinstance(exc, refused):
        return COULD_NOT_CONNECT
    return text.split("?", 1)[0][:300]


# -- S3 ------------------------------------------------------------------------------------


class S3Storage(Storage):
    """An S3 (or S3-compatible) store through s3fs; `s3a://bucket/key` as Spark spells it."""

    scheme = "s3a"

    def __init__(self, settings: StorageSettings):
        super().__init__(settings)
        import s3fs

        client = {"region_name": settings.s3_region}
        if settings.s3_endpoint:
            client["endpoint_url"] = settings.s3_endpoint
        config = {
            "connect_timeout": settings.timeout,
            "read_timeout": settings.timeout,
            "retries": {"max_attempts": 2, "mode": "standard"},
        }
        if settings.s3_path_style:
            config["s3"] = {"addressing_style": "path"}
        self.fs = s3fs.S3FileSystem(
            key=settings.s3_access_key,
            secret=settings.s3_secret_key,
            anon=not settings.s3_access_key,
            client_kwargs=client,
            config_kwargs=config,
            skip_instance_cache=True,
            use_listings_cache=False,
        )
        self.fs.retries = 2  # s3fs's own loop around botocore's (5 by default)
        self.endpoint = settings.s3_endpoint or "AWS S3"

    @staticmethod
    def _key(uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme.lower() not in S3_SCHEMES:
            raise ValueError(f"{uri!r} is not an s3a:// location")
        return f"{parts.netloc}{parts.path}".rstrip("/")

    def _uri(self, key: str, like: str) -> str:
        scheme = urlsplit(like).scheme
        return f"{scheme}://{key}"

    @contextlib.contextmanager
    def _errors(self, what: str):
        self._check_reachable()
        try:
            yield
        except FileNotFoundError:
            raise
        except StorageError:
            raise
        except (OSError, Exception) as exc:  # botocore, aiohttp and s3fs errors alike
            brief = _brief(exc)
            if brief in (DID_NOT_ANSWER, COULD_NOT_CONNECT):
                raise self._unreachable(f"S3 at {self.endpoint}: {what}: {brief}") from None
            if isinstance(exc, PermissionError):
                raise StorageError(
                    errno.EACCES, f"S3 at {self.endpoint}: {what}: refused"
                ) from None
            raise StorageError(errno.EIO, f"S3 at {self.endpoint}: {what}: {_brief(exc)}") from None

    def exists(self, uri: str) -> bool:
        with self._errors(f"looking up {self._key(uri)}"):
            return self.fs.exists(self._key(uri))

    def is_dir(self, uri: str) -> bool:
        with self._errors(f"looking up {self._key(uri)}"):
            return self.fs.isdir(self._key(uri))

    def list(self, uri: str) -> list[Entry]:
        key = self._key(uri)
        try:
            with self._errors(f"listing {key}"):
                found = self.fs.ls(key, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        out = []
        for info in found:
            name = info["name"].rstrip("/").rpartition("/")[2]
            if info["name"].rstrip("/") == key:
                continue  # the directory's own marker object
            is_dir = info.get("type") == "directory"
            modified = info.get("LastModified")
            out.append(
                Entry(
                    path=join(uri, name),
                    name=name,
                    is_dir=is_dir,
                    size=0 if is_dir else int(info.get("size") or 0),
                    mtime=modified if isinstance(modified, datetime) else None,
                )
            )
        return sorted(out, key=lambda e: e.name)

    def walk(self, uri: str) -> Iterator[Entry]:
        # One listing of the whole prefix (no directories on S3).
        key = self._key(uri)
        try:
            with self._errors(f"listing {key}"):
                found = self.fs.find(key, detail=True, withdirs=False)
        except FileNotFoundError:
            return
        for name, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            modified = info.get("LastModified")
            yield Entry(
                path=join(uri, name[len(key) :]) if name.startswith(key + "/") else uri,
                name=name.rpartition("/")[2],
                is_dir=False,
                size=int(info.get("size") or 0),
                mtime=modified if isinstance(modified, datetime) else None,
            )

    def read_bytes(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes:
        key = self._key(uri)
        with self._errors(f"reading {key}"):
            data = self.fs.cat_file(key, start=0, end=limit + 1)
        if len(data) > limit:
            raise StorageError(errno.EFBIG, f"{uri}: larger than {limit} bytes")
        return data

    def write_text(self, uri: str, text: str) -> None:
        key = self._key(uri)
        with self._errors(f"writing {key}"):
            self.fs.pipe_file(key, text.encode())

    def makedirs(self, uri: str) -> None:
        return  # S3 has no directories: a prefix exists once something is under it

    def remove(self, uri: str) -> None:
        key = self._key(uri)
        with contextlib.suppress(FileNotFoundError), self._errors(f"deleting {key}"):
            self.fs.rm_file(key)

    def remove_tree(self, uri: str) -> None:
        key = self._key(uri)
        with contextlib.suppress(FileNotFoundError), self._errors(f"deleting {key}/"):
            if self.fs.find(key):
                self.fs.rm(key, recursive=True)

    def copy_tree(self, source: str, target: str, *, skip=None) -> None:
        source_key, target_key = self._key(source), self._key(target)
        # SST files last, as on the other stores: a RocksDB snapshot found finds its files.
        files = sorted(self.walk(source), key=lambda e: ("/SSTs/" in e.path, e.path))
        for entry in files:
            relative = entry.path[len(source.rstrip("/")) + 1 :]
            if skip is not None and any(skip(part) for part in relative.split("/")):
                continue
            try:
                with self._errors(f"copying {source_key}/{relative}"):
                    self.fs.copy(f"{source_key}/{relative}", f"{target_key}/{relative}")
            except FileNotFoundError:
                continue

    def move_tree(self, source: str, target: str) -> None:
        if any(True for _ in self.walk(target)):
            raise StorageError(errno.EEXIST, f"{target}: exists")
        self.copy_tree(source, target)
        self.remove_tree(source)


# -- opening a store ---------------------------------------------------------------------------

_KINDS: dict[str, type[Storage]] = {"file": LocalStorage, "hdfs": HdfsStorage, "s3a": S3Storage}
_OPEN: dict[tuple, Storage] = {}
_OPEN_GUARD = threading.Lock()


def storage_for(uri: str | os.PathLike, settings: StorageSettings | None = None) -> Storage:
    """The store `uri` is on, opened with `settings` (kept per process: a forked Celery
    worker opens its own, never its parent's connections)."""
    settings = settings or StorageSettings()
    kind = scheme_of(uri)
    key = (kind, settings, os.getpid())
    with _OPEN_GUARD:
        found = _OPEN.get(key)
        if found is None:
            found = _OPEN[key] = _KINDS[kind](settings)
        return found
