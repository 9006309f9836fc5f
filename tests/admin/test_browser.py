"""A real browser on the real console: Debian's chromium driven by Playwright
against a live server (PostgreSQL), with a real `qcluster` and
`run_dispatcher` running the work where a test needs workers.

- an operator triggers `demo.slow`, watches it, cancels it from the task
  page, retries it and sees it succeed, then reads the dashboard;
- the workers panel shows a worker busy with a `demo.slow` run, and the task
  page updates the running step's elapsed time without a reload;
- a filter-wide cancel of 1 500 pending tasks runs through the engine in
  chunks, with audit rows and Django admin log entries in Recent actions;
- long values never widen the page (1280 px and 390 px), every list column
  shows at 1440 px, the confirm page keeps its key columns on a phone, the
  charts follow dark mode, and no request of any page 404s (the favicon);
- with the fair-share cap at 1, a task held by its client's cap says so on
  its page, in the list and on Workers & queue, and a failed task lists each
  attempt with its traceback;
- a payload search finds an order's task; a filter-wide retry names the
  client, groups the errors and gives the fresh budget; the progress page
  shows no Start while its script runs the job; every header link reads at
  4.5:1 or better in the light and dark themes;
- webhooks failing across tasks show on the dashboard and in the deliveries
  list, whose bulk Re-send shows its dry run first; a task page with webhook
  attempts fits 390 px; a schedule runs now from its page and its runs link
  lists that run; the Trigger form's key box holds its UUID.

Screenshots go to test-artifacts/; with PILOT_UPDATE_SCREENSHOTS=1 the ones
the README and docs/console.md show are also written to docs/screenshots/.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.utils import timezone

from tests.admin.conftest import operators_group
from tests.support.procs import ARTIFACTS, ROOT, Fleet, wait_until
from workflows.engine.operations import task_cancel
from workflows.engine.run import task_run
from workflows.engine.store.rows import CANCELLED_WHILE_RUNNING
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskTransition
from workflows.rules.errors import NonRetryableError
from workflows.rules.fingerprint import fingerprint
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow,
              pytest.mark.django_db(transaction=True)]

PASSWORD = "browser-test-pw-1"
DOCS_SHOTS = ROOT / "docs" / "screenshots"


def shot(page, name: str, *, docs: bool = False) -> None:
    """A full-page screenshot in test-artifacts/, and in docs/screenshots/ when
    asked to regenerate the documentation's pictures."""
    page.screenshot(path=ARTIFACTS / f"admin-{name}.png", full_page=True)
    if docs and os.environ.get("PILOT_UPDATE_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=DOCS_SHOTS / f"{name}.png", full_page=True)


def other_sessions() -> int:
    """Connections to this test database other than ours (workers, dispatcher)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.fixture
def fleet(settings):
    # The workers' lease (tests/support/procs.py); the page derives the last heartbeat from it.
    settings.PILOT_LEASE_SECONDS = 3
    fleet = Fleet()
    fleet.dispatcher()
    fleet.workers()
    yield fleet
    fleet.stop_all()
    # A killed process's server session ends a moment after it; wait for that so
    # the test database can be dropped when this test runs last.
    wait_until(lambda: other_sessions() == 0, 10, what="worker sessions to close")


@pytest.fixture
def capped_fleet(settings):
    """`fleet` with the fair-share cap at 1 (the web process reads it too)."""
    settings.PILOT_LEASE_SECONDS = 3
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    fleet = Fleet(PILOT_MAX_RUNNING_PER_CLIENT="1")
    fleet.dispatcher()
    fleet.workers()
    yield fleet
    fleet.stop_all()
    wait_until(lambda: other_sessions() == 0, 10, what="worker sessions to close")


@pytest.fixture
def operator_user(django_user_model):
    user = django_user_model.objects.create_user("op-browser", password=PASSWORD,
                                                 is_staff=True)
    user.groups.add(operators_group())
    user.user_permissions.add(Permission.objects.get(content_type__app_label="workflows",
                                                     codename="add_task"))
    return user


@pytest.fixture
def signed_in(live_server, page, operator_user):
    """The page, signed in as the operator; every response of 400 or more is
    collected in `page.failures`."""
    page.failures = []
    page.on("response", lambda r: page.failures.append((r.status, r.url))
            if r.status >= 400 else None)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", operator_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector(".pilot-console-links")
    return page


def badge(page) -> str:
    return page.locator(".field-state_badge .pilot-badge").inner_text(timeout=2000).strip()


def wait_for_badge(page, *states: str, timeout: float = 60) -> str:
    """Wait until the task page shows one of `states`. The page updates itself
    (and reloads on a change of state); reading may meet a reload mid-way."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        try:
            state = badge(page)
        except PlaywrightError:
            state = "(reloading)"
        if state in states:
            return state
        time.sleep(0.3)
    raise AssertionError(f"task stayed {state!r}, expected {states}")


def page_width(page) -> tuple[int, int]:
    return page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")


def confirm(page, action: str, reason: str) -> None:
    page.click(f"a[data-action='{action}']")
    page.wait_for_selector("#pilot-plan")
    page.fill("#id_reason", reason)
    page.click("#pilot-confirm")
    page.wait_for_selector(".field-state_badge")


def test_an_operator_triggers_watches_cancels_and_retries_in_a_real_browser(
        live_server, fleet, signed_in, operator_user):
    page = signed_in
    page.click("text=Trigger a workflow")
    page.select_option("#id_workflow", "demo.slow")
    # The form filled in the workflow's example payload.
    assert '"steps": 1' in page.input_value("#id_payload")
    key = page.input_value("#id_idempotency_key")
    assert len(key) == 36  # a fresh UUID, pre-filled
    page.fill("#id_payload", '{"steps": 10, "seconds": 1.0}')
    page.click("#pilot-trigger")
    assert "Created task" in page.locator("ul.messagelist").inner_text()
    task = Task.objects.get(idempotency_key=key)
    assert task.owner_id == operator_user.pk and task.source == "admin"

    # Watch it run: the page follows on its own (live updates), no reload by us.
    wait_for_badge(page, S.RUNNING)
    page.wait_for_selector("#pilot-steps tr[data-step='s0'][data-step-state='succeeded']",
                           timeout=30_000)
    shot(page, "task-running")

    # Cancel from the task page: a dry run first, then the engine.
    page.click("a[data-action='cancel']")
    assert "running → cancelling" in page.locator("#pilot-plan").inner_text()
    page.go_back()
    confirm(page, "cancel", "browser test: stop it")
    assert "Cancel: running → cancelling" in page.locator("ul.messagelist").inner_text()
    wait_for_badge(page, S.CANCELLED, timeout=30)
    history = page.locator("#transitions-group").inner_text()
    assert "browser test: stop it" in history and "finish_cancel" in history
    # The step the cancel stopped reads "cancelled", not a red "failed". Where the
    # cancel lands is timing: mid-sleep, the heartbeat notices it and the step is
    # stopped; in the last moments of a step's sleep (after its last heartbeat) the
    # body returns first and the step is recorded done. The page shows what the
    # checkpoints say either way, and never a failure.
    stopped = task.steps.filter(state="failed", error=CANCELLED_WHILE_RUNNING).count()
    assert stopped <= 1
    assert page.locator("#pilot-steps [data-step-state='cancelled']").count() == stopped
    assert page.locator("#pilot-steps [data-step-state='failed']").count() == 0
    assert page.locator("a[data-action='cancel']").count() == 0
    assert page.locator("a[data-action='retry']").count() == 1
    task.refresh_from_db()
    done_before_retry = task.steps.filter(state="succeeded").count()
    assert 1 <= done_before_retry < 10

    # Retry: it resumes from its checkpoints and succeeds.
    confirm(page, "retry", "browser test: go on")
    wait_for_badge(page, S.SUCCEEDED, timeout=60)
    page.wait_for_selector(".field-result_json")
    assert '"completed_steps": 10' in page.locator(".field-result_json").inner_text()
    history = page.locator("#transitions-group").inner_text()
    assert "browser test: go on" in history and "succeed" in history
    shot(page, "task-page", docs=True)

    edges = list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id")
                 .values_list("transition", "from_state", "to_state"))
    assert ("cancel", "running", "cancelling") in edges
    assert ("finish_cancel", "cancelling", "cancelled") in edges
    assert ("retry", "cancelled", "pending") in edges
    assert edges[-1] == ("succeed", "running", "succeeded")
    task.refresh_from_db()
    assert task.result == {"completed_steps": 10}
    # The console's actions are in Django's log, on the task's History page too.
    page.click("a.historylink")
    logged = page.locator("#change-history").inner_text()
    assert "Triggered through the console: created" in logged
    assert "Cancel through the console: browser test: stop it" in logged
    assert page.locator("#pilot-transitions tr[data-transition]").count() == len(edges)

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
    assert "of 2 worker(s) busy" in page.locator("#pilot-workers-summary").inner_text()
    shot(page, "dashboard", docs=True)
    page.goto(f"{live_server.url}/admin/workflows/task/")
    shot(page, "task-list", docs=True)
    assert page.failures == []


