"""Django settings for the control plane.

Every setting an operator may change comes from an environment variable (see docs/configuration.md);
the defaults are the embedded development stack that `./stack up` starts under var/.
"""

from __future__ import annotations

import re
import secrets
import socket
from datetime import timedelta
from pathlib import Path

import psutil
from csp.constants import NONCE, NONE, SELF

from .env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    parse_database_url,
)

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
# Connection secrets are encrypted with keys of their own (controlplane/crypto.py), never
# derived from SECRET_KEY: CONTROLPLANE_SECRETS_KEY (comma-separated, newest first), or a key
# file generated once (mode 0600) and rotated with `manage.py rotate_secrets_key`.
CONTROLPLANE_SECRETS_KEY = env_str("CONTROLPLANE_SECRETS_KEY", None)
CONTROLPLANE_SECRETS_KEY_FILE = Path(
    env_str("CONTROLPLANE_SECRETS_KEY_FILE", str(VAR_DIR / "secrets.key"))
)
# TLS files a connection names (Postgres sslrootcert, Kafka ssl_cafile/ssl_certfile/
# ssl_keyfile) must be inside this directory; unset: connections may name no TLS file.
CONTROLPLANE_CERT_DIR = env_str("CONTROLPLANE_CERT_DIR", None)
# Whether a Postgres connection may use a Unix socket (a host starting with "/").
CONTROLPLANE_ALLOW_UNIX_SOCKETS = env_bool("CONTROLPLANE_ALLOW_UNIX_SOCKETS", False)
# A files connection's local (file:) root must be inside this directory (symbolic links
# resolved). Here var/files; the production profile allows no local roots unless it is set.
CONTROLPLANE_FILES_DIR = env_str("CONTROLPLANE_FILES_DIR", str(VAR_DIR / "files"))

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
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here (no CDN)
    "axes",  # sign-in lockout (controlplane.accounts.lockout)
    "csp",  # Content-Security-Policy header
    "controlplane.accounts",
    "controlplane.connections",
    "controlplane.definitions",
    "controlplane.supervision",
    "controlplane.observability",
    "controlplane.alerting",
    "controlplane.fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Early: a database that is down makes any later middleware or view fail.
    "controlplane.middleware.DatabaseUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.accounts.security.CSPMiddleware",  # CONTENT_SECURITY_POLICY below
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
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
            # Human units and one timestamp style on every page (`seconds`, `ms`, `ago`, `when`).
            "builtins": ["controlplane.pages.units"],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", "postgresql://controlplane@127.0.0.1:55432/controlplane")
    )
}
# Every connection to the control plane's database gives up connecting after a few seconds,
# notices a dead server by TCP keepalives, and stops a statement that waits too long (a lock
# held by a hung client); DATABASE_URL's own ?options win.
_DB_STATEMENT_TIMEOUT_MS = int(
    1000 * env_float("CONTROLPLANE_DB_STATEMENT_TIMEOUT", 60.0, minimum=0.0)
)
DATABASES["default"]["OPTIONS"] = {
    "connect_timeout": env_int("CONTROLPLANE_DB_CONNECT_TIMEOUT", 5, minimum=1),
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    **(
        {"options": f"-c statement_timeout={_DB_STATEMENT_TIMEOUT_MS}"}
        if _DB_STATEMENT_TIMEOUT_MS
        else {}
    ),
    **DATABASES["default"]["OPTIONS"],
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
    # DRF's defaults, JSON's bounded: depth, numbers, strings, duplicate keys (parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
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
    # /api/schema/swagger-ui/: Swagger UI from the app's own static files, its initializer a
    # script of its own (SpectacularSwaggerSplitView), under the Content-Security-Policy.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SERVE_PERMISSIONS": ["controlplane.accounts.permissions.RolePermission"],
    "COMPONENT_SPLIT_REQUEST": True,
    # 3.1: its schemas are JSON Schema 2020-12, which the pipeline spec's is.
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api.openapi.add_spec_schemas",
    ],
}

