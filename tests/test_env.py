from __future__ import annotations

import pytest

from controlplane.env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_float,
    env_int,
    parse_database_url,
)


def test_bad_values_fail_loudly_with_the_variable_name(monkeypatch):
    monkeypatch.setenv("CP_TEST_SECONDS", "5s")
    with pytest.raises(ImproperlyConfiguredEnv, match="CP_TEST_SECONDS"):
        env_float("CP_TEST_SECONDS", 1.0)
    monkeypatch.setenv("CP_TEST_FLAG", "maybe")
    with pytest.raises(ImproperlyConfiguredEnv, match="CP_TEST_FLAG"):
        env_bool("CP_TEST_FLAG", False)
    monkeypatch.setenv("CP_TEST_N", "-1")
    with pytest.raises(ImproperlyConfiguredEnv, match="minimum"):
        env_int("CP_TEST_N", 3, minimum=0)


def test_unset_and_empty_values_give_the_default(monkeypatch):
    monkeypatch.setenv("CP_TEST_EMPTY", "  ")
    assert env_int("CP_TEST_EMPTY", 7) == 7
    assert env_bool("CP_TEST_UNSET_XYZ", True) is True


def test_database_urls_become_django_settings():
    db = parse_database_url("postgresql://u:p%40ss@db.example:6543/app?sslmode=require")
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "app",
        "u",
        "p@ss",
        "db.example",
        "6543",
    )
    assert db["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(ImproperlyConfiguredEnv):
        parse_database_url("mysql://x/y")
    with pytest.raises(ImproperlyConfiguredEnv):
        parse_database_url("postgresql://host")
