"""Cancel / retry / retry from start from the task page and as bulk actions
(workflows/admin/confirm.py): dry run first, then one engine call per task;
refused to users without the transition's permission on every path."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client

from tests.admin.conftest import LIST_URL, task_url
from tests.factories import make_task
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.states import StepState
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

ACTIONS = ["cancel", "retry", "retry_from_start"]
BULK = {"cancel": "cancel_selected", "retry": "retry_selected",
        "retry_from_start": "retry_selected_from_start"}
# Where each action takes a task from each state it is legal in (nothing to compensate).
AFTER = {
    "cancel": {S.PENDING: S.CANCELLED, S.RETRYING: S.CANCELLED, S.WAITING: S.CANCELLED,
               S.RUNNING: S.CANCELLING},
    "retry": {S.FAILED: S.PENDING, S.CANCELLED: S.PENDING},
    "retry_from_start": {S.FAILED: S.PENDING, S.CANCELLED: S.PENDING},
}


def history(task) -> list[tuple]:
    return list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id")
                .values_list("transition", "from_state", "to_state", "actor", "reason"))


def plan_rows(response) -> dict[str, str]:
    """{task id: "will become" text} from the confirmation table."""
    html = response.content.decode()
    rows = re.findall(r'data-task="([0-9a-f-]+)">(.*?)</tr>', html, re.S)
    return {pk: re.search(r'class="pilot-outcome">(.*?)</td>', row).group(1)
            for pk, row in rows}


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("state", list(S.values))
def test_the_task_page_action_applies_only_where_legal_and_audits(action, state,
                                                                  operator_client, owner):
    task = make_task(owner, state=state)
    before = history(task)
    confirm = operator_client.get(task_url(task, f"transition/{action}/"))
    assert confirm.status_code == 200
    legal = state in AFTER[action]
    assert plan_rows(confirm)[str(task.pk)] == (
        f"{state} → {AFTER[action][state]}" if legal else "no change")
    response = operator_client.post(task_url(task, f"transition/{action}/"),
                                    {"confirmed": "yes", "reason": "operator says so"},
                                    follow=True)
    assert response.redirect_chain[0][0] == task_url(task)
    message = next(str(m) for m in response.context["messages"])
    task.refresh_from_db()
    if legal:
        assert task.state == AFTER[action][state]
        assert history(task) == [*before, (
            "cancel" if action == "cancel" else "retry", state, task.state, "user:operator",
            "operator says so")]
        assert "→" in message
    else:
        assert task.state == state and history(task) == before
        assert "refused — invalid_transition" in message


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("state", [S.PENDING, S.RUNNING, S.FAILED, S.CANCELLED])
def test_a_user_without_the_permission_is_refused_on_every_path(action, state, viewer_client,
                                                                owner):
    task = make_task(owner, state=state)
    before = history(task)
    url = task_url(task, f"transition/{action}/")
    assert viewer_client.get(url).status_code == 403
    assert viewer_client.post(url, {"confirmed": "yes"}).status_code == 403
    # The list's bulk action, confirmed straight away.
    response = viewer_client.post(LIST_URL, {"action": BULK[action], "confirmed": "yes",
                                             ACTION_CHECKBOX_NAME: [str(task.pk)]},
                                  follow=True)
    assert response.status_code == 200
    assert BULK[action] not in response.content.decode()  # not even offered
    # django-fsm-2's change-form path, which its FSMAdminMixin would honour.
    assert viewer_client.post(task_url(task), {"_fsm_transition_to": "cancel"}).status_code == 403
    task.refresh_from_db()
    assert task.state == state and history(task) == before


def test_an_operator_holding_only_cancel_gets_only_cancel(django_user_model, owner):
    from tests.admin.conftest import _staff

    canceller = _staff(django_user_model, "canceller", perms=(
        "view_task", "view_all_tasks", "cancel_task"))
    client = Client()
    client.force_login(canceller)
    failed, pending = make_task(owner, state=S.FAILED), make_task(owner, state=S.PENDING)
    assert 'data-action="cancel"' in client.get(task_url(pending)).content.decode()
    assert "data-action" not in client.get(task_url(failed)).content.decode()
    assert client.post(task_url(failed, "transition/retry/"), {"confirmed": "yes"}
                       ).status_code == 403
    actions = client.get(LIST_URL).content.decode()
    assert "cancel_selected" in actions and "retry_selected" not in actions
    failed.refresh_from_db()
    assert failed.state == S.FAILED


def test_acting_on_the_task_page_also_needs_the_view_permission(django_user_model):
    from tests.admin.conftest import _staff

    blind = _staff(django_user_model, "blind", perms=("cancel_task", "retry_task"))
    client = Client()
    client.force_login(blind)
    task = make_task(blind, state=S.PENDING)  # even their own task
    assert client.get(task_url(task, "transition/cancel/")).status_code == 403
    assert client.post(task_url(task, "transition/cancel/"), {"confirmed": "yes"}
                       ).status_code == 403
    task.refresh_from_db()
    assert task.state == S.PENDING


def test_confirming_needs_a_csrf_token(operator, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    task = make_task(owner, state=S.PENDING)
    assert client.post(task_url(task, "transition/cancel/"), {"confirmed": "yes"}
                       ).status_code == 403
    assert client.post(LIST_URL, {"action": "cancel_selected", "confirmed": "yes",
                                  ACTION_CHECKBOX_NAME: [str(task.pk)]}).status_code == 403
    task.refresh_from_db()
    assert task.state == S.PENDING
    # With the token the page gives, it goes through.
    page = client.get(task_url(task, "transition/cancel/")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    client.post(task_url(task, "transition/cancel/"),
                {"confirmed": "yes", "csrfmiddlewaretoken": token})
    task.refresh_from_db()
    assert task.state == S.CANCELLED


@pytest.mark.parametrize("action", ACTIONS)
def test_bulk_action_over_a_mix_of_states_previews_then_reports_each_task(action,
                                                                          operator_client,
                                                                          owner):
    tasks = {state: make_task(owner, state=state) for state in S.values}
    before = {state: history(t) for state, t in tasks.items()}
    selected = [str(t.pk) for t in tasks.values()]
    preview = operator_client.post(LIST_URL, {"action": BULK[action],
                                              ACTION_CHECKBOX_NAME: selected})
    assert preview.status_code == 200
    planned = plan_rows(preview)
    expected = {str(t.pk): (f"{s} → {AFTER[action][s]}" if s in AFTER[action] else "no change")
                for s, t in tasks.items()}
    assert planned == expected
    # The dry run changed nothing.
    assert {s: Task.objects.get(pk=t.pk).state for s, t in tasks.items()} == {
        s: s for s in tasks}

    done = operator_client.post(LIST_URL, {"action": BULK[action], "confirmed": "yes",
                                           "reason": "bulk test",
                                           ACTION_CHECKBOX_NAME: selected})
    assert done.status_code == 200
    results = {str(r.task_id): r for r in done.context["results"]}
    for state, task in tasks.items():
        task.refresh_from_db()
        result = results[str(task.pk)]
        if state in AFTER[action]:
            assert result.ok and task.state == AFTER[action][state]
            assert history(task)[-1][1:] == (state, task.state, "user:operator", "bulk test")
            assert len(history(task)) == len(before[state]) + 1
        else:
            assert not result.ok and result.detail.startswith("invalid_transition")
            assert task.state == state and history(task) == before[state]
    html = done.content.decode()
    assert f"{sum(r.ok for r in results.values())} of {len(S.values)} task(s) changed" in html


# transaction=True: with the Redis broker an enqueue happens on commit.
@pytest.mark.django_db(transaction=True)
def test_bulk_retry_from_start_resets_checkpoints_and_enqueues(operator_client, owner):
    from tests.support.helpers import drain, pop_queued, queued_task_ids
    from workflows.engine.triggers import task_trigger

    task = task_trigger(owner=owner, key="saga-x", workflow="demo.saga",
                        payload={"fail": True}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    pop_queued()
    assert Task.objects.get(pk=task.pk).state == S.FAILED
    preview = operator_client.post(LIST_URL, {"action": "retry_selected_from_start",
                                              ACTION_CHECKBOX_NAME: [str(task.pk)]})
    assert "every step runs again from the first (0 finished step(s) reset)" in \
        preview.content.decode()  # reserve and charge were compensated, not succeeded
    operator_client.post(LIST_URL, {"action": "retry_selected_from_start", "confirmed": "yes",
                                    ACTION_CHECKBOX_NAME: [str(task.pk)]})
    assert set(StepCheckpoint.objects.filter(task_id=task.pk).values_list(
        "state", flat=True)) == {StepState.PENDING}
    assert queued_task_ids() == [str(task.pk)]
    assert history(task)[-1][:3] == ("retry", "failed", "pending")


@pytest.mark.django_db(transaction=True)  # the atomic step's own transaction commits
def test_retry_from_a_step_on_the_task_page_shows_its_dry_run_then_applies(operator_client,
                                                                             owner):
    """The task page's "Retry from step" form: the chosen step's dry run, then
    the retry from it; a step the workflow lacks is refused and changes nothing."""
    from tests.support.helpers import drain, pop_queued, queued_task_ids
    from workflows.engine.triggers import task_trigger

    task = task_trigger(owner=owner, key="sync-x", workflow="demo.sync_orders",
                        payload={"batch": "b", "count": 2}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    pop_queued()
    Task.objects.filter(pk=task.pk).update(state=S.CANCELLED)  # as if cancelled at the end
    page = operator_client.get(task_url(task)).content.decode()
    assert 'id="pilot-retry-from"' in page and '<option value="transform">2. transform' in page
    url = task_url(task, "transition/retry/")
    confirm = operator_client.get(url, {"from_step": "transform"}).content.decode()
    assert "Retry from step transform" in confirm
    assert "runs again from step transform, keeping the finished step(s) fetch" in confirm
    assert '<input type="hidden" name="from_step" value="transform">' in confirm
    refused = operator_client.post(url, {"confirmed": "yes", "from_step": "nope"}, follow=True)
    assert "There is no step &#x27;nope&#x27; in demo.sync_orders" in refused.content.decode()
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED and queued_task_ids() == []
    operator_client.post(url, {"confirmed": "yes", "from_step": "transform", "reason": "redo"})
    assert history(task)[-1] == ("retry", "cancelled", "pending", "user:operator", "redo")
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index").values_list(
        "name", "state")) == [("fetch", "succeeded"), ("transform", "pending"),
                              ("write", "pending")]
    assert queued_task_ids() == [str(task.pk)]