def test_the_workers_panel_and_the_task_page_follow_a_running_task_live(
        live_server, fleet, signed_in, operator_user):
    page = signed_in
    task = task_trigger(owner=operator_user, key="watch-live", workflow="demo.slow",
                        payload={"steps": 4, "seconds": 3}).task
    page.goto(f"{live_server.url}/admin/workflows/task/workers/")
    busy = page.locator(f"tr[data-task='{task.pk}'] [data-worker-state='busy']")
    busy.wait_for(timeout=30_000)  # the panel updates itself: no reload by the test
    row = page.locator(f"tr[data-task='{task.pk}']")
    worker = row.get_attribute("data-worker")
    assert worker == Task.objects.get(pk=task.pk).lease_owner  # "<host>:<worker pid>"
    assert "demo.slow" in row.inner_text()
    assert page.locator("[data-worker-state='idle']").count() == 1  # the other worker
    shot(page, "workers", docs=True)

    page.goto(f"{live_server.url}/admin/workflows/task/{task.pk}/change/")
    elapsed = page.locator("#pilot-elapsed")
    elapsed.wait_for(timeout=20_000)
    page.evaluate("window.pilotMarker = 'same page'")
    first_step = page.locator("#pilot-now .pilot-now-step").inner_text()
    first = elapsed.inner_text()
    assert "of 4:" in first_step
    page.wait_for_function(
        "previous => { const e = document.getElementById('pilot-elapsed');"
        " return e && e.textContent !== previous; }", arg=first, timeout=10_000)
    page.wait_for_timeout(2500)  # at least one round trip to the live endpoint
    assert page.evaluate("window.pilotMarker") == "same page"  # never reloaded
    assert "updated" in page.locator("#pilot-live-status").inner_text()
    assert page.locator("#pilot-heartbeat").inner_text().startswith("last heartbeat")
    assert "still to run" in page.locator("#pilot-now").inner_text() or \
        "the last planned step" in page.locator("#pilot-now").inner_text()
    task_cancel(task_id=task.pk, user=operator_user, reason="test over")
    assert page.failures == []


