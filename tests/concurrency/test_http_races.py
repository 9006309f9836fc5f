"""100 concurrent HTTP triggers with one key, through the whole middleware and
DRF stack, each request on its own database connection."""

import sys

import pytest
from rest_framework.test import APIClient

from tests.support.helpers import queued_task_ids, run_at_once
from tests.support.procs import _answers, free_port
from workflows.accounts import api_client_create
from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_hundred_identical_http_triggers_make_one_202_and_99_replays(enough_connections):
    _, token = api_client_create("racer")
    for round_no in range(5):  # 3 more over real sockets below
        key = f"http-storm-{round_no}"

        def post(i, key=key):
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
            return client.post("/api/v1/tasks", {"workflow": "demo.echo", "payload": {"r": 1}},
                               format="json", HTTP_IDEMPOTENCY_KEY=key)

        responses = run_at_once(100, post)
        assert [r for r in responses if isinstance(r, BaseException)] == []
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] * 99 + [202]
        assert len({r.json()["id"] for r in responses}) == 1
        assert sorted(r["Idempotent-Replayed"] for r in responses) == ["false"] + ["true"] * 99
        task = Task.objects.get(idempotency_key=key)
        assert task.replays == 99
        assert queued_task_ids().count(str(task.pk)) == 1


@pytest.mark.slow
@pytest.mark.redis
def test_a_hundred_identical_triggers_over_real_sockets_make_one_202_and_99_replays(
        enough_connections):
    """The same race through gunicorn (threaded workers: ~100 requests in the
    server at once), real TCP, and the real Redis queue."""
    from tests.faults.client import request
    from tests.support.procs import Fleet, wait_until


    _, token = api_client_create("socket-racer")
    fleet = Fleet()
    try:
        port = free_port()
        web = fleet.start_process("gunicorn", [
            sys.executable, "-m", "gunicorn", "pilot.wsgi", "-w", "3", "--threads", "34",
            "-b", f"127.0.0.1:{port}", "--access-logfile", "-"])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{url}/healthz"), 30, what="gunicorn to start")
        body = {"workflow": "demo.echo", "payload": {"r": 1}}
        for round_no in range(3):
            key = f"socket-storm-{round_no}"
            responses = run_at_once(100, lambda i, key=key: request(
                url, "POST", "/api/v1/tasks", token=token, body=body, timeout=60,
                headers={"Idempotency-Key": key}))
            assert [r for r in responses if isinstance(r, BaseException)] == []
            assert sorted(r.status for r in responses) == [200] * 99 + [202]
            assert len({r.json()["id"] for r in responses}) == 1
            replayed = sorted({k.lower(): v for k, v in r.headers.items()}
                              ["idempotent-replayed"] for r in responses)
            assert replayed == ["false"] + ["true"] * 99
            task = Task.objects.get(idempotency_key=key)
            assert task.replays == 99
            assert queued_task_ids().count(str(task.pk)) == 1
        # gunicorn writes an access line after its response went out: the last one
        # may reach the log a moment after its client read the answer.
        served = lambda: web.log().count('"POST /api/v1/tasks HTTP/1.1" 20')  # noqa: E731
        wait_until(lambda: served() >= 300, 10, what="gunicorn to log every POST")
        assert served() == 300
    finally:
        fleet.stop_all()
