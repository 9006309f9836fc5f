"""The trigger form (workflows/admin/trigger.py, forms.py): the same engine
call as the API, as the signed-in user, source=admin."""

from __future__ import annotations

import pytest

from tests.admin.conftest import task_url
from tests.support.helpers import drain, queued_task_ids
from workflows.models import Task, TaskReplay
from workflows.rules.states import Source
from workflows.rules.states import TaskState as S

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/workflows/task/trigger/"


def submit(client, *, workflow="demo.echo", key="key-1", payload='{"n": 1}'):
    return client.post(URL, {"workflow": workflow, "idempotency_key": key, "payload": payload},
                       follow=True)


def errors_of(response, field: str) -> str:
    return " | ".join(response.context["form"].errors[field])


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_form_offers_every_workflow_and_a_fresh_key(operator_client):
    first = operator_client.get(URL)
    second = operator_client.get(URL)
    assert first.status_code == 200
    html = first.content.decode()
    for name in ("demo.echo", "demo.sync_orders", "demo.flaky", "demo.slow", "demo.saga"):
        assert f'<option value="{name}"' in html
    key1 = first.context["form"]["idempotency_key"].value()
    key2 = second.context["form"]["idempotency_key"].value()
    assert len(key1) == 36 and key1 != key2


def test_a_new_trigger_creates_a_task_and_shows_it(operator_client, operator):
    response = submit(operator_client, payload='{"n": 1}')
    task = Task.objects.get()
    assert response.redirect_chain[-1][0] == task_url(task)
    assert (task.owner, task.source, task.workflow, task.payload, task.idempotency_key) == (
        operator, Source.ADMIN, "demo.echo", {"n": 1}, "key-1")
    assert "Created task" in messages_of(response)[0] and str(task.pk) in messages_of(response)[0]
    assert queued_task_ids() == [str(task.pk)]


def test_the_same_trigger_again_replays(operator_client):
    submit(operator_client)
    response = submit(operator_client)
    task = Task.objects.get()
    assert response.redirect_chain[-1][0] == task_url(task)
    assert "Replayed" in messages_of(response)[0] and "nothing new was started" in \
        messages_of(response)[0]
    assert task.replays == 1 and TaskReplay.objects.filter(task=task).count() == 1
    assert len(queued_task_ids()) == 1


def test_a_failed_task_is_restarted_by_the_same_trigger(operator_client):
    submit(operator_client, workflow="demo.saga", key="saga", payload='{"fail": true}')
    task = Task.objects.get()
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.FAILED
    response = submit(operator_client, workflow="demo.saga", key="saga", payload='{"fail": true}')
    assert "Restarted" in messages_of(response)[0]
    assert Task.objects.get(pk=task.pk).state == S.PENDING


def test_the_key_reused_with_another_payload_is_refused_once_with_a_link(operator_client):
    submit(operator_client, payload='{"n": 1}')
    task = Task.objects.get()
    response = submit(operator_client, payload='{"n": 2}')
    assert response.status_code == 200 and not response.redirect_chain
    assert messages_of(response) == []  # said once, on the field, not again on top
    html = response.content.decode()
    assert html.count("idempotency_key_reused") == 1
    assert "idempotency_key_reused" in errors_of(response, "idempotency_key")
    # The task the key belongs to is a link to its page.
    assert f'<a href="{task_url(task)}">{task.pk}</a>' in html
    assert Task.objects.get().payload == {"n": 1}


def test_a_cancelled_task_refuses_its_trigger(operator_client, operator):
    from workflows.engine.operations import task_cancel

    submit(operator_client)
    task = Task.objects.get()
    task_cancel(task_id=task.pk, user=operator)
    response = submit(operator_client)
    assert "task_cancelled" in errors_of(response, "idempotency_key")
    assert f'<a href="{task_url(task)}">{task.pk}</a>' in response.content.decode()
    assert Task.objects.get().state == S.CANCELLED


@pytest.mark.parametrize("payload, problem", [
    ('{"n": 1', "Not valid JSON: Expecting ',' delimiter (line 1, column 8)"),
    ("", "This field is required."),
    ("[1, 2]", "Must be a JSON object."),
    ("NaN", "Must be a JSON object."),
    ('{"x": NaN}', "Must be plain JSON (no NaN or Infinity)."),
])
def test_invalid_json_is_refused_without_a_task(operator_client, payload, problem):
    response = submit(operator_client, payload=payload)
    assert response.status_code == 200
    assert problem in errors_of(response, "payload")
    assert not Task.objects.exists() and queued_task_ids() == []


def test_the_workflows_own_serializer_validates_the_payload(operator_client):
    response = submit(operator_client, workflow="demo.slow", payload='{"steps": 0}')
    errors = errors_of(response, "payload")
    assert "steps: Ensure this value is greater than or equal to 1." in errors
    assert "seconds: This field is required." in errors
    assert not Task.objects.exists()


def test_an_invalid_key_and_an_unknown_workflow_are_refused(operator_client):
    response = submit(operator_client, key="bad key\twith tab")
    assert "idempotency_key_invalid" in errors_of(response, "idempotency_key")
    response = submit(operator_client, workflow="nope.missing")
    assert "nope.missing" in errors_of(response, "workflow")
    assert not Task.objects.exists()


def test_the_form_takes_every_key_the_api_takes_and_no_other(operator_client):
    quoted = '"' + "k" * 255 + '"'  # 257 characters, the key inside 255
    assert submit(operator_client, key=quoted).status_code == 200
    assert list(Task.objects.values_list("idempotency_key", flat=True)) == ["k" * 255]
    response = submit(operator_client, key="k" * 256)
    assert "idempotency_key_invalid" in errors_of(response, "idempotency_key")
    assert Task.objects.count() == 1


def test_triggering_needs_the_add_task_permission(viewer_client):
    assert viewer_client.get(URL).status_code == 403
    assert submit(viewer_client).status_code == 403
    assert not Task.objects.exists()
