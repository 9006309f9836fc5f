"""`schedule_workflow`: create, change, pause, delete, list and sync schedules
from the command line, through the engine's schedule services."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from workflows.models import PilotSchedule

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("schedule_workflow", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def create(*extra) -> str:
    return run("demo.echo", "--name", "nightly", "--cron", "0 3 * * *", "--payload",
               '{"msg": "hi"}', *extra)


def test_a_new_schedule_is_created_for_the_scheduler_user_with_skip_by_default():
    out = create()
    schedule = PilotSchedule.objects.get()
    assert out.startswith("created: schedule nightly triggers demo.echo at '0 3 * * *' "
                          "(missed: skip, owner: scheduler); next slot ")
    assert (schedule.workflow, schedule.cron, schedule.payload, schedule.missed,
            schedule.owner.username, schedule.origin) == (
        "demo.echo", "0 3 * * *", {"msg": "hi"}, "skip", "scheduler", "operator")
    assert schedule.next_slot_at.hour == 3 and not schedule.owner.has_usable_password()


def test_changing_one_option_keeps_the_others():
    create("--missed", "catch_up")
    out = json.loads(run("--name", "nightly", "--cron", "*/5 * * * * *", "--json"))
    assert (out["outcome"], out["cron"], out["payload"], out["missed"]) == (
        "updated", "*/5 * * * * *", {"msg": "hi"}, "catch_up")
    assert json.loads(create("--missed", "catch_up", "--cron", "*/5 * * * * *",
                             "--json"))["outcome"] == "unchanged"


def test_the_payload_may_come_from_a_file(tmp_path):
    path = tmp_path / "payload.json"
    path.write_text('{"from": "file"}')
    run("demo.echo", "--name", "filed", "--cron", "0 * * * *", "--payload", f"@{path}")
    assert PilotSchedule.objects.get().payload == {"from": "file"}


def test_an_owner_may_be_named(django_user_model):
    django_user_model.objects.create_user("acme")
    create("--owner", "acme")
    assert PilotSchedule.objects.get().owner.username == "acme"
    with pytest.raises(CommandError, match="--owner: no user named 'ghost'"):
        run("demo.echo", "--name", "other", "--cron", "0 3 * * *", "--owner", "ghost")


@pytest.mark.parametrize(("args", "message"), [
    (["demo.echo", "--name", "n", "--cron", "61 * * * *"],
     r"refused \(validation_error\).*\n  cron: '61 \* \* \* \*' is not a valid cron"),
    (["acme.nope", "--name", "n", "--cron", "0 3 * * *"],
     r"workflow: No workflow is registered as 'acme.nope'"),
    (["demo.echo", "--name", "bad name", "--cron", "0 3 * * *"], r"name: 1-100 letters"),
    (["demo.echo", "--name", "n"], r"a new schedule needs --cron"),
    (["--name", "n", "--cron", "0 3 * * *"], r"a new schedule needs NAME"),
    (["demo.echo", "--cron", "0 3 * * *"], r"--name is required"),
    (["demo.echo", "--name", "n", "--cron", "0 3 * * *", "--payload", "[1]"],
     r"the payload must be a JSON object"),
])
def test_bad_arguments_are_refused_and_nothing_is_written(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert PilotSchedule.objects.count() == 0


def test_a_schedule_is_paused_and_resumed():
    create()
    assert run("--name", "nightly", "--disable").startswith("disabled: schedule nightly")
    schedule = PilotSchedule.objects.get()
    assert (schedule.enabled, schedule.next_slot_at) == (False, None)
    assert "next slot never (paused)" in run("--name", "nightly", "--disable")
    run("--name", "nightly", "--enable")
    assert PilotSchedule.objects.get().next_slot_at is not None


def test_delete_removes_the_schedule_but_refuses_a_workflow_mismatch():
    create()
    with pytest.raises(CommandError, match=r"triggers demo\.echo, not demo\.slow; nothing deleted"):
        run("demo.slow", "--name", "nightly", "--delete")
    assert run("demo.echo", "--name", "nightly", "--delete").startswith("deleted: schedule")
    assert PilotSchedule.objects.count() == 0
    with pytest.raises(CommandError, match="No schedule is named 'nightly'"):
        run("--name", "nightly", "--delete")


def test_list_shows_every_schedule_with_its_state():
    assert run("--list") == "no schedules\n"
    create()
    run("demo.echo", "--name", "paused", "--cron", "*/5 * * * * *", "--disable")
    text = run("--list")
    assert "nightly: demo.echo at '0 3 * * *', enabled, missed skip, owner scheduler" in text
    assert "paused: demo.echo at '*/5 * * * * *', paused" in text
    rows = json.loads(run("--list", "--json"))
    assert [(r["name"], r["enabled"], r["fired_count"]) for r in rows] == [
        ("nightly", True, 0), ("paused", False, 0)]


def test_sync_writes_the_schedules_declared_in_code(temp_workflow):
    temp_workflow("t.cli_declared", schedule="0 5 * * *").step(lambda ctx: None, name="only")
    out = json.loads(run("--sync", "--json"))
    assert out["created"] == ["t.cli_declared"] and out["errors"] == {}
    with pytest.raises(CommandError, match=r"refused \(validation_error\).*declared in code"):
        run("t.cli_declared", "--name", "t.cli_declared", "--cron", "0 6 * * *")
    with pytest.raises(CommandError, match="declared in code"):
        run("--name", "t.cli_declared", "--delete")
    run("--name", "t.cli_declared", "--disable")  # operators may pause it
    assert PilotSchedule.objects.get().enabled is False
