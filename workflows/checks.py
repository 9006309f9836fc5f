"""System checks: refuse a configuration that would run a task twice.

django-q2's defaults redeliver a still-running task after `retry` seconds and
retry forever; PILOT's lease keeps that harmless only if the numbers agree.
"""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register()
def pilot_execution_settings(app_configs, **kwargs):
    errors = []
    q = getattr(settings, "Q_CLUSTER", {})
    timeout, retry = q.get("timeout"), q.get("retry", 60)
    if not timeout:
        errors.append(Error(
            "Q_CLUSTER['timeout'] is not set: a hung worker would never be stopped.",
            hint="Set PILOT_TASK_TIMEOUT.", id="pilot.E001"))
    elif retry <= timeout:
        errors.append(Error(
            f"Q_CLUSTER['retry'] ({retry}s) must exceed Q_CLUSTER['timeout'] ({timeout}s), "
            "or django-q2 redelivers a task that is still running.",
            hint="Keep retry = timeout + a margin.", id="pilot.E002"))
    if not q.get("max_attempts"):
        errors.append(Error(
            "Q_CLUSTER['max_attempts'] is unbounded (0): django-q2 would redeliver a failing "
            "message forever. PILOT's dispatcher owns retries.",
            hint="Set max_attempts to 1.", id="pilot.E003"))
    lease, beat = settings.PILOT_LEASE_SECONDS, settings.PILOT_HEARTBEAT_SECONDS
    if lease < 2 * beat:
        errors.append(Error(
            f"PILOT_LEASE_SECONDS ({lease}) is shorter than twice PILOT_HEARTBEAT_SECONDS "
            f"({beat}): one late heartbeat would lose the lease of a healthy worker.",
            hint="Raise the lease or lower the heartbeat interval.", id="pilot.E004"))
    return errors


# Backends that are not shared between processes: a limit or lockout kept there
# holds per gunicorn worker (LocMem) or not at all (Dummy) — failing open.
_UNSHARED_CACHES = ("django.core.cache.backends.dummy.DummyCache",
                    "django.core.cache.backends.locmem.LocMemCache")


@register(Tags.caches)
def pilot_cache_shared(app_configs, **kwargs):
    backend = settings.CACHES.get("default", {}).get("BACKEND", "")
    if backend in _UNSHARED_CACHES:
        return [Error(
            f"CACHES['default'] is {backend.rsplit('.', 1)[-1]}, which every process keeps "
            "to itself (or not at all): the rate limits and login lockouts would not hold.",
            hint="Use the database cache (the default) or Redis (REDIS_URL).",
            id="pilot.E010")]
    return []


@register(Tags.caches, Tags.database)
def pilot_cache_reachable(app_configs, databases=None, **kwargs):
    """With `check --database default` (and during `migrate`): one read of the
    shared cache. A permanent error (workflows.shared_cache) is an error; a
    transient one a warning. A missing cache table is not reported while the
    app's migrations are still to run: they create it."""
    if not databases:
        return []
    from django.core.cache import cache

    from workflows.shared_cache import PERMANENT, cache_error_kind, describe

    try:
        cache.get("pilot:check-probe")
    except Exception as exc:  # noqa: BLE001 - classified
        if cache_error_kind(exc) == PERMANENT:
            if _migrations_pending():
                return []
            return [Error(
                f"The shared cache is misconfigured ({describe(exc)}): rate limits refuse "
                "every request (503) and logins are refused until it is fixed.",
                hint="A missing table: `manage.py createcachetable` (migrate creates it on a "
                     "new database). Redis: fix REDIS_URL.", id="pilot.E011")]
        return [Warning(
            f"The shared cache is unreachable ({describe(exc)}): rate limits are off and "
            "logins are refused until it is back.",
            hint="Check that Redis (REDIS_URL) or the database is up.", id="pilot.W011")]
    return []


def _migrations_pending() -> bool:
    from django.db import DEFAULT_DB_ALIAS, connections
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        targets = executor.loader.graph.leaf_nodes()
        return bool(executor.migration_plan(targets))
    except Exception:  # noqa: BLE001 - cannot tell: report the cache error
        return False


@register(Tags.security, deploy=True)
def pilot_webhook_targets(app_configs, **kwargs):
    """`check --deploy`: webhooks may reach the internal network (docs/webhooks.md)."""
    if settings.PILOT_WEBHOOK_ALLOW_PRIVATE:
        return [Warning(
            "PILOT_WEBHOOK_ALLOW_PRIVATE is on: any API client can make PILOT's workers POST "
            "to loopback, private and link-local addresses (cloud metadata included).",
            hint="Unset it outside tests and closed networks.", id="pilot.W020")]
    return []
