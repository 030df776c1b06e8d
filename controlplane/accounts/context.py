from __future__ import annotations

from .roles import EDITOR, has_role, role_of


def role(request) -> dict:
    """In every template: `user_role`, the signed-in user's role (or None), and `can_edit`,
    whether they may create and change pipelines and connections (links are only shown to
    those; the views check the role themselves)."""
    user = getattr(request, "user", None)
    return {"user_role": role_of(user), "can_edit": bool(user) and has_role(user, EDITOR)}
