"""Clients of the API and the pages as each kind of caller (a role's user, a driver with its
run token), and what they send: the pipeline form's fields, a driver's progress reports."""

from __future__ import annotations

import re

from django.test import Client
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import set_role
from controlplane.pages import forms

# -- clients ----------------------------------------------------------------------------------


def client_as(django_user_model, role: str) -> APIClient:
    """An API client with a token of a new user of `role`."""
    user = django_user_model.objects.create_user(username=f"r-{role}", password="x-not-used-1")
    set_role(user, role)
    _, key = ApiToken.issue(user, "t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def client_with(django_user_model, role: str | None) -> Client:
    """A signed-in page client of a user of `role` (None: no role)."""
    user, _ = django_user_model.objects.get_or_create(username=f"page-{role}")
    set_role(user, role)
    client = Client()
    client.force_login(user)
    return client


def driver(token: str) -> APIClient:
    """A driver's client: its run token."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"RunToken {token}")
    return client


# -- the pipeline form ------------------------------------------------------------------------


def form_for(spec: dict, **changes) -> dict:
    """The pipeline form's fields for `spec`, as the edit page fills them, with changes."""
    values = forms.pipeline_values("orders", "", spec)
    values.update(changes)
    return {k: v for k, v in values.items() if v not in ("", False)}


def field_errors(html: str, name: str) -> str:
    """The errors a page shows next to the form field `name` ("" if none)."""
    match = re.search(rf'<ul class="field-errors" id="e-{re.escape(name)}">(.*?)</ul>', html, re.S)
    return match.group(1) if match else ""


def new_pipeline_post(**changes) -> dict:
    """The new-pipeline form's fields for a valid pipeline `payments`; None drops a field."""
    post = {
        "name": "payments",
        "description": "card payments",
        "source_connection": "events",
        "topics": "payments",
        "schema": "id STRING, amount DOUBLE",
        "starting_offsets": "earliest",
        "max_records_per_batch": "1000",
        "fail_on_data_loss": "on",
        "reader": "python",
        "transform_sql": "SELECT id, amount FROM source WHERE amount > 0",
        "sink_connection": "warehouse",
        "table": "payments",
        "mode": "append",
        "interval_seconds": "2",
        "restart_kind": "fixed-delay",
        "restart_fixed-delay_attempts": "4",
    }
    post.update(changes)
    return {k: v for k, v in post.items() if v is not None}


# -- what drivers report ----------------------------------------------------------------------

PROGRESS = {
    "id": "q",
    "batchId": 3,
    "timestamp": "2026-11-21T10:00:00.000Z",
    "numInputRows": 1200,
    "inputRowsPerSecond": 1000.5,
    "processedRowsPerSecond": 2400.0,
    "batchDuration": 500,
    "durationMs": {"addBatch": 400, "latestOffset": 20, "triggerExecution": 500},
    "sources": [
        {
            "description": "cp_kafka",
            "startOffset": '{"t": {"0": 0}}',
            "endOffset": '{"t": {"0": 1200}, "$plan": {"min_splits": 2}}',
            "latestOffset": '{"t": {"0": 5000}}',
            "numInputRows": 1200,
        }
    ],
}

ROCKSDB = {
    "operatorName": "stateStoreSave",
    "numRowsTotal": 1500,
    "numRowsUpdated": 120,
    "numRowsRemoved": 30,
    "allUpdatesTimeMs": 12,
    "allRemovalsTimeMs": 3,
    "commitTimeMs": 41,
    "memoryUsedBytes": 250_000,
    "numRowsDroppedByWatermark": 7,
    "numShufflePartitions": 4,
    "numStateStoreInstances": 4,
    # As Spark 4 reports them (and more rocksdb* metrics), captured from a real query.
    "customMetrics": {
        "SnapshotLastUploaded.partition_0_default": 4,
        "rocksdbSstFileSize": 9_000_000,
        "rocksdbCommitCheckpointLatency": 6,
        "rocksdbCommitFlushLatency": 2,
        "rocksdbCommitCompactLatency": 0,
        "rocksdbChangeLogWriterCommitLatencyMs": 1,
    },
}
HDFS = {
    "operatorName": "dedupeWithinWatermark",
    "numRowsTotal": 80,
    "numRowsUpdated": 10,
    "numRowsRemoved": 0,
    "commitTimeMs": 9,
    "memoryUsedBytes": 60_000,
    "numRowsDroppedByWatermark": 2,
    "customMetrics": {
        "SnapshotLastUploaded.partition_0_default": -1,  # not read: may be negative
        "forceSnapshotCount": 0,
        "loadedMapCacheHitCount": 12,
        "loadedMapCacheMissCount": 0,
        "stateOnCurrentVersionSizeBytes": 21_000,
    },
}


def stateful(batch: int, *operators: dict, **overrides) -> dict:
    """A progress report of batch `batch` with these stateful operators (both by default)."""
    return {
        **PROGRESS,
        "batchId": batch,
        "durationMs": {"walCommit": 11, "commitOffsets": 5, "addBatch": 300},
        "stateOperators": list(operators or (ROCKSDB, HDFS)),
        **overrides,
    }
