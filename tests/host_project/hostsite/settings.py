"""A host project's settings: `django-admin startproject hostsite` plus the
steps of docs/embedding.md, nothing else. tests/host_project/test_host_project.py
runs it from an installed wheel; HOST_DB (a SQLite path or a PostgreSQL URL) and
HOST_REDIS_URL come from the test."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "host-project-test-secret-key-0123456789-not-for-production"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # docs/embedding.md, step 2: PILOT and what it needs.
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "workflows",
    "workflows.login_guard",  # docs/embedding.md, step 3: the opt-in login guard
    # The host's own app, with its own workflow.
    "shop",
]

MIDDLEWARE = [
    # docs/embedding.md, step 3 (optional pieces, each with a check warning if left out).
    "workflows.observability.middleware.TraceIdMiddleware",
    "workflows.observability.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "workflows.accounts.login_guard.LoginDeviceMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
AUTHENTICATION_BACKENDS = [
    "workflows.accounts.login_guard.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "hostsite.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
WSGI_APPLICATION = "hostsite.wsgi.application"

_db = os.environ["HOST_DB"]
if _db.startswith("postgres"):
    from urllib.parse import urlsplit

    _url = urlsplit(_db)
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "", "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "", "PORT": str(_url.port or "")}}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _db,
                             "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# The host's own DRF defaults, deliberately unlike PILOT's: PILOT's API views
# must not depend on them, nor change them for the host's own views.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.BrowsableAPIRenderer",
                                 "rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.NamespaceVersioning",
}

# docs/embedding.md, step 5: a cache every process shares (PILOT's rate limits
# and login lockouts) under an alias of PILOT's own, so the host's default cache
# stays Django's per-process one; PILOT's migrations create the `pilot_cache` table.
_redis = os.environ.get("HOST_REDIS_URL")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if _redis:
    CACHES["pilot"] = {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                       "LOCATION": _redis, "KEY_PREFIX": f"host-{os.getpid()}"}
else:
    CACHES["pilot"] = {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                       "LOCATION": "pilot_cache"}
PILOT_CACHE_ALIAS = "pilot"

# docs/embedding.md, step 5: the host's own django-q2 cluster keeps django-q2's
# defaults (max_attempts 0, results kept); PILOT's cluster is an ALT_CLUSTERS
# entry with PILOT's limits, run by `manage.py run_workers`.
# PILOT's cluster, and so its Redis queue (django_q:<name>:q), named for this
# project: on a Redis other projects share, the default "pilot" would be
# shared too (pilot.W027).
PILOT_Q_CLUSTER_NAME = "hostsite-pilot"
Q_CLUSTER = {
    "name": "hostsite",
    "workers": 1,
    "timeout": 60,
    "retry": 90,
    "poll": 0.1,
    "ALT_CLUSTERS": {
        PILOT_Q_CLUSTER_NAME: {"workers": 2, "timeout": 300, "retry": 360, "max_attempts": 1,
                  "ack_failures": True, "save_limit": -1, "catch_up": False},
    },
}
if _redis:
    Q_CLUSTER["redis"] = _redis
else:
    Q_CLUSTER["orm"] = "default"

# A smaller payload limit than PILOT's default, to see the app-level default
# overridden by the host.
PILOT_MAX_PAYLOAD_BYTES = 4096
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "WARNING"}}

# docs/django-tasks.md: Django's task framework on PILOT (django.tasks on Django 6,
# the django-tasks backport, pilot-workflows[tasks], on 5.2). The host's tasks
# belong to its API client, so they show in that client's own task list.
TASKS = {"default": {"BACKEND": "workflows.django_tasks.PilotTaskBackend",
                     "OPTIONS": {"OWNER": "shop-backend"}}}
