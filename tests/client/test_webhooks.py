"""verify_webhook / sign_webhook (pilot_client/webhooks.py) against the
Standard Webhooks reference implementation (the `standardwebhooks` package),
both ways: what it signs we verify, what we sign it verifies."""

from __future__ import annotations

import base64
import json
import os
import time
from datetime import UTC, datetime

import pytest
from pilot_client import WebhookVerificationError, sign_webhook, verify_webhook
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError as ReferenceError_

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
BODY = json.dumps({"id": "3f0c", "state": "succeeded", "result": {"echo": {"n": 1}}}).encode()
MSG_ID = "3f0c:succeeded:0"


def reference_headers(body: bytes = BODY, *, secret: str = SECRET, msg_id: str = MSG_ID,
                      at: int | None = None) -> dict:
    at = int(time.time()) if at is None else at
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(at, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(at), "webhook-signature": signature}


def test_a_delivery_signed_by_the_reference_implementation_verifies():
    assert verify_webhook(SECRET, reference_headers(), BODY) == json.loads(BODY)


def test_our_signature_is_byte_for_byte_the_reference_one_and_it_verifies_ours():
    at = int(time.time())
    ours = sign_webhook(SECRET, MSG_ID, at, BODY)
    assert ours == reference_headers(at=at)["webhook-signature"]
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(at), "webhook-signature": ours}
    assert Webhook(SECRET).verify(BODY, headers) == json.loads(BODY)


def test_header_names_are_matched_in_any_case_and_the_body_may_be_text():
    headers = {k.title(): v for k, v in reference_headers().items()}
    assert verify_webhook(SECRET, headers, BODY.decode())["state"] == "succeeded"


def test_one_valid_signature_among_several_is_enough_while_a_secret_rotates():
    old = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    headers = reference_headers()
    headers["webhook-signature"] = (reference_headers(secret=old)["webhook-signature"] + " v2,xyz "
                                    + headers["webhook-signature"])
    assert verify_webhook(SECRET, headers, BODY)["id"] == "3f0c"


@pytest.mark.parametrize("tamper", ["body", "id", "timestamp", "secret", "signature"])
def test_anything_altered_is_rejected_by_both_implementations(tamper):
    headers, body, secret = reference_headers(), BODY, SECRET
    if tamper == "body":
        body = BODY.replace(b"succeeded", b"cancelled")
    elif tamper == "id":
        headers["webhook-id"] = "3f0c:succeeded:1"
    elif tamper == "timestamp":
        headers["webhook-timestamp"] = str(int(headers["webhook-timestamp"]) - 1)
    elif tamper == "secret":
        secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    else:
        headers["webhook-signature"] = "v1," + base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(WebhookVerificationError, match="no matching v1 signature"):
        verify_webhook(secret, headers, body)
    with pytest.raises(ReferenceError_):
        Webhook(secret).verify(body, headers)


def test_an_old_or_future_timestamp_is_rejected_even_when_signed():
    now = int(time.time())
    for at, message in ((now - 301, "too old"), (now + 301, "in the future")):
        with pytest.raises(WebhookVerificationError, match=message):
            verify_webhook(SECRET, reference_headers(at=at), BODY)
    assert verify_webhook(SECRET, reference_headers(at=now - 3600), BODY, tolerance=7200)
    assert verify_webhook(SECRET, reference_headers(at=now - 3600), BODY, now=now - 3600)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_rejected(missing):
    headers = reference_headers()
    del headers[missing]
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify_webhook(SECRET, headers, BODY)


def test_garbage_headers_are_rejected_not_crashed_on():
    headers = reference_headers()
    with pytest.raises(WebhookVerificationError, match="not an integer"):
        verify_webhook(SECRET, headers | {"webhook-timestamp": "soon"}, BODY)
    with pytest.raises(WebhookVerificationError, match="no matching"):
        verify_webhook(SECRET, headers | {"webhook-signature": "v1,%%% v1 garbage"}, BODY)


def test_parsed_json_is_refused_as_a_body():
    with pytest.raises(TypeError, match="raw request body"):
        verify_webhook(SECRET, reference_headers(), json.loads(BODY))


def test_a_secret_without_its_prefix_or_padding_works_and_an_empty_one_is_refused():
    raw = SECRET.removeprefix("whsec_")
    assert verify_webhook(raw.rstrip("="), reference_headers(), BODY)["id"] == "3f0c"
    with pytest.raises(ValueError, match="empty"):
        verify_webhook("whsec_", reference_headers(), BODY)


# --- against PILOT's own deliveries (docs/webhooks.md) -------------------------------------------

@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_live_pilot_delivers_what_the_client_triggered_and_the_client_verifies_it(
        pilot, api_client):
    from tests.support.procs import wait_until
    from tests.webhooks.receiver import Receiver
    from workflows.accounts import client_webhook_ensure

    _, secret = client_webhook_ensure(api_client[0])
    with Receiver(lambda mid, n: (503, 0) if n == 1 else (204, 0)) as receiver:
        run = pilot.trigger("demo.echo", {"n": 7}, callback_url=receiver.url)
        [item] = pilot.batch([{"workflow": "demo.echo", "payload": {"n": 8},
                               "callback_url": receiver.url}])
        assert run.task.raw["callback_url"] == receiver.url
        wait_until(lambda: all(d["state"] == "delivered"
                               for t in (run.task_id, item.task.id)
                               for d in pilot.get(t).raw["deliveries"] or [{"state": "-"}]),
                   60, interval=0.2, what="both deliveries")
    by_id = {r.message_id: r for r in receiver.received if r.status == 204}
    assert set(by_id) == {f"{run.task_id}:succeeded:0", f"{item.task.id}:succeeded:0"}
    for r in by_id.values():
        task = verify_webhook(secret, r.headers, r.body)
        assert task["result"]["echo"]["n"] in (7, 8)
    [delivery] = pilot.get(run.task_id).raw["deliveries"]
    assert (delivery["attempts"], delivery["last_status"]) == (2, 204)
