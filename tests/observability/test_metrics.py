"""`/metrics`: the Prometheus exposition, counted from engine events."""

import os
import subprocess
import sys

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import S
from tests.support.helpers import drain
from tests.support.procs import ROOT
from workflows.engine.triggers import task_trigger
from workflows.rules.errors import PilotError

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client=None, **headers) -> dict:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(autouse=True)
def _fresh_task_counts(settings):
    settings.PILOT_METRICS_TASKS_TTL = 0


def test_a_trigger_and_its_run_are_counted(owner):
    before = scrape()
    task = task_trigger(owner=owner, key="m1", workflow="demo.sync_orders",
                        payload={"batch": "m1", "count": 2}).task
    task_trigger(owner=owner, key="m1", workflow="demo.sync_orders",
                 payload={"batch": "m1", "count": 2})
    with pytest.raises(PilotError):
        task_trigger(owner=owner, key="m1", workflow="demo.sync_orders",
                     payload={"batch": "other", "count": 2})
    drain(lambda: task.__class__.objects.get(pk=task.pk).is_finished)
    after = scrape()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    wf = "demo.sync_orders"
    assert delta("pilot_triggers_total", workflow=wf, outcome="created") == 1
    assert delta("pilot_triggers_total", workflow=wf, outcome="replayed") == 1
    assert delta("pilot_triggers_total", workflow="", outcome="idempotency_key_reused") == 1
    assert delta("pilot_transitions_total", workflow=wf, **{"from": "pending"}, to="running") \
        == 1
    assert delta("pilot_transitions_total", workflow=wf, **{"from": "running"},
                 to="succeeded") == 1
    for step in ("fetch", "transform", "write"):
        assert delta("pilot_step_duration_seconds_count", workflow=wf, step=step) == 1
    assert delta("pilot_queue_lag_seconds_count") == 1
    assert value(after, "pilot_tasks", state="succeeded") == 1
    assert value(after, "pilot_tasks", state="pending") == 0
    assert value(after, "pilot_database_up") == 1


def test_dispatcher_actions_are_counted(owner):
    from datetime import timedelta

    from django.utils import timezone

    from tests.support.helpers import pop_queued
    from workflows.engine.dispatcher import dispatch_once
    from workflows.models import Task

    before = value(scrape(), "pilot_dispatcher_actions_total", action="reenqueued")
    task = task_trigger(owner=owner, key="lost", workflow="demo.echo", payload={}).task
    pop_queued()  # the message is lost
    Task.objects.filter(pk=task.pk).update(enqueued_at=timezone.now() - timedelta(minutes=5),
                                           next_attempt_at=timezone.now() - timedelta(minutes=5))
    assert dispatch_once().reenqueued == 1
    assert value(scrape(), "pilot_dispatcher_actions_total", action="reenqueued") == before + 1


def test_webhook_attempts_are_counted_by_outcome(owner, settings):
    from tests.webhooks.receiver import Receiver
    from workflows.accounts import client_webhook_ensure
    from workflows.models import WebhookDelivery

    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 0.05
    client_webhook_ensure(owner)
    before = scrape()
    with Receiver(lambda mid, n: (500, 0) if n == 1 else (204, 0)) as receiver:
        task_trigger(owner=owner, key="hook", workflow="demo.echo", payload={},
                     callback_url=receiver.url)
        drain(lambda: WebhookDelivery.objects.filter(state="delivered").exists())
    after = scrape()
    for outcome in ("retrying", "delivered"):
        assert (value(after, "pilot_webhook_attempts_total", outcome=outcome)
                - value(before, "pilot_webhook_attempts_total", outcome=outcome)) == 1
    assert (value(after, "pilot_webhook_attempt_seconds_count")
            - value(before, "pilot_webhook_attempt_seconds_count")) == 2