def pending_incident(owner, n: int) -> None:
    """n pending tasks, as many triggers would have left them, inserted in bulk."""
    now = timezone.now()
    Task.objects.bulk_create([
        Task(owner=owner, idempotency_key=f"incident-{i}", workflow="demo.echo",
             payload={"i": i}, fingerprint=fingerprint("demo.echo", {"i": i}),
             max_attempts=3, created_at=now, updated_at=now, enqueued_at=now)
        for i in range(n)], batch_size=500)


def test_a_filter_wide_cancel_of_1500_pending_tasks(live_server, signed_in, operator_user,
                                                   django_user_model):
    page = signed_in
    client = django_user_model.objects.create_user("upstream-client")
    pending_incident(client, 1500)
    Task.objects.create(owner=client, idempotency_key="not-incident", workflow="demo.echo",
                        payload={}, fingerprint=fingerprint("demo.echo", {}), max_attempts=3)
    filtered = f"{live_server.url}/admin/workflows/task/?q=incident&state__exact=pending"
    page.goto(filtered)
    page.click("a[data-filter-action='cancel']")
    page.wait_for_selector("#pilot-bulk-summary")
    assert page.locator("[data-summary-state='pending'] [data-count]").inner_text() == "1500"
    assert page.locator("#pilot-confirm").get_attribute("value") == "Cancel 1500 task(s)"
    page.set_viewport_size({"width": 390, "height": 800})
    assert page_width(page)[0] <= 390
    shot(page, "bulk-confirm", docs=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.fill("#id_reason", "incident 42: upstream sent garbage")
    started = time.monotonic()
    page.click("#pilot-confirm")
    page.wait_for_url("**/bulk/cancel/done/**", timeout=120_000)
    took = time.monotonic() - started
    print(f"\nfilter-wide cancel of 1500 tasks through the engine: {took:.1f} s")
    assert "1500</strong> of 1500 task(s) changed" in page.content()
    assert page.locator("[data-now-state='cancelled'] [data-count]").inner_text() == "1500"
    shot(page, "bulk-done", docs=True)

    assert Task.objects.filter(idempotency_key__startswith="incident-",
                               state=S.CANCELLED).count() == 1500
    assert Task.objects.get(idempotency_key="not-incident").state == S.PENDING
    audit = TaskTransition.objects.filter(transition="cancel", from_state="pending",
                                          to_state="cancelled", actor="user:op-browser",
                                          reason="incident 42: upstream sent garbage")
    assert audit.count() == 1500
    assert LogEntry.objects.filter(user=operator_user).count() == 1500

    # Back keeps the filter; run again, nothing would change, so no Confirm.
    page.click("#pilot-back")
    assert page.url == filtered
    assert "0 tasks" in page.locator("p.paginator").inner_text()
    page.click("a[data-filter-action='cancel']")
    page.wait_for_selector("#pilot-nothing")
    assert page.locator("#pilot-confirm").count() == 0
    # Recent actions on the console's home page.
    page.goto(f"{live_server.url}/admin/")
    recent = page.locator("#recent-actions-module").inner_text()
    assert "incident-" in recent and "(cancelled)" in recent
    assert page.failures == []


def test_the_running_filter_follows_live_and_its_rows_stay_selectable(
        live_server, signed_in, operator_user):
    from tests.factories import make_task

    page = signed_in
    first = make_task(operator_user, state=S.RUNNING, key="live-row-1")
    page.goto(f"{live_server.url}/admin/workflows/task/?state__exact=running")
    assert page.locator("#pilot-live-toggle").is_checked()  # live by default here
    page.evaluate("window.pilotMarker = 'same page'")
    second = make_task(operator_user, state=S.RUNNING, key="live-row-2")
    page.wait_for_selector("#result_list >> text=live-row-2", timeout=10_000)
    assert page.evaluate("window.pilotMarker") == "same page"  # rows swapped, no reload
    # Django's "select all" and counter work on the new rows.
    page.click("#action-toggle")
    assert page.locator("tr input.action-select:checked").count() == 2
    assert "2 of 2 selected" in page.locator(".action-counter").inner_text()
    page.select_option("select[name=action]", "cancel_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#pilot-plan")
    assert {str(first.pk), str(second.pk)} == set(
        page.locator("#pilot-plan tbody tr").evaluate_all("rows => rows.map(r => r.dataset.task)"))
    assert page.failures == []


def test_pages_keep_to_the_screen_follow_dark_mode_and_load_without_a_404(
        live_server, signed_in, operator_user, temp_workflow):
    page = signed_in
    wf = temp_workflow("t.long_values")

    def shout(ctx):
        raise NonRetryableError("E" * 300)

    wf.step(lambda ctx: {"text": "x" * 300, "word": "y" * 120}, name="long_output")
    wf.step(shout, name="long_error")
    task = task_trigger(owner=operator_user, key=f"long-{uuid.uuid4().hex[:6]}",
                        workflow="t.long_values", payload={"note": "z" * 300}).task
    task_run(task_id=str(task.pk))  # in this process: the workflow is registered here
    assert Task.objects.get(pk=task.pk).state == S.FAILED
    url = f"{live_server.url}/admin/workflows/task/{task.pk}/change/"
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url)
        page.wait_for_selector("#pilot-steps")
        document, viewport = page_width(page)
        assert document <= viewport, (width, document)
    # On a laptop the long output wraps inside its box, on screen; on a phone the
    # steps table scrolls inside its own box instead of widening the page.
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(url)
    for cell in ("#pilot-steps .pilot-cell-json pre", "#pilot-steps .pilot-cell-error",
                 "#pilot-error pre", ".field-payload_json pre"):
        box = page.locator(cell).last.bounding_box()
        assert box["x"] + box["width"] <= 1280, cell
    shot(page, "task-long-values")

    # The confirm page keeps task, now and outcome on a phone.
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{url[:-len('change/')]}transition/retry/")
    for column in (1, 2, 3):
        cell = page.locator(f"#pilot-plan tbody tr td:nth-child({column})").bounding_box()
        assert cell["x"] + cell["width"] <= 390, column
    assert page_width(page)[0] <= 390

    # Every column of the list at 1440 px, duration and step / error included.
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{live_server.url}/admin/workflows/task/")
    for column in ("duration", "step_or_error"):
        head = page.locator(f"#result_list th.column-{column}").bounding_box()
        assert head["x"] + head["width"] <= 1440, column
    assert page.locator("td.field-step_or_error .pilot-error-head").count() == 1

    # Dark mode: the charts are drawn in the theme's colours, not white boxes.
    page.emulate_media(color_scheme="dark")
    page.goto(f"{live_server.url}/admin/workflows/task/dashboard/")
    colours = page.evaluate("""() => {
        const svg = document.querySelector('.pilot-svg');
        const style = (el) => getComputedStyle(el);
        return {svg: style(svg).backgroundColor, page: style(document.body).backgroundColor,
                ink: style(svg.querySelector('.pilot-ink-muted')).fill,
                text: style(document.querySelector('p.pilot-muted')).color};
    }""")
    assert colours["svg"] == colours["page"] != "rgb(255, 255, 255)", colours
    assert colours["ink"] == colours["text"], colours  # axis labels in the page's own grey
    shot(page, "dashboard-dark")
    page.goto(f"{live_server.url}/admin/workflows/task/workflows/")
    plate = page.evaluate("getComputedStyle(document.querySelector('.pilot-plate')).fill")
    assert plate != "rgb(255, 255, 255)"
    # Every request of every page above succeeded: the favicon is found too.
    assert page.failures == []


