"""System checks: refuse a configuration that would run a task twice, and say
what a host project left out.

django-q2's defaults redeliver a still-running task after `retry` seconds and
retry forever; PILOT's lease keeps that harmless only if the numbers agree.
They are checked on PILOT's own cluster (workflows.cluster: the default
cluster of the standalone project, an ALT_CLUSTERS entry in a host project),
never on the host's other clusters.

The integration checks (`pilot.W02x`) are warnings: PILOT runs without the
middleware, backend and route they look for, with the feature they name off.
"""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from workflows.cluster import (
    BROKER_KEYS,
    ORM_BROKER_CLASS,
    alt_entry,
    cluster_conf,
    cluster_name,
    recommended_entry,
)
from workflows.conf import pilot_settings


@register()
def pilot_execution_settings(app_configs, **kwargs):
    errors = []
    q = cluster_conf()
    if q is None:
        name = cluster_name()
        return [Error(
            f"PILOT's django-q2 cluster {name!r} (PILOT_Q_CLUSTER_NAME) is not configured: "
            "it is neither Q_CLUSTER['name'] nor an entry of Q_CLUSTER['ALT_CLUSTERS'], so "
            "its workers would run with settings that redeliver and retry PILOT's tasks.",
            hint=f"Add Q_CLUSTER['ALT_CLUSTERS'] = {{{name!r}: {recommended_entry()!r}}} "
                 "and run PILOT's workers with `manage.py run_workers` (docs/embedding.md).",
            id="pilot.E005")]
    entry = alt_entry() or {}
    own_broker = sorted(k for k in entry if k in BROKER_KEYS)
    if own_broker:
        errors.append(Error(
            f"Q_CLUSTER['ALT_CLUSTERS'][{cluster_name()!r}] sets its own broker "
            f"({', '.join(own_broker)}): web processes enqueue PILOT's messages on the main "
            "configuration's broker, so these workers would never see them.",
            hint="Keep the broker in Q_CLUSTER; the ALT_CLUSTERS entry only changes the "
                 "queue and its limits.", id="pilot.E006"))
    own_orm = q.get("orm") and q.get("broker_class") == ORM_BROKER_CLASS  # PILOT's ORM broker
    if not (q.get("orm") or q.get("redis")) or any(
            q.get(k) for k in BROKER_KEYS if k not in ("orm", "redis")
            and not (k == "broker_class" and own_orm)):
        errors.append(Error(
            "PILOT's django-q2 cluster must use the ORM broker (Q_CLUSTER['orm']) or Redis "
            "(Q_CLUSTER['redis']): PILOT writes its messages to those two directly. "
            f"(With the ORM broker, broker_class may be {ORM_BROKER_CLASS!r}.)",
            id="pilot.E007"))
    timeout, retry = q.get("timeout"), q.get("retry", 60)
    if not timeout:
        errors.append(Error(
            "Q_CLUSTER['timeout'] is not set for PILOT's cluster: a hung worker would never "
            "be stopped.", hint="Set PILOT_TASK_TIMEOUT (or the cluster's timeout).",
            id="pilot.E001"))
    elif retry <= timeout:
        errors.append(Error(
            f"Q_CLUSTER['retry'] ({retry}s) must exceed Q_CLUSTER['timeout'] ({timeout}s) for "
            "PILOT's cluster, or django-q2 redelivers a task that is still running.",
            hint="Keep retry = timeout + a margin.", id="pilot.E002"))
    if q.get("max_attempts", 0) != 1:
        errors.append(Error(
            f"Q_CLUSTER['max_attempts'] is {q.get('max_attempts', 0)} for PILOT's cluster "
            "(0 is unbounded): django-q2 would redeliver a failed message. PILOT's "
            "dispatcher owns retries.", hint="Set max_attempts to 1.", id="pilot.E003"))
    if not q.get("ack_failures"):
        errors.append(Error(
            "Q_CLUSTER['ack_failures'] is off for PILOT's cluster: a failed message would "
            "stay on the broker and be delivered again. PILOT records the failure itself.",
            hint="Set ack_failures to True.", id="pilot.E008"))
    if q.get("save_limit", 250) != -1:
        errors.append(Warning(
            "Q_CLUSTER['save_limit'] is not -1 for PILOT's cluster: django-q2 keeps a result "
            "row per message, which PILOT never reads (its Task table is the record).",
            hint="Set save_limit to -1.", id="pilot.W008"))
    lease, beat = pilot_settings.PILOT_LEASE_SECONDS, pilot_settings.PILOT_HEARTBEAT_SECONDS
    if lease < 2 * beat:
        errors.append(Error(
            f"PILOT_LEASE_SECONDS ({lease}) is shorter than twice PILOT_HEARTBEAT_SECONDS "
            f"({beat}): one late heartbeat would lose the lease of a healthy worker.",
            hint="Raise the lease or lower the heartbeat interval.", id="pilot.E004"))
    cap = pilot_settings.PILOT_MAX_RUNNING_PER_CLIENT
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        errors.append(Error(
            f"PILOT_MAX_RUNNING_PER_CLIENT is {cap!r}: it must be an integer >= 0 (0: no cap "
            "on a client's running tasks).", id="pilot.E009"))
    return errors


