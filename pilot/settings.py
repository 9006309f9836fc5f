"""PILOT settings, read from the environment; the names are a contract
(docs/design.md, "Settings are a contract").

A local run needs nothing set except `DJANGO_DEBUG=true` (which `make run` sets);
a production deployment sets `DJANGO_SECRET_KEY`, `DATABASE_URL` (PostgreSQL)
and usually `REDIS_URL`.
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from pilot.database_url import parse_database_url
from pilot.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    local_secret_key,
    refuse_placeholder,
)
from workflows.cluster import ORM_BROKER_CLASS
from workflows.conf import settings_from_environment

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DJANGO_DEBUG", False)

_secret = env_str("DJANGO_SECRET_KEY")
if not _secret:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY must be set (or DJANGO_DEBUG=true for a local run)"
        )
    # Only ever with DEBUG on: a local run must not need a secret, but it must
    # not share a published one either (sessions, password-reset links and the
    # login guard's device cookies are signed with it). Generated once per
    # checkout into an ignored file.
    _secret = local_secret_key(env_str("PILOT_LOCAL_SECRET_FILE")
                               or BASE_DIR / ".local-secret-key")
elif not DEBUG:
    # A production process does not start on an example's value or a short key
    # (before, `change-me` from deploy/pilot.env.example started with only a
    # check --deploy warning): sessions, device cookies and the sealed webhook
    # secrets (unless PILOT_SECRETS_KEYS) depend on it.
    refuse_placeholder("DJANGO_SECRET_KEY", _secret, minimum=50)
SECRET_KEY = _secret

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1")

# --- PILOT's settings -------------------------------------------------------------
# Every PILOT_* setting is declared once, with its type, default, bounds and what
# it does (workflows/conf.py, SETTINGS); this project reads each from the
# environment variable of its name, refusing a bad value with the variable's name.
# PILOT_Q_WORKERS, this project's cluster size, comes first: defaults follow it.
PILOT_Q_WORKERS = env_int("PILOT_Q_WORKERS", 2, minimum=1)
_pilot = settings_from_environment(os.environ, workers=PILOT_Q_WORKERS)
if not DEBUG:
    for _name, _minimum in (("PILOT_METRICS_TOKEN", 16), ("PILOT_SECRETS_KEYS", 32)):
        if _pilot[_name]:
            refuse_placeholder(_name, _pilot[_name], minimum=_minimum)
globals().update(_pilot)
PILOT_TRUSTED_PROXIES: int = _pilot["PILOT_TRUSTED_PROXIES"]  # named: read below
PILOT_Q_CLUSTER_NAME: str = _pilot["PILOT_Q_CLUSTER_NAME"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "workflows",
    "workflows.login_guard",  # lockouts after failed logins (docs/security.md)
]

MIDDLEWARE = [
    # request.trace_id (traceparent / X-Request-ID / generated) on every log event.
    "workflows.observability.middleware.TraceIdMiddleware",
    # /healthz, /readyz and /metrics answered here, before anything checks the
    # Host header: probes and scrapers address a node by its IP. Every other
    # path goes on to ALLOWED_HOSTS as usual.
    "workflows.observability.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from gunicorn, compressed and cached forever (hashed names).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Sets the login guard's device cookie after a successful password login.
    "workflows.accounts.login_guard.LoginDeviceMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Under DEBUG, Django's technical 404 page lists every route; answer like
# production instead (a no-op without DEBUG).
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.common.CommonMiddleware") + 1,
                  "workflows.debug.PlainNotFoundMiddleware")
# The technical 500 page (DEBUG) and error e-mails mask URL credentials too:
# DATABASE_URL, REDIS_URL, CACHES, Q_CLUSTER, the environment.
DEFAULT_EXCEPTION_REPORTER_FILTER = "workflows.debug.CredentialMaskingFilter"

ROOT_URLCONF = "pilot.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own pages: its 403 page, which names the missing permission
        # in the console's look (a host project keeps its own).
        "DIRS": [BASE_DIR / "pilot" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "pilot.wsgi.application"
ASGI_APPLICATION = "pilot.asgi.application"

# --- database -------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
# libpq's multi-host form too (pilot/database_url.py); a bad URL stops start-up.
_db = parse_database_url(DATABASE_URL)  # type: ignore[arg-type]  # it has a default

if _db["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two writers queue on the busy
    # timeout instead of deadlocking on a read-to-write upgrade ("database is
    # locked"). WAL lets readers run beside the single writer.
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": env_float("PILOT_SQLITE_TIMEOUT", 30.0, minimum=1),
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _db["CONN_MAX_AGE"] = 0
elif _db["ENGINE"] == "django.db.backends.postgresql":
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"].setdefault("connect_timeout", env_int("PILOT_DB_CONNECT_TIMEOUT", 5, minimum=1))
    # Persistent connections, checked before reuse so a restarted server costs a
    # reconnect, not an error.
    _db["CONN_MAX_AGE"] = env_int("PILOT_CONN_MAX_AGE", 60, minimum=0)
    _db["CONN_HEALTH_CHECKS"] = True
else:
    raise ImproperlyConfigured(
        f"DATABASE_URL must be sqlite:// or postgres:// (got engine {_db['ENGINE']})"
    )
DATABASES = {"default": _db}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth, i18n, static ---------------------------------------------------------

AUTHENTICATION_BACKENDS = [
    # Refuses a locked-out (username, client address) before any password check.
    "workflows.accounts.login_guard.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]

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
STATIC_ROOT = env_str("DJANGO_STATIC_ROOT") or BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # `manage.py collectstatic` writes compressed copies with content-hashed
    # names; whitenoise serves them with a far-future Cache-Control.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- HTTPS and security headers ---------------------------------------------------
# Secure by default whenever DEBUG is off; each can be turned down explicitly.
# Behind a TLS-terminating proxy set PILOT_TRUSTED_PROXIES to the number of
# proxies in front: Django then believes their X-Forwarded-Proto (so it knows a
# request came over HTTPS and does not redirect it again) and the login guard
# reads the client address from X-Forwarded-For. Only set it when the app is
# reachable solely through those proxies, or clients could forge both headers.

if PILOT_TRUSTED_PROXIES:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Probes and scrapers talk to the processes directly over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000,
                              minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
SESSION_COOKIE_AGE = env_int("DJANGO_SESSION_COOKIE_AGE", 8 * 3600, minimum=60)
X_FRAME_OPTIONS = "DENY"

# Deploy checks silenced, each for a reason (`check --deploy --fail-level WARNING`
# must pass on a correct production configuration):
SILENCED_SYSTEM_CHECKS = []
if not SECURE_HSTS_INCLUDE_SUBDOMAINS:
    # security.W005: HSTS for every subdomain is a decision about the whole domain
    # (other services live there), not PILOT's to make; the operator opts in with
    # DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS=true.
    SILENCED_SYSTEM_CHECKS.append("security.W005")
if not SECURE_HSTS_PRELOAD:
    # security.W021: preload-list submission is likewise domain-wide and hard to
    # undo; DJANGO_SECURE_HSTS_PRELOAD=true opts in.
    SILENCED_SYSTEM_CHECKS.append("security.W021")

# --- REST framework -------------------------------------------------------------
# Nothing global: PILOT's API views carry their own authentication (hashed API
# tokens, session), parser, renderer, exception handler and schema class
# (workflows/api/base.py), and the schema view its own drf-spectacular settings
# (workflows/api/docs_views.py), so a host project's REST_FRAMEWORK never
# changes PILOT's API, nor PILOT's the host's. DRF's defaults for anything else.

# --- PILOT's project knobs ------------------------------------------------------
# (PILOT's own settings are read at the top, from workflows/conf.py's declarations.)

# The operator console's look for the whole admin site (its header, index and
# login pages): this project is PILOT alone. A host project leaves it off.
PILOT_ADMIN_BRANDING = True

# How long an idle worker of the ORM broker waits before it asks the queue table
# again: the bound on an unloaded system's queue lag (the Redis broker blocks on
# its list instead). 20 cheap indexed reads a second per cluster when idle.
PILOT_Q_POLL_SECONDS = env_float("PILOT_Q_POLL_SECONDS", 0.05, minimum=0.01)
# Longest a single django-q2 delivery may run before its worker is killed; the
# lease and checkpoints make the kill safe, the next attempt resumes.
PILOT_TASK_TIMEOUT = env_int("PILOT_TASK_TIMEOUT", 1800, minimum=1)

# One cache shared by every process on every machine (the rate limits, login
# lockouts, the metrics' task counts): a table in the main database by default
# (the migrations create it whatever the broker), Redis when REDIS_URL is set.
# What a cache failure does is decided in workflows/observability/shared_cache.py.
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": REDIS_URL, "KEY_PREFIX": "pilot",
                          # A Redis that stops answering costs a request 2 s, not a
                          # hung worker (the defaults wait forever).
                          "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2}}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                          "LOCATION": "pilot_cache"}}
# django-q2's cluster statistics (which clusters are alive, their worker pids),
# read by the console's Workers & queue panel in the web process, so they must
# live where every process sees them. With the Redis broker django-q2 keeps them
# in Redis itself and this cache is unused. With the ORM broker they go to this
# cache: the same shared store as the default one (the pilot_cache table), under
# its own key prefix. A process-local cache would hide every cluster from the
# web process. Cost: each cluster writes one small row every guard cycle (0.5 s).
CACHES["djangoq"] = {**CACHES["default"], "KEY_PREFIX": "djangoq"}


# --- django-q2 ------------------------------------------------------------------
# Its defaults retry forever and redeliver a still-running task after `retry`
# seconds. PILOT's own claim, lease and dispatcher are the source of truth, so a
# redelivered message must be, and is, harmless: `retry` > `timeout`, one
# attempt, failures acknowledged, and no result rows (the Task table is the
# record). The `pilot.E00x` system checks refuse a configuration that breaks this.

Q_CLUSTER = {
    "name": PILOT_Q_CLUSTER_NAME,
    "workers": PILOT_Q_WORKERS,
    "timeout": PILOT_TASK_TIMEOUT,
    "retry": PILOT_TASK_TIMEOUT + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "save_limit": -1,
    "catch_up": False,
    "recycle": 500,
    "poll": PILOT_Q_POLL_SECONDS,
    "label": "Django Q",
    "cache": "djangoq",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"
    # django-q2's ORM broker whose pusher does not sleep 10 s after a database
    # error (workflows/broker.py).
    Q_CLUSTER["broker_class"] = ORM_BROKER_CLASS

# --- Django's task framework ------------------------------------------------------
# `@task` functions enqueued through django.tasks (the `django_tasks` backport on
# Django 5.2) run as PILOT tasks: docs/django-tasks.md.

TASKS = {"default": {"BACKEND": "workflows.django_tasks.PilotTaskBackend"}}

# --- logging ---------------------------------------------------------------------
# JSON lines on stdout by default (one object per record: timestamp, level, event,
# trace_id, task_id, workflow, attempt, duration_ms, ...); `text` for people
# (`make run` sets it). See workflows/observability/logging.py.

PILOT_LOG_FORMAT = env_choice("PILOT_LOG_FORMAT", "json", ("json", "text"))
_log_stream = env_choice("PILOT_LOG_STREAM", "stdout", ("stdout", "stderr"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "workflows.observability.logging.JsonFormatter"},
        "text": {"()": "workflows.observability.logging.TextFormatter"},
    },
    "filters": {
        "expected_forbidden": {"()": "workflows.observability.logging.ExpectedForbidden"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": PILOT_LOG_FORMAT,
                    "stream": f"ext://sys.{_log_stream}"},
    },
    "root": {"handlers": ["console"],
             "level": env_choice("PILOT_LOG_LEVEL", "info",
                                 ("debug", "info", "warning", "error")).upper()},
    "loggers": {
        "django-q": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        # Django's own handler (on `django`, printing with DEBUG on) would print every
        # record a second time, through root: only root's.
        "django": {"handlers": [], "level": "INFO"},
        "django.request": {"filters": ["expected_forbidden"]},
    },
}
