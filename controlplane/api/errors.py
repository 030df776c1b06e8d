"""One error shape for the whole API.

Validation errors are `{"<dotted.field.path>": ["message", ...], ...}` (nested serializer
errors are flattened, so `spec.source.schema` names the exact field); every other error is
`{"detail": "..."}`. An unexpected exception is logged and answered with a JSON 500 carrying
an id to find it in the logs, never a stack trace; an unreachable database is a 503. A body
over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 and any other request Django finds suspicious (too
many form fields or files) a 400: both are raised when the body is read, inside the view. A
JSON body nested too deep, or holding what the control plane cannot store, is refused by the
parser (controlplane.api.parsers) with field errors.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousMultipartForm,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger("controlplane.api")

DATABASE_UNAVAILABLE = (
    "the control plane's database is unavailable; nothing was changed, try again shortly"
)


def flatten(errors, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            name = str(key)
            if name == "non_field_errors" and prefix:
                name = ""
            path = f"{prefix}.{name}" if prefix and name else (prefix or name)
            for sub_path, messages in flatten(value, path).items():
                out.setdefault(sub_path, []).extend(messages)
    elif isinstance(errors, list):
        if all(not isinstance(item, dict | list) for item in errors):
            out[prefix or "non_field_errors"] = [str(item) for item in errors]
        else:
            for i, item in enumerate(errors):
                for sub_path, messages in flatten(item, f"{prefix}[{i}]").items():
                    out.setdefault(sub_path, []).extend(messages)
    else:
        out[prefix or "non_field_errors"] = [str(errors)]
    return out


def too_big_message() -> str:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return (
        f"the request body is larger than {limit:,} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE), the "
        "most this control plane reads; nothing was changed"
    )


def _suspicious(exc: SuspiciousOperation, context) -> Response:
    """Django answers these 400 outside a view; inside one (DRF reads the body there) they
    would be a 500. Logged as Django logs them, under django.security.<kind>."""
    kind = type(exc).__name__
    logging.getLogger(f"django.security.{kind}").warning(
        "%s in %s: %s", kind, type(context.get("view")).__name__, exc
    )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"detail": too_big_message()}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
        )
    # The body's own refusals say what was wrong (too many fields...); any other says nothing
    # (a suspicious file name, say, may name a server path).
    body = isinstance(exc, TooManyFieldsSent | TooManyFilesSent | SuspiciousMultipartForm)
    why = f": {exc}" if body else " as suspicious (the server log says why)"
    return Response({"detail": f"the request was refused{why}"}, status=status.HTTP_400_BAD_REQUEST)


def exception_handler(exc, context):
    if isinstance(exc, SuspiciousOperation):
        return _suspicious(exc, context)
    response = drf_exception_handler(exc, context)
    if response is None and isinstance(exc, DatabaseOperationalError | DatabaseInterfaceError):
        log.warning("database unavailable in %s: %s", context.get("view"), exc)
        return Response(
            {"detail": DATABASE_UNAVAILABLE},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
    if response is None:
        error_id = uuid.uuid4().hex[:12]
        log.exception("unhandled API error %s in %s", error_id, context.get("view"))
        return Response(
            {"detail": f"internal error (id {error_id}); the details are in the server log"},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    if isinstance(exc, ValidationError):
        response.data = flatten(response.data)
    return response
