"""Sign-in and browser security (docs/security.md): lockout of repeated failed sign-ins on the
sign-in page and the admin, the security log, the limit on refused API tokens, the
Content-Security-Policy, and the production settings profile."""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.roles import set_role
from tests.clients import driver

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "Right-horse-battery-9"  # a test user's
WRONG = "Wrong-Guess-for-sure-1"


@pytest.fixture
def lena(db, django_user_model):
    user = django_user_model.objects.create_user(username="lena", password=PASSWORD)
    set_role(user, "operator")
    return user


@pytest.fixture
def root(db, django_user_model):
    return django_user_model.objects.create_superuser(username="root", password=PASSWORD)


@pytest.fixture
def limits(settings):
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    settings.CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT = 50
    return settings


def sign_in(path: str, username: str, password: str, ip: str = "203.0.113.5"):
    return Client(REMOTE_ADDR=ip).post(path, {"username": username, "password": password})


def signed_in(response) -> bool:
    return response.status_code == 302


def locked(response) -> bool:
    return response.status_code == 429 and "Sign-in blocked" in response.content.decode()


# --- lockout --------------------------------------------------------------------------------


def test_the_sign_in_page_locks_a_user_at_one_address_after_the_limit(lena, limits):
    for _ in range(2):
        response = sign_in("/login/", "lena", WRONG)
        assert response.status_code == 200
        assert "do not match" in response.content.decode()
    response = sign_in("/login/", "lena", WRONG)  # the third failure: locked
    assert locked(response)
    assert "15 minutes" in response.content.decode()
    assert response["Retry-After"] == "900"
    # Locked: even the right password is refused, from that address...
    assert locked(sign_in("/login/", "lena", PASSWORD))
    # ...but not from elsewhere: the guesser cannot lock the real user out.
    assert signed_in(sign_in("/login/", "lena", PASSWORD, ip="198.51.100.7"))
    # An administrator lifts the block.
    call_command("axes_reset_username", "lena")
    assert signed_in(sign_in("/login/", "lena", PASSWORD))


def test_the_lockout_ends_after_the_cool_off(lena, limits):
    for _ in range(3):
        sign_in("/login/", "lena", WRONG)
    assert locked(sign_in("/login/", "lena", PASSWORD))
    with time_machine.travel(timezone.now() + timedelta(minutes=14), tick=False):
        assert locked(sign_in("/login/", "lena", PASSWORD))  # and the wait starts again
    with time_machine.travel(timezone.now() + timedelta(minutes=14 + 16), tick=False):
        assert signed_in(sign_in("/login/", "lena", PASSWORD))


def test_the_admin_sign_in_is_locked_too(root, limits):
    for _ in range(3):
        response = sign_in("/admin/login/", "root", WRONG)
    assert locked(response)
    assert locked(sign_in("/admin/login/", "root", PASSWORD))
    # One lockout for the whole site: the sign-in page is no way round it.
    assert locked(sign_in("/login/", "root", PASSWORD))
    with time_machine.travel(timezone.now() + timedelta(minutes=16), tick=False):
        assert signed_in(sign_in("/admin/login/", "root", PASSWORD))
    # Or at once, by `manage.py axes_reset`.
    for _ in range(3):
        sign_in("/admin/login/", "root", WRONG)
    assert locked(sign_in("/admin/login/", "root", PASSWORD))
    call_command("axes_reset")
    assert signed_in(sign_in("/admin/login/", "root", PASSWORD))


def test_one_address_trying_many_user_names_is_locked_for_all(lena, limits, django_user_model):
    limits.CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT = 4
    for name in ("anna", "bert", "carl"):  # one guess each: no user's own limit
        assert sign_in("/login/", name, "Summer2026!").status_code == 200
    assert locked(sign_in("/login/", "dora", "Summer2026!"))  # the address's fourth failure
    assert locked(sign_in("/login/", "lena", PASSWORD))
    assert signed_in(sign_in("/login/", "lena", PASSWORD, ip="198.51.100.7"))
    call_command("axes_reset_ip", "203.0.113.5")
    assert signed_in(sign_in("/login/", "lena", PASSWORD))


def test_a_success_forgets_the_earlier_failures(lena, limits):
    for _ in range(2):
        sign_in("/login/", "lena", WRONG)
    assert signed_in(sign_in("/login/", "lena", PASSWORD))
    for _ in range(2):
        assert sign_in("/login/", "lena", WRONG).status_code == 200  # not locked yet
    assert signed_in(sign_in("/login/", "lena", PASSWORD))