def test_an_operator_approves_a_waiting_task_and_a_real_worker_finishes_it(
        live_server, fleet, signed_in, operator_user):
    """demo.approval parks (no worker held); on its page the operator clicks
    Approve…, reads what will be sent, sends it; the workers finish the task
    with the operator's name in its result; the dashboard no longer lists it."""
    page = signed_in
    owner = operator_user
    task = task_trigger(owner=owner, key=f"approve-{uuid.uuid4().hex[:8]}",
                        workflow="demo.approval", payload={"timeout_seconds": 600}).task
    wait_until(lambda: Task.objects.get(pk=task.pk).state == S.WAITING, 60,
               what="the approval to park")
    page.goto(f"{live_server.url}/admin/workflows/task/dashboard/")
    assert str(task.pk)[:8] in page.locator("#pilot-waiting-for-a-person").inner_text()
    page.goto(f"{live_server.url}/admin/workflows/task/{task.pk}/change/")
    assert "Waiting for signal decision" in page.locator("#pilot-waiting").inner_text()
    page.click("#pilot-approve")
    page.click("#pilot-signal-review")
    shown = page.locator("#pilot-signal-payload").inner_text()
    assert '"approved": true' in shown and '"by": "op-browser"' in shown
    assert Task.objects.get(pk=task.pk).state == S.WAITING  # nothing sent yet
    shot(page, "signal-confirm")
    page.click("#pilot-signal-send")
    page.wait_for_selector(".messagelist")
    assert "Signal 'decision' sent" in page.locator(".messagelist").inner_text()
    wait_until(lambda: Task.objects.get(pk=task.pk).state == S.SUCCEEDED, 60,
               what="the workers to finish the approved task")
    task.refresh_from_db()
    assert task.result == {"approved": True, "by": "op-browser"}
    wake = TaskTransition.objects.get(task_id=task.pk, transition="wake")
    assert wake.actor == "user:op-browser"
    assert LogEntry.objects.filter(object_id=str(task.pk),
                                   change_message__startswith="Sent signal").exists()
    assert page.failures == []


