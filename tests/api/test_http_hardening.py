"""Rate limits, their failure mode and the probes' Host header, over real HTTP:
gunicorn with several worker processes, which must count one limit together
(the shared cache) and answer probes that address the node by IP."""

import contextlib
import importlib
import uuid

import pytest
import requests
from django.db import connection

from tests.support.procs import Fleet
from workflows.accounts import api_client_create

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextlib.contextmanager
def web(**env):
    """gunicorn (2 workers sharing one cache key space) with `env`; yields its URL."""
    fleet = Fleet(PILOT_TEST_CACHE_PREFIX=f"http-{uuid.uuid4().hex[:8]}", **env)
    try:
        _, url = fleet.web(workers=2)
        yield url
    finally:
        fleet.stop_all()


def client_session(name: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {api_client_create(name)[1]}"
    return session


def post_trigger(session, url, key):
    return session.post(f"{url}/api/v1/tasks", json={"workflow": "demo.echo", "payload": {}},
                        headers={"Idempotency-Key": key}, timeout=10)


def assert_problem(response, status, code):
    assert response.status_code == status, response.text[:500]
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == code
    return response.json()


def test_retry_and_cancel_are_throttled_across_server_processes():
    upstream = client_session("upstream")
    with web(PILOT_ACTION_RATE="4/min", PILOT_TRIGGER_RATE="3/min") as url:
        ids = [post_trigger(upstream, url, f"k{i}").json()["id"] for i in range(3)]
        assert_problem(post_trigger(upstream, url, "k3"), 429, "throttled")
        answers = [upstream.post(f"{url}/api/v1/tasks/{ids[0]}/{action}", timeout=10)
                   for action in ("cancel", "retry", "cancel", "retry", "cancel", "retry")]
        assert [a.status_code for a in answers[:4]] == [200, 202, 200, 202]
        for refused in answers[4:]:
            body = assert_problem(refused, 429, "throttled")
            assert "PILOT_ACTION_RATE" in body["detail"]
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
        # The other tasks cannot be cancelled either until the window ends.
        assert_problem(upstream.post(f"{url}/api/v1/tasks/{ids[1]}/cancel", timeout=10),
                       429, "throttled")
        assert upstream.get(f"{url}/api/v1/tasks/{ids[1]}", timeout=10).json()["state"] \
            == "pending"


def drop_cache_table():
    with connection.schema_editor() as editor:
        editor.execute(editor.sql_delete_table % {"table": editor.quote_name("pilot_cache")})


def create_cache_table():
    with connection.schema_editor() as editor:
        importlib.import_module("workflows.migrations.0008_cache_table_whatever_the_broker") \
            .create_cache_table(None, editor)


def test_a_missing_cache_table_refuses_triggers_instead_of_letting_them_all_through():
    """The issue's case: `migrate` ran with REDIS_URL, the app runs without it.
    Before, 60 of 60 triggers passed a 20/min limit."""
    upstream = client_session("upstream")
    drop_cache_table()
    try:
        with web(REDIS_URL="", PILOT_TRIGGER_RATE="20/min") as url:
            statuses = [post_trigger(upstream, url, f"k{i}").status_code for i in range(25)]
            assert statuses == [503] * 25
            ready = requests.get(f"{url}/readyz", timeout=10)
            assert_problem(ready, 503, "unavailable")
            assert ready.json()["degraded"] == {"cache": "misconfigured"}
            create_cache_table()  # what `migrate` does now, whatever the broker
            statuses = [post_trigger(upstream, url, f"k{i}").status_code for i in range(21)]
            assert statuses == [202] * 20 + [429]
            assert requests.get(f"{url}/readyz", timeout=10).json()["status"] == "ok"
    finally:
        if "pilot_cache" not in connection.introspection.table_names():
            create_cache_table()


def test_probes_by_ip_are_answered_and_every_other_path_still_checks_the_host():
    by_ip = {"Host": "10.0.0.5:8000"}
    with web() as url:
        for path in ("/healthz", "/readyz", "/metrics"):
            answer = requests.get(f"{url}{path}", headers=by_ip, timeout=10)
            assert answer.status_code == 200, (path, answer.text[:300])
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
        for path in ("/api/v1/tasks", "/admin/login/", "/api/v1/schema", "/healthz/",
                     "/metricsx"):
            answer = requests.get(f"{url}{path}", headers=by_ip, timeout=10)
            assert answer.status_code == 400, (path, answer.status_code)
        assert requests.get(f"{url}/api/v1/tasks", timeout=10).status_code == 401
