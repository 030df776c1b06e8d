"""A client of a schema registry's Confluent REST API (Confluent's Schema Registry, Karapace,
Apicurio's `/apis/ccompat/v7`), on requests: what the control plane asks when a spec is saved
(a subject's version, compatibility) and what a driver asks at start (a sink's schema,
registered). Records are decoded by the executors' JVM, which asks by id on its own
(controlplane.spark.ConfluentAvro).

Every request: the connection's authentication, its TLS trust and client certificate, a
timeout, no redirects (a credential goes to the URL it was entered for), answers read up to
MAX_ANSWER_BYTES. Failures are typed (RegistryError's subclasses), never matched by text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

MAX_ANSWER_BYTES = 4 * 1024 * 1024
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(Exception):
    """The registry could not answer what was asked (the message says why, in words)."""


class Unreachable(RegistryError):
    """No answer: down, a timeout, a TLS failure, or a server error (5xx). Waiting may fix it."""


class Refused(RegistryError):
    """401 or 403: the connection's credentials are wrong or may not do this."""


class NotFound(RegistryError):
    """No such subject, version or schema id."""


class Incompatible(RegistryError):
    """409: the schema breaks the subject's compatibility rule."""


class InvalidSchema(RegistryError):
    """422: the registry does not take the schema."""


@dataclass(frozen=True)
class Version:
    subject: str
    version: int
    id: int
    schema: str  # the schema's JSON text


class Registry:
    """One registry connection (jobs.registry.connection.client_arguments)."""

    def __init__(self, arguments: Mapping[str, Any], session=None):
        import requests

        self.url = str(arguments["url"]).rstrip("/")
        self.timeout = float(arguments.get("timeout_seconds") or 10.0)
        self.session = session or requests.Session()
        self.session.headers["Accept"] = CONTENT_TYPE + ", application/json"
        auth = arguments.get("auth") or "none"
        if auth == "basic":
            self.session.auth = (arguments.get("username") or "", arguments.get("password") or "")
        elif auth == "bearer":
            self.session.headers["Authorization"] = f"Bearer {arguments.get('token') or ''}"
        self.session.verify = arguments.get("ca_file") or True
        if arguments.get("cert_file"):
            self.session.cert = (arguments["cert_file"], arguments.get("key_file"))
        self.session.trust_env = False  # no proxies or netrc from the environment

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what is asked ------------------------------------------------------------------

    def subjects(self) -> list[str]:
        return list(self._ask("GET", "/subjects"))

    def schema(self, schema_id: int) -> str:
        """The schema with this id (its JSON text)."""
        return self._ask("GET", f"/schemas/ids/{int(schema_id)}")["schema"]

    def version(self, subject: str, version: int | str = "latest") -> Version:
        """A subject's version (a number, or "latest")."""
        found = self._ask("GET", f"/subjects/{_q(subject)}/versions/{_q(str(version))}")
        return Version(subject, int(found["version"]), int(found["id"]), found["schema"])

    def versions(self, subject: str) -> list[int]:
        return [int(v) for v in self._ask("GET", f"/subjects/{_q(subject)}/versions")]

    def versions_of(self, schema_id: int) -> list[tuple[str, int]]:
        """Every (subject, version) the schema with this id is registered as."""
        found = self._ask("GET", f"/schemas/ids/{int(schema_id)}/versions")
        return [(str(f["subject"]), int(f["version"])) for f in found]

    def lookup(self, subject: str, schema: str) -> Version | None:
        """The version of `subject` that is this schema, or None if it is not registered."""
        try:
            found = self._ask("POST", f"/subjects/{_q(subject)}", {"schema": schema})
        except NotFound:
            return None
        return Version(
            subject, int(found["version"]), int(found["id"]), found.get("schema", schema)
        )

    def register(self, subject: str, schema: str) -> int:
        """The id of `schema` under `subject`, registered if it is not there yet (raises
        Incompatible when the subject's rule refuses it)."""
        return int(self._ask("POST", f"/subjects/{_q(subject)}/versions", {"schema": schema})["id"])

    def compatibility_level(self, subject: str | None = None) -> str:
        """The subject's compatibility rule (the registry's default when it has none, or
        when no subject is named)."""
        found = None
        if subject:
            try:
                found = self._ask("GET", f"/config/{_q(subject)}?defaultToGlobal=true")
            except NotFound:
                found = None
        if found is None:
            found = self._ask("GET", "/config")
        return str(found.get("compatibilityLevel") or found.get("compatibility") or "BACKWARD")

    # -- the request ----------------------------------------------------------------------

    def _ask(self, method: str, path: str, body: Any = None) -> Any:
        import requests

        try:
            response = self.session.request(
                method,
                self.url + path,
                data=json.dumps(body) if body is not None else None,
                headers={"Content-Type": CONTENT_TYPE} if body is not None else None,
                timeout=self.timeout,
                allow_redirects=False,
                stream=True,
            )
        except requests.exceptions.SSLError as exc:
            raise Unreachable(
                f"the registry at {self.url}: TLS failed: {_tls_reason(exc)}"
            ) from None
        except requests.RequestException as exc:
            raise Unreachable(
                f"the registry at {self.url} does not answer ({_short(exc)})"
            ) from None
        try:
            raw = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
        except (requests.RequestException, OSError) as exc:
            raise Unreachable(f"the registry at {self.url} broke off ({_short(exc)})") from None
        finally:
            response.close()
        if len(raw) > MAX_ANSWER_BYTES:
            raise RegistryError(f"the registry's answer is over {MAX_ANSWER_BYTES:,} bytes")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = None
        status = response.status_code
        if 200 <= status < 300 and data is not None:
            return data
        message = data.get("message") if isinstance(data, dict) else None
        what = f"{method} {path.split('?')[0]}: {status}{f' {message}' if message else ''}"
        error = _BY_STATUS.get(status)
        if error is Refused:
            raise Refused(f"the registry refused the connection's credentials ({what})")
        if error is not None:
            raise error(what)
        if status >= 500 or status == 429:
            raise Unreachable(f"the registry at {self.url} failed ({what})")
        if 300 <= status < 400:
            raise RegistryError(f"the registry redirected ({what}); redirects are not followed")
        raise RegistryError(f"the registry answered {what}")


# Confluent's API's answers that mean something of their own.
_BY_STATUS: dict[int, type[RegistryError]] = {
    401: Refused,
    403: Refused,
    404: NotFound,
    409: Incompatible,
    422: InvalidSchema,
}


def _q(part: str) -> str:
    return quote(part, safe="")


def _tls_reason(exc: BaseException) -> str:
    """Why a TLS handshake failed, in words: the ssl module's error found inside what
    requests and urllib3 wrap it in (an untrusted certificate says why, and what to set)."""
    import ssl

    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        found = todo.pop(0)
        if not isinstance(found, BaseException) or id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, ssl.SSLCertVerificationError):
            return (
                f"the server's certificate is not trusted ({found.verify_message}): give the"
                " connection the CA that signed it (ssl_cafile)"
            )
        if isinstance(found, ssl.SSLError):
            return _short(found)
        todo.extend([*found.args, found.__cause__, found.__context__])
        todo.append(getattr(found, "reason", None))  # urllib3's MaxRetryError
    return _short(exc)


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
