"""Placeholder while being written."""

from __future__ import annotations


class SQLError(ValueError):
    pass


def check_transform_sql(sql, *, source_view="source", columns=None):
    return None
