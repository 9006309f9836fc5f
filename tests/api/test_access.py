"""Authentication, permissions and scoping on every route: a client sees only
its own tasks, and another client's task is a 404 everywhere."""

import uuid

import pytest
from django.contrib.auth.models import Permission

from tests.api.conftest import assert_problem, trigger
from tests.factories import make_task
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def routes(task_id):
    return [
        ("get", "/api/v1/tasks", None),
        ("post", "/api/v1/tasks", {"workflow": "demo.echo", "payload": {}}),
        ("post", "/api/v1/tasks/batch", {"tasks": [{"idempotency_key": "x",
                                                    "workflow": "demo.echo"}]}),
        ("get", f"/api/v1/tasks/{task_id}", None),
        ("post", f"/api/v1/tasks/{task_id}/cancel", {}),
        ("post", f"/api/v1/tasks/{task_id}/retry", {}),
        ("get", "/api/v1/workflows", None),
    ]


def call(client, method, path, body):
    if method == "get":
        return client.get(path)
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="k-x")


def test_every_route_needs_authentication(anon, api):
    task = make_task(api.user)
    for method, path, body in routes(task.pk):
        r = call(anon, method, path, body)
        assert_problem(r, 401, "not_authenticated")
        assert r["WWW-Authenticate"] == "Token"


def test_a_bad_token_is_401(anon):
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert_problem(anon.get("/api/v1/tasks"), 401, "not_authenticated")


def test_basic_auth_is_not_accepted(anon, django_user_model):
    django_user_model.objects.create_user("basic", password="secret-pass-123")
    anon.credentials(HTTP_AUTHORIZATION="Basic YmFzaWM6c2VjcmV0LXBhc3MtMTIz")
    assert_problem(anon.get("/api/v1/tasks"), 401, "not_authenticated")


def test_triggering_needs_the_add_task_permission(api):
    api.user.user_permissions.clear()
    assert_problem(trigger(api), 403, "permission_denied")
    r = api.post("/api/v1/tasks/batch", {"tasks": [{"workflow": "demo.echo"}]}, format="json")
    assert_problem(r, 403, "permission_denied")
    assert Task.objects.count() == 0
    assert api.get("/api/v1/tasks").status_code == 200  # reading needs no permission


def test_another_clients_task_is_404_on_every_route_and_never_listed(api, api_b):
    theirs = make_task(api_b.user, key="k-x", state=S.FAILED)
    mine = make_task(api.user, key="mine")
    for method, path, body in routes(theirs.pk)[3:6]:
        assert_problem(call(api, method, path, body), 404, "not_found")
    listing = api.get("/api/v1/tasks").json()
    assert [t["id"] for t in listing["results"]] == [str(mine.pk)]
    assert api.get("/api/v1/tasks", {"idempotency_key": "k-x"}).json()["results"] == []
    # The same key is theirs, not ours: triggering it creates our own task.
    r = trigger(api, key="k-x", payload={})
    assert r.status_code == 202 and r.json()["id"] != str(theirs.pk)
    theirs.refresh_from_db()
    assert theirs.state == S.FAILED and theirs.replays == 0


def test_unknown_and_malformed_task_ids_are_404(api):
    for path in (f"/api/v1/tasks/{uuid.uuid4()}", "/api/v1/tasks/not-a-uuid",
                 "/api/v1/nothing/here", "/api/v1/tasks/"):
        assert_problem(api.get(path), 404, "not_found")
    for path in (f"/api/v1/tasks/{uuid.uuid4()}/cancel", "/api/v1/tasks/not-a-uuid/retry"):
        assert_problem(api.post(path, {}, format="json"), 404, "not_found")


def test_view_all_tasks_lets_an_operator_read_everything_but_not_act(api, api_b):
    theirs = make_task(api_b.user)
    api.user.user_permissions.add(Permission.objects.get(codename="view_all_tasks"))
    assert api.get(f"/api/v1/tasks/{theirs.pk}").status_code == 200
    assert len(api.get("/api/v1/tasks").json()["results"]) == 1
    assert_problem(api.post(f"/api/v1/tasks/{theirs.pk}/cancel", {}, format="json"), 403,
                   "permission_denied")
    api.user.user_permissions.add(Permission.objects.get(codename="cancel_task"))
    r = api.post(f"/api/v1/tasks/{theirs.pk}/cancel", {}, format="json")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_task_ids_are_random_uuids(api):
    ids = [trigger(api, key=f"k{i}").json()["id"] for i in range(3)]
    assert all(uuid.UUID(i).version == 4 for i in ids)