def test_the_client_address_behind_proxies_is_the_one_they_saw(lena, limits):
    limits.CONTROLPLANE_PROXY_COUNT = 1
    # The client wrote a first X-Forwarded-For entry itself; the proxy appended the real one.
    for spoofed in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):
        Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=f"{spoofed}, 203.0.113.9").post(
            "/login/", {"username": "lena", "password": WRONG}
        )
    behind = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert locked(behind.post("/login/", {"username": "lena", "password": PASSWORD}))
    other = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.10")
    assert signed_in(other.post("/login/", {"username": "lena", "password": PASSWORD}))


# --- the security log -----------------------------------------------------------------------


def security_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "controlplane.security"]


def test_failed_sign_ins_are_logged_with_name_and_address_never_the_password(
    lena, root, limits, caplog
):
    caplog.set_level(logging.INFO, logger="controlplane.security")
    sign_in("/login/", "lena", WRONG)
    sign_in("/admin/login/", "root", WRONG, ip="198.51.100.7")
    sign_in("/login/", "nobody\nforged line", WRONG)
    for _ in range(3):
        sign_in("/login/", "lena", WRONG)
    sign_in("/login/", "lena", PASSWORD, ip="198.51.100.8")
    lines = security_lines(caplog)
    text = "\n".join(lines)
    assert "sign-in failed: user 'lena' from 203.0.113.5 at sign-in page" in lines
    assert "sign-in failed: user 'root' from 198.51.100.7 at admin" in lines
    assert "sign-in failed: user 'nobody\\nforged line'" in text  # one line, escaped
    assert any(
        line.startswith("sign-in locked out: user 'lena' from 203.0.113.5") for line in lines
    )
    assert "signed in: user 'lena' from 198.51.100.8 at sign-in page" in lines
    assert WRONG not in caplog.text and PASSWORD not in caplog.text


# --- refused API tokens ---------------------------------------------------------------------


@pytest.fixture
def token_limit(settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"bad_token": "3/min"},
    }


def bad(ip: str = "203.0.113.5", key: str = "cpt_not-a-real-token-at-all") -> APIClient:
    client = APIClient(REMOTE_ADDR=ip)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_refused_tokens_get_429_past_the_limit_and_a_valid_token_still_works(
    token_limit, api, token, caplog
):
    caplog.set_level(logging.INFO, logger="controlplane.security")
    for _ in range(3):
        assert bad().get("/api/pipelines/").status_code == 401
    response = bad().get("/api/pipelines/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert bad(key="cpt_another-guess").get("/metrics").status_code == 429
    # A valid token is not limited, from the same address either (the `api` client's is
    # 127.0.0.1: from there too).
    valid = APIClient(REMOTE_ADDR="203.0.113.5")
    valid.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    for _ in range(5):
        assert valid.get("/api/pipelines/").status_code == 200
    # Other addresses are not limited by this one's failures.
    assert bad(ip="198.51.100.7").get("/api/pipelines/").status_code == 401
    # Each refusal is logged with the address, never the token.
    lines = security_lines(caplog)
    assert len([line for line in lines if "API token refused" in line]) == 6
    assert any("from 203.0.113.5" in line and "-> 429" in line for line in lines)
    assert "not-a-real-token" not in caplog.text and "another-guess" not in caplog.text
    assert token not in caplog.text


def test_a_client_that_keeps_trying_stays_limited(token_limit, db):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        for _ in range(3):
            assert bad().get("/api/pipelines/").status_code == 401
        # Still trying, faster than the limit: still refused, for as long as it goes on.
        for _ in range(12):
            clock.shift(15)
            assert bad().get("/api/pipelines/").status_code == 429
        clock.shift(61)  # a minute without trying: back to 401
        assert bad().get("/api/pipelines/").status_code == 401


def test_inactive_users_tokens_and_malformed_headers_count_too(token_limit, user, token, caplog):
    caplog.set_level(logging.INFO, logger="controlplane.security")
    user.is_active = False
    user.save()
    assert bad(key=token).get("/api/pipelines/").status_code == 401
    malformed = APIClient(REMOTE_ADDR="203.0.113.5")
    malformed.credentials(HTTP_AUTHORIZATION="Token")
    assert malformed.get("/api/pipelines/").status_code == 401
    assert bad().get("/api/pipelines/").status_code == 401
    assert bad().get("/api/pipelines/").status_code == 429
    text = "\n".join(security_lines(caplog))
    assert "API token refused (inactive user) for user 'oncall' from 203.0.113.5" in text
    assert "API token refused (malformed header)" in text
    assert token not in caplog.text


def test_driver_run_tokens_are_not_limited(token_limit, running):
    for _ in range(4):
        bad(ip="127.0.0.1").get("/api/pipelines/")
    assert bad(ip="127.0.0.1").get("/api/pipelines/").status_code == 429
    for _ in range(10):
        assert driver("tok-1").post(f"/api/runs/{running.pk}/heartbeat/").status_code == 200
    assert driver("wrong").post(f"/api/runs/{running.pk}/heartbeat/").status_code == 401


# --- Content-Security-Policy ----------------------------------------------------------------


def directives(response) -> dict[str, set[str]]:
    header = response["Content-Security-Policy"]
    out = {}
    for part in header.split(";"):
        name, *values = part.split()
        out[name] = set(values)
    return out


def test_pages_carry_the_content_security_policy(lena, root):
    anon = Client()
    page = anon.get("/login/")
    policy = directives(page)
    assert policy["default-src"] == {"'self'"}
    assert policy["script-src"] == {"'self'"}  # no nonce asked for, none sent
    assert policy["style-src"] == {"'self'"}
    assert policy["object-src"] == {"'none'"}
    assert policy["frame-ancestors"] == {"'none'"}
    assert policy["base-uri"] == {"'self'"}
    assert policy["form-action"] == {"'self'"}
    assert "'unsafe-inline'" not in page["Content-Security-Policy"]
    assert "'unsafe-eval'" not in page["Content-Security-Policy"]

    client = Client()
    client.force_login(lena)
    for url in ("/", "/audit/", "/connections/"):
        assert directives(client.get(url)) == policy, url
    admin = Client()
    admin.force_login(root)
    assert directives(admin.get("/admin/")) == policy
    # DRF's browsable API has a few inline styles: allowed there, and only there.
    browsable = admin.get("/api/pipelines/", HTTP_ACCEPT="text/html")
    assert browsable["Content-Type"].startswith("text/html")
    assert directives(browsable)["style-src-attr"] == {"'unsafe-inline'"}
    assert directives(browsable)["style-src-elem"] == {"'self'", "'unsafe-inline'"}
    assert directives(browsable)["script-src"] == {"'self'"}
    assert "style-src-elem" not in directives(admin.get("/api/pipelines/"))  # JSON


SCRIPT_WITHOUT_SRC = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
EVENT_HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)


