"""`cpfleet`: a fleet's files against a control plane, for people and CI jobs.

    cpfleet lint   [PATH ...] [--environment ENV]                 offline: the files alone
    cpfleet plan   [PATH ...] --fleet NAME [--environment ENV] [--prune]
    cpfleet apply  [PATH ...] --fleet NAME [--environment ENV] [--prune] [--yes]
    cpfleet diff   [PATH ...] --fleet NAME [--environment ENV]    what differs, in full
    cpfleet export --out DIR [--fleet NAME] [--kind KIND ...]
    cpfleet schema                                                the files' JSON Schema

PATHs are YAML files or directories (their *.yaml and *.yml, recursively; default `.`),
named in messages as given. The control plane is --url (or CONTROLPLANE_URL); its API token
is read from the environment (CONTROLPLANE_TOKEN) or a file (--token-file), never from the
command line. --json prints the server's answer (lint: the problems) as JSON.

Exit codes: 0 done (lint: no problem; plan: planned; diff: no difference), 1 refused or a
problem found (nothing was applied), 2 plan --detailed-exitcode or diff: there are changes,
3 the control plane could not be asked (unreachable, busy, not allowed), 64 a usage error.

This module needs no Django settings nor database (its imports are pure, an import-linter
contract): it reads files, checks them with the same pure validators the control plane uses
(documents, pipeline specs, connection settings) and talks HTTP.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from controlplane.redaction import without_credentials
from jobs.connections import ConnectionPolicy, validate_connection
from jobs.spec import SpecError, parse_spec

from . import documents, secrets

# What export may write: one object's file in its kind's folder, nothing else (not .git/,
# not a CI workflow), whatever the server answers.
_FOLDER = "|".join(map(re.escape, documents.FOLDERS.values()))
EXPORTED = re.compile(rf"^({_FOLDER})/{documents.NAME_RE.pattern[1:-1]}\.yaml$")

OK, REFUSED, CHANGES, UNREACHABLE, USAGE = 0, 1, 2, 3, 64
SYMBOLS = {
    "create": "+",
    "update": "~",
    "delete": "-",
    "unchanged": "=",
    "left": "?",
    "refused": "!",
}


class Trouble(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


# -- files ---------------------------------------------------------------------------------------


def collect(paths: list[str]) -> dict[str, str]:
    """{path as named: text} of the YAML files under `paths`."""
    found: dict[str, str] = {}
    for given in paths or ["."]:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
            files = [p for p in files if not any(part.startswith(".") for part in p.parts[1:])]
        elif path.is_file():
            files = [path]
        else:
            raise Trouble(f"{given}: no such file or directory", USAGE)
        for file in files:
            try:
                found[file.as_posix()] = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise Trouble(f"{file}: cannot be read ({exc})", REFUSED) from None
    if not found:
        raise Trouble(f"no *.yaml files under {', '.join(paths or ['.'])}", USAGE)
    return found


def lint(files: dict[str, str], environment: str | None) -> tuple[list[dict], list[dict]]:
    """(errors, warnings), each {file, document, path, message}: the files read as the
    control plane reads them, pipeline specs and connection settings checked by the same
    validators; what only the control plane knows (its other objects, its installation's
    policy, schema registries, roles) is left to `plan`."""
    try:
        objects = documents.read(files, environment=environment)
    except documents.DocumentsRefused as exc:
        return [e.as_dict() for e in exc.errors], []
    errors: list[dict] = []
    warnings: list[dict] = []
    kinds = {o.name: o.spec.get("kind") for o in objects if o.kind == "Connection"}
    store = secrets.Store(
        environ={},
        prefix=os.environ.get("CONTROLPLANE_FLEET_SECRET_PREFIX", "FLEET_SECRET_"),
        directory="(the control plane's)",
    )
    context = _LintContext(kinds, store)
    for obj in objects:
        check = _LINTERS.get(obj.kind)
        if check is None:
            continue
        where = obj.source.where(obj.kind, obj.name)
        for path, message, is_error in check(obj, context):
            problem = documents.DocumentError(obj.source.file, where, path, message).as_dict()
            (errors if is_error else warnings).append(problem)
    return errors, warnings


@dataclass(frozen=True)
class _LintContext:
    kinds: dict[str, Any]  # the connections the files define: name -> kind
    store: secrets.Store


def _lint_connection(obj: documents.Object, context: _LintContext):
    """Its secrets are references, its settings as the control plane's validator says (with
    a lenient policy: what this installation allows is the plan's to say)."""
    given = obj.spec.get("secrets") or {}
    for key, ref in given.items() if isinstance(given, dict) else []:
        if problem := secrets.check(ref, context.store):
            yield f"spec.secrets.{key}", problem, True
    lenient = ConnectionPolicy(cert_dir="/", allow_unix_sockets=True, files_dir="/")
    try:
        _, moved = validate_connection(
            obj.spec.get("kind"), obj.spec.get("settings", {}), {}, lenient
        )
    except SpecError as exc:
        for path, messages in exc.as_dict("spec.settings.").items():
            for message in messages:
                yield path, message, True
    else:
        for key in moved:
            yield "spec.settings", f"holds a secret ({key}): give it in spec.secrets", True