# Celery: Redis is the broker; results are not kept (tasks report through Postgres).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "redis://127.0.0.1:56379/0")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# ...but not the periodic tasks (the tick, the metrics collector, retention): each is
# idempotent and the next one does its work, so redelivery buys nothing, and a message still
# unacknowledged when Redis goes away makes kombu 5.7's worker crash while restoring it
# ("Unrecoverable error: AttributeError: 'NoneType' object has no attribute 'hostname'"):
# they ack on receipt (`acks_late=False` on the tasks).
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker that is down or paused costs seconds, never a hung process: sending a task (done
# off the request path, see tasks.nudge) and the worker's own connection time out.
CELERY_BROKER_CONNECTION_TIMEOUT = env_float("CONTROLPLANE_BROKER_TIMEOUT", 5.0, minimum=0.5)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_timeout": CELERY_BROKER_CONNECTION_TIMEOUT,
    "socket_connect_timeout": CELERY_BROKER_CONNECTION_TIMEOUT,
    "socket_keepalive": True,
    "health_check_interval": 10,
}
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CONTROLPLANE_RECONCILE_SECONDS = env_float("CONTROLPLANE_RECONCILE_SECONDS", 5.0, minimum=0.5)
# The metrics collector's interval: how fresh the figures every page and scrape show are.
CONTROLPLANE_COLLECT_SECONDS = env_float("CONTROLPLANE_COLLECT_SECONDS", 10.0, minimum=1.0)
# Lag samples (one per pipeline and round) are kept this long.
CONTROLPLANE_LAG_SAMPLE_HOURS = env_float("CONTROLPLANE_LAG_SAMPLE_HOURS", 48.0, minimum=0.1)
CONTROLPLANE_ALERT_SECONDS = env_float("CONTROLPLANE_ALERT_SECONDS", 15.0, minimum=1.0)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "controlplane.supervision.tasks.reconcile",
        "schedule": CONTROLPLANE_RECONCILE_SECONDS,
        # A tick that waited longer than one interval is stale: the next one supersedes it.
        "options": {"expires": CONTROLPLANE_RECONCILE_SECONDS},
    },
    "collect-metrics": {
        "task": "controlplane.observability.tasks.collect_metrics",
        "schedule": CONTROLPLANE_COLLECT_SECONDS,
        # A round that waited longer than one interval is stale: the next one supersedes it.
        "options": {"expires": CONTROLPLANE_COLLECT_SECONDS},
    },
    "evaluate-alerts": {
        "task": "controlplane.alerting.tasks.evaluate_alerts",
        "schedule": CONTROLPLANE_ALERT_SECONDS,
        "options": {"expires": CONTROLPLANE_ALERT_SECONDS},
    },
    "deliver-alerts": {
        "task": "controlplane.alerting.tasks.deliver_alerts",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    "fleet-drift": {
        "task": "controlplane.fleet.tasks.check_drift",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "auto-rollback": {
        "task": "controlplane.supervision.tasks.auto_rollback",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    "restore-points": {
        "task": "controlplane.supervision.tasks.restore_points",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "purge-dead-letters": {
        "task": "controlplane.observability.tasks.purge_dead_letters",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    "compact-progress": {
        "task": "controlplane.observability.tasks.compact_progress",
        "schedule": 600.0,
        "options": {"expires": 600.0},
    },
}
# Several control-plane hosts (docs/deployment.md). Each host's Celery worker also consumes
# the queue `host.<name>`: whatever touches a process (launch, stop, kill, observe) runs on
# the host that runs it. The name defaults to the machine's; give each host its own.
CONTROLPLANE_HOST_NAME = env_str("CONTROLPLANE_HOST_NAME", "") or socket.gethostname()
# How many driver processes (dedicated drivers and shared applications) this host takes;
# by default one per 2 GiB of memory (a driver is ~1.65 GB resident).
CONTROLPLANE_HOST_DRIVERS = env_int(
    "CONTROLPLANE_HOST_DRIVERS", max(1, psutil.virtual_memory().total // (2 * 1024**3)), minimum=0
)
# A worker says its host is alive this often; a host silent for CONTROLPLANE_HOST_TIMEOUT is
# lost: its runs' tokens are revoked (the runs end, cause `host-lost`) and they start elsewhere.
CONTROLPLANE_HOST_HEARTBEAT_SECONDS = env_float(
    "CONTROLPLANE_HOST_HEARTBEAT_SECONDS", 5.0, minimum=0.5
)
CONTROLPLANE_HOST_TIMEOUT = env_float("CONTROLPLANE_HOST_TIMEOUT", 60.0, minimum=2.0)
# Alerts (controlplane.alerting): evaluated and sent by beat tasks, apart from the tick.
# E-mail for alert channels of kind "email" (Django's SMTP backend).
EMAIL_HOST = env_str("CONTROLPLANE_SMTP_HOST", "localhost")
EMAIL_PORT = env_int("CONTROLPLANE_SMTP_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("CONTROLPLANE_SMTP_USER", "")
EMAIL_HOST_PASSWORD = env_str("CONTROLPLANE_SMTP_PASSWORD", "")
EMAIL_USE_TLS = env_bool("CONTROLPLANE_SMTP_STARTTLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("CONTROLPLANE_ALERT_FROM", "controlplane@localhost")
# No rule reminds more often than this (a rule asking for less is refused; 0 stays "never").
CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS = env_int(
    "CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS", 60, minimum=1
)
# At most this many messages per channel within the window, all rules together; the excess
# is recorded as suppressed and the next message sent says how many. 0: no limit.
CONTROLPLANE_ALERT_CHANNEL_LIMIT = env_int("CONTROLPLANE_ALERT_CHANNEL_LIMIT", 20, minimum=0)
CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES = env_float(
    "CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES", 10.0, minimum=0.1
)
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
# makes the next run start from the spec's starting_offsets. A local path (every host that
# runs drivers must see the same one), or a URI on a distributed file system:
# hdfs://namenode:8020/path or s3a://bucket/path (controlplane/definitions/checkpoints.py
# reaches them; docs/deployment.md).
_checkpoint_root = env_str("CONTROLPLANE_CHECKPOINT_ROOT", str(VAR_DIR / "checkpoints"))
CONTROLPLANE_CHECKPOINT_ROOT = (
    _checkpoint_root.rstrip("/") if "://" in _checkpoint_root else Path(_checkpoint_root)
)
# HDFS, read by the control plane over WebHDFS: the NameNode's HTTP address (host:port) and
# the user it acts as (simple authentication; the OS user by default). Drivers reach HDFS with
# Hadoop's own client (the URI's host and port, HADOOP_CONF_DIR for anything more).
CONTROLPLANE_HDFS_HTTP_ADDRESS = env_str("CONTROLPLANE_HDFS_HTTP_ADDRESS")
CONTROLPLANE_HDFS_USER = env_str("CONTROLPLANE_HDFS_USER")
# S3 (or an S3-compatible store): the endpoint (unset: AWS's), region, path-style addressing
# and the keys, which the control plane and drivers use for s3a:// checkpoints and files
# roots. The keys are secrets: they reach drivers only in their 0600 run files.
CONTROLPLANE_S3_ENDPOINT = env_str("CONTROLPLANE_S3_ENDPOINT")
CONTROLPLANE_S3_REGION = env_str("CONTROLPLANE_S3_REGION", "us-east-1")
CONTROLPLANE_S3_PATH_STYLE = env_bool("CONTROLPLANE_S3_PATH_STYLE", True)
CONTROLPLANE_S3_ACCESS_KEY = env_str("CONTROLPLANE_S3_ACCESS_KEY")
CONTROLPLANE_S3_SECRET_KEY = env_str("CONTROLPLANE_S3_SECRET_KEY")
# Every request the control plane makes to HDFS or S3 gives up after this long (connect and
# read each): a slow NameNode never hangs a page, an API call or a reconcile tick.
CONTROLPLANE_STORAGE_TIMEOUT_SECONDS = env_float(
    "CONTROLPLANE_STORAGE_TIMEOUT_SECONDS", 10.0, minimum=0.5
)
# Restore points (copies of checkpoints) live under the checkpoint root, so that their files
# can share data with the checkpoint's through hard links: `<root>/_restore_points/<pipeline>/`.
# Per pipeline, the newest CONTROLPLANE_RESTORE_POINTS_KEEP are kept, none older than
# CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS, except the newest one, always kept.
CONTROLPLANE_RESTORE_POINTS_KEEP = env_int("CONTROLPLANE_RESTORE_POINTS_KEEP", 10, minimum=1)
CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS = env_int(
    "CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS", 30, minimum=1
)
# Dead letters (records that did not parse, in each sink database's `_cp_dead_letters`) older
# than this are deleted by the control plane (hourly).
CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS = env_int(
    "CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS", 30, minimum=1
)
CONTROLPLANE_RUNS_ROOT = Path(env_str("CONTROLPLANE_RUNS_ROOT", str(VAR_DIR / "runs")))
# local[2,4]: two cores, and a failed task is tried up to 4 times (plain local[2] tries once),
# so a sink write broken by a database restart is retried by Spark, not fatal to the batch.
SPARK_MASTER = env_str("SPARK_MASTER", "local[2,4]")
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "1g")
# A shared application that names no master of its own. In local mode it gets more task
# slots than the machine has cores: its members' small batches spend most of a task waiting
# on Kafka and Postgres round trips, holding the slot meanwhile (docs/shared-applications.md).
SPARK_APPLICATION_MASTER = env_str(
    "SPARK_APPLICATION_MASTER",
    "local[8,4]" if SPARK_MASTER.startswith("local") else SPARK_MASTER,
)
# The spark-submit to launch drivers with; empty: the one shipped with pip's pyspark.
SPARK_SUBMIT = env_str("SPARK_SUBMIT", "")
# A standalone master's web UI (`./stack cluster` prints it), linked from the pages of
# applications and pipelines that run on a spark:// master.
SPARK_MASTER_UI_URL = env_str("SPARK_MASTER_UI_URL", "")
# The driver's Spark UI (and RPC endpoint) listen on this address (SPARK_LOCAL_IP in the
# driver's environment): loopback by default. "*": Spark's own default, every interface.
CONTROLPLANE_SPARK_UI_HOST = env_str("CONTROLPLANE_SPARK_UI_HOST", "127.0.0.1")
CONTROLPLANE_SPARK_UI_ENABLED = env_bool("CONTROLPLANE_SPARK_UI_ENABLED", True)
# Drivers get a minimal environment (launcher.DRIVER_ENV); these variables (names, or
# prefixes ending in "*") are passed on as well. Never the control plane's own secrets.
CONTROLPLANE_DRIVER_ENV = env_list("CONTROLPLANE_DRIVER_ENV", [])
# A graceful stop that has not finished after this long is turned into a kill.
CONTROLPLANE_STOP_TIMEOUT = env_float("CONTROLPLANE_STOP_TIMEOUT", 60.0, minimum=1.0)
# A query killed inside a shared application that has not ended after this long gets its
# application recycled (the other members stopped gracefully, the process killed).
CONTROLPLANE_KILL_TIMEOUT = env_float("CONTROLPLANE_KILL_TIMEOUT", 30.0, minimum=1.0)
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
# Health (controlplane.observability.health): a pipeline that failed this many times within
# this many minutes since its last start by hand, its current run not having committed since
# it started, is crash-looping (red everywhere), whatever its status says.
# Preflight (controlplane.definitions.preflight): each system a definition names is asked
# within this many seconds. Saving from the form and starting (resume, restart) run it: on
# errors it `refuse`s (unless the user ticks / sends force), `warn`s (goes on, and says so),
# or is `off`.
CONTROLPLANE_PREFLIGHT_TIMEOUT = env_float("CONTROLPLANE_PREFLIGHT_TIMEOUT", 5.0, minimum=0.5)
CONTROLPLANE_PREFLIGHT = env_str("CONTROLPLANE_PREFLIGHT", "refuse")
if CONTROLPLANE_PREFLIGHT not in ("refuse", "warn", "off"):
    raise ImproperlyConfiguredEnv(
        f"CONTROLPLANE_PREFLIGHT={CONTROLPLANE_PREFLIGHT!r}: refuse, warn or off"
    )
# Definitions as code (controlplane.fleet, docs/definitions-as-code.md): a fleet's files name
# their secrets by reference, never by value: `{env: NAME}` reads the control plane's
# environment variable NAME, which must begin with this prefix (so a file cannot name the
# control plane's own secrets, e.g. DATABASE_URL); `{file: NAME}` reads the file NAME in this
# directory (a mounted secret store, e.g. /run/secrets; empty: none). An apply waits this
# long for another one to finish, then is refused (409).
CONTROLPLANE_FLEET_SECRET_PREFIX = env_str("CONTROLPLANE_FLEET_SECRET_PREFIX", "FLEET_SECRET_")
if not CONTROLPLANE_FLEET_SECRET_PREFIX or len(CONTROLPLANE_FLEET_SECRET_PREFIX) < 3:
    raise ImproperlyConfiguredEnv("CONTROLPLANE_FLEET_SECRET_PREFIX: at least 3 characters")
CONTROLPLANE_FLEET_SECRETS_DIR = env_str("CONTROLPLANE_FLEET_SECRETS_DIR", "")
CONTROLPLANE_FLEET_LOCK_SECONDS = env_float("CONTROLPLANE_FLEET_LOCK_SECONDS", 30.0, minimum=0.1)
CONTROLPLANE_CRASH_LOOP_FAILURES = env_int("CONTROLPLANE_CRASH_LOOP_FAILURES", 3, minimum=1)
CONTROLPLANE_CRASH_LOOP_MINUTES = env_float("CONTROLPLANE_CRASH_LOOP_MINUTES", 10.0, minimum=1.0)

# --- Sign-in and browser security (docs/security.md) ---------------------------------------
# Lockout of repeated failed sign-ins on /login/ and /admin/login/ (django-axes): a user name
# is locked at one client address after CONTROLPLANE_LOGIN_FAILURE_LIMIT failures, an address
# for every user name after CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT (0: no such limit), until
# CONTROLPLANE_LOGIN_COOLOFF_MINUTES have passed since the last failure (0: until an admin
# runs `manage.py axes_reset_username NAME` / `axes_reset_ip ADDRESS` / `axes_reset`).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out client
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("CONTROLPLANE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT = env_int("CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT", 50, minimum=0)
_cooloff_minutes = env_float("CONTROLPLANE_LOGIN_COOLOFF_MINUTES", 15.0, minimum=0.0)
AXES_COOLOFF_TIME = timedelta(minutes=_cooloff_minutes) if _cooloff_minutes else None
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "controlplane.accounts.lockout.LoginLockoutHandler"
AXES_LOCKOUT_CALLABLE = "controlplane.accounts.lockout.lockout_response"
AXES_CLIENT_IP_CALLABLE = "controlplane.accounts.security.client_ip"
AXES_RESET_ON_SUCCESS = True  # a user who mistyped and then got it right starts afresh
AXES_VERBOSE = False
# Reverse proxies in front of the web app that append to X-Forwarded-For (0: none, the
# client's address is REMOTE_ADDR). Lockouts and API throttles count per that address.
CONTROLPLANE_PROXY_COUNT = env_int("CONTROLPLANE_PROXY_COUNT", 0, minimum=0)

# Refused API tokens per client address (controlplane.accounts.throttles): past the rate, 429.
_bad_token_rate = env_str("CONTROLPLANE_API_BAD_TOKEN_RATE", "20/min")
if _bad_token_rate.lower() == "off":
    _bad_token_rate = None
elif not re.fullmatch(r"[1-9]\d*/(s|sec|m|min|h|hour|d|day)", _bad_token_rate):
    raise ImproperlyConfiguredEnv(
        f"CONTROLPLANE_API_BAD_TOKEN_RATE={_bad_token_rate!r} is not a rate like 20/min (or off)"
    )
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"bad_token": _bad_token_rate}
REST_FRAMEWORK["NUM_PROXIES"] = CONTROLPLANE_PROXY_COUNT
# Throttle counters: per web process by default; a redis:// URL shares them between processes.
_security_cache_url = env_str("CONTROLPLANE_SECURITY_CACHE_URL", None)
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "security": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _security_cache_url}
        if _security_cache_url
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "security"}
    ),
}
# Failed sign-ins, lockouts and refused tokens are logged by controlplane.security; axes' own
# lines would repeat them.
LOGGING["loggers"]["axes"] = {"level": "ERROR"}

# Content-Security-Policy (django-csp): scripts and styles only from this site's own files,
# no inline script, no style attribute, no plugin, no framing, forms post only here. A
# template that really needs an inline script gives it nonce="{{ request.csp_nonce }}".
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "connect-src": [SELF],
        # Images inline as data: URIs too (Swagger UI's icons); never a script.
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
if _csp_report_uri := env_str("CONTROLPLANE_CSP_REPORT_URI", None):
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["report-uri"] = [_csp_report_uri]
if env_bool("CONTROLPLANE_CSP_REPORT_ONLY", False):
    # Report what would be blocked without blocking it (while rolling out a change).
    CONTENT_SECURITY_POLICY_REPORT_ONLY = CONTENT_SECURITY_POLICY
    CONTENT_SECURITY_POLICY = None