def test_a_parent_shows_its_children_and_the_workflows_page_its_versions(
        live_server, fleet, signed_in, operator_user):
    """demo.fanout with 4 children, one failing: the parent's page counts its
    children by state and links to them; a child's page links back; the
    workflows page lists demo.versioned's versions with their unfinished
    tasks, at 1440 and 390 px."""
    page = signed_in
    parent = task_trigger(owner=operator_user, key=f"fan-{uuid.uuid4().hex[:8]}",
                          workflow="demo.fanout",
                          payload={"children": 4, "child_seconds": 0.2, "fail_child": 2}).task
    wait_until(lambda: Task.objects.get(pk=parent.pk).is_finished, 60,
               what="the fan-out to end")
    assert Task.objects.get(pk=parent.pk).error_type == "ChildFailed"
    page.goto(f"{live_server.url}/admin/workflows/task/{parent.pk}/change/")
    children = page.locator(".field-children").inner_text()
    assert "4" in children and "3 succeeded" in children and "1 failed" in children
    shot(page, "task-children", docs=True)
    page.click('[data-children-state="failed"]')
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "demo.saga" in rows.first.inner_text()
    rows.first.locator("th a, td a").first.click()
    page.wait_for_selector(".field-parent")
    assert str(parent.pk)[:8] in page.locator(".field-parent").inner_text()
    page.click(".field-parent a")
    page.wait_for_selector(".field-children")
    waiting = task_trigger(owner=operator_user, key=f"ver-{uuid.uuid4().hex[:8]}",
                           workflow="demo.versioned", payload={}).task
    wait_until(lambda: Task.objects.get(pk=waiting.pk).state == S.WAITING, 60,
               what="the versioned task to wait at its gate")
    # A deployment adds version 2 (in the web process: what the page reads).
    from tests.support.helpers import versioned_v2
    from workflows.registry import registry

    registry.register(versioned_v2())
    try:
        page.goto(f"{live_server.url}/admin/workflows/task/workflows/#workflow-demo-versioned")
        versions = page.locator('[data-workflow="demo.versioned"] .pilot-versions')
        assert "newest" in versions.locator('[data-version="2"]').inner_text()
        assert versions.locator('[data-version="1"] [data-open]').inner_text() == "1"
        shot(page, "workflow-versions", docs=True)
        for width in (1440, 390):
            page.set_viewport_size({"width": width, "height": 900})
            assert page_width(page)[0] <= width
        page.set_viewport_size({"width": 1440, "height": 900})
        versions.locator('[data-version="1"] [data-open] a').click()
        page.wait_for_selector("#result_list")
        assert str(waiting.pk)[:8] in page.locator("#result_list").inner_text()
    finally:
        registry.unregister("demo.versioned", 2)
    assert page.failures == []


