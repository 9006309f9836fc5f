"""The refusals a newcomer following the docs meets name the setting that fixes
them (issue 32, point 8): a demo workflow while PILOT_DEMO_WORKFLOWS is off, a
loopback webhook without PILOT_WEBHOOK_ALLOW_PRIVATE, an empty `$TOKEN`, and
manage.py without DJANGO_SECRET_KEY — one line, no traceback; from a `make run`
checkout (SQLite, nothing set) manage.py takes make run's profile and just works."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from tests.docs.conftest import developer_env
from tests.local.conftest import skip_on_postgres
from tests.support.procs import ROOT
from workflows.models import PilotSchedule
from workflows.registry import registry
from workflows.rules.errors import UnknownWorkflow, ValidationFailed
from workflows.webhooks.targets import target_validate

_spec = importlib.util.spec_from_file_location("pilot_manage", ROOT / "manage.py")
manage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manage)  # type: ignore[union-attr]


def test_an_unknown_demo_workflow_names_pilot_demo_workflows_and_others_do_not():
    with pytest.raises(UnknownWorkflow, match=r"'demo\.nope' \(the demo workflows are "
                                              r"registered only with PILOT_DEMO_WORKFLOWS=true\)"):
        registry.get("demo.nope")
    with pytest.raises(UnknownWorkflow) as other:
        registry.get("acme.nope")
    assert "PILOT_DEMO_WORKFLOWS" not in str(other.value)


@pytest.mark.django_db
def test_scheduling_a_demo_workflow_that_is_not_registered_says_which_setting(monkeypatch):
    """schedules.md's "Try it" on a server without the demo workflows."""
    monkeypatch.delitem(registry._workflows, "demo.echo")
    with pytest.raises(CommandError, match="registered only with PILOT_DEMO_WORKFLOWS=true"):
        call_command("schedule_workflow", "demo.echo", "--name", "heartbeat",
                     "--cron", "*/2 * * * * *")
    assert PilotSchedule.objects.count() == 0


@pytest.mark.django_db
def test_a_loopback_webhook_is_refused_naming_pilot_webhook_allow_private(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(ValidationFailed) as refused:
        target_validate("http://127.0.0.1:8702/pilot-webhooks")
    assert "PILOT_WEBHOOK_ALLOW_PRIVATE=true allows them" in refused.value.errors[
        "callback_url"][0]
    with pytest.raises(CommandError, match="PILOT_WEBHOOK_ALLOW_PRIVATE=true"):
        call_command("create_api_client", "acme-hooks", "--webhook",
                     "http://127.0.0.1:8702/pilot-webhooks")
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    assert target_validate("http://127.0.0.1:8702/x") == "http://127.0.0.1:8702/x"


@pytest.mark.django_db
def test_an_empty_token_is_called_empty_and_a_wrong_one_invalid(client):
    empty = client.get("/api/v1/tasks", HTTP_AUTHORIZATION="Token ")
    assert empty.status_code == 401
    assert "the token after 'Token' is empty" in empty.json()["detail"]
    wrong = client.get("/api/v1/tasks", HTTP_AUTHORIZATION="Token pilot_nope")
    assert (wrong.status_code, wrong.json()["detail"]) == (401, "Invalid token.")


def test_the_local_profile_is_only_for_a_make_run_checkout():
    assert manage.local_profile({}) == {"DJANGO_DEBUG": "true", "PILOT_DEMO_WORKFLOWS": "true",
                                        "PILOT_LOG_FORMAT": "text"}
    assert manage.local_profile({"DATABASE_URL": "sqlite:////tmp/x.sqlite3",
                                 "PILOT_DEMO_WORKFLOWS": "false", "PILOT_LOG_FORMAT": "json"}
                                ) == {"DJANGO_DEBUG": "true"}
    # A deployment: PostgreSQL, or a secret key (even an empty one) or DJANGO_DEBUG set.
    for env in ({"DATABASE_URL": "postgres://db/pilot"}, {"DJANGO_SECRET_KEY": ""},
                {"DJANGO_DEBUG": "false"}):
        assert manage.local_profile(env) == {}


def manage_py(*args, **env) -> subprocess.CompletedProcess:
    """manage.py as a developer's shell runs it: none of the suite's variables."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                          env={**developer_env(), **env}, capture_output=True, text=True,
                          timeout=120)


def test_manage_py_without_a_secret_key_on_postgres_says_so_in_one_line():
    done = manage_py("check", DATABASE_URL="postgres://postgres@127.0.0.1:1/none")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "manage.py: DJANGO_SECRET_KEY must be set (or DJANGO_DEBUG=true for a local run)"]


@skip_on_postgres
def test_manage_py_from_a_make_run_checkout_just_works(make_run_database):
    """schedules.md's first line, as written, on make run's kind of database."""
    database = make_run_database
    done = manage_py("schedule_workflow", "demo.echo", "--name", "newcomer", "--cron",
                     "*/2 * * * * *", "--payload", '{"ping": true}', DATABASE_URL=database)
    assert done.returncode == 0, done.stderr
    assert "created: schedule newcomer triggers demo.echo" in done.stdout