def test_task_counts_are_shared_for_the_ttl(owner, settings):
    from django.core.cache import cache

    settings.PILOT_METRICS_TASKS_TTL = 60
    cache.delete("pilot:metrics:task_counts")
    first = value(scrape(), "pilot_tasks", state="pending")
    task_trigger(owner=owner, key="ttl", workflow="demo.echo", payload={})
    assert value(scrape(), "pilot_tasks", state="pending") == first  # cached
    cache.delete("pilot:metrics:task_counts")
    assert value(scrape(), "pilot_tasks", state="pending") == first + 1


def test_a_token_when_configured_is_required(settings):
    settings.PILOT_METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics").status_code == 401
    denied = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert denied.status_code == 401 and denied["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Token s3cret-scrape-token") \
        .status_code == 401
    scrape(HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")


def test_without_a_token_metrics_are_closed_unless_debug_or_opened_on_purpose(settings):
    """Outside `make run` (DEBUG) a project that set no token gets a 403 naming
    both ways out; PILOT_METRICS_PUBLIC opens it (the suite's own setting)."""
    settings.PILOT_METRICS_TOKEN = None
    settings.PILOT_METRICS_PUBLIC = False
    closed = Client().get("/metrics")
    assert closed.status_code == 403
    assert b"PILOT_METRICS_TOKEN" in closed.content and b"PILOT_METRICS_PUBLIC" in closed.content
    settings.DEBUG = True
    scrape()
    settings.DEBUG = False
    settings.PILOT_METRICS_PUBLIC = True
    scrape()


def test_only_get_is_allowed():
    assert Client().post("/metrics").status_code == 405


def test_processes_sharing_a_multiprocess_dir_are_merged(tmp_path):
    """Two separate processes count into PROMETHEUS_MULTIPROC_DIR; a third
    (like a gunicorn worker) exposes the sum."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "tests.settings"}
    count = ("import django; django.setup(); "
             "from workflows.observability.events import emit; "
             "emit('task_triggered', workflow='demo.echo', outcome='created')")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", count], cwd=ROOT, env=env, check=True,
                       timeout=60, capture_output=True)
    show = ("import django; django.setup(); "
            "from workflows.observability.metrics import exposition; "
            "import sys; sys.stdout.write(exposition().decode())")
    # The database part needs a database; this process has none, and says so.
    out = subprocess.run([sys.executable, "-c", show], cwd=ROOT, check=True, timeout=60,
                         env={**env, "DATABASE_URL": f"sqlite:///{tmp_path}/none.sqlite3"},
                         capture_output=True, text=True).stdout
    assert 'pilot_triggers_total{outcome="created",workflow="demo.echo"} 2.0' in out
    assert "pilot_database_up 0.0" in out


# --- gauges read at scrape time: backlog, oldest pending, dispatcher liveness -------------

def test_backlog_and_the_oldest_waiting_task_are_gauges(owner, settings):
    from datetime import timedelta

    from django.utils import timezone

    from tests.factories import make_task
    from workflows.models import Task

    settings.PILOT_METRICS_TASKS_TTL = 0
    old, _new = make_task(owner), make_task(owner)
    Task.objects.filter(pk=old.pk).update(enqueued_at=timezone.now() - timedelta(seconds=120))
    make_task(owner, state=S.SUCCEEDED)
    samples = scrape()
    assert value(samples, "pilot_backlog_tasks") == 2
    assert 120 <= value(samples, "pilot_oldest_pending_age_seconds") < 180


def test_a_dispatcher_pass_makes_its_liveness_gauge_young(settings):
    import threading

    from django.core.cache import cache

    from workflows.engine.loop import dispatcher_loop
    from workflows.observability import metrics

    cache.delete(metrics._DISPATCHER_KEY)
    metrics._last_beat = 0.0
    assert ("pilot_dispatcher_last_pass_age_seconds", ()) not in scrape()
    dispatcher_loop(threading.Event(), poll=0.01, max_passes=1)
    assert 0 <= scrape()[("pilot_dispatcher_last_pass_age_seconds", ())] < 5
