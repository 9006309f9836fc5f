"""The schema against real tasks on a live server. The generated pass
(test_schemathesis.py) rolls every example back, so its id routes only ever
answer 404; here real tasks run — gunicorn, workers, the dispatcher — and every
answer on the way is checked against the served OpenAPI schema: the trigger's
202, the task found by following its `Location`, in flight and finished
(succeeded, failed after compensating, retried, cancelled), a replay's 200, the
list and the workflows."""

import time

import httpx
import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from schemathesis.core.failures import FailureGroup
from schemathesis.openapi.checks import JsonSchemaError

from tests.support.procs import Fleet, wait_until
from workflows.accounts import api_client_create
from workflows.rules.states import FINISHED_STATES

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow,
              pytest.mark.django_db(transaction=True)]

with override_settings(PILOT_API_DOCS_PUBLIC=True):
    schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json",
                                            get_wsgi_application())

TRIGGER = schema["/api/v1/tasks"]["POST"]
LIST = schema["/api/v1/tasks"]["GET"]
DETAIL = schema["/api/v1/tasks/{task_id}"]["GET"]
CANCEL = schema["/api/v1/tasks/{task_id}/cancel"]["POST"]
RETRY = schema["/api/v1/tasks/{task_id}/retry"]["POST"]
WORKFLOWS = schema["/api/v1/workflows"]["GET"]


@pytest.fixture
def live():
    fleet = Fleet(PILOT_LEASE_SECONDS=3, PILOT_DISPATCHER_POLL_SECONDS=0.2)
    try:
        fleet.dispatcher()
        fleet.workers()
        _, url = fleet.web(workers=2)
        _, token = api_client_create("live-schema")
        with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"},
                          timeout=15) as client:
            yield client
    finally:
        fleet.stop_all()


def checked(operation, response, status: int):
    assert response.status_code == status, response.text
    operation.validate_response(response)  # raises, naming every mismatch
    return response.json()


def test_real_tasks_answer_as_the_schema_says_all_the_way(live):
    triggers = {
        "echo": ("demo.echo", {"msg": "hi"}),
        "orders": ("demo.sync_orders", {"batch": "live-schema", "count": 3}),
        "flaky": ("demo.flaky", {"fail_times": 1}),
        "saga-ok": ("demo.saga", {"fail": False}),
        "saga-fails": ("demo.saga", {"fail": True}),
        "slow": ("demo.slow", {"steps": 3, "seconds": 5}),
    }
    locations = {}
    for key, (workflow, payload) in triggers.items():
        r = live.post("/api/v1/tasks", headers={"Idempotency-Key": key},
                      json={"workflow": workflow, "payload": payload})
        body = checked(TRIGGER, r, 202)
        locations[key] = r.headers["Location"]
        assert locations[key].endswith(body["id"])
    # A replay answers 200 with the same task.
    workflow, payload = triggers["echo"]
    replay = live.post("/api/v1/tasks", headers={"Idempotency-Key": "echo"},
                       json={"workflow": workflow, "payload": payload})
    assert checked(TRIGGER, replay, 200)["id"] == locations["echo"].rsplit("/", 1)[1]
    # In flight, followed by its Location, then cancelled.
    wait_until(lambda: checked(DETAIL, live.get(locations["slow"]), 200)["state"] == "running",
               30, interval=0.1, what="the slow task to run")
    slow_id = locations["slow"].rsplit("/", 1)[1]
    assert checked(CANCEL, live.post(f"/api/v1/tasks/{slow_id}/cancel"), 200)["state"] == \
        "cancelling"

    def finished(key):
        return checked(DETAIL, live.get(locations[key]), 200)["state"] in FINISHED_STATES

    wait_until(lambda: all(finished(k) for k in triggers), 90, interval=0.3,
               what="every live task to finish")
    final = {k: checked(DETAIL, live.get(locations[k]), 200) for k in triggers}
    # The check bites: a task is not a page of tasks.
    with pytest.raises((FailureGroup, JsonSchemaError)):
        LIST.validate_response(live.get(locations["echo"]))
    assert {k: t["state"] for k, t in final.items()} == {
        "echo": "succeeded", "orders": "succeeded", "flaky": "succeeded",
        "saga-ok": "succeeded", "saga-fails": "failed", "slow": "cancelled"}
    # A retry of the failed saga, then its new run, still as the schema says.
    saga_id = locations["saga-fails"].rsplit("/", 1)[1]
    checked(RETRY, live.post(f"/api/v1/tasks/{saga_id}/retry"), 202)
    time.sleep(0.2)
    checked(DETAIL, live.get(locations["saga-fails"]), 200)
    wait_until(lambda: finished("saga-fails"), 60, interval=0.3, what="the retried saga")
    listed = checked(LIST, live.get("/api/v1/tasks"), 200)
    assert len(listed["results"]) == len(triggers)
    checked(WORKFLOWS, live.get("/api/v1/workflows"), 200)