def test_a_task_held_by_its_clients_cap_says_so_and_a_failure_shows_each_attempt(
        live_server, capped_fleet, signed_in, operator_user, django_user_model):
    """PILOT_MAX_RUNNING_PER_CLIENT=1 and two workers: while the operator's
    demo.slow runs, their demo.echo waits beside an idle worker, and its Now,
    the list's "why not running" and Workers & queue's client shares say it is
    the client's cap. Another client's demo.flaky fails for good on the free
    worker: its page lists each attempt with its traceback."""
    page = signed_in
    slow = task_trigger(owner=operator_user, key=f"slow-{uuid.uuid4().hex[:8]}",
                        workflow="demo.slow", payload={"steps": 4, "seconds": 3}).task
    wait_until(lambda: Task.objects.get(pk=slow.pk).state == S.RUNNING, 30,
               what="the slow task to start")
    held = task_trigger(owner=operator_user, key=f"held-{uuid.uuid4().hex[:8]}",
                        workflow="demo.echo", payload={"msg": "after the slow one"}).task
    page.goto(f"{live_server.url}/admin/workflows/task/{held.pk}/change/")
    why = page.locator('#pilot-why[data-why="client_cap"]')
    why.wait_for()
    text = why.inner_text()
    assert "op-browser is at its cap" in text and "1 of 1" in text
    assert "PILOT_MAX_RUNNING_PER_CLIENT=1" in text
    shot(page, "task-why-cap", docs=True)
    page.goto(f"{live_server.url}/admin/workflows/task/?owner={operator_user.pk}")
    cell = page.locator(f'tr:has(a[href*="{held.pk}"]) [data-why="client_cap"]')
    assert "at its client's cap: 1 of 1 running" in cell.inner_text()
    page.goto(f"{live_server.url}/admin/workflows/task/workers/")
    share = page.locator('#pilot-shares-table tr[data-client="op-browser"]')
    assert share.get_attribute("data-at-cap") == "true" and "1 / 1" in share.inner_text()
    assert page.locator('[data-worker-state="idle"]').count() >= 1  # idle, on purpose

    other = django_user_model.objects.create_user("acme-billing")
    flaky = task_trigger(owner=other, key=f"flaky-{uuid.uuid4().hex[:8]}",
                         workflow="demo.flaky", payload={"fail_times": 9}).task
    wait_until(lambda: Task.objects.get(pk=flaky.pk).state == S.FAILED, 90,
               what="the flaky task to run out of attempts")
    wait_until(lambda: Task.objects.get(pk=held.pk).state == S.SUCCEEDED, 60,
               what="the held task to run once the slow one ended")
    page.goto(f"{live_server.url}/admin/workflows/task/{flaky.pk}/change/")
    failures = page.locator("#pilot-failures")
    rows = failures.locator("tr[data-failure-attempt]")
    assert [rows.nth(i).get_attribute("data-failure-attempt")
            for i in range(rows.count())] == ["5", "4", "3", "2", "1"]
    newest = failures.locator("details.pilot-traceback[open] pre").first
    assert "Traceback (most recent call last)" in newest.inner_text()
    assert "flaky failure on attempt 5" in newest.inner_text()
    page.locator("#pilot-failures").scroll_into_view_if_needed()
    shot(page, "task-failed-attempts", docs=True)
    assert page.failures == []


