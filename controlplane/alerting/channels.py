"""Checking a channel's target when it is defined or changed: the API and the admin both call
`clean_target`, so a URL is resolved and refused the same way wherever it is entered."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator, URLValidator

from controlplane.crypto import SecretsUnreadable

from . import targets
from .models import MAILED, AlertChannel
from .targets import TargetProblem

__all__ = ["TargetProblem", "clean_target"]


def clean_target(kind: str, submitted: str, channel: AlertChannel | None = None) -> str:
    """The target to store: e-mail addresses as given, or the full URL, its masked parts
    filled in from `channel`'s stored URL (`targets.resolve`). Raises TargetProblem saying
    what is wrong (never quoting the URL)."""
    if kind in MAILED:
        addresses = [a.strip() for a in submitted.split(",") if a.strip()]
        if not addresses:
            raise TargetProblem("give one or more e-mail addresses")
        for address in addresses:
            try:
                EmailValidator()(address)
            except ValidationError:
                raise TargetProblem(f"{address!r} is not an e-mail address") from None
        return submitted
    try:
        urlsplit(submitted)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise TargetProblem("must be an http(s) URL") from None
    stored = None
    if channel is not None and channel.pk and channel.kind not in MAILED:
        if targets.has_placeholders(submitted) and channel.url_encrypted:
            if channel.kind != kind:
                # Which parts are secret depends on the kind (a Slack path): a masked URL
                # kept across the change could show what was hidden.
                raise TargetProblem(
                    "give the URL in full when changing the kind: which of its parts are "
                    "secret depends on it"
                )
            try:
                stored = channel.get_url()
            except SecretsUnreadable:
                raise TargetProblem(
                    "the stored URL cannot be decrypted with the configured keys: give it in full"
                ) from None
        else:
            stored = channel.target
    full = targets.resolve(submitted, kind, stored)
    try:
        URLValidator(schemes=["http", "https"])(full)
    except ValidationError:
        raise TargetProblem("must be an http(s) URL") from None
    # Masks can be longer than what they hide (`v=1` shows as `v=***`): both must fit.
    limit = AlertChannel._meta.get_field("target").max_length
    if max(len(full), len(targets.mask(full, kind))) > limit:
        raise TargetProblem(f"must be at most {limit} characters, masked parts included")
    return full