@pytest.mark.parametrize(
    "path",
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "templates").rglob("*.html")),
)
def test_templates_have_no_inline_script_or_style(path):
    """What the policy would block: inline scripts, event handler attributes, style attributes
    and elements, htmx's hx-on (evaluated code)."""
    text = (ROOT / path).read_text()
    assert not SCRIPT_WITHOUT_SRC.search(text), "an inline <script>: use static/js/"
    assert not EVENT_HANDLER.search(text), "an on...= handler: use addEventListener"
    assert not re.search(r"\sstyle\s*=|<style[\s>]", text), "inline style: use static/css/"
    assert "hx-on" not in text, "hx-on needs eval"


# --- the production profile -----------------------------------------------------------------


def check_deploy(**env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST"))}
    base["DJANGO_SETTINGS_MODULE"] = "controlplane.settings_production"
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**base, **{k: v for k, v in env.items() if v is not None}},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_production_profile_passes_the_deploy_checks():
    result = check_deploy(
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="controlplane.example.com",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_development_settings_would_not_pass_them():
    """The check above can fail: the same command on the default settings warns."""
    result = check_deploy(DJANGO_SETTINGS_MODULE="controlplane.settings")
    assert result.returncode != 0
    assert "security.W008" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"DJANGO_ALLOWED_HOSTS": "cp.example.com"}, "DJANGO_SECRET_KEY must be set"),
        (
            {"DJANGO_SECRET_KEY": "short-key", "DJANGO_ALLOWED_HOSTS": "cp.example.com"},
            "50 or more random characters",
        ),
        ({"DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}, "DJANGO_ALLOWED_HOSTS must"),
        (
            {
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                "DJANGO_ALLOWED_HOSTS": "cp.example.com",
                "DJANGO_DEBUG": "true",
            },
            "DJANGO_DEBUG must be off",
        ),
    ],
    ids=["no-key", "short-key", "no-hosts", "debug"],
)
def test_the_production_profile_refuses_to_start_without_key_and_hosts(env, problem):
    result = check_deploy(**env)
    assert result.returncode != 0
    assert problem in result.stderr


def test_a_deliberately_disabled_redirect_or_preload_keeps_the_check_clean():
    result = check_deploy(
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="controlplane.example.com",
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SECURE_HSTS_PRELOAD="false",
        DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
    )
    assert result.returncode == 0, result.stdout + result.stderr