def test_failing_webhooks_fleet_wide_and_a_schedule_run_now_from_its_page(
        live_server, signed_in, operator_user, settings):
    """Two tasks whose receiver answers 500 (attempted in this process: the
    real sender, no worker needed): the dashboard names the endpoint, the
    deliveries list filters to them and its Re-send shows what it would send
    before anything is; the task page's attempts fit a phone. A schedule's
    Run now confirms, starts its run and the schedule's runs link finds it."""
    from tests.support.helpers import drain, purge_queue
    from tests.webhooks.receiver import Receiver
    from workflows.accounts import client_webhook_ensure, scheduler_owner_get
    from workflows.engine.schedule_definitions import schedule_save
    from workflows.models import WebhookDelivery

    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 300  # one failed attempt each, then it waits
    page = signed_in
    operator_user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="workflows",
        codename__in=["resend_webhook", "view_pilotschedule", "change_pilotschedule"]))
    client_webhook_ensure(operator_user)
    with Receiver(lambda mid, n: (500, 0)) as receiver:
        tasks = [task_trigger(owner=operator_user, key=f"hook-{i}-{uuid.uuid4().hex[:6]}",
                              workflow="demo.echo", payload={"order": i},
                              callback_url=receiver.url).task for i in range(2)]
        drain(lambda: WebhookDelivery.objects.filter(attempts__gte=1).count() == 2)
        purge_queue()
    endpoint = WebhookDelivery.objects.filter(task_id=tasks[0].pk).get().endpoint

    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/admin/workflows/task/dashboard/")
    card = page.locator("#pilot-webhooks-failing")
    assert card.get_attribute("data-retrying") == "2"
    card.locator(f'tr[data-endpoint="{endpoint}"] a').click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 2
    assert page_width(page)[0] <= 1280  # every column on a laptop
    shot(page, "webhook-deliveries", docs=True)
    page.check("#action-toggle")
    page.select_option("select[name=action]", "resend_selected")
    page.click("button[name=index]")
    page.wait_for_selector(".pilot-resend-plan")
    assert page.locator("#pilot-resend-count").inner_text() == "2"
    assert page.locator(f'#pilot-resend-endpoints tr[data-endpoint="{endpoint}"]').count() == 1
    shot(page, "webhook-resend-dry-run", docs=True)
    # The dry run sent nothing: each delivery still has its one failed attempt, no re-send owed.
    assert not WebhookDelivery.objects.filter(resend_owed=True).exists()

    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{live_server.url}/admin/workflows/task/{tasks[0].pk}/change/")
    page.wait_for_selector("#pilot-webhooks .pilot-attempts")
    assert page_width(page)[0] <= 390

    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/admin/workflows/task/trigger/")
    key = page.evaluate("(() => { const k = document.getElementById('id_idempotency_key');"
                        " return [k.scrollWidth, k.clientWidth]; })()")
    assert key[0] <= key[1], key  # the default UUID shows whole

    schedule, _ = schedule_save(name="nightly-report", workflow="demo.echo", cron="0 3 * * *",
                                payload={"report": "daily"}, owner=scheduler_owner_get(),
                                missed="skip", enabled=True)
    page.goto(f"{live_server.url}/admin/workflows/pilotschedule/{schedule.pk}/change/")
    slots = page.locator("#pilot-next-slots li")
    assert slots.count() == 5 and slots.first.inner_text().endswith("T03:00:00Z")
    shot(page, "schedule-page", docs=True)
    page.click("#pilot-run-now")
    page.fill("#id_reason", "the 03:00 run was lost")
    page.click("#pilot-confirm")
    page.wait_for_selector(".field-state_badge")
    run = Task.objects.get(idempotency_key__startswith="schedule:nightly-report:now-")
    assert str(run.pk) in page.url and run.owner.username == "scheduler"
    page.goto(f"{live_server.url}/admin/workflows/pilotschedule/{schedule.pk}/change/")
    page.click("#pilot-schedule-runs")
    page.wait_for_selector("#result_list")
    assert page.locator(f'#result_list a[href*="{run.pk}"]').count() >= 1
    assert page.failures == []


CONTRAST = """(selectors) => {
    // WCAG contrast of each visible link against the first opaque background behind it.
    const rgb = (text) => text.match(/[\\d.]+/g).map(Number);
    const lum = ([r, g, b]) => {
        const c = [r, g, b].map(v => {
            v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
        });
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    };
    const behind = (el) => {
        for (; el; el = el.parentElement) {
            const bg = getComputedStyle(el).backgroundColor;
            const parts = rgb(bg);
            if (parts.length === 3 || parts[3] > 0) return parts.slice(0, 3);
        }
        return [255, 255, 255];
    };
    return [...document.querySelectorAll(selectors)].filter(a => a.offsetParent).map(a => {
        const [fg, bg] = [lum(rgb(getComputedStyle(a).color)), lum(behind(a))];
        const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
        return {text: a.textContent.trim(), ratio: ratio};
    });
}"""
HEADER_LINKS = "#header a, .module h2 a, .module caption a"


