"""PILOT signs deliveries so that the documented recipe, the Python client's
verify_webhook and the Standard Webhooks reference package all accept them —
and refuse them once anything is changed."""

import base64
import json
import time

import pytest
from pilot_client import WebhookVerificationError, sign_webhook, verify_webhook
from standardwebhooks import Webhook
from standardwebhooks import WebhookVerificationError as StandardError

from workflows.webhooks.signing import webhook_headers, webhook_secret_new, webhook_sign

BODY = json.dumps({"id": "t1", "state": "succeeded", "result": {"ok": True}}).encode()


def test_a_secret_is_whsec_and_32_random_bytes():
    secret = webhook_secret_new()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    assert webhook_secret_new() != secret


def test_the_signature_is_the_clients_and_the_standards():
    secret, now = webhook_secret_new(), int(time.time())
    headers = webhook_headers(secret, "t1:succeeded:0", now, BODY)
    assert headers["webhook-signature"] == sign_webhook(secret, "t1:succeeded:0", now, BODY)
    assert verify_webhook(secret, headers, BODY)["state"] == "succeeded"
    assert Webhook(secret).verify(BODY, headers)["id"] == "t1"


@pytest.mark.parametrize("tamper", ["body", "id", "timestamp", "secret"])
def test_any_change_breaks_it(tamper):
    secret, now = webhook_secret_new(), int(time.time())
    headers = webhook_headers(secret, "t1:failed:2", now, BODY)
    body = BODY
    if tamper == "body":
        body = BODY.replace(b"succeeded", b"failed")
    elif tamper == "id":
        headers["webhook-id"] = "t1:failed:3"
    elif tamper == "timestamp":
        headers["webhook-timestamp"] = str(now + 1)
    else:
        secret = webhook_secret_new()
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body)
    with pytest.raises(StandardError):
        Webhook(secret).verify(body, headers)


def test_the_signed_message_is_id_timestamp_body():
    import hashlib
    import hmac

    secret = webhook_secret_new()
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, b"m1.1700000000." + BODY,
                                         hashlib.sha256).digest()).decode()
    assert webhook_sign(secret, "m1", 1700000000, BODY) == f"v1,{expected}"
