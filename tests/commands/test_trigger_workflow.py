"""`trigger_workflow`: the CLI door to the same engine call as the API."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.factories import make_task
from tests.support.helpers import drain, queued_task_ids
from workflows.models import Task
from workflows.rules.states import Source
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def trigger(*args) -> str:
    out = StringIO()
    call_command("trigger_workflow", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_a_first_trigger_creates_and_enqueues_a_cli_task_owned_by_the_cli_user():
    out = trigger("demo.echo", "--key", "k1", "--payload", '{"msg": "hi"}')
    task = Task.objects.get()
    assert out.startswith(f"created: task {task.pk} (demo.echo, key 'k1', owner cli)")
    assert (task.owner.username, task.source, task.payload) == ("cli", Source.CLI, {"msg": "hi"})
    assert len(task.trace_id) == 32
    assert queued_task_ids() == [str(task.pk)]
    assert not task.owner.has_usable_password()


def test_the_same_trigger_again_replays_and_enqueues_nothing():
    trigger("demo.echo", "--key", "k1", "--payload", '{"a": 1}')
    out = json.loads(trigger("demo.echo", "--key", "k1", "--payload", '{"a": 1}', "--json"))
    assert (out["outcome"], out["state"], out["owner"]) == ("replayed", "pending", "cli")
    assert Task.objects.get().replays == 1
    assert len(queued_task_ids()) == 1


def test_a_failed_task_is_restarted(django_user_model):
    task = make_task(django_user_model.objects.create_user("cli"), state=S.FAILED, key="k",
                     payload={"n": 1})
    out = trigger("demo.echo", "--key", "k", "--payload", '{"n": 1}')
    assert out.startswith(f"restarted: task {task.pk}")
    assert Task.objects.get(pk=task.pk).state == S.PENDING


@pytest.mark.parametrize("args, code", [
    (["demo.echo", "--key", "k1", "--payload", '{"a": 2}'], "idempotency_key_reused"),
    (["no.such.workflow", "--key", "k2"], "unknown_workflow"),
    (["demo.echo"], "idempotency_key_missing"),
    (["demo.sync_orders", "--key", "k3", "--payload", '{"batch": "b"}'], "validation_error"),
])
def test_refusals_print_their_code_and_exit_1(args, code):
    trigger("demo.echo", "--key", "k1", "--payload", '{"a": 1}')
    with pytest.raises(CommandError, match=rf"^refused \({code}\): ") as err:
        trigger(*args)
    assert err.value.returncode == 1
    assert Task.objects.count() == 1


def test_a_cancelled_task_is_refused_with_task_cancelled(django_user_model):
    make_task(django_user_model.objects.create_user("cli"), state=S.CANCELLED, key="c",
              payload={"n": 1})
    with pytest.raises(CommandError, match=r"^refused \(task_cancelled\)"):
        trigger("demo.echo", "--key", "c", "--payload", '{"n": 1}')


def test_owner_acts_for_an_existing_user_and_keys_are_scoped_per_owner(owner):
    trigger("demo.echo", "--key", "same", "--payload", "{}")
    out = trigger("demo.echo", "--key", "same", "--payload", "{}", "--owner", owner.username)
    assert out.startswith("created:")
    assert sorted(Task.objects.values_list("owner__username", flat=True)) == ["cli", "client-a"]
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        trigger("demo.echo", "--key", "x", "--owner", "nobody")


def test_the_payload_comes_from_a_file_or_is_refused_when_it_is_not_an_object(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"from": "file"}')
    trigger("demo.echo", "--key", "f", "--payload", f"@{path}")
    assert Task.objects.get().payload == {"from": "file"}
    with pytest.raises(CommandError, match="not valid JSON"):
        trigger("demo.echo", "--key", "g", "--payload", "{nope")
    with pytest.raises(CommandError, match="must be a JSON object"):
        trigger("demo.echo", "--key", "g", "--payload", "[1]")
    with pytest.raises(CommandError, match="cannot read the payload"):
        trigger("demo.echo", "--key", "g", "--payload", f"@{tmp_path / 'missing.json'}")


def test_wait_prints_the_final_state_and_result_of_a_finished_task():
    trigger("demo.echo", "--key", "w", "--payload", '{"x": 1}')
    drain()
    out = trigger("demo.echo", "--key", "w", "--payload", '{"x": 1}', "--wait")
    assert "final state: succeeded after 1 attempt(s)" in out
    assert 'result: {"echo": {"x": 1}}' in out


def test_wait_exits_3_when_the_timeout_passes_first():
    with pytest.raises(CommandError, match=r"is still pending after 0\.3s") as err:
        trigger("demo.echo", "--key", "t", "--wait", "--timeout", "0.3")
    assert err.value.returncode == 3
