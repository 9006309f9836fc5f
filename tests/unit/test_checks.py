from django.test import override_settings

from workflows.checks import pilot_execution_settings


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