def _lint_pipeline(obj: documents.Object, context: _LintContext):
    """Its spec as the control plane's parser says, against the connections the files
    define (one they do not define is a warning: the control plane may have it)."""
    spec_at = "spec.pipeline." if obj.source.instance else "spec."
    unknown = sorted(n for n in _connections(obj.spec) if n not in context.kinds)
    for name in unknown:
        message = f"connection {name!r} is not in these files (the control plane may have it)"
        yield spec_at.rstrip("."), message, False
    try:
        parse_spec(obj.spec, connections=None if unknown else context.kinds)
    except SpecError as exc:
        for path, messages in exc.as_dict(spec_at).items():
            for message in messages:
                yield path, message, True


# What lint checks of each kind offline (the others: their reading, and the plan).
_LINTERS = {"Connection": _lint_connection, "Pipeline": _lint_pipeline}


def _connections(spec: Any) -> set[str]:
    """The connection names a pipeline spec gives (wherever a `connection` key is)."""
    found: set[str] = set()
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key == "connection" and isinstance(value, str):
                found.add(value)
            else:
                found |= _connections(value)
    elif isinstance(spec, list):
        for value in spec:
            found |= _connections(value)
    return found


def _line(problem: dict) -> str:
    at = f": {problem['path']}" if problem["path"] else ""
    where = f" {problem['document']}" if problem["document"] else ""
    return f"{problem['file'] or '(the set)'}:{where}{at}: {problem['message']}"


# -- the control plane -----------------------------------------------------------------------


class Client:
    def __init__(self, url: str, token: str, timeout: float = 300.0):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        try:
            response = self.session.request(
                method, f"{self.url}{path}", timeout=self.timeout, **kwargs
            )
        except requests.RequestException as exc:
            reason = type(exc).__name__
            raise Trouble(f"{self.url}: cannot be reached ({reason})", UNREACHABLE) from None
        if response.status_code in (401, 403):
            detail = f"{response.status_code}: {_detail(response)}"
            raise Trouble(f"{self.url}: not allowed ({detail})", UNREACHABLE)
        if response.status_code == 409:
            raise Trouble(f"{self.url}: {_detail(response)}", UNREACHABLE)
        if response.status_code >= 500:
            raise Trouble(f"{self.url}: the server failed ({response.status_code})", UNREACHABLE)
        return response


def _detail(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]


def client(args) -> Client:
    url = args.url or os.environ.get("CONTROLPLANE_URL")
    if not url:
        raise Trouble("give the control plane's URL: --url or CONTROLPLANE_URL", USAGE)
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise Trouble(f"{args.token_file}: cannot be read ({exc.strerror})", USAGE) from None
    else:
        token = os.environ.get("CONTROLPLANE_TOKEN", "")
    if not token:
        raise Trouble("give an API token: CONTROLPLANE_TOKEN or --token-file", USAGE)
    return Client(url, token)


