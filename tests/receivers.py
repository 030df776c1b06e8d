"""An HTTP receiver in the test session, for what the control plane posts out (alert
webhooks, Slack messages): it records each POST, or answers 503 to the next `fail_next`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.posts: list[tuple[str, dict, bytes]] = []
        self.fail_next = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: Receiver = self.server
        if server.fail_next:
            server.fail_next -= 1
            self.send_response(503)
        else:
            server.posts.append((self.path, dict(self.headers), body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass
