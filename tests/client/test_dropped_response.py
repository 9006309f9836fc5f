"""The answer to the first attempt is lost after the server committed (a proxy
forwards the request, lets the server answer, and cuts the client off). The
client retries with the same idempotency key: one task, reported as a replay.
An operator action (cancel) is not re-sent blind: its outcome is reported as
unknown instead."""

from __future__ import annotations

import pilot_client
import pytest
from pilot_client import PilotClient, RetryPolicy

from tests.client.proxy import DroppingProxy
from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def through_proxy(live_pilot, api_client):
    _, url = live_pilot
    port = int(url.rsplit(":", 1)[1])
    with DroppingProxy(port, drop=1) as proxy:
        client = PilotClient(proxy.url, api_client[1],
                             retry=RetryPolicy(initial=0.05, max_delay=0.2))
        yield proxy, client
        client.close()


def test_a_lost_answer_is_retried_with_the_same_key_and_reported_as_a_replay(
        through_proxy, api_client):
    proxy, client = through_proxy
    result = client.trigger("demo.echo", {"order": 42})
    assert proxy.dropped and proxy.dropped[0].startswith(b"HTTP/1.1 202")  # it was created
    assert b"Idempotent-Replayed: false" in proxy.dropped[0]
    assert (result.attempts, result.status, result.replayed) == (2, 200, True)
    task = Task.objects.get(owner=api_client[0])  # exactly one
    assert (str(task.pk), task.idempotency_key, task.replays) == (
        result.task_id, result.key, 1)
    assert proxy.connections == 2


def test_a_lost_answer_to_a_batch_is_retried_and_every_item_replays(through_proxy, api_client):
    proxy, client = through_proxy
    results = client.batch([{"workflow": "demo.echo", "payload": {"i": i}} for i in range(3)])
    assert proxy.dropped[0].startswith(b"HTTP/1.1 200")
    assert [(r.status, r.replayed) for r in results] == [(200, True)] * 3
    assert Task.objects.filter(owner=api_client[0]).count() == 3


def test_a_lost_answer_to_a_cancel_is_not_resent_but_reported_as_unknown(
        live_pilot, api_client):
    _, url = live_pilot
    with PilotClient(url, api_client[1]) as direct:
        run = direct.trigger("demo.slow", {"steps": 2, "seconds": 2})
    port = int(url.rsplit(":", 1)[1])
    with DroppingProxy(port, drop=1) as proxy, PilotClient(proxy.url, api_client[1]) as client:
        with pytest.raises(pilot_client.PilotConnectionError, match="may have been processed"):
            client.cancel(run.task_id)
        assert proxy.dropped[0].startswith(b"HTTP/1.1 200") and proxy.connections == 1
        assert client.get(run.task_id).state in ("cancelling", "cancelled")
