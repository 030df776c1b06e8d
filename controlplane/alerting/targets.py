"""Webhook URLs whose parts are credentials. Pure: no Django, no Celery.

A webhook's URL often *is* its password: the user info (`https://user:pass@host/`), query
values (`?token=...`, `?key=...`, `?sig=...`) and, for Slack-style incoming webhooks
(`https://hooks.slack.com/services/T../B../XXXX`), the whole path. Those parts are write-only
like a password: stored encrypted, shown masked (`mask`), and scrubbed out of any text that
may quote the URL (`scrub`: requests' exceptions and urllib3's log lines do).

Editing: a URL sent back with its masked parts (`***`, or `•••` in a path) keeps the stored
values for them (`resolve`), but only while it points at the same scheme, host and port: a
credential is only ever sent where it was entered for.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit

from requests.utils import requote_uri

from controlplane.redaction import redact

MASK = "***"
PATH_MASK = "•••"
# What a client may send back in place of a stored part: our masks, as written or as a
# client that rebuilds the URL percent-encodes them.
PLACEHOLDERS = frozenset(
    {MASK, PATH_MASK, quote(MASK, safe=""), quote(PATH_MASK, safe=""), "%2a%2a%2a"}
)
# Hosts of incoming webhooks whose path is the credential, whatever the channel's kind (a
# channel of kind "slack" has a secret path wherever it points).
SECRET_PATH_HOSTS = frozenset(
    {"hooks.slack.com", "discord.com", "discordapp.com", "hooks.zapier.com"}
)
SECRET_PATH_HOST_SUFFIXES = (".webhook.office.com",)
SECRET_PATH_KINDS = frozenset({"slack"})  # channel kinds whose URL's path is a secret anywhere
# Shorter values, outside the URL itself, would mask ordinary words and digits all over an
# error message (the URL forms are replaced whole first, whatever their values' length).
MIN_LENGTH = 4
DEFAULT_PORTS = {"http": 80, "https": 443}


class TargetProblem(ValueError):
    """A submitted URL cannot be taken as it is (the message says why; never the URL)."""


@dataclass(frozen=True)
class Url:
    """A URL split into the parts that matter here, each as written (still percent-encoded)."""

    scheme: str
    userinfo: str | None  # None: no "@"
    hostport: str
    path: str
    query: tuple[tuple[str | None, str], ...]  # (name, value); name None: a bare item
    has_query: bool
    fragment: str | None  # None: no "#"

    @classmethod
    def parse(cls, url: str) -> Url:
        parts = urlsplit(url)
        userinfo, at, hostport = parts.netloc.rpartition("@")
        query: list[tuple[str | None, str]] = []
        for item in parts.query.split("&") if parts.query else ():
            name, eq, value = item.partition("=")
            query.append((name, value) if eq else (None, item))
        return cls(
            scheme=parts.scheme,
            userinfo=userinfo if at else None,
            hostport=hostport,
            path=parts.path,
            query=tuple(query),
            has_query="?" in url.split("#", 1)[0],
            fragment=url.split("#", 1)[1] if "#" in url else None,
        )

    def __str__(self) -> str:
        out = f"{self.scheme}://"
        if self.userinfo is not None:
            out += f"{self.userinfo}@"
        out += self.hostport + self.path
        if self.has_query:
            out += f"?{self.query_text()}"
        if self.fragment is not None:
            out += f"#{self.fragment}"
        return out

    @property
    def host(self) -> str:
        return (urlsplit(f"//{self.hostport}").hostname or "").lower()

    def origin(self) -> tuple[str, str, int | None]:
        """What identifies the far end: a change of any of these is somebody else."""
        try:
            port = urlsplit(f"//{self.hostport}").port
        except ValueError:
            port = None
        scheme = self.scheme.lower()
        return (scheme, self.host, port or DEFAULT_PORTS.get(scheme))

    def query_text(self) -> str:
        return "&".join(value if name is None else f"{name}={value}" for name, value in self.query)

    def path_url(self) -> str:
        """What an HTTP client puts on its request line (and urllib3 in its errors)."""
        return (self.path or "/") + (f"?{self.query_text()}" if self.has_query else "")


def path_is_secret(kind: str, host: str) -> bool:
    return (
        kind in SECRET_PATH_KINDS
        or host in SECRET_PATH_HOSTS
        or host.endswith(SECRET_PATH_HOST_SUFFIXES)
    )


def _masked_path(path: str) -> str:
    """The first segment stays (`/services/`: which API it is), the rest is the secret."""
    segments = [s for s in path.split("/") if s]
    if not segments:
        return path
    if len(segments) == 1:
        return f"/{PATH_MASK}"
    return f"/{segments[0]}/{PATH_MASK}"


def _mask_url(url: Url, kind: str) -> Url:
    return replace(
        url,
        userinfo=MASK if url.userinfo else url.userinfo,
        path=_masked_path(url.path) if path_is_secret(kind, url.host) else url.path,
        query=tuple((name, MASK if value else value) for name, value in url.query),
        fragment=MASK if url.fragment else url.fragment,
    )


def mask(url: str, kind: str) -> str:
    """The URL as anyone may see it: user info, query values, the fragment and (Slack-style)
    the path replaced by masks. Equal to `url` when nothing in it is secret."""
    return str(_mask_url(Url.parse(url), kind))


def has_placeholders(url: str) -> bool:
    """Whether a submitted URL stands for stored parts somewhere (it was sent back masked)."""
    parsed = Url.parse(url)
    return bool(
        _is_placeholder(parsed.userinfo)
        or any(_is_placeholder(s) for s in parsed.path.split("/"))
        or any(_is_placeholder(value) for _, value in parsed.query)
        or _is_placeholder(parsed.fragment)
    )


def _is_placeholder(value: str | None) -> bool:
    return value is not None and value.lower() in {p.lower() for p in PLACEHOLDERS}


def resolve(submitted: str, kind: str, stored: str | None) -> str:
    """The full URL a submission means: as given, or with its masked parts filled in from the
    stored URL (same scheme, host and port only). Raises TargetProblem."""
    if not has_placeholders(submitted):
        return submitted
    if not stored:
        raise TargetProblem(
            f"{MASK} stands for a stored credential and this channel has none: give the URL in full"
        )
    new, old = Url.parse(submitted), Url.parse(stored)
    if new.origin() != old.origin():
        raise TargetProblem(
            "points at another scheme, host or port than the stored URL: its credentials are "
            "only sent where they were entered for; give the URL in full, credentials included"
        )
    userinfo = new.userinfo
    if _is_placeholder(userinfo):
        if not old.userinfo:
            raise TargetProblem(f"there is no stored user info for {MASK}@ to keep")
        userinfo = old.userinfo
    path = new.path
    if any(_is_placeholder(s) for s in new.path.split("/")):
        if new.path not in (
            _masked_path(old.path),
            _masked_path(old.path).replace(PATH_MASK, MASK),
        ):
            raise TargetProblem("the path is masked but is not the stored one: give it in full")
        path = old.path
    stored_values = _keyed(old.query)
    query = []
    for key, (name, value) in zip(_keys(new.query), new.query, strict=True):
        if _is_placeholder(value):
            if key not in stored_values or not stored_values[key]:
                what = f"query parameter {name!r}" if name is not None else "query item"
                raise TargetProblem(f"there is no stored value of the {what} to keep: give it")
            value = stored_values[key]
        query.append((name, value))
    fragment = new.fragment
    if _is_placeholder(fragment):
        if not old.fragment:
            raise TargetProblem("there is no stored fragment to keep: give it")
        fragment = old.fragment
    return str(replace(new, userinfo=userinfo, path=path, query=tuple(query), fragment=fragment))


def _keys(query: Iterable[tuple[str | None, str]]) -> list[tuple[str | None, int]]:
    """Each item's key: its name and which of that name it is (bare items by position)."""
    seen: dict[str | None, int] = {}
    keys = []
    for name, _ in query:
        keys.append((name, seen.get(name, 0)))
        seen[name] = seen.get(name, 0) + 1
    return keys


