"""Who may do what: four roles, each with the rights of the ones before it.

- `viewer`: read everything (pipelines, runs, metrics, checkpoints, the audit log);
- `operator`: and use the on-call controls (start, stop, kill, restart, suspend, resume,
  restart now, reset restarts) and test connections;
- `editor`: and create, change and delete pipelines and connections;
- `admin`: and manage users, roles and API tokens (the Django admin).

A role is a Django group of that name (created by a migration); superusers are admins. A user
in no role group may sign in but do nothing. API tokens act with their user's role. Enforced
for every API endpoint by `RolePermission` (and for pages by the same rules), not by hiding
buttons.
"""

from __future__ import annotations

VIEWER, OPERATOR, EDITOR, ADMIN = "viewer", "operator", "editor", "admin"
ROLES = (VIEWER, OPERATOR, EDITOR, ADMIN)


def role_of(user) -> str | None:
    """The user's highest role, or None."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, "_cp_role", False)
    if cached is not False:
        return cached
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    role = next((r for r in reversed(ROLES) if r in names), None)
    user._cp_role = role
    return role


def has_role(user, needed: str) -> bool:
    role = role_of(user)
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


def set_role(user, role: str | None) -> None:
    """Make `role` the user's only role group (None: no role)."""
    from django.contrib.auth.models import Group

    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    user.__dict__.pop("_cp_role", None)
