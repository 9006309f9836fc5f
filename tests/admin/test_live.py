"""The live-updates endpoint (workflows/admin/live.py): the parts of a page
that change, rendered again with the page's own templates and permissions."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.test import Client

from tests.admin.conftest import LIST_URL, _staff
from tests.factories import make_task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

URL = "/admin/workflows/task/live/"


def live(client, **params):
    response = client.get(URL, params)
    return response.status_code, response.json()


def test_the_task_view_renders_the_live_part_and_reports_the_state(operator_client, owner):
    task = make_task(owner, state=S.RUNNING)
    status, data = live(operator_client, view="task", id=str(task.pk))
    assert status == 200 and data["state"] == "running" and data["finished"] is False
    html = data["fragments"]["pilot-task-live"]
    assert html.lstrip().startswith('<div id="pilot-task-live"')
    assert 'id="pilot-now"' in html and 'id="steps-group"' in html
    # The same markup the page itself has.
    page = operator_client.get(f"{LIST_URL}{task.pk}/change/").content.decode()
    assert re.sub(r"\d+ ms|\d+\.\d s", "T", html).strip()[:400] in re.sub(
        r"\d+ ms|\d+\.\d s", "T", page)
    assert "now" in data and data["now"].endswith("+00:00")


def test_a_task_the_user_may_not_see_is_not_found(django_user_model, owner):
    client = Client()
    client.force_login(_staff(django_user_model, "own-only", perms=("view_task",)))
    task = make_task(owner)
    assert live(client, view="task", id=str(task.pk))[0] == 404
    assert live(client, view="task", id="not-a-uuid")[0] == 404


def test_the_list_view_renders_the_rows_of_the_lists_query(operator_client, owner):
    make_task(owner, state=S.RUNNING, key="is-running")
    make_task(owner, state=S.SUCCEEDED, key="is-done")
    status, data = live(operator_client, view="list",
                        params=urlencode({"state__exact": "running"}))
    assert status == 200 and data["count"] == 1
    rows = data["fragments"]["pilot-results"]
    assert "is-running" in rows and "is-done" not in rows and 'id="result_list"' in rows
    status, data = live(operator_client, view="list", params="state__exact=%00")
    assert status == 400 and "NUL" in data["error"]


def test_the_dashboard_and_workers_views_need_view_all_tasks(operator_client, django_user_model):
    for view in ("dashboard", "workers"):
        status, data = live(operator_client, view=view)
        assert status == 200 and data["fragments"]
    client = Client()
    client.force_login(_staff(django_user_model, "own-only", perms=("view_task",)))
    for view in ("dashboard", "workers"):
        status, data = live(client, view=view)
        assert status == 403 and "workflows.view_all_tasks" in data["error"]


def test_an_unknown_view_or_no_view_permission_is_refused(operator_client, django_user_model):
    assert live(operator_client, view="nope")[0] == 400
    client = Client()
    client.force_login(_staff(django_user_model, "no-perms"))
    assert live(client, view="task", id="x") == (
        403, {"error": "Live updates need the permission workflows.view_task"})
    assert Client().get(URL, {"view": "task"}).status_code == 302  # to the login page


def test_every_live_page_names_its_endpoint(operator_client, owner):
    task = make_task(owner, state=S.RUNNING)
    for url, view in ((f"{LIST_URL}{task.pk}/change/", "view=task"),
                      (f"{LIST_URL}?state__exact=running", "view=list"),
                      ("/admin/workflows/task/dashboard/", "view=dashboard"),
                      ("/admin/workflows/task/workers/", "view=workers")):
        html = operator_client.get(url).content.decode()
        endpoint = re.search(r'data-live-url="([^"]+)"', html).group(1)
        assert endpoint.startswith(URL) and view in endpoint
        assert 'src="/static/pilot/console.js"' in html
    # Live by default where things move: a running filter on, the whole list off.
    assert 'data-live-default="on"' in operator_client.get(
        f"{LIST_URL}?state__exact=running").content.decode()
    assert 'data-live-default="off"' in operator_client.get(LIST_URL).content.decode()