def test_find_a_task_by_payload_retry_its_filter_with_no_surprises_and_read_every_header(
        live_server, signed_in, operator_user, django_user_model):
    """Issue 32, points 3-5 in one walk: the payload search finds the order's
    task; the filter-wide retry of a client's failures names the client,
    groups the errors and gives the fresh budget; the progress page offers no
    Start while its script runs the job; and every header link reads at
    4.5:1 or better on the dashboard and Workers & queue in both themes."""
    page = signed_in
    client = django_user_model.objects.create_user("partner-x")
    now = timezone.now()
    errors = ["RetryableError: merchant API said 502", "TimeoutError: ledger took 30 s"]
    Task.objects.bulk_create([
        Task(owner=client, idempotency_key=f"order-{i}", workflow="demo.echo",
             payload={"order_id": 4000 + i, "shop": {"id": f"shop-{i % 3}"}},
             fingerprint=fingerprint("demo.echo", {"order_id": 4000 + i}), state=S.FAILED,
             error=errors[i % 4 == 0], error_type="RetryableError", attempts=3,
             max_attempts=3, created_at=now, updated_at=now, finished_at=now)
        for i in range(260)])

    page.goto(f"{live_server.url}/admin/workflows/task/")
    page.fill("#searchbar", "payload.order_id=4242")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#pilot-view-link")
    keys = page.locator("td.field-key_short span").all_inner_texts()
    assert keys == ["order-242"], keys
    assert "q=payload.order_id%3D4242" in page.locator("#pilot-view-link").get_attribute("href")
    page.click("#pilot-range summary")  # the time range's boxes and presets, in the picture
    assert page.locator("#pilot-range-form").is_visible()
    shot(page, "list-payload-search", docs=True)

    page.goto(f"{live_server.url}/admin/workflows/task/?owner={client.pk}&state__exact=failed")
    page.click("a[data-filter-action='retry']")
    page.wait_for_selector("#pilot-bulk-outlook")
    assert page.locator('code[data-filter="owner"]').inner_text() == "owner=partner-x"
    rows = page.locator("#pilot-bulk-errors tbody tr").all_inner_texts()
    assert [r.split("\t") for r in rows] == [["195", errors[0]], ["65", errors[1]]], rows
    assert page.locator("#pilot-bulk-budgets [data-budget]").inner_text() == "3"
    assert "behind 0 due task(s)" in page.locator("#pilot-bulk-when").inner_text()
    shot(page, "bulk-retry-dryrun", docs=True)

    # While the script runs the chunks, Start is never on screen beside "working…".
    page.add_init_script("""document.addEventListener("DOMContentLoaded", () => {
        const state = document.getElementById("pilot-bulk-state");
        const button = document.getElementById("pilot-continue");
        if (!state || !button) return;
        const seen = () => sessionStorage.setItem("pilot-seen", JSON.stringify([
            ...JSON.parse(sessionStorage.getItem("pilot-seen") || "[]"),
            [state.textContent, button.offsetParent !== null, button.value]]));
        new MutationObserver(seen).observe(state, {childList: true, characterData: true,
                                                   subtree: true});
    });""")
    page.fill("#id_reason", "partner-x fixed its merchant API")
    page.click("#pilot-confirm")
    page.wait_for_url("**/bulk/retry/done/**", timeout=60_000)
    seen = page.evaluate("JSON.parse(sessionStorage.getItem('pilot-seen') || '[]')")
    working = [s for s in seen if s[0] == "working…"]
    assert working and not any(visible for _, visible, _ in working), seen
    assert "260</strong> of 260 task(s) changed" in page.content()
    assert Task.objects.filter(owner=client, state=S.PENDING).count() == 260

    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for path in ("dashboard/", "workers/"):
            page.goto(f"{live_server.url}/admin/workflows/task/{path}")
            links = page.evaluate(CONTRAST, HEADER_LINKS)
            assert any(link["text"] == "Workers & queue" for link in links) or path == "workers/"
            poor = [link for link in links if link["ratio"] < 4.5]
            assert not poor, (scheme, path, poor)
    page.emulate_media(color_scheme="light")
    page.goto(f"{live_server.url}/admin/workflows/task/dashboard/")
    shot(page, "dashboard-light-header")
    assert page.failures == []
