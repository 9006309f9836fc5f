"""Completion webhooks and trace context through the API: `callback_url` on
triggers and batch items (checked, refused as 400 validation_error), a
client's default endpoint, `callback_url` and `deliveries` in the task
representation and the schema, `traceparent` stored with the task."""

import pytest
import yaml

from tests.api.conftest import assert_problem
from tests.support.helpers import drain
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.models import Task, WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


_UNSET = object()


def trigger(client, key="k-1", callback_url=_UNSET, **headers):
    body = {"workflow": "demo.echo", "payload": {"msg": "hi"}}
    if callback_url is not _UNSET:
        body["callback_url"] = callback_url
    return client.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY=key,
                       **headers)


@pytest.fixture(autouse=True)
def _loopback(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture
def signed(api):
    """`api`'s client with a signing secret."""
    client_webhook_ensure(api.user)
    return api


def test_a_trigger_with_a_callback_url_is_delivered_and_lists_its_delivery(signed):
    with Receiver() as receiver:
        r = trigger(signed, callback_url=receiver.url)
        assert r.status_code == 202, r.content
        body = r.json()
        assert (body["callback_url"], body["deliveries"]) == (receiver.url, [])
        task_id = body["id"]
        drain(lambda: WebhookDelivery.objects.filter(state="delivered").exists())
    read = signed.get(f"/api/v1/tasks/{task_id}").json()
    [delivery] = read["deliveries"]
    assert delivery["id"] == f"{task_id}:succeeded:0"
    assert (delivery["state"], delivery["attempts"], delivery["last_status"],
            delivery["last_error"], delivery["next_attempt_at"]) == (
        "delivered", 1, 204, "", None)
    assert delivery["delivered_at"] and delivery["created_at"]
    [attempt] = delivery["attempt_log"]
    assert (attempt["attempt"], attempt["status"], attempt["error"]) == (1, 204, "")
    assert attempt["at"].endswith("Z") and attempt["duration_ms"] >= 0
    listed = signed.get("/api/v1/tasks").json()["results"]
    assert listed[0]["deliveries"] == read["deliveries"]
    replay = trigger(signed, callback_url=receiver.url)
    assert replay.status_code == 200 and replay.json()["deliveries"] == read["deliveries"]


@pytest.mark.parametrize("url, message", [
    ("ftp://files.example.com/in", "http:// or https://"),
    ("https://user:pw@hooks.example.com/", "credentials"),
    ("not a url", "visible ASCII"),
    ("https:///nohost", "Must name a host"),
])
def test_a_bad_callback_url_is_a_400_and_creates_nothing(signed, url, message):
    body = assert_problem(trigger(signed, callback_url=url), 400, "validation_error")
    assert message in body["errors"]["callback_url"][0]
    assert not Task.objects.exists()


@pytest.mark.parametrize("value", [42, None, ["https://x.example.com"], "h" * 2001])
def test_a_callback_url_that_is_not_a_short_string_is_a_400(signed, value):
    body = assert_problem(trigger(signed, callback_url=value), 400, "validation_error")
    assert "callback_url" in body["errors"]
    assert not Task.objects.exists()


def test_a_private_target_is_refused_unless_allowed(signed, settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    for url in ("http://127.0.0.1:8080/h", "http://localhost/h", "http://10.0.0.5/h",
                "http://169.254.169.254/latest/meta-data/"):
        body = assert_problem(trigger(signed, key=url, callback_url=url), 400,
                              "validation_error")
        assert "not a public address" in body["errors"]["callback_url"][0]
    assert not Task.objects.exists()


def test_a_client_without_a_signing_secret_cannot_ask_for_webhooks(api):
    body = assert_problem(trigger(api, callback_url="http://127.0.0.1:9/h"), 400,
                          "validation_error")
    assert "no webhook signing secret" in body["detail"]
    assert not Task.objects.exists()
    assert trigger(api).status_code == 202  # without a callback_url it is fine


def test_the_default_endpoint_applies_to_triggers_without_a_callback_url(api):
    client_webhook_ensure(api.user, url="http://127.0.0.1:9/default")
    plain = trigger(api, key="a").json()
    assert plain["callback_url"] == "http://127.0.0.1:9/default"
    own = trigger(api, key="b", callback_url="http://127.0.0.1:9/own").json()
    assert own["callback_url"] == "http://127.0.0.1:9/own"
    batch = api.post("/api/v1/tasks/batch", {"tasks": [
        {"idempotency_key": "c", "workflow": "demo.echo", "payload": {}},
        {"idempotency_key": "d", "workflow": "demo.echo", "payload": {},
         "callback_url": "http://127.0.0.1:9/item"},
        {"idempotency_key": "e", "workflow": "demo.echo", "payload": {},
         "callback_url": "gopher://x.example.com/"},
    ]}, format="json").json()["results"]
    assert [r["status"] for r in batch] == [202, 202, 400]
    assert batch[0]["task"]["callback_url"] == "http://127.0.0.1:9/default"
    assert batch[1]["task"]["callback_url"] == "http://127.0.0.1:9/item"
    assert batch[2]["code"] == "validation_error"
    assert dict(Task.objects.values_list("idempotency_key", "callback_url")) == {
        "a": "http://127.0.0.1:9/default", "b": "http://127.0.0.1:9/own",
        "c": "http://127.0.0.1:9/default", "d": "http://127.0.0.1:9/item"}
    client_webhook_ensure(api.user, url="")
    assert trigger(api, key="f").json()["callback_url"] is None


def test_a_replay_keeps_the_endpoint_the_task_was_created_with(signed):
    first = trigger(signed, callback_url="http://127.0.0.1:9/first").json()
    again = trigger(signed, callback_url="http://127.0.0.1:9/second")
    assert again.status_code == 200
    assert again.json()["callback_url"] == first["callback_url"] == "http://127.0.0.1:9/first"


def test_a_traceparent_is_stored_with_the_task(api):
    r = trigger(api, key="traced", HTTP_TRACEPARENT=TRACEPARENT.upper())
    task = Task.objects.get(idempotency_key="traced")
    assert (task.trace_id, task.traceparent) == (TRACE, TRACEPARENT)
    assert r.json()["trace_id"] == TRACE
    r = trigger(api, key="untraced", HTTP_TRACEPARENT="00-garbage")
    task = Task.objects.get(idempotency_key="untraced")
    assert task.trace_id == r["X-Request-ID"] and len(task.trace_id) == 32
    # Ours: the request's trace id, a span id of PILOT's, not sampled.
    version, trace_id, span_id, flags = task.traceparent.split("-")
    assert (version, trace_id, len(span_id), flags) == ("00", task.trace_id, 16, "00")


def test_the_schema_documents_callback_url_deliveries_and_traceparent(api):
    schema = yaml.safe_load(api.get("/api/v1/schema").content)
    components = schema["components"]["schemas"]
    task = components["Task"]["properties"]
    assert task["callback_url"]["format"] == "uri" and task["callback_url"]["nullable"]
    assert task["deliveries"]["items"]["$ref"] == "#/components/schemas/Delivery"
    delivery = components["Delivery"]
    assert set(delivery["properties"]) == {"id", "state", "attempts", "last_status",
                                           "last_error", "next_attempt_at", "delivered_at",
                                           "created_at", "attempt_log"}
    assert set(components["Attempt"]["properties"]) == {"attempt", "at", "status", "error",
                                                        "duration_ms"}
    assert "webhook-id" in delivery["properties"]["id"]["description"]
    trigger_shapes = [name for name in components
                      if name.startswith("TriggerDemo") and name.endswith("Request")]
    assert trigger_shapes and all("callback_url" in components[name]["properties"]
                                  for name in trigger_shapes)
    post = schema["paths"]["/api/v1/tasks"]["post"]
    assert "traceparent" in [p["name"] for p in post["parameters"]]
    assert "webhook-signature" in post["description"]
    batch = components["BatchRequestDocRequest"]["properties"]["tasks"]
    assert "callback_url" in batch["description"]
