"""PILOT's settings, each with an app-level default: the one place the app reads them.

A host project that adds `workflows` to INSTALLED_APPS needs to set none of
these; it sets one to change it (`PILOT_LEASE_SECONDS = 120` in its settings).
The standalone project (pilot/settings.py) reads each from the environment.

    from workflows.conf import pilot_settings
    pilot_settings.PILOT_LEASE_SECONDS

Every read goes through `django.conf.settings`, so `override_settings` works and
nothing is frozen at import time. A name that is not a PILOT setting is an
AttributeError (a typo must not silently read a default).

docs/embedding.md lists the settings and what each does.
"""

from __future__ import annotations

from django.conf import settings


def _heartbeat_default() -> float:
    # A third of the lease, at most 5 s: one late heartbeat never loses a lease.
    return min(5.0, float(pilot_settings.PILOT_LEASE_SECONDS) / 3)


def _max_running_default() -> int:
    from django_q.conf import Conf

    return max(1, int(Conf.WORKERS or 1) - 1)


DEFAULTS: dict[str, object] = {
    # Execution (docs/design.md).
    "PILOT_LEASE_SECONDS": 60.0,
    "PILOT_HEARTBEAT_SECONDS": _heartbeat_default,
    "PILOT_DISPATCHER_POLL_SECONDS": 1.0,
    "PILOT_REENQUEUE_SECONDS": 10.0,
    # The queue: how long one message keeps a worker taking due tasks from the
    # table, and whether the PostgreSQL store prepares its hot statements (off
    # behind a pooler that does not keep sessions).
    "PILOT_DRAIN_SECONDS": 5.0,
    # Fair shares (docs/design.md, "Fairness"): most tasks of one client running at
    # once, 0 for no cap. Default: one worker fewer than the cluster has, so on
    # one cluster another client always finds a worker.
    "PILOT_MAX_RUNNING_PER_CLIENT": _max_running_default,
    "PILOT_PG_PREPARED": True,
    # The django-q2 cluster (and so the broker queue) PILOT's messages go to: the
    # host's Q_CLUSTER name, or an ALT_CLUSTERS entry (docs/embedding.md).
    "PILOT_Q_CLUSTER_NAME": "pilot",
    # How long `run_workers` lets running steps go on after a stop signal.
    "PILOT_STOP_SECONDS": 8.0,
    # Schedules (docs/schedules.md).
    "PILOT_SCHEDULER_POLL_SECONDS": 1.0,
    "PILOT_SCHEDULE_GRACE_SECONDS": 60.0,
    # The API.
    "PILOT_MAX_PAYLOAD_BYTES": 262144,
    "PILOT_TRIGGER_RATE": "6000/min",
    "PILOT_ACTION_RATE": "600/min",
    "PILOT_API_DOCS_PUBLIC": False,
    # Completion webhooks (docs/webhooks.md).
    "PILOT_WEBHOOK_ALLOW_PRIVATE": False,
    "PILOT_WEBHOOK_TIMEOUT_SECONDS": 10.0,
    "PILOT_WEBHOOK_FIRST_RETRY_SECONDS": 2.0,
    "PILOT_WEBHOOK_MAX_DELAY_SECONDS": 3600.0,
    "PILOT_WEBHOOK_GIVE_UP_SECONDS": 86400.0,
    # Metrics (docs/operations.md).
    "PILOT_METRICS_TOKEN": None,
    "PILOT_METRICS_TASKS_TTL": 15,
    # Login guard (docs/security.md).
    "PILOT_TRUSTED_PROXIES": 0,
    "PILOT_LOGIN_MAX_FAILURES": 5,
    "PILOT_LOGIN_MAX_FAILURES_PER_USER": 20,
    "PILOT_LOGIN_MAX_FAILURES_PER_IP": 50,
    "PILOT_LOGIN_LOCKOUT_SECONDS": 900,
    "PILOT_LOGIN_DEVICE_DAYS": 90,
    # Opt-in: the demo.* workflows, and the operator console's branding of the
    # whole admin site (header, title, index page, login page).
    "PILOT_DEMO_WORKFLOWS": False,
    "PILOT_ADMIN_BRANDING": False,
}


class PilotSettings:
    """Attribute access to PILOT's settings: the project's value, else the default."""

    def __getattr__(self, name: str):
        if name not in DEFAULTS:
            raise AttributeError(f"{name} is not a PILOT setting (workflows/conf.py)")
        value = getattr(settings, name, _MISSING)
        if value is _MISSING:
            value = DEFAULTS[name]
            if callable(value):
                value = value()
        return value


_MISSING = object()

pilot_settings = PilotSettings()
