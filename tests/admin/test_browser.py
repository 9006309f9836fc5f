"""A real browser on the real console: Debian's chromium driven by Playwright
against a live server, with a real `qcluster` and `run_dispatcher` running the
work (PostgreSQL). An operator logs in, triggers `demo.slow` from the form,
watches it run, cancels it from the task page, sees it `cancelled` with its
history, retries it and sees it succeed. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from tests.admin.conftest import operators_group
from tests.procs import ARTIFACTS, Fleet, wait_until
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskTransition
from workflows.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow,
              pytest.mark.django_db(transaction=True)]

PASSWORD = "browser-test-pw-1"


def other_sessions() -> int:
    """Connections to this test database other than ours (workers, dispatcher)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.fixture
def fleet():
    fleet = Fleet()
    fleet.dispatcher()
    fleet.workers()
    yield fleet
    fleet.stop_all()
    # A killed process's server session ends a moment after it; wait for that so
    # the test database can be dropped when this test runs last.
    wait_until(lambda: other_sessions() == 0, 10, what="worker sessions to close")


@pytest.fixture
def operator_user(django_user_model):
    user = django_user_model.objects.create_user("op-browser", password=PASSWORD,
                                                 is_staff=True)
    user.groups.add(operators_group())
    user.user_permissions.add(Permission.objects.get(content_type__app_label="workflows",
                                                     codename="add_task"))
    return user


def badge(page) -> str:
    return page.locator(".field-state_badge .pilot-badge").inner_text().strip()


def wait_for_badge(page, *states: str, timeout: float = 60) -> str:
    """Reload the task page, as an operator would, until its state is one of `states`."""
    deadline = time.monotonic() + timeout
    while True:
        state = badge(page)
        if state in states:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"task stayed {state!r}, expected {states}")
        time.sleep(0.4)
        page.reload()


def confirm(page, action: str, reason: str) -> None:
    page.click(f"a[data-action='{action}']")
    page.wait_for_selector("#pilot-plan")
    page.fill("#id_reason", reason)
    page.click("#pilot-confirm")
    page.wait_for_selector(".field-state_badge")


def test_an_operator_triggers_watches_cancels_and_retries_in_a_real_browser(
        live_server, fleet, page, operator_user):
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", operator_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.click("text=Trigger a workflow")

    page.select_option("#id_workflow", "demo.slow")
    key = page.input_value("#id_idempotency_key")
    assert len(key) == 36  # a fresh UUID, pre-filled
    page.fill("#id_payload", '{"steps": 10, "seconds": 1.0}')
    page.click("#pilot-trigger")
    assert "Created task" in page.locator("ul.messagelist").inner_text()
    task = Task.objects.get(idempotency_key=key)
    assert task.owner_id == operator_user.pk and task.source == "admin"

    # Watch it run: a worker claims it and checkpoints steps.
    wait_for_badge(page, S.RUNNING)
    deadline = time.monotonic() + 30
    while "s0" not in page.locator("#steps-group").inner_text():
        assert time.monotonic() < deadline, "no step was checkpointed"
        time.sleep(0.4)
        page.reload()
    page.screenshot(path=ARTIFACTS / "admin-task-running.png", full_page=True)

    # Cancel from the task page: a dry run first, then the engine.
    page.click("a[data-action='cancel']")
    assert "running → cancelling" in page.locator("#pilot-plan").inner_text()
    page.go_back()
    confirm(page, "cancel", "browser test: stop it")
    assert "Cancel: running → cancelling" in page.locator("ul.messagelist").inner_text()
    wait_for_badge(page, S.CANCELLED, timeout=30)
    history = page.locator("#transitions-group").inner_text()
    assert "browser test: stop it" in history and "finish_cancel" in history
    assert page.locator("a[data-action='cancel']").count() == 0
    assert page.locator("a[data-action='retry']").count() == 1
    task.refresh_from_db()
    done_before_retry = task.steps.filter(state="succeeded").count()
    assert 1 <= done_before_retry < 10

    # Retry: it resumes from its checkpoints and succeeds.
    confirm(page, "retry", "browser test: go on")
    wait_for_badge(page, S.SUCCEEDED, timeout=60)
    assert '"completed_steps": 10' in page.locator(".field-result_json").inner_text()
    history = page.locator("#transitions-group").inner_text()
    assert "browser test: go on" in history and "succeed" in history
    page.screenshot(path=ARTIFACTS / "admin-task-page.png", full_page=True)

    edges = list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id")
                 .values_list("transition", "from_state", "to_state"))
    assert ("cancel", "running", "cancelling") in edges
    assert ("finish_cancel", "cancelling", "cancelled") in edges
    assert ("retry", "cancelled", "pending") in edges
    assert edges[-1] == ("succeed", "running", "succeeded")
    task.refresh_from_db()
    assert task.result == {"completed_steps": 10}

    # Some more work for the workers, so the dashboard has something to say:
    # a replay, retries and a failure with compensations.
    more = [task_trigger(owner=operator_user, key=f"echo-{i}", workflow="demo.echo",
                         payload={"i": i}).task.pk for i in range(3)]
    task_trigger(owner=operator_user, key="echo-0", workflow="demo.echo", payload={"i": 0})
    more.append(task_trigger(owner=operator_user, key="flaky", workflow="demo.flaky",
                             payload={"fail_times": 2}).task.pk)
    more.append(task_trigger(owner=operator_user, key="saga", workflow="demo.saga",
                             payload={"fail": True}).task.pk)
    wait_until(lambda: all(t.is_finished for t in Task.objects.filter(pk__in=more)), 60,
               what="the extra tasks to finish")
    page.goto(f"{live_server.url}/admin/workflows/task/dashboard/")
    cards = {state: int(page.locator(f".pilot-card[data-state='{state}'] .pilot-card-n")
                        .inner_text()) for state in ("succeeded", "failed")}
    assert cards == {"succeeded": 5, "failed": 1}
    assert "demo.saga" in page.locator("#pilot-top-failing").inner_text()
    page.screenshot(path=ARTIFACTS / "admin-dashboard.png", full_page=True)
    page.goto(f"{live_server.url}/admin/workflows/task/")
    page.screenshot(path=ARTIFACTS / "admin-task-list.png", full_page=True)
