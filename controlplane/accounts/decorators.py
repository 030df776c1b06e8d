"""Roles for server-rendered pages: the same rules as the API (controlplane.accounts.roles)."""

from __future__ import annotations

import functools

from django.contrib.auth.views import redirect_to_login
from django.shortcuts import render

from .roles import has_role, role_of


def role_required(role: str):
    """Anonymous visitors go to the login page; a signed-in user without `role` gets a 403
    page that says which role is needed."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user, role):
                return render(
                    request,
                    "403.html",
                    {"needed": role, "role": role_of(request.user)},
                    status=403,
                )
            return view(request, *args, **kwargs)

        wrapped.required_role = role
        return wrapped

    return decorate
