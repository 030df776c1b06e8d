"""Answering 503 (not a 500 page) while the control plane's database cannot be reached."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse

from controlplane.api.errors import DATABASE_UNAVAILABLE

log = logging.getLogger("controlplane.web")


class DatabaseUnavailableMiddleware:
    """Pages (the API has its own handler) that hit a database that is down get a short 503
    with Retry-After, which load balancers and people both understand."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, OperationalError | InterfaceError):
            log.warning("database unavailable for %s: %s", request.path, exception)
            response = HttpResponse(
                DATABASE_UNAVAILABLE, status=503, content_type="text/plain; charset=utf-8"
            )
            response["Retry-After"] = "5"
            return response
        return None
