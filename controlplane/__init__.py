"""The control plane: a Django project whose Celery app is loaded with it."""

from .celery import app as celery_app

__all__ = ("celery_app",)