@register()
def pilot_queue_per_project(app_configs, **kwargs):
    """On Redis the queue is the key `django_q:<PILOT_Q_CLUSTER_NAME>:q`, and the
    default name is the same in every PILOT project: a project that never chose
    one shares its queue with any other on the same Redis database (each takes
    the other's messages, cannot open them, and the dispatcher re-sends them
    after PILOT_REENQUEUE_SECONDS). The standalone project always sets it."""
    q = cluster_conf()
    if q is None or not q.get("redis") or hasattr(settings, "PILOT_Q_CLUSTER_NAME"):
        return []
    main = settings.Q_CLUSTER.get("name", "default")
    return [Warning(
        f"PILOT's queue on Redis is django_q:{cluster_name()}:q, the default every PILOT "
        "project shares: two projects (or staging and production) on one Redis database "
        "would take each other's messages and delay each other's runs.",
        hint=f"Set PILOT_Q_CLUSTER_NAME = {f'{main}-pilot'!r} (a name of this project's own) "
             "and name the ALT_CLUSTERS entry the same (docs/embedding.md).",
        id="pilot.W027")]


# --- what a host project must install, and what it may leave out ---------------------------

REQUIRED_APPS = ("rest_framework", "drf_spectacular", "drf_spectacular_sidecar", "django_q")
LOGIN_GUARD_APP = "workflows.login_guard"  # opt-in: lockouts after failed logins

_MIDDLEWARE = {
    "workflows.observability.middleware.TraceIdMiddleware": (
        "pilot.W020", "requests get no X-Request-ID and events of one request do not share a "
                      "trace id (a trace id is still generated for each trigger)"),
    "workflows.observability.probes.ProbeMiddleware": (
        "pilot.W021", "/healthz, /readyz and /metrics answer 400 to a probe or scraper that "
                      "addresses the server by IP (Django's host check)"),
    "workflows.accounts.login_guard.LoginDeviceMiddleware": (
        "pilot.W022", "browsers that logged in before get no device cookie, so a lockout "
                      "that an attacker causes also locks the real user out"),
}


@register()
def pilot_installation(app_configs, **kwargs):
    """Errors for apps PILOT cannot run without; warnings for the optional parts."""
    from django.apps import apps

    problems = [Error(f"PILOT needs {app!r} in INSTALLED_APPS.",
                      hint="See docs/embedding.md.", id="pilot.E020")
                for app in REQUIRED_APPS if not apps.is_installed(app)]
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    backends = list(getattr(settings, "AUTHENTICATION_BACKENDS", None) or [])
    lockout_backend = "workflows.accounts.login_guard.LockoutBackend"
    guarded = apps.is_installed(LOGIN_GUARD_APP)
    for path, (check_id, consequence) in _MIDDLEWARE.items():
        if check_id == "pilot.W022" and not guarded:
            continue  # the login guard is opt-in: no device cookie to set without it
        if path not in middleware:
            problems.append(Warning(f"{path} is not in MIDDLEWARE: {consequence}.",
                                    hint="docs/embedding.md says where it goes.",
                                    id=check_id))
    if not guarded and lockout_backend in backends:
        problems.append(Warning(
            f"{lockout_backend} is in AUTHENTICATION_BACKENDS but {LOGIN_GUARD_APP!r} is not "
            "in INSTALLED_APPS: failed logins are not counted, so nobody is ever locked out.",
            hint=f"Add {LOGIN_GUARD_APP!r} to INSTALLED_APPS, or remove the backend "
                 "(docs/embedding.md).", id="pilot.W026"))
    if guarded and lockout_backend not in backends:
        problems.append(Warning(
            f"{lockout_backend} is not in AUTHENTICATION_BACKENDS: password logins are not "
            "limited (no lockout after repeated failures).",
            hint="Put it first in AUTHENTICATION_BACKENDS (docs/embedding.md).",
            id="pilot.W023"))
    if settings.DEBUG and "workflows.debug.PlainNotFoundMiddleware" not in middleware:
        problems.append(Warning(
            "workflows.debug.PlainNotFoundMiddleware is not in MIDDLEWARE: under DEBUG a 404 "
            "page lists every URL pattern of the site.",
            hint="Add it after CommonMiddleware (docs/embedding.md).", id="pilot.W024"))
    return problems


