"""One error shape for the whole API.

Validation errors are `{"<dotted.field.path>": ["message", ...], ...}` (nested serializer
errors are flattened, so `spec.source.schema` names the exact field); every other error is
`{"detail": "..."}`. An unexpected exception is logged and answered with a JSON 500 carrying
an id to find it in the logs, never a stack trace; an unreachable database is a 503.
"""

from __future__ import annotations

import logging
import uuid

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


def exception_handler(exc, context):
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
