"""Django settings for the control plane.

Every setting an operator may change comes from an environment variable (see docs/configuration.md);
the defaults are the embedded development stack that `./stack up` starts under var/.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from .env import env_bool, env_float, env_int, env_list, env_str, parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR", str(BASE_DIR / "var")))


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, or a key generated once into var/secret_key for the dev stack."""
    configured = env_str("DJANGO_SECRET_KEY")
    if configured:
        return configured
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Connection secrets are encrypted with this key; it defaults to one derived from SECRET_KEY.
CONTROLPLANE_SECRETS_KEY = env_str("CONTROLPLANE_SECRETS_KEY", None)

# DEBUG pages show stack traces and settings: never on by default.
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "controlplane.accounts",
    "controlplane.connections",
    "controlplane.pipelines",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "controlplane.accounts.context.role",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", "postgresql://controlplane@127.0.0.1:55432/controlplane")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# Static files straight from the app's static folders (no collectstatic step needed).
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header is what turns "not authenticated" into a 401.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Roles (viewer, operator, editor, admin): controlplane.accounts.roles.
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.accounts.permissions.RolePermission"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}
if env_bool("CONTROLPLANE_BROWSABLE_API", True):
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

SPECTACULAR_SETTINGS = {
    "TITLE": "Streaming control plane API",
    "DESCRIPTION": "Pipeline definitions, connections and on-call controls for PySpark "
    "Structured Streaming jobs. Authenticate with `Authorization: Token <key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["controlplane.accounts.permissions.RolePermission"],
    "COMPONENT_SPLIT_REQUEST": True,
}

# Celery: Redis is the broker; results are not kept (tasks report through Postgres).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "redis://127.0.0.1:56379/0")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CONTROLPLANE_RECONCILE_SECONDS = env_float("CONTROLPLANE_RECONCILE_SECONDS", 5.0, minimum=0.5)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "controlplane.pipelines.tasks.reconcile",
        "schedule": CONTROLPLANE_RECONCILE_SECONDS,
        # A tick that waited longer than one interval is stale: the next one supersedes it.
        "options": {"expires": CONTROLPLANE_RECONCILE_SECONDS},
    },
    "compact-progress": {
        "task": "controlplane.pipelines.tasks.compact_progress",
        "schedule": 600.0,
        "options": {"expires": 600.0},
    },
}
# Batch progress is kept raw this long, then summed per hour; the hourly sums this long.
CONTROLPLANE_PROGRESS_RAW_HOURS = env_float("CONTROLPLANE_PROGRESS_RAW_HOURS", 24.0, minimum=0.1)
CONTROLPLANE_PROGRESS_ROLLUP_DAYS = env_float(
    "CONTROLPLANE_PROGRESS_ROLLUP_DAYS", 90.0, minimum=1.0
)

# Timeouts for `POST /api/connections/{name}/test/`: an operator is waiting on the answer.
CONTROLPLANE_CONNECTION_TEST_TIMEOUT = env_float(
    "CONTROLPLANE_CONNECTION_TEST_TIMEOUT", 10.0, minimum=0.5
)
CONTROLPLANE_VERSION_HISTORY_LIMIT = env_int("CONTROLPLANE_VERSION_HISTORY_LIMIT", 0, minimum=0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "controlplane.redaction.RedactSecretsFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact"],
        },
    },
    "root": {"handlers": ["console"], "level": env_str("CONTROLPLANE_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # sqlglot warns with the user's SQL in the message when it falls back to a Command.
        "sqlglot": {"level": "ERROR"},
    },
}

# Spark jobs. Checkpoints are kept across runs (one directory per pipeline): deleting one
# makes the next run start from the spec's starting_offsets.
CONTROLPLANE_CHECKPOINT_ROOT = Path(
    env_str("CONTROLPLANE_CHECKPOINT_ROOT", str(VAR_DIR / "checkpoints"))
)
CONTROLPLANE_RUNS_ROOT = Path(env_str("CONTROLPLANE_RUNS_ROOT", str(VAR_DIR / "runs")))
SPARK_MASTER = env_str("SPARK_MASTER", "local[2]")
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "1g")
# The spark-submit to launch drivers with; empty: the one shipped with pip's pyspark.
SPARK_SUBMIT = env_str("SPARK_SUBMIT", "")
# A graceful stop that has not finished after this long is turned into a kill.
CONTROLPLANE_STOP_TIMEOUT = env_float("CONTROLPLANE_STOP_TIMEOUT", 60.0, minimum=1.0)
# Where drivers send heartbeats and progress (as seen from the driver's host).
CONTROLPLANE_URL = env_str("CONTROLPLANE_URL", "http://127.0.0.1:8000")
CONTROLPLANE_HEARTBEAT_SECONDS = env_float("CONTROLPLANE_HEARTBEAT_SECONDS", 5.0, minimum=0.5)
# A run that has sent no heartbeat for this long is lost: killed, and restarted per its policy.
CONTROLPLANE_HEARTBEAT_TIMEOUT = env_float("CONTROLPLANE_HEARTBEAT_TIMEOUT", 30.0, minimum=1.0)
# A running query that completes no batch (and is not idle, waiting for data) for
# max(this, 10 trigger intervals) is stalled: killed, and restarted per its policy. Spark
# reports an idle query every 10 s, so this must be longer than that.
CONTROLPLANE_STALL_SECONDS = env_float("CONTROLPLANE_STALL_SECONDS", 60.0, minimum=15.0)
# How long a new driver may take to send its first heartbeat (Spark's start-up included).
CONTROLPLANE_STARTUP_GRACE = env_float("CONTROLPLANE_STARTUP_GRACE", 120.0, minimum=1.0)
