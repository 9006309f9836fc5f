import os

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from tests.api.test_cache_outage import DEAD_REDIS, MISCONFIGURED_REDIS, MISSING_TABLE
from workflows.checks import pilot_cache_reachable, pilot_cache_shared, pilot_execution_settings


def ids(**overrides):
    with override_settings(**overrides):
        return [e.id for e in pilot_execution_settings(None)]


def test_the_shipped_configuration_passes():
    assert ids() == []


def test_retry_not_above_timeout_is_refused(settings):
    q = dict(settings.Q_CLUSTER, timeout=60, retry=60)
    assert ids(Q_CLUSTER=q) == ["pilot.E002"]


def test_missing_timeout_and_unbounded_attempts_are_refused(settings):
    q = {k: v for k, v in settings.Q_CLUSTER.items() if k != "timeout"}
    q["max_attempts"] = 0
    assert ids(Q_CLUSTER=q) == ["pilot.E001", "pilot.E003"]


def test_a_lease_shorter_than_two_heartbeats_is_refused():
    assert ids(PILOT_LEASE_SECONDS=5, PILOT_HEARTBEAT_SECONDS=3) == ["pilot.E004"]
    assert ids(PILOT_LEASE_SECONDS=6, PILOT_HEARTBEAT_SECONDS=3) == []


# --- the shared cache (pilot.E010, pilot.E011, pilot.W011) ---------------------------

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
DUMMY = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}


@pytest.mark.parametrize("caches", [LOCMEM, DUMMY], ids=["locmem", "dummy"])
def test_a_cache_every_process_keeps_to_itself_is_refused(caches):
    with override_settings(CACHES=caches):
        assert [e.id for e in pilot_cache_shared(None)] == ["pilot.E010"]
    assert pilot_cache_shared(None) == []


@pytest.mark.django_db
def test_check_with_the_database_reports_a_misconfigured_cache_as_an_error():
    with override_settings(CACHES=MISCONFIGURED_REDIS):
        assert [e.id for e in pilot_cache_reachable(None, databases=["default"])] == \
            ["pilot.E011"]
        assert pilot_cache_reachable(None, databases=None) == []  # plain `check`: no I/O
        with pytest.raises(SystemCheckError, match=r"pilot\.E011"):
            call_command("check", "--database", "default")
    with override_settings(CACHES=DEAD_REDIS):
        assert [e.id for e in pilot_cache_reachable(None, databases=["default"])] == \
            ["pilot.W011"]
    assert pilot_cache_reachable(None, databases=["default"]) == []


@pytest.mark.django_db(transaction=True)  # the failing query must not poison a test transaction
def test_a_missing_cache_table_is_an_error_once_the_migrations_have_run():
    with override_settings(CACHES=MISSING_TABLE):
        [error] = pilot_cache_reachable(None, databases=["default"])
    assert error.id == "pilot.E011" and "createcachetable" in error.hint


def test_the_deploy_check_warns_when_webhooks_may_reach_private_addresses(settings):
    from workflows.checks import pilot_webhook_targets

    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    assert pilot_webhook_targets(None) == []
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    [warning] = pilot_webhook_targets(None)
    assert warning.id == "pilot.W030" and "cloud metadata" in warning.msg


# --- PILOT's own cluster (ALT_CLUSTERS) ----------------------------------------------

HOST_Q = {"name": "mysite", "orm": "default", "timeout": 60, "retry": 90,
          "ALT_CLUSTERS": {"pilot": {"timeout": 300, "retry": 360, "max_attempts": 1,
                                     "ack_failures": True, "save_limit": -1}}}


def test_an_alt_cluster_entry_is_checked_and_the_hosts_cluster_is_not():
    # The host's own cluster retries forever (max_attempts 0): its business.
    assert ids(Q_CLUSTER=HOST_Q, PILOT_Q_CLUSTER_NAME="pilot") == []
    broken = {**HOST_Q, "ALT_CLUSTERS": {"pilot": {"timeout": 300, "retry": 60}}}
    assert ids(Q_CLUSTER=broken, PILOT_Q_CLUSTER_NAME="pilot") == \
        ["pilot.E002", "pilot.E003", "pilot.E008", "pilot.W008"]


def test_a_missing_cluster_is_refused_with_the_entry_to_add():
    with override_settings(Q_CLUSTER={"name": "mysite", "orm": "default"},
                           PILOT_Q_CLUSTER_NAME="pilot"):
        [error] = pilot_execution_settings(None)
    assert error.id == "pilot.E005" and "ALT_CLUSTERS" in error.hint
    assert "'max_attempts': 1" in error.hint


def test_an_alt_cluster_with_a_broker_of_its_own_is_refused():
    q = {**HOST_Q, "ALT_CLUSTERS": {"pilot": {**HOST_Q["ALT_CLUSTERS"]["pilot"],
                                              "redis": "redis://elsewhere:6379/0"}}}
    assert "pilot.E006" in ids(Q_CLUSTER=q, PILOT_Q_CLUSTER_NAME="pilot")


