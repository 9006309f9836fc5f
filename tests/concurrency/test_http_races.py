"""100 concurrent HTTP triggers with one key, through the whole middleware and
DRF stack, each request on its own database connection."""

import pytest
from rest_framework.test import APIClient

from tests.helpers import queued_task_ids, run_at_once
from workflows.accounts import api_client_create
from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_hundred_identical_http_triggers_make_one_202_and_99_replays(enough_connections):
    _, token = api_client_create("racer")
    for round_no in range(10):
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
