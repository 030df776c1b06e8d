"""Helpers shared by the API's serializers."""

from __future__ import annotations

from jobs.spec import SpecError


def flatten_spec_error(exc: SpecError, prefix: str = "") -> dict[str, list[str]]:
    """A SpecError as DRF validation errors keyed by dotted field path."""
    return exc.as_dict(prefix)
