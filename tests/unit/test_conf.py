"""Every PILOT setting has an app-level default (workflows/conf.py)."""

import pytest
from django.test import override_settings

from workflows.conf import DEFAULTS, pilot_settings


def test_a_project_that_sets_nothing_gets_the_defaults(settings):
    for name in DEFAULTS:
        if hasattr(settings, name):
            delattr(settings, name)
    assert pilot_settings.PILOT_LEASE_SECONDS == 60.0
    assert pilot_settings.PILOT_HEARTBEAT_SECONDS == 5.0
    assert pilot_settings.PILOT_MAX_PAYLOAD_BYTES == 262144
    assert pilot_settings.PILOT_TRIGGER_RATE == "6000/min"
    assert pilot_settings.PILOT_Q_CLUSTER_NAME == "pilot"
    assert pilot_settings.PILOT_METRICS_TOKEN is None
    assert pilot_settings.PILOT_DEMO_WORKFLOWS is False
    assert pilot_settings.PILOT_ADMIN_BRANDING is False


def test_the_heartbeat_default_follows_a_short_lease(settings):
    del settings.PILOT_HEARTBEAT_SECONDS
    settings.PILOT_LEASE_SECONDS = 3
    assert pilot_settings.PILOT_HEARTBEAT_SECONDS == 1.0


def test_a_project_value_wins_and_is_read_live():
    with override_settings(PILOT_MAX_PAYLOAD_BYTES=10):
        assert pilot_settings.PILOT_MAX_PAYLOAD_BYTES == 10
    assert pilot_settings.PILOT_MAX_PAYLOAD_BYTES != 10


def test_a_misspelt_setting_is_an_error_not_a_silent_default():
    with pytest.raises(AttributeError, match="not a PILOT setting"):
        pilot_settings.PILOT_LEASE_SECOND  # noqa: B018


def test_the_app_reads_no_pilot_setting_but_through_conf():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "workflows"
    offenders = [f"{path.relative_to(root)}:{n}"
                 for path in root.rglob("*.py") if path.name != "conf.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if "settings.PILOT_" in line and "pilot_settings.PILOT_" not in line]
    assert offenders == []
