from __future__ import annotations

from .roles import role_of


def role(request) -> dict:
    """`user_role` in every template: the signed-in user's role, or None."""
    return {"user_role": role_of(getattr(request, "user", None))}
