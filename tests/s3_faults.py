"""A reverse proxy in front of the S3 server, for fault tests: it passes every request through
to the real server (s3proxy) as it came, or, while `failing` is set, answers each one itself
with an S3 error (503 Slow Down by default), as S3 does when it throttles a prefix.

Requests are passed on with their Host header as the client sent it: AWS signatures (V4)
cover it, and the client signed the proxy's address. Bodies are read whole and passed on
whole (the tests' objects are small); the answer goes back with its status, headers and body.
Standard library only; one thread per connection.
"""

from __future__ import annotations

import http.client
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Not passed on either way: they describe one connection, not the request (RFC 9110 7.6.1).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
SLOW_DOWN = (503, "SlowDown", "Please reduce your request rate.")
INTERNAL = (500, "InternalError", "We encountered an internal error. Please try again.")


class FaultyS3:
    """`FaultyS3(upstream).start()`; `endpoint` is where clients go; `fail(SLOW_DOWN)` /
    `heal()` switch the answers; `failed` counts the requests answered with an error."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.failing: tuple[int, str, str] | None = None
        self.failed = 0
        self.passed = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as clients expect of S3

            def log_message(self, format, *args):
                return  # quiet: a request per line would drown the test's output

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                failing = proxy.failing
                if failing is not None:
                    with proxy._lock:
                        proxy.failed += 1
                    self._error(*failing)
                    return
                with proxy._lock:
                    proxy.passed += 1
                try:
                    self._forward(body)
                except OSError:
                    # The server is not there (or went away mid-answer): the client sees its
                    # connection end, as it would without the proxy.
                    self.close_connection = True

            def _error(self, status: int, code: str, message: str) -> None:
                request_id = uuid.uuid4().hex[:16].upper()
                xml = (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>{message}</Message>"
                    f"<RequestId>{request_id}</RequestId><HostId>faulty-s3</HostId></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("x-amz-request-id", request_id)
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(xml)

            def _forward(self, body: bytes) -> None:
                headers = {
                    name: value
                    for name, value in self.headers.items()
                    if name.lower() not in HOP_BY_HOP and name.lower() != "expect"
                }
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    # skip_host: the client's Host header goes on as it is (it is signed).
                    upstream.putrequest(self.command, self.path, skip_host=True,
                                        skip_accept_encoding=True)  # fmt: skip
                    for name, value in headers.items():
                        upstream.putheader(name, value)
                    upstream.endheaders(body or None)
                    answer = upstream.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for name, value in answer.getheaders():
                        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                            self.send_header(name, value)
                    if self.command == "HEAD":
                        length = answer.getheader("Content-Length")
                        if length is not None:
                            self.send_header("Content-Length", length)
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultyS3:
        self._thread.start()
        return self

    def fail(self, answer: tuple[int, str, str] = SLOW_DOWN) -> None:
        self.failing = answer

    def heal(self) -> None:
        self.failing = None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