def _keyed(query: tuple[tuple[str | None, str], ...]) -> dict[tuple[str | None, int], str]:
    return {key: value for key, (_, value) in zip(_keys(query), query, strict=True)}


def scrub(text: str, url: str, kind: str) -> str:
    """`text` without the URL's secret parts: the URL itself (as written, as an HTTP client
    re-quotes it, its request line) replaced by its masked form, then every secret value
    left (raw, decoded, encoded) masked, and whatever looks like a credential
    (controlplane.redaction)."""
    if not text:
        return text or ""
    parsed = Url.parse(url)
    masked = _mask_url(parsed, kind)
    bare = replace(masked, fragment=None)
    forms = [
        (variant, str(masked) if "#" in variant else str(bare))
        for form in {url, str(replace(parsed, fragment=None))}
        for variant in _variants(form)
    ]
    forms += [(variant, masked.path_url()) for variant in _variants(parsed.path_url())]
    forms = [(found, shown) for found, shown in forms if found != shown]
    # The masked forms already there stay as they are (our own messages quote the target).
    forms += [(m, m) for m in {str(masked), str(bare), masked.path_url()} if _shows_masks(m)]
    # Each found form is held by a marker while the pattern-based redaction runs (it would
    # take the masked form's `token=***` for a credential, and mask it again).
    shown_forms: list[str] = []
    for found, shown in sorted(forms, key=lambda pair: len(pair[0]), reverse=True):
        if found in text:
            text = text.replace(found, f"\x00{len(shown_forms)}\x00")
            shown_forms.append(shown)
    text = redact(text, secret_values(url, kind))
    for index, shown in enumerate(shown_forms):
        text = text.replace(f"\x00{index}\x00", shown)
    return text


def _shows_masks(text: str) -> bool:
    return MASK in text or PATH_MASK in text


def _variants(text: str) -> set[str]:
    return {text, requote_uri(text), unquote(text), quote(unquote(text), safe="")} - {""}


def secret_parts(url: str, kind: str) -> tuple:
    """The URL's secret parts as written (to tell whether a change replaced them)."""
    parsed = Url.parse(url)
    path = parsed.path if path_is_secret(kind, parsed.host) else None
    return (parsed.userinfo, path, tuple(v for _, v in parsed.query), parsed.fragment)


def secret_values(url: str, kind: str) -> tuple[str, ...]:
    """Every secret part of the URL, in each form it may be quoted in (long enough ones)."""
    parsed = Url.parse(url)
    parts: list[str] = []
    if parsed.userinfo:
        user, _, password = parsed.userinfo.partition(":")
        parts += [parsed.userinfo, user, password]
        basic = f"{unquote(user)}:{unquote(password)}".encode()
        parts.append(base64.b64encode(basic).decode())
    if path_is_secret(kind, parsed.host):
        segments = [s for s in parsed.path.split("/") if s]
        parts += ["/".join(segments[1:]), *segments[1:]] if len(segments) > 1 else segments
    parts += [value for _, value in parsed.query]
    if parsed.fragment:
        parts.append(parsed.fragment)
    values = {v for part in parts if part for v in _variants(part)}
    return tuple(sorted((v for v in values if len(v) >= MIN_LENGTH), key=len, reverse=True))