@register(Tags.urls)
def pilot_urls(app_configs, **kwargs):
    """The guarded admin password change, where the admin is mounted."""
    from django.urls import NoReverseMatch, Resolver404, resolve, reverse

    try:
        path = reverse("admin:password_change")
    except NoReverseMatch:
        return []  # no admin site: nothing to guard
    try:
        match = resolve(path)
    except Resolver404:
        return []
    if match.url_name != "pilot_password_change":
        return [Warning(
            f"{path} is the admin's own view: the current-password check is not limited, so "
            "a hijacked session can guess the password.",
            hint="Mount workflows.urls.admin_password_change_urls() before admin.site.urls "
                 "(docs/embedding.md).", id="pilot.W025")]
    return []


# Backends that are not shared between processes: a limit or lockout kept there
# holds per gunicorn worker (LocMem) or not at all (Dummy) — failing open.
_UNSHARED_CACHES = ("django.core.cache.backends.dummy.DummyCache",
                    "django.core.cache.backends.locmem.LocMemCache")


@register(Tags.caches)
def pilot_cache_shared(app_configs, **kwargs):
    from workflows.observability.shared_cache import cache_alias

    alias = cache_alias()
    if alias not in settings.CACHES:
        return [Error(
            f"PILOT_CACHE_ALIAS is {alias!r}, which CACHES does not define: PILOT's rate "
            "limits and login lockouts have nowhere to live.",
            hint=f"Add CACHES[{alias!r}] (the database cache on the pilot_cache table, or "
                 "Redis), or set PILOT_CACHE_ALIAS to one of "
                 f"{', '.join(map(repr, settings.CACHES))}.",
            id="pilot.E010")]
    backend = settings.CACHES[alias].get("BACKEND", "")
    if backend in _UNSHARED_CACHES:
        return [Error(
            f"CACHES[{alias!r}] (PILOT_CACHE_ALIAS) is {backend.rsplit('.', 1)[-1]}, which "
            "every process keeps to itself (or not at all): the rate limits and login "
            "lockouts would not hold.",
            hint=f"Point CACHES[{alias!r}] at the database cache (LOCATION 'pilot_cache', "
                 "which PILOT's migrations create) or Redis — or set PILOT_CACHE_ALIAS to "
                 "an alias of its own for PILOT and leave your default cache as it is.",
            id="pilot.E010")]
    return []


@register(Tags.caches, Tags.database)
def pilot_cache_reachable(app_configs, databases=None, **kwargs):
    """With `check --database default` (and during `migrate`): one read of the
    shared cache. A permanent error (workflows.observability.shared_cache) is an error; a
    transient one a warning. A missing cache table is not reported while the
    app's migrations are still to run: they create it."""
    if not databases:
        return []
    from workflows.observability.shared_cache import (
        PERMANENT,
        cache,
        cache_error_kind,
        describe,
    )

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
    if pilot_settings.PILOT_WEBHOOK_ALLOW_PRIVATE:
        return [Warning(
            "PILOT_WEBHOOK_ALLOW_PRIVATE is on: any API client can make PILOT's workers POST "
            "to loopback, private and link-local addresses (cloud metadata included).",
            hint="Unset it outside tests and closed networks.", id="pilot.W030")]
    return []


@register()
def pilot_webhook_egress(app_configs, **kwargs):
    """PILOT_WEBHOOK_PORTS and PILOT_WEBHOOK_PROXY must be readable: a malformed
    port list refuses every callback URL, a malformed proxy every delivery."""
    from urllib.parse import urlsplit

    from workflows.webhooks.targets import ports_parse

    problems = []
    ports = pilot_settings.PILOT_WEBHOOK_PORTS
    if ports:
        try:
            ports_parse(str(ports))
        except ValueError as exc:
            problems.append(Error(f"PILOT_WEBHOOK_PORTS={ports!r}: {exc}; every callback URL "
                                  "would be refused.", hint="e.g. 443,8443 or 80,443,8000-8999",
                                  id="pilot.E031"))
    proxy = pilot_settings.PILOT_WEBHOOK_PROXY
    if proxy:
        parts = urlsplit(str(proxy))
        try:
            valid = parts.scheme == "http" and bool(parts.hostname) and (parts.port or 80) > 0
        except ValueError:
            valid = False
        if not valid:
            problems.append(Error(f"PILOT_WEBHOOK_PROXY={proxy!r} is not http://host:port; "
                                  "every delivery would fail.", id="pilot.E032"))
    return problems
