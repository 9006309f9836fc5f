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


def test_the_settings_page_is_the_declarations_rendered():
    """docs/settings.md is generated from workflows/conf.py (`python -m
    workflows.conf > docs/settings.md`): a declaration changed without the page
    fails here."""
    from pathlib import Path

    from workflows.conf import settings_reference

    page = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
    assert page.read_text() == settings_reference()


def test_no_page_restates_a_default_the_declarations_do_not_say():
    """A topic page may list its settings again (webhooks.md does); the default
    it gives must be the declared one."""
    import re
    from pathlib import Path

    from workflows.conf import DECLARED

    wrong = []
    for page in (Path(__file__).resolve().parents[2] / "docs").glob("*.md"):
        for name, default in re.findall(r"^\| `(PILOT_[A-Z_]+)` \| `([^`|]+)` \|",
                                        page.read_text(), re.MULTILINE):
            if name in DECLARED and f"`{default}`" != DECLARED[name].default_text:
                wrong.append(f"{page.name}: {name} = {default}")
    assert wrong == []


def test_the_standalone_project_restates_no_default():
    """pilot/settings.py reads PILOT's settings through their declarations; it
    writes none of their defaults again (28 of 30 were written in both files)."""
    import re
    from pathlib import Path

    from workflows.conf import DECLARED

    source = (Path(__file__).resolve().parents[2] / "pilot" / "settings.py").read_text()
    restated = [name for name in re.findall(r'env_\w+\("(PILOT_[A-Z_]+)"', source)
                if name in DECLARED]
    assert restated == []


@pytest.mark.parametrize(("name", "raw", "expected"), [
    ("PILOT_LEASE_SECONDS", "90", 90.0),
    ("PILOT_PG_PREPARED", "off", False),
    ("PILOT_MAX_RUNNING_PER_CLIENT", "0", 0),
    ("PILOT_TRIGGER_RATE", "10/s", "10/s"),
])
def test_the_environment_is_read_by_each_declaration(name, raw, expected):
    from workflows.conf import settings_from_environment

    values = settings_from_environment({name: raw}, workers=4)
    assert values[name] == expected
    assert values["PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT"] == 3  # derived: workers - 1


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("PILOT_LEASE_SECONDS", "6o", "is not a number"),
    ("PILOT_LEASE_SECONDS", "0.1", "must be at least 0.5"),
    ("PILOT_MAX_PAYLOAD_BYTES", "1.5", "is not an integer"),
    ("PILOT_DEMO_WORKFLOWS", "maybe", "is not a boolean"),
    ("PILOT_ACTION_RATE", "lots", "must look like 6000/min"),
])
def test_a_bad_value_stops_the_process_naming_the_variable(name, raw, message):
    from django.core.exceptions import ImproperlyConfigured

    from workflows.conf import settings_from_environment

    with pytest.raises(ImproperlyConfigured, match=f"^{name}=.*{message}"):
        settings_from_environment({name: raw}, workers=2)


def test_a_derived_default_follows_what_it_derives_from():
    from workflows.conf import settings_from_environment

    values = settings_from_environment({"PILOT_LEASE_SECONDS": "3"}, workers=1)
    assert values["PILOT_HEARTBEAT_SECONDS"] == 1.0
    assert values["PILOT_MAX_RUNNING_PER_CLIENT"] == 1  # at least 1
