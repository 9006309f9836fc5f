"""POST /api/v1/tasks/batch: per-item outcomes in input order, few queries."""

import math

import pytest
from django.conf import settings
from django.db import connection

from tests.api.conftest import assert_problem
from tests.factories import make_task
from tests.support.helpers import queued_task_ids
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_mixed_batch_answers_item_by_item_in_order(api):
    make_task(api.user, key="done", state=S.SUCCEEDED, payload={"n": 1})
    make_task(api.user, key="gone", state=S.CANCELLED, payload={"n": 1})
    items = [
        {"idempotency_key": "new", "workflow": "demo.echo", "payload": {"n": 1}},
        {"idempotency_key": "done", "workflow": "demo.echo", "payload": {"n": 1}},
        {"idempotency_key": "gone", "workflow": "demo.echo", "payload": {"n": 1}},
        {"idempotency_key": "new", "workflow": "demo.echo", "payload": {"n": 1}},
        {"idempotency_key": "new", "workflow": "demo.echo", "payload": {"n": 2}},
        {"idempotency_key": "bad key", "workflow": "demo.echo"},
        {"workflow": "demo.echo"},
        {"idempotency_key": "x", "workflow": "nope.nothing"},
        {"idempotency_key": "y", "workflow": "demo.sync_orders", "payload": {"count": 0}},
        {"idempotency_key": "z", "workflow": "demo.echo", "state": "succeeded"},
        "not an object",
    ]
    r = api.post("/api/v1/tasks/batch", {"tasks": items}, format="json")
    assert r.status_code == 200
    results = r.json()["results"]
    assert [(x["status"], x.get("code")) for x in results] == [
        (202, None), (200, None), (409, "task_cancelled"), (200, None),
        (422, "idempotency_key_reused"), (400, "idempotency_key_invalid"),
        (400, "idempotency_key_missing"), (400, "unknown_workflow"),
        (400, "validation_error"), (400, "validation_error"), (400, "validation_error"),
    ]
    assert results[0]["task"]["id"] == results[3]["task"]["id"]
    assert results[1]["task"]["result"] == {"ok": True} and results[1]["replayed"] is True
    assert "state" in results[9]["errors"]
    assert "a batch item: its idempotency_key" in results[6]["detail"]  # names the item's field
    assert set(results[8]["errors"]["payload"]) == {"batch", "count"}
    assert queued_task_ids() == [results[0]["task"]["id"]]


@pytest.mark.parametrize("body", [
    [], {"tasks": []}, {"tasks": "x"}, {"nope": []}, {"tasks": [{}] * 1001},
    {"tasks": [{"workflow": "demo.echo"}], "extra": 1},
])
def test_a_malformed_batch_is_refused_whole(api, body):
    assert_problem(api.post("/api/v1/tasks/batch", body, format="json"), 400,
                   "validation_error")
    assert Task.objects.count() == 0


def test_a_thousand_items_with_duplicates_and_invalid_items_take_few_queries(
        api, django_assert_max_num_queries):
    for i in range(100):
        make_task(api.user, key=f"k{i}", state=S.SUCCEEDED, payload={"i": i})
    items = [{"idempotency_key": f"k{i}", "workflow": "demo.echo", "payload": {"i": i}}
             for i in range(850)]
    items += [{"idempotency_key": f"k{i}", "workflow": "demo.echo", "payload": {"i": i}}
              for i in range(100, 200)]                                  # in-batch repeats
    items += [{"idempotency_key": f"k{i}", "workflow": "demo.echo", "payload": {"i": -1}}
              for i in range(25)]                                        # reused keys
    items += [{"idempotency_key": f"bad {i}", "workflow": "demo.echo"} for i in range(25)]
    limit = connection.features.max_query_params
    chunks = 0 if limit is None else (
        math.ceil(850 / (limit // len(Task._meta.concrete_fields))) + math.ceil(750 / (limit // 3))
        + math.ceil(200 / (limit // 5)))
    # The throttle counts in the cache: a few statements more when that cache
    # is the database (no REDIS_URL), none when it is Redis.
    throttle = 6 if "DatabaseCache" in settings.CACHES["default"]["BACKEND"] else 0
    with django_assert_max_num_queries(14 + chunks + throttle):
        r = api.post("/api/v1/tasks/batch", {"tasks": items}, format="json")
    results = r.json()["results"]
    assert len(results) == 1000
    statuses = [x["status"] for x in results]
    assert statuses[:100] == [200] * 100 and statuses[100:850] == [202] * 750
    assert statuses[850:950] == [200] * 100
    assert statuses[950:975] == [422] * 25 and statuses[975:] == [400] * 25
    assert [x["task"]["idempotency_key"] for x in results[:850]] == [f"k{i}" for i in range(850)]
    assert Task.objects.count() == 850
    assert len(queued_task_ids()) == 750
