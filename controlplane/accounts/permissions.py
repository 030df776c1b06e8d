"""The API's permission check: the role an endpoint needs (controlplane.accounts.roles)."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from .roles import EDITOR, VIEWER, has_role, role_of


def required_role(request, view) -> str:
    """A view's `action_roles` (per action) first; else reading needs a viewer and writing
    the view's `write_role` (an editor by default)."""
    action = getattr(view, "action", None)
    roles = getattr(view, "action_roles", {})
    if action in roles:
        return roles[action]
    if request.method in SAFE_METHODS:
        return VIEWER
    return getattr(view, "write_role", EDITOR)


class RolePermission(BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            return False  # 401 with the authentication challenge
        needed = required_role(request, view)
        if has_role(user, needed):
            return True
        self.message = (
            f"this needs the {needed} role; {user.get_username()} has {role_of(user) or 'no role'}"
        )
        return False
