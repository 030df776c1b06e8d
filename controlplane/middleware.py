"""Answering 503 at once (not a 500 page, not a hung request) while the control plane's
database cannot be reached."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse

from controlplane import health
from controlplane.api.errors import DATABASE_UNAVAILABLE

log = logging.getLogger("controlplane.web")


class DatabaseUnavailableMiddleware:
    """Pages (the API has its own handler) that hit a database that is down get a short 503
    with Retry-After, which load balancers and people both understand."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        # /healthz checks the database itself (and says more); static files need none.
        self.exempt = ("/healthz", f"/{settings.STATIC_URL.strip('/')}/")

    def __call__(self, request):
        # A database that does not answer (down, or paused and never answering) is found out
        # by one shared check a second (controlplane.health): every request meanwhile gets a
        # 503 at once instead of hanging on the database with the others.
        if not request.path.startswith(self.exempt) and not health.database_answering():
            return self._unavailable(request, "the database does not answer")
        return self.get_response(request)

    def _unavailable(self, request, why) -> HttpResponse:
        log.warning("database unavailable for %s: %s", request.path, why)
        if request.path.startswith("/api/"):
            response = JsonResponse({"detail": DATABASE_UNAVAILABLE}, status=503)
        else:
            response = HttpResponse(
                DATABASE_UNAVAILABLE, status=503, content_type="text/plain; charset=utf-8"
            )
        response["Retry-After"] = "5"
        return response

    def process_exception(self, request, exception):
        if isinstance(exception, OperationalError | InterfaceError):
            return self._unavailable(request, exception)
        return None
