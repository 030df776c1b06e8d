"""Telling a refused SASL login apart from an unreachable cluster.

kafka-python does not report a failed SASL authentication: the broker answers the login with
an error and closes the connection, and the client takes that for a network failure, retries
until its bootstrap timeout, then says only "Unable to bootstrap". So before a client is made
for a SASL cluster, `check_sasl_login` logs in once itself (SaslHandshake and SaslAuthenticate
on one socket, with kafka-python's own PLAIN and SCRAM implementations): a wrong user name or
password, or a mechanism the broker does not enable, fails at once with a message naming the
broker, the user and the mechanism, never the password. Anything else (no broker answering, a
connection reset, a broker speaking another protocol) is left to the client, which retries
and reports it as usual.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Mapping
from typing import Any

from ..failures import AUTHENTICATION, PermanentError

# Mechanisms checked here (the ones a stored connection may name).
CHECKED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# At most this long, however long the client itself would wait.
MAX_CHECK_SECONDS = 10.0

_SASL_HANDSHAKE, _SASL_AUTHENTICATE = 17, 36
_UNSUPPORTED_SASL_MECHANISM, _ILLEGAL_SASL_STATE, _SASL_AUTHENTICATION_FAILED = 33, 34, 58
_CLIENT_ID = b"controlplane-sasl-check"


class SaslLoginError(PermanentError, RuntimeError):
    """The broker refused the login: wrong user name or password, or a mechanism it does not
    enable. The message names the broker, user and mechanism, never the password."""

    what = "bad credentials"
    category = AUTHENTICATION


class _Inconclusive(Exception):
    """This broker gave no answer about the login (unreachable, closed, not Kafka...)."""


def check_sasl_login(client_config: Mapping[str, Any], timeout: float | None = None) -> None:
    """Raise SaslLoginError if the cluster refuses these SASL credentials; return otherwise
    (credentials accepted, or no broker answered within `timeout`: the client will say why).
    A no-op for configurations without SASL PLAIN or SCRAM."""
    protocol = str(client_config.get("security_protocol", "PLAINTEXT"))
    mechanism = client_config.get("sasl_mechanism")
    if not protocol.startswith("SASL") or mechanism not in CHECKED_MECHANISMS:
        return
    if not client_config.get("sasl_plain_password"):
        raise SaslLoginError(
            f"cannot log in as {describe_login(client_config)}: the connection has no "
            "sasl_password secret"
        )
    if timeout is None:
        timeout = _client_timeout(client_config)
    deadline = time.monotonic() + min(timeout, MAX_CHECK_SECONDS)
    for host, port in _servers(client_config.get("bootstrap_servers")):
        if time.monotonic() >= deadline:
            return
        with contextlib.suppress(_Inconclusive):
            _login(client_config, host, port, deadline)
            return


def describe_login(client_config: Mapping[str, Any]) -> str:
    """'user 'x' with SASL SCRAM-SHA-256': the login, without its password."""
    return (
        f"user {client_config.get('sasl_plain_username')!r} "
        f"with SASL {client_config.get('sasl_mechanism')}"
    )


def _client_timeout(config: Mapping[str, Any]) -> float:
    """As long as the client itself would wait to bootstrap (kafka-python's defaults: 30 s)."""
    bootstrap = config.get("bootstrap_timeout_ms") or 30_000
    return min(bootstrap, config.get("request_timeout_ms") or 30_000) / 1000


def _servers(bootstrap) -> list[tuple[str, int]]:
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    out = []
    for server in bootstrap or ():
        server = server.strip()
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            continue
        out.append((host.strip("[]"), int(port)))
    return out


def _login(config: Mapping[str, Any], host: str, port: int, deadline: float) -> None:
    from kafka.net.sasl import get_sasl_mechanism

    where = f"{host}:{port}"
    name = config["sasl_mechanism"]
    try:
        sock = socket.create_connection((host, port), timeout=_left(deadline))
    except OSError as exc:
        raise _Inconclusive(str(exc)) from None
    try:
        if config.get("security_protocol") == "SASL_SSL":
            sock = _tls(config).wrap_socket(sock, server_hostname=host)
        with sock:
            # SaslHandshake v1: the mechanism; the broker says whether it enables it.
            body = _read(sock, deadline, _request(sock, _SASL_HANDSHAKE, 1, _string(name)))
            error, offered = _handshake_response(body)
            if error == _UNSUPPORTED_SASL_MECHANISM:
                raise SaslLoginError(
                    f"authentication failed: the broker at {where} does not enable SASL "
                    f"mechanism {name} (it offers {', '.join(offered) or 'none'}); "
                    "check sasl_mechanism"
                )
            if error == _ILLEGAL_SASL_STATE:
                raise _Inconclusive("not a SASL listener")  # the client will time out on it
            if error:
                raise _Inconclusive(f"SaslHandshake error {error}")
            client = get_sasl_mechanism(name)(host=host, **dict(config))
            while not client.is_done():
                request = _bytes(client.auth_bytes())
                body = _read(sock, deadline, _request(sock, _SASL_AUTHENTICATE, 1, request))
                error, message, auth_bytes = _authenticate_response(body)
                if error == _SASL_AUTHENTICATION_FAILED:
                    raise SaslLoginError(
                        f"authentication failed: the broker at {where} refused "
                        f"{describe_login(config)}"
                        + (f" ({message})" if message else "")
                        + "; check sasl_username and the sasl_password secret"
                    )
                if error:
                    raise _Inconclusive(f"SaslAuthenticate error {error}: {message}")
                try:
                    client.receive(auth_bytes)
                except ValueError as exc:  # SCRAM: the server's proof does not match
                    raise SaslLoginError(
                        f"authentication failed: the broker at {where} could not prove it "
                        f"knows the credentials of {describe_login(config)} ({exc})"
                    ) from None
            if not client.is_authenticated():
                raise SaslLoginError(
                    f"authentication failed: the broker at {where} refused "
                    f"{describe_login(config)}; check sasl_username and the sasl_password secret"
                )
    except (OSError, struct.error, ValueError, KeyError, IndexError) as exc:
        raise _Inconclusive(str(exc)) from None


def _tls(config: Mapping[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.get("ssl_cafile"))
    if config.get("ssl_certfile"):
        context.load_cert_chain(
            config["ssl_certfile"], config.get("ssl_keyfile"), config.get("ssl_password")
        )
    context.check_hostname = bool(config.get("ssl_check_hostname", True))
    return context


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Inconclusive("timed out")
    return left


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def _bytes(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def _request(sock, api_key: int, version: int, body: bytes) -> int:
    """Send one request (header v1: not a flexible version); returns its correlation id."""
    correlation = api_key  # one request at a time on this socket
    header = struct.pack(">hhih", api_key, version, correlation, len(_CLIENT_ID)) + _CLIENT_ID
    message = header + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    return correlation


def _read(sock, deadline: float, correlation: int) -> bytes:
    """The body of the response to `correlation` (response header v0)."""
    (size,) = struct.unpack(">i", _exactly(sock, 4, deadline))
    if not 4 <= size <= 1 << 20:
        raise _Inconclusive(f"a response of {size} bytes: not a Kafka broker?")
    data = _exactly(sock, size, deadline)
    if struct.unpack(">i", data[:4])[0] != correlation:
        raise _Inconclusive("an answer to another request")
    return data[4:]


def _exactly(sock, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise _Inconclusive("the broker closed the connection")
        out += chunk
    return out


def _handshake_response(body: bytes) -> tuple[int, list[str]]:
    error, count = struct.unpack(">hi", body[:6])
    offered, at = [], 6
    for _ in range(max(0, count)):
        (length,) = struct.unpack(">h", body[at : at + 2])
        offered.append(body[at + 2 : at + 2 + length].decode())
        at += 2 + length
    return error, offered


def _authenticate_response(body: bytes) -> tuple[int, str, bytes]:
    """SaslAuthenticate v1: error code, error message, auth bytes (then a session lifetime)."""
    (error, length) = struct.unpack(">hh", body[:4])
    at = 4
    message = ""
    if length >= 0:
        message = body[at : at + length].decode()
        at += length
    (size,) = struct.unpack(">i", body[at : at + 4])
    at += 4
    return error, message, body[at : at + max(0, size)]