def test_a_broker_pilot_cannot_write_to_is_refused(settings):
    q = {k: v for k, v in settings.Q_CLUSTER.items() if k not in ("orm", "redis")}
    q["sqs"] = {"aws_region": "x"}
    assert "pilot.E007" in ids(Q_CLUSTER=q)


# --- what a host project left out (warnings, never a crash) ---------------------------

def installation_ids(**overrides):
    from workflows.checks import pilot_installation

    with override_settings(**overrides):
        return [e.id for e in pilot_installation(None)]


def test_the_standalone_project_has_every_piece():
    from workflows.checks import pilot_urls

    assert installation_ids() == []
    assert pilot_urls(None) == []


def test_each_missing_middleware_and_the_lockout_backend_is_a_named_warning():
    bare = ["django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware"]
    assert installation_ids(MIDDLEWARE=bare) == ["pilot.W020", "pilot.W021", "pilot.W022"]
    assert installation_ids(
        AUTHENTICATION_BACKENDS=["django.contrib.auth.backends.ModelBackend"]) == ["pilot.W023"]
    assert installation_ids(MIDDLEWARE=bare, DEBUG=True)[-1] == "pilot.W024"


def test_without_the_login_guard_app_its_pieces_are_not_asked_for():
    from django.test import modify_settings

    bare = ["django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware"]
    with modify_settings(INSTALLED_APPS={"remove": ["workflows.login_guard"]}):
        assert installation_ids(
            MIDDLEWARE=bare, AUTHENTICATION_BACKENDS=["django.contrib.auth.backends.ModelBackend"]
        ) == ["pilot.W020", "pilot.W021"]
        # The backend alone would lock nobody out: no failure is counted.
        assert installation_ids() == ["pilot.W026"]


def test_a_project_without_the_login_guard_app_counts_no_login():
    """The receivers are connected by the opt-in app only: a host without it
    (django-axes, say) has none of its logins reach PILOT's cache."""
    import subprocess
    import sys

    from tests.support.procs import ROOT

    script = ("import django; django.setup(); "
              "from django.contrib.auth.signals import user_logged_in, user_login_failed; "
              "print([len(s.receivers) for s in (user_login_failed, user_logged_in)])")
    counts = {}
    for module in ("tests.settings", "tests.unit.settings_no_login_guard"):
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                              text=True, timeout=60,
                              env={**os.environ, "DJANGO_SETTINGS_MODULE": module})
        assert done.returncode == 0, done.stderr
        counts[module] = done.stdout.strip().splitlines()[-1]
    # user_logged_in keeps Django's own update_last_login either way.
    assert list(counts.values()) == ["[1, 2]", "[0, 1]"], counts


def test_a_redis_queue_under_the_default_name_every_project_shares_is_a_warning(settings):
    from workflows.checks import pilot_queue_per_project

    host = {"name": "mysite", "redis": "redis://127.0.0.1:6379/0", "timeout": 60, "retry": 90,
            "ALT_CLUSTERS": {"pilot": {"timeout": 300, "retry": 360, "max_attempts": 1,
                                       "ack_failures": True, "save_limit": -1}}}
    del settings.PILOT_Q_CLUSTER_NAME
    settings.Q_CLUSTER = host
    [warning] = pilot_queue_per_project(None)
    assert warning.id == "pilot.W027" and "django_q:pilot:q" in warning.msg
    assert "'mysite-pilot'" in warning.hint
    settings.Q_CLUSTER = {**host, "redis": None, "orm": "default"}  # a queue per database
    assert pilot_queue_per_project(None) == []
    settings.Q_CLUSTER = host
    settings.PILOT_Q_CLUSTER_NAME = "pilot"  # chosen, not defaulted
    assert pilot_queue_per_project(None) == []


def test_a_missing_required_app_is_an_error():
    from django.test import modify_settings

    with modify_settings(INSTALLED_APPS={"remove": ["drf_spectacular_sidecar"]}):
        assert installation_ids() == ["pilot.E020"]


def test_the_admins_unguarded_password_change_is_a_warning():
    from workflows.checks import pilot_urls

    with override_settings(ROOT_URLCONF="tests.unit.unguarded_urls"):
        assert [e.id for e in pilot_urls(None)] == ["pilot.W025"]


def test_pilots_own_orm_broker_class_is_accepted_and_a_foreign_one_refused(settings):
    q = {k: v for k, v in settings.Q_CLUSTER.items() if k not in ("redis", "broker_class")}
    q["orm"] = "default"
    assert "pilot.E007" not in ids(Q_CLUSTER={**q, "broker_class": "workflows.broker.OrmBroker"})
    assert "pilot.E007" in ids(Q_CLUSTER={**q, "broker_class": "mysite.brokers.Custom"})
    redis_q = {k: v for k, v in q.items() if k != "orm"}
    assert "pilot.E007" in ids(Q_CLUSTER={**redis_q, "redis": "redis://x:6379/0",
                                          "broker_class": "workflows.broker.OrmBroker"})