def _git(*arguments: str) -> str:
    try:
        done = subprocess.run(  # noqa: S603 - fixed arguments, no shell
            ["git", *arguments],  # noqa: S607 - git from PATH, as a developer runs it
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def revision(args) -> tuple[str, str]:
    """(repository, commit): as given, else from git where the files are."""
    repository = (
        args.repository
        if args.repository is not None
        else _git("config", "--get", "remote.origin.url")
    )
    commit = args.commit if args.commit is not None else _git("rev-parse", "HEAD")
    return without_credentials(repository), commit  # a CI job's remote may carry its token


def request_apply(args, files: dict[str, str], *, dry_run: bool) -> dict:
    repository, commit = revision(args)
    body = {
        "fleet": args.fleet,
        "files": files,
        "environment": args.environment,
        "dry_run": dry_run,
        "prune": args.prune,
        "restart": not args.no_restart,
        "preflight": not args.no_preflight,
        "force": args.force,
        "repository": repository,
        "commit": commit,
    }
    response = client(args).call("POST", "/api/apply/", json=body)
    answer = response.json()
    if response.status_code == 400 and "objects" not in answer:
        raise Trouble(f"the request was refused: {json.dumps(answer)}", USAGE)
    return answer


# -- output ------------------------------------------------------------------------------------


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def show_plan(answer: dict, *, full: bool = False, out=sys.stdout) -> None:
    """A plan for people: one line per object that changes or is refused (unchanged ones
    counted, and listed with `full`), its changes and its errors under it."""
    for obj in answer["objects"]:
        action = obj["action"]
        if action == "unchanged" and not full and not obj.get("drifted"):
            continue
        where = f"  {obj['file']}#{obj['document']}" if obj.get("file") else ""
        if obj.get("template"):
            where += f" (template {obj['template']})"
        notes = []
        if obj.get("adopted"):
            notes.append("adopted")
        if obj.get("restart"):
            notes.append("restarts")
        if obj.get("restore_point"):
            notes.append("restore point first")
        if obj.get("preflight") and not obj["preflight"].get("ok", True):
            notes.append("preflight errors")
        tail = f"  [{', '.join(notes)}]" if notes else ""
        print(f"{SYMBOLS[action]} {obj['kind']}/{obj['name']}  {action}{where}{tail}", file=out)
        for change in obj.get("drifted", []):
            print(f"    drifted: {_change(change)}", file=out)
        for change in obj.get("changes", []):
            print(f"    {_change(change)}", file=out)
        for name in obj.get("secrets_changed", []):
            print(f"    {name}: (secret) changed", file=out)
        for check in (obj.get("preflight") or {}).get("checks", []):
            if check.get("status") in ("error", "warning"):
                print(f"    preflight {check['status']}: {check.get('field', '')}: "
                      f"{check.get('message', '')}", file=out)  # fmt: skip
        for error in obj.get("errors", []):
            at = f"{error['path']}: " if error["path"] else ""
            print(f"    error: {at}{error['message']}", file=out)
    for error in answer.get("errors", []):
        print(f"! {_line(error)}", file=out)
    s = answer["summary"]
    verb = "applied" if answer.get("applied") else "planned"
    print(
        f"{verb}: {s['create']} to create, {s['update']} to update, {s['unchanged']} unchanged,"
        f" {s['delete']} to delete, {s['left']} left (not in the files), {s['refused']} refused"
        + (" - nothing was applied" if answer.get("refused") else ""),
        file=out,
    )


def _change(change: dict) -> str:
    if "message" in change:
        return f"{change['path'] or '(the object)'}: {change['message']}"
    before = _value(change["before"]) if "before" in change else "(none)"
    after = _value(change["after"]) if "after" in change else "(none)"
    return f"{change['path']}: {before} -> {after}"


def _changes(answer: dict) -> bool:
    s = answer["summary"]
    return bool(s["create"] or s["update"] or s["delete"])


# -- commands ---------------------------------------------------------------------------------


def cmd_lint(args) -> int:
    files = collect(args.paths)
    errors, warnings = lint(files, args.environment)
    if args.json:
        print(json.dumps({"files": len(files), "errors": errors, "warnings": warnings}, indent=2))
    else:
        for problem in errors:
            print(f"error: {_line(problem)}")
        for problem in warnings:
            print(f"warning: {_line(problem)}")
        print(f"{len(files)} files: {len(errors)} errors, {len(warnings)} warnings")
    return REFUSED if errors else OK


def cmd_plan(args) -> int:
    answer = request_apply(args, collect(args.paths), dry_run=True)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        show_plan(answer, full=args.verbose)
    if answer["refused"]:
        return REFUSED
    return CHANGES if args.detailed_exitcode and _changes(answer) else OK


def cmd_diff(args) -> int:
    answer = request_apply(args, collect(args.paths), dry_run=True)
    if args.json:
        print(json.dumps([o for o in answer["objects"] if o["action"] != "unchanged"], indent=2))
    else:
        show_plan(answer, full=False)
    if answer["refused"]:
        return REFUSED
    return CHANGES if _changes(answer) else OK


def cmd_apply(args) -> int:
    files = collect(args.paths)
    if not args.yes:
        plan = request_apply(args, files, dry_run=True)
        show_plan(plan)
        if plan["refused"]:
            return REFUSED
        if not _changes(plan):
            print("nothing to apply")
            return OK
        if not sys.stdin.isatty():
            print("not applied: confirm with --yes (no terminal to ask on)", file=sys.stderr)
            return USAGE
        if input("apply these changes? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not applied")
            return REFUSED
    answer = request_apply(args, files, dry_run=False)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        show_plan(answer)
    return REFUSED if answer["refused"] else OK


def cmd_export(args) -> int:
    params: list[tuple[str, str]] = [("kind", k) for k in args.kind or []]
    if args.fleet:
        params.append(("fleet", args.fleet))
    answer = client(args).call("GET", "/api/export/", params=params).json()
    out = Path(args.out)
    for path in answer["files"]:
        if not isinstance(path, str) or not EXPORTED.fullmatch(path):
            raise Trouble(f"the server answered a file {path!r} export does not write", REFUSED)
    for path, text in sorted(answer["files"].items()):
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    if args.json:
        print(json.dumps({"written": sorted(answer["files"]), "notes": answer["notes"]}, indent=2))
    else:
        print(f"{len(answer['files'])} files written under {out}")
        for note in answer["notes"]:
            print(f"note: {note}")
    return OK


def cmd_schema(args) -> int:
    from .schema import document_schema

    print(json.dumps(document_schema(), indent=2, sort_keys=True))
    return OK


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cpfleet", description="A fleet's files against a control plane."
    )
    commands = top.add_subparsers(dest="command", required=True)

    def common(p, *, remote: bool = True, files: bool = True) -> None:
        p.add_argument("--json", action="store_true", help="print JSON")
        if files:
            p.add_argument("paths", nargs="*", help="YAML files or directories (default: .)")
            p.add_argument("--environment", "-e", help="the Environment to read the files for")
        if remote:
            p.add_argument("--url", help="the control plane (default: $CONTROLPLANE_URL)")
            p.add_argument("--token-file", help="a file holding the API token")

    def planning(p) -> None:
        p.add_argument("--fleet", required=True, help="the fleet these files are")
        p.add_argument("--prune", action="store_true", help="delete what left the files")
        p.add_argument("--no-restart", action="store_true", help="do not restart pipelines")
        p.add_argument("--no-preflight", action="store_true", help="skip preflights")
        p.add_argument("--force", action="store_true", help="restart despite preflight errors")
        p.add_argument("--repository", help="where the files are kept (default: git's origin)")
        p.add_argument("--commit", help="the files' revision (default: git's HEAD)")

    p = commands.add_parser("lint", help="check the files offline")
    common(p, remote=False)
    p.set_defaults(run=cmd_lint)
    p = commands.add_parser("plan", help="what an apply would do")
    common(p)
    planning(p)
    p.add_argument("--verbose", "-v", action="store_true", help="list unchanged objects too")
    p.add_argument("--detailed-exitcode", action="store_true", help="exit 2 when there are changes")
    p.set_defaults(run=cmd_plan)
    p = commands.add_parser("diff", help="what differs between the files and the control plane")
    common(p)
    planning(p)
    p.set_defaults(run=cmd_diff)
    p = commands.add_parser("apply", help="apply the files (after a plan, unless --yes)")
    common(p)
    planning(p)
    p.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    p.set_defaults(run=cmd_apply)
    p = commands.add_parser("export", help="write the control plane's objects as files")
    common(p, files=False)
    p.add_argument("--out", required=True, help="the directory to write into")
    p.add_argument("--fleet", help="only this fleet's objects")
    p.add_argument("--kind", action="append", help="only objects of this kind (repeatable)")
    p.set_defaults(run=cmd_export)
    p = commands.add_parser("schema", help="print the files' JSON Schema (for editors)")
    p.set_defaults(run=cmd_schema)
    return top


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors
        return USAGE if exc.code else OK
    try:
        return args.run(args)
    except Trouble as exc:
        print(f"cpfleet: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
