"""docs/webhooks.md's examples, run as written (so the page cannot rot): the
receiver, started as its own process, gets a real delivery from PILOT, a
re-send of it (a duplicate it recognises) and a forgery (refused); the
verification snippets check a real delivery."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.docs.blocks import checked_by
from tests.support.helpers import drain
from tests.support.procs import ROOT, free_port, wait_until
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine.deliveries import delivery_resend
from workflows.engine.triggers import task_trigger
from workflows.models import WebhookDelivery

PAGE = ROOT / "docs" / "webhooks.md"

pytestmark = pytest.mark.django_db(transaction=True)


RECEIVER_TEST = ("test_the_receiver_accepts_a_real_delivery_recognises_a_resend_and_refuses_"
                 "a_forgery")


@pytest.fixture(autouse=True)
def _loopback(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_page_has_its_examples():
    [receiver] = checked_by(PAGE, RECEIVER_TEST)
    [snippets] = checked_by(PAGE, "test_the_verification_snippets_accept_a_real_delivery")
    assert "verify_webhook(SECRET, self.headers, body)" in receiver
    assert "Webhook(SECRET).verify(body, headers)" in snippets


def test_the_receiver_accepts_a_real_delivery_recognises_a_resend_and_refuses_a_forgery(
        owner, django_user_model):
    _, secret = client_webhook_ensure(owner)
    port = free_port()
    [code] = checked_by(PAGE, RECEIVER_TEST)
    receiver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                                env={"PATH": "/usr/bin:/bin", "PILOT_WEBHOOK_SECRET": secret,
                                     "PORT": str(port)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _listening(port) or receiver.poll() is not None, 20,
                   what="the receiver to listen")
        assert receiver.poll() is None, receiver.stderr.read()
        task = task_trigger(owner=owner, key="order-42", workflow="demo.echo",
                            payload={"order": 42},
                            callback_url=f"http://127.0.0.1:{port}/pilot-webhooks").task
        drain(lambda: WebhookDelivery.objects.filter(state="delivered").exists())
        operator = django_user_model.objects.create_superuser("op", "op@x", "pw-op-123456")
        delivery = WebhookDelivery.objects.get()
        delivery_resend(delivery_id=delivery.pk, user=operator)
        drain(lambda: WebhookDelivery.objects.get().attempts == 2
              and WebhookDelivery.objects.get().state == "delivered")
        forged = urllib.request.Request(
            f"http://127.0.0.1:{port}/pilot-webhooks", data=b'{"state": "succeeded"}',
            method="POST", headers={"webhook-id": f"{task.pk}:succeeded:9",
                                    "webhook-timestamp": "1700000000",
                                    "webhook-signature": "v1,Zm9yZ2Vk"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=5)
        assert refused.value.code == 400
        refused.value.close()
    finally:
        receiver.terminate()
        out, err = receiver.communicate(timeout=10)
    assert out.splitlines() == [
        f'accepted {task.pk}:succeeded:0 succeeded {{"echo": {{"order": 42}}}}',
        f"duplicate {task.pk}:succeeded:0"], err


def test_the_verification_snippets_accept_a_real_delivery(owner):
    _, secret = client_webhook_ensure(owner)
    with Receiver() as capture:
        task = task_trigger(owner=owner, key="k", workflow="demo.echo", payload={"n": 1},
                            callback_url=capture.url).task
        drain(lambda: WebhookDelivery.objects.filter(state="delivered").exists())
    [got] = capture.received
    names = {"SECRET": secret, "body": got.body, "headers": got.headers}
    [snippets] = checked_by(PAGE, "test_the_verification_snippets_accept_a_real_delivery")
    exec(compile(snippets, str(PAGE), "exec"), names)
    assert names["task"]["id"] == str(task.pk)
    assert names["valid"] is True
