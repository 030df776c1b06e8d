"""WSGI entry point (gunicorn, uWSGI, or `manage.py runserver` in development)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()
