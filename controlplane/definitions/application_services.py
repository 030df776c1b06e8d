"""Defining shared Spark applications: what a definition may say, and creating, changing and
deleting one (each audited in its own transaction, under the application's row lock).

A definition (master, memory, Spark settings, capacity) takes effect at the application's
next start; what runs now is left alone. Which Spark settings an application may be given is
the launcher's allow-list (`supervision.launcher.conf_problem`), passed in by the caller:
this module sits below supervision.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from . import application_audit
from .models import AUTO, DEDICATED, ApplicationStatus, Pipeline, RunState, SparkApplication
from .services import Conflict, Invalid

# Pipelines' placement says "dedicated", "auto" or an application's name: those two words
# cannot be names.
RESERVED_NAMES = (DEDICATED, AUTO)
DEFINITION_FIELDS = application_audit.DEFINITION
MAX_CAPACITY = 1000
MAX_CONF = 50
MAX_CONF_VALUE = 1000

MEMORY = re.compile(r"[1-9][0-9]*[kmgtKMGT]?")
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
_PORT = r"[0-9]{1,5}"
MASTERS = [
    re.compile(r"local"),
    re.compile(r"local\[(?:[1-9][0-9]*|\*)(?:,[1-9][0-9]*)?\]"),
    re.compile(rf"spark://{_HOST}:{_PORT}(?:,{_HOST}:{_PORT})*"),
    re.compile(r"yarn"),
    re.compile(rf"k8s://https://{_HOST}(?::{_PORT})?(?:/[A-Za-z0-9._~/-]*)?"),
]
MASTER_FORMS = (
    "empty (the control plane's), local, local[N], local[N,M], local[*], "
    "spark://host:port[,host:port...], yarn or k8s://https://host[:port]"
)
CONF_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def name_problem(name: str) -> str | None:
    if name in RESERVED_NAMES:
        return f"{name!r} is what a pipeline's placement says for no particular application"
    return None


def memory_problem(value: str, *, required: bool) -> str | None:
    if value == "":
        return "is required, e.g. 2g" if required else None
    if not MEMORY.fullmatch(value):
        return (
            f"{value!r} is not an amount of memory: a whole number, optionally followed by"
            " k, m, g or t (e.g. 512m, 2g)"
        )
    return None


def master_problem(value: str) -> str | None:
    if value == "":
        return None
    if any(c.isspace() for c in value):
        return "must not contain whitespace"
    if any(c in value for c in "'\"`"):
        return "must not contain quotes"
    if value.startswith("-"):
        return "must not start with '-'"
    for form in MASTERS:
        match = form.fullmatch(value)
        if match:
            ports = re.findall(r":([0-9]{1,5})(?=,|/|$)", value.split("://", 2)[-1])
            if any(not 1 <= int(p) <= 65535 for p in ports):
                return f"{value!r} has a port outside 1-65535"
            return None
    return f"{value!r} is not a Spark master this control plane accepts: {MASTER_FORMS}"


def clean_conf(conf: Any, key_problem: Callable[[str], str | None]) -> dict[str, str]:
    """The Spark settings as spark-submit takes them (every value a string; booleans
    `true`/`false`); raises Invalid("conf", ...) naming each refused key."""
    if not isinstance(conf, dict):
        raise Invalid("conf", "must be an object of Spark setting names to values")
    if len(conf) > MAX_CONF:
        raise Invalid("conf", f"at most {MAX_CONF} settings; got {len(conf)}")
    out: dict[str, str] = {}
    problems: dict[str, list[str]] = {}
    for key, value in conf.items():
        if not isinstance(key, str) or not CONF_KEY.fullmatch(key):
            problems[str(key)] = [f"{key!r} is not a Spark setting's name"]
            continue
        if problem := key_problem(key):
            problems[key] = [f"{key} {problem}"]
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                problems[key] = ["must be a finite number"]
                continue
            text = str(int(value)) if value.is_integer() else str(value)
        elif isinstance(value, str):
            text = value
        else:
            problems[key] = ["must be a string, a number or a boolean"]
            continue
        if len(text) > MAX_CONF_VALUE:
            problems[key] = [f"at most {MAX_CONF_VALUE} characters"]
        elif _CONTROL.search(text):
            problems[key] = ["must not contain control characters (line breaks, tabs)"]
        else:
            out[key] = text
    if problems:
        raise Invalid("conf", problems)
    return out


# -- changes --------------------------------------------------------------------------------


def create_application(*, name: str, user=None, **definition: Any) -> SparkApplication:
    """Create it (wanted running: the reconciler starts it within seconds), audited."""
    unknown = set(definition) - set(DEFINITION_FIELDS)
    if unknown:
        raise TypeError(f"not part of a definition: {sorted(unknown)}")
    if problem := name_problem(name):
        raise Invalid("name", problem)
    try:
        with transaction.atomic():
            app = SparkApplication.objects.create(name=name, created_by=user, **definition)
            application_audit.record(
                name,
                "application-create",
                user=user,
                before={},
                after=application_audit.snapshot(app),
            )
    except IntegrityError:
        raise Conflict(f"an application named {name!r} already exists") from None
    return app


def update_application(
    app: SparkApplication, *, user=None, reason: str = "", **definition: Any
) -> SparkApplication:
    """Change its definition (what is given and differs), audited; it takes effect at the
    application's next start. Only those fields are written: what the reconciler records
    meanwhile (status, process, measurements) is never overwritten."""
    unknown = set(definition) - set(DEFINITION_FIELDS)
    if unknown:
        raise TypeError(f"not part of a definition: {sorted(unknown)}")
    with transaction.atomic():
        current = SparkApplication.objects.select_for_update().filter(pk=app.pk).first()
        if current is None:
            raise Conflict(f"application {app.name!r} was deleted meanwhile")
        changed = {k: v for k, v in definition.items() if getattr(current, k) != v}
        if changed:
            before = application_audit.snapshot(current)
            SparkApplication.objects.filter(pk=current.pk).update(
                **changed, updated_at=timezone.now()
            )
            current.refresh_from_db()
            application_audit.record(
                current.name,
                "application-update",
                user=user,
                reason=reason,
                before=before,
                after=application_audit.snapshot(current),
            )
    return current


def delete_application(app: SparkApplication, *, user=None, reason: str = "") -> bool:
    """Delete an application no pipeline is placed in by name, with no active run and no
    process, audited. Refused with Conflict saying what holds it; False if it was gone."""
    with transaction.atomic():
        current = SparkApplication.objects.select_for_update().filter(pk=app.pk).first()
        if current is None:
            return False
        if refusal := deletion_refusal(current):
            raise Conflict(refusal)
        application_audit.record(
            current.name,
            "application-delete",
            user=user,
            reason=reason,
            before=application_audit.snapshot(current),
            after={},
        )
        current.delete()
    return True


def deletion_refusal(app: SparkApplication) -> str | None:
    """Why the application cannot be deleted now, or None."""
    naming = _names(Pipeline.objects.filter(placement=app.name))
    if naming:
        return (
            f"application {app.name!r} is the placement of {listed(naming)}:"
            " place them elsewhere first"
        )
    active = _names(
        Pipeline.objects.filter(runs__application=app, runs__state__in=RunState.active())
    )
    if active:
        return (
            f"application {app.name!r} still runs the queries of {listed(active)}: stop them first"
        )
    if app.pid is not None or app.status not in (
        ApplicationStatus.STOPPED,
        ApplicationStatus.RESTARTING,
    ):
        where = f" (process {app.pid} on {app.host})" if app.pid is not None else ""
        return (
            f"application {app.name!r} is {app.status}{where}: stop it first, and delete it"
            " once it is stopped"
        )
    return None


def _names(pipelines) -> list[str]:
    return sorted(set(pipelines.values_list("name", flat=True)))


def listed(names: list[str], noun: str = "pipeline", most: int = 10) -> str:
    """ "2 pipelines (a, b)", at most `most` names shown."""
    shown = ", ".join(names[:most])
    if len(names) > most:
        shown += f" and {len(names) - most} more"
    return f"{len(names)} {noun}{'s' if len(names) != 1 else ''} ({shown})"
