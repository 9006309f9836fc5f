"""PILOT's settings, each declared once: its name, type, default, bounds and what
it does (docs/design.md, "Settings are a contract").

A host project that adds `workflows` to INSTALLED_APPS needs to set none of
these; it sets one to change it (`PILOT_LEASE_SECONDS = 120` in its settings).
The standalone project (pilot/settings.py) reads every one of them from the
environment through the same declarations (`settings_from_environment`), so a
default, a bound or a type is never written twice.

    from workflows.conf import pilot_settings
    pilot_settings.PILOT_LEASE_SECONDS

Every read goes through `django.conf.settings`, so `override_settings` works and
nothing is frozen at import time. A name that is not a PILOT setting is an
AttributeError (a typo must not silently read a default). docs/embedding.md and
docs/operations.md list the settings; tests/unit/test_conf.py holds the lists to
these declarations.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_RATE = re.compile(r"\d+/(s|sec|second|m|min|minute|h|hour|d|day)")


class Rate(str):
    """A throttle rate such as 6000/min (s, min, hour, day)."""


# A default computed from other values: `read(name)` gives a setting's value (the
# project's, the environment's or its own default), `workers` the number of
# worker processes of a cluster (django-q2's, or PILOT_Q_WORKERS when the
# standalone project reads its environment).
Derived = Callable[[Callable[[str], Any], int], Any]


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str
    minimum: float | None = None

    @property
    def default_text(self) -> str:
        """The default as docs/settings.md shows it."""
        if callable(self.default):
            return {_heartbeat: "min(5, `PILOT_LEASE_SECONDS` / 3)",
                    _one_worker_fewer: "a cluster's workers − 1, at least 1"}[self.default]
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "`true`" if self.default else "`false`"
        return f"`{self.default:g}`" if isinstance(self.default, float) else f"`{self.default}`"

    def default_for(self, read: Callable[[str], Any], workers: int) -> Any:
        return self.default(read, workers) if callable(self.default) else self.default

    def parse(self, raw: str) -> Any:
        """The value of `raw` (an environment variable's text) or
        ImproperlyConfigured naming the variable."""
        name = self.name
        text = raw.strip()
        if self.type is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")
        if self.type is Rate:
            if not _RATE.fullmatch(text):
                raise ImproperlyConfigured(
                    f"{name}={raw!r} must look like 6000/min (s, min, hour, day)")
            return text
        if self.type is str:
            return raw
        try:
            value = self.type(text)
        except ValueError:
            kind = "an integer" if self.type is int else "a number"
            raise ImproperlyConfigured(f"{name}={raw!r} is not {kind}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ImproperlyConfigured(f"{name}={raw!r} must be a finite number")
        if self.minimum is not None and value < self.minimum:
            raise ImproperlyConfigured(f"{name}={value} must be at least {self.minimum:g}")
        return value


def _heartbeat(read: Callable[[str], Any], workers: int) -> float:
    # A third of the lease, at most 5 s: one late heartbeat never loses a lease.
    return min(5.0, float(read("PILOT_LEASE_SECONDS")) / 3)


def _one_worker_fewer(read: Callable[[str], Any], workers: int) -> int:
    # One worker fewer than a cluster has, so another client always finds one free.
    return max(1, workers - 1)


S = Setting
SETTINGS: tuple[Setting, ...] = (
    # Execution (docs/design.md, "Execution").
    S("PILOT_LEASE_SECONDS", float, 60.0, "worker lease; heartbeats renew it", minimum=0.5),
    S("PILOT_HEARTBEAT_SECONDS", float, _heartbeat,
      "how often ctx.heartbeat() really writes (a third of the lease, at most 5 s)",
      minimum=0.1),
    S("PILOT_DISPATCHER_POLL_SECONDS", float, 1.0, "dispatcher poll interval when idle",
      minimum=0.05),
    S("PILOT_REENQUEUE_SECONDS", float, 10.0,
      "a due task whose message is this old is sent another (it may be lost)", minimum=0.5),
    S("PILOT_DRAIN_SECONDS", float, 5.0,
      "how long one message keeps a worker claiming due tasks from the table; 0: one "
      "task per message", minimum=0),
    S("PILOT_PG_PREPARED", bool, True,
      "the PostgreSQL store prepares its hot statements once per connection; off behind a "
      "pooler that does not keep sessions (pgbouncer in transaction mode)"),
    # Fair shares (docs/design.md, "Fairness").
    S("PILOT_MAX_RUNNING_PER_CLIENT", int, _one_worker_fewer,
      "most tasks of one client held by workers at once (running, compensating, "
      "cancelling); 0: no cap", minimum=0),
    # The django-q2 cluster (and so the broker queue) PILOT's messages go to: the
    # host's Q_CLUSTER name, or an ALT_CLUSTERS entry (docs/embedding.md).
    S("PILOT_Q_CLUSTER_NAME", str, "pilot", "the django-q2 cluster (and queue) PILOT uses"),
    S("PILOT_STOP_SECONDS", float, 8.0,
      "how long run_workers lets running steps go on after a stop signal", minimum=1),
    # Schedules (docs/schedules.md).
    S("PILOT_SCHEDULER_POLL_SECONDS", float, 1.0,
      "how often a scheduler looks for new or changed schedules", minimum=0.05),
    S("PILOT_SCHEDULE_GRACE_SECONDS", float, 60.0,
      "how late a slot may fire and still count as on time", minimum=0),
    # The API.
    S("PILOT_MAX_PAYLOAD_BYTES", int, 262144, "trigger payload limit", minimum=2),
    S("PILOT_MAX_RUN_AFTER_DAYS", int, 365, "how far ahead a trigger's run_after may be",
      minimum=1),
    S("PILOT_TRIGGER_RATE", Rate, "6000/min", "per-client trigger throttle"),
    S("PILOT_ACTION_RATE", Rate, "600/min", "per-client cancel + retry throttle"),
    S("PILOT_API_DOCS_PUBLIC", bool, False, "serve the API schema and docs without a login"),
    # Completion webhooks (docs/webhooks.md).
    S("PILOT_WEBHOOK_ALLOW_PRIVATE", bool, False,
      "allow private, loopback and link-local callback targets (tests, closed networks)"),
    S("PILOT_WEBHOOK_RESOLVE_SECONDS", float, 2.0,
      "a trigger or batch resolves its callback hosts within this long, all together; a "
      "name not answered by then is checked by the sender instead", minimum=0),
    S("PILOT_WEBHOOK_PORTS", str, None,
      "ports callback URLs may name, e.g. 443,8443 or 80,443,8000-8999 (unset: any but 0)"),
    S("PILOT_WEBHOOK_PROXY", str, None,
      "an HTTP proxy (http://host:port) every delivery goes through, by CONNECT to the "
      "address PILOT checked (unset: direct)"),
    S("PILOT_WEBHOOK_TIMEOUT_SECONDS", float, 10.0,
      "one delivery attempt (DNS, connect, send, answer) may take this long", minimum=0.1),
    S("PILOT_WEBHOOK_FIRST_RETRY_SECONDS", float, 2.0,
      "the first retry comes within this long (then doubling, full jitter)", minimum=0.01),
    S("PILOT_WEBHOOK_MAX_DELAY_SECONDS", float, 3600.0, "retries at most this far apart",
      minimum=0.01),
    S("PILOT_WEBHOOK_GIVE_UP_SECONDS", float, 86400.0,
      "a delivery is given up this long after the task ended (or the re-send)", minimum=1),
    S("PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT", int, _one_worker_fewer,
      "most webhook attempts of one client in flight at once; 0: no cap", minimum=0),
    S("PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT", int, 1,
      "most webhook attempts to one receiver (host:port) in flight at once; 0: no cap",
      minimum=0),
    S("PILOT_WEBHOOK_BREAKER_FAILURES", int, 5,
      "failed attempts in a row that pause an endpoint; 0: no circuit breaker", minimum=0),
    S("PILOT_WEBHOOK_BREAKER_SECONDS", float, 30.0,
      "an endpoint's first pause (doubling after each failed probe)", minimum=0.01),
    # Secrets at rest and their rotation (docs/security.md).
    S("PILOT_SECRETS_KEYS", str, None,
      "comma-separated keys sealing client webhook secrets at rest: the first seals, every "
      "one opens (rotation); unset: derived from DJANGO_SECRET_KEY and its fallbacks"),
    S("PILOT_ROTATION_OVERLAP_SECONDS", float, 86400.0,
      "after a rotation the old API token keeps authenticating and the old webhook secret "
      "keeps signing (beside the new) this long; 0: the old stops at once", minimum=0),
    # The shared cache (docs/embedding.md, "A shared cache").
    S("PILOT_CACHE_ALIAS", str, "default",
      "the CACHES alias holding PILOT's rate limits, login lockouts and metrics counts; "
      "every process must share it"),
    # Metrics (docs/operations.md).
    S("PILOT_METRICS_TOKEN", str, None,
      "a bearer token /metrics requires (unset: /metrics is closed, unless DEBUG or "
      "PILOT_METRICS_PUBLIC)"),
    S("PILOT_METRICS_PUBLIC", bool, False,
      "without PILOT_METRICS_TOKEN, /metrics answers anyone (only the scraper can reach it)"),
    S("PILOT_METRICS_TASKS_TTL", int, 15, "seconds the task-count gauges are cached",
      minimum=0),
    # Login guard (docs/security.md).
    S("PILOT_TRUSTED_PROXIES", int, 0,
      "reverse proxies in front of the web server whose X-Forwarded-For is believed",
      minimum=0),
    S("PILOT_LOGIN_MAX_FAILURES", int, 5,
      "failed logins of one user from one place before a lockout", minimum=1),
    S("PILOT_LOGIN_MAX_FAILURES_PER_USER", int, 20, "failed logins of one user, anywhere",
      minimum=1),
    S("PILOT_LOGIN_MAX_FAILURES_PER_IP", int, 50, "failed logins from one address",
      minimum=1),
    S("PILOT_LOGIN_LOCKOUT_SECONDS", int, 900, "how long a lockout lasts", minimum=1),
    S("PILOT_LOGIN_DEVICE_DAYS", int, 90, "how long a device that logged in is known",
      minimum=1),
    # Opt-in: the demo.* workflows, and the operator console's branding of the
    # whole admin site (header, title, index page, login page).
    S("PILOT_DEMO_WORKFLOWS", bool, False, "register the demo.* workflows; off in production"),
    S("PILOT_DEMO_VERSIONS", str, "1",
      "the versions of demo.versioned registered, comma-separated (1, 2 or 1,2)"),
    S("PILOT_ADMIN_BRANDING", bool, False,
      "the operator console's look for the whole admin site (the standalone project's)"),
)
DECLARED: dict[str, Setting] = {s.name: s for s in SETTINGS}
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}  # (a callable: derived)


def settings_reference() -> str:
    """docs/settings.md, rendered from the declarations (`python -m workflows.conf`
    writes it; tests/unit/test_conf.py fails when the committed page differs)."""
    kinds = {bool: "boolean", int: "integer", float: "number", str: "text", Rate: "rate"}
    rows = [f"| `{s.name}` | {kinds[s.type]}"
            f"{f' ≥ {s.minimum:g}' if s.minimum is not None else ''} | {s.default_text} | "
            f"{s.doc} |" for s in SETTINGS]
    return "\n".join([
        "# PILOT's settings",
        "",
        "<!-- Generated from workflows/conf.py (SETTINGS) by `python -m workflows.conf`;",
        "     tests/unit/test_conf.py keeps it in step. Edit the declarations, not this page. -->",
        "",
        "Every PILOT setting, declared once in `workflows/conf.py`. In a host project each",
        "is a Django setting of that name ([embedding.md](embedding.md)); the standalone",
        "project reads each from the environment variable of that name, and a bad value",
        "stops the process at start-up naming the variable. The standalone project's own",
        "variables (database, broker, web server, logging) are in",
        "[operations.md](operations.md#settings).",
        "",
        "| setting | type | default | what it does |",
        "|---|---|---|---|",
        *rows,
        ""])


def settings_from_environment(environ: Mapping[str, str], *, workers: int) -> dict[str, Any]:
    """Every PILOT setting, from the environment variable of its name when it is
    set (non-empty), else its default — for the standalone project's settings
    module. Raises ImproperlyConfigured naming the variable for a bad value."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.name)
        values[setting.name] = (setting.parse(raw) if raw is not None and raw.strip() != ""
                                else setting.default_for(values.__getitem__, workers))
    return values


class PilotSettings:
    """Attribute access to PILOT's settings: the project's value, else the default."""

    def __getattr__(self, name: str) -> Any:
        setting = DECLARED.get(name)
        if setting is None:
            raise AttributeError(f"{name} is not a PILOT setting (workflows/conf.py)")
        value = getattr(settings, name, _MISSING)
        if value is _MISSING:
            value = setting.default_for(lambda other: getattr(self, other), _workers())
        return value


def _workers() -> int:
    from django_q.conf import Conf

    return int(Conf.WORKERS or 1)


_MISSING = object()

pilot_settings = PilotSettings()


if __name__ == "__main__":
    import sys

    sys.stdout.write(settings_reference())
