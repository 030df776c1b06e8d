"""Export: the control plane's objects as a fleet's files, one object per file
(`pipelines/orders.yaml`), canonical, so that applying them gives a plan that is unchanged
everywhere, and exporting again gives the same bytes.

Secrets are written as the references the files gave (a managed object), or, for a secret
set through a form or the API, as a reference to an environment variable named after it
(`FLEET_SECRET_<OBJECT>_<FIELD>`), listed in the notes: set it in the control plane's
environment before applying.
"""

from __future__ import annotations

import re

import yaml
from django.conf import settings

from controlplane.definitions.models import ManagedObject

from . import documents
from .kinds import KINDS, ORDER


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # never &anchors: the reader refuses them
        return True


def dump(doc: dict) -> str:
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )


def _suggested(name: str, field: str) -> dict:
    text = re.sub(r"[^A-Z0-9]+", "_", f"{name}_{field}".upper()).strip("_")
    return {"env": f"{settings.CONTROLPLANE_FLEET_SECRET_PREFIX}{text}"}


def export(*, fleet: str | None = None, kinds: list[str] | None = None) -> tuple[dict, list]:
    """({path: YAML}, notes): every object (or a fleet's, or some kinds'), sorted by kind and
    name."""
    managed = {(m.kind, m.name): m for m in ManagedObject.objects.all()}
    files: dict[str, str] = {}
    notes: list[str] = []
    for name in ORDER:
        if kinds and name not in kinds:
            continue
        kind = KINDS[name]
        for object_name, instance in sorted(kind.instances().items()):
            row = managed.get((name, object_name))
            if fleet is not None and (row is None or row.fleet != fleet):
                continue
            refs = dict(row.secret_refs) if row is not None else {}
            for field in [f for f in kind.secret_fields(instance) if f not in refs]:
                refs[field] = _suggested(object_name, field.rsplit(".", 1)[-1])
                notes.append(
                    f"{name}/{object_name}: {field} is written as {{env: {refs[field]['env']}}}:"
                    " set that variable in the control plane's environment before applying"
                )
            files[f"{documents.FOLDERS[name]}/{object_name}.yaml"] = dump(
                kind.document(instance, refs)
            )
    return files, notes
