"""The Workers & queue panel (workflows/admin/workers.py, dashboard.py).

Cluster status records are written exactly as a django-q2 cluster writes
them (`broker.set_stat` of a signed `Status`), to the store the settings
give django-q2 — the shared database cache with the ORM broker, Redis with
the Redis broker — and read back by the web process. The browser test does
the same with a real `qcluster`."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.signing import SignedPackage
from django_q.status import Status

from tests.factories import make_task
from tests.support.procs import wait_until
from workflows.admin.workers import cluster_stats, queue_state, work_status
from workflows.engine.enqueue import broker, enqueue_rollback_unsafe
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/workflows/task/workers/"


@pytest.fixture
def cluster():
    """A live cluster's status record on host node-a with workers 111 and 222."""
    stat = Status(pid=4242, cluster_id=uuid.uuid4())
    stat.host, stat.workers, stat.status = "node-a", [111, 222], "Working"
    stat.tob = timezone.now()
    key = f"{Conf.Q_STAT}:{stat.cluster_id}"
    broker().set_stat(key, SignedPackage.dumps(stat, True), 30)
    yield stat
    if broker().cache is not None and Conf.ORM:
        broker().cache.delete(key)
    else:
        broker().connection.delete(key)


def lease(task, worker: str) -> None:
    Task.objects.filter(pk=task.pk).update(lease_owner=worker)


def test_the_panel_shows_each_worker_busy_or_idle_and_what_it_runs(cluster, owner,
                                                                   operator_client):
    busy = make_task(owner, state=S.RUNNING, workflow="demo.slow",
                     payload={"steps": 3, "seconds": 1})
    lease(busy, "node-a:111")
    StepCheckpoint.objects.create(task=busy, index=1, name="s1", state="running",
                                  started_at=timezone.now())
    ghost = make_task(owner, state=S.RUNNING)
    lease(ghost, "node-z:9")
    status = work_status(timezone.now())
    [row] = [c for c in status.clusters if c.host == "node-a"]
    assert [(w.pid, w.busy) for w in row.workers] == [(111, True), (222, False)]
    assert row.workers[0].tasks[0].pk == busy.pk
    assert row.workers[0].tasks[0].current_step.name == "s1"
    assert [t.pk for t in status.orphans] == [ghost.pk]

    html = operator_client.get(URL).content.decode()
    worker = html.split('data-worker="node-a:111" data-task=')[1].split("</tr>")[0]
    assert 'data-worker-state="busy"' in worker and "demo.slow" in worker and "s1" in worker
    assert 'data-worker="node-a:222"' in html and 'data-worker-state="idle"' in html
    assert str(ghost.pk)[:8] in html.split('id="pilot-stuck"')[1]
    dashboard = operator_client.get("/admin/workflows/task/dashboard/").content.decode()
    assert 'data-workers-busy="1">1 of 2</strong> worker(s) busy' in dashboard
    # One truth: the dashboard names the same stuck task, for the same reason.
    for page in (html, dashboard):
        stuck = page.split('id="pilot-stuck"')[1].split("</table>")[0]
        assert f'data-task="{ghost.pk}" data-worker-gone="true"' in stuck
        assert f'data-task="{busy.pk}"' not in stuck
        assert "its worker is in no live cluster&#x27;s report" in stuck


def test_no_cluster_reporting_is_said_plainly(operator_client):
    # A cluster an earlier test of this worker stopped keeps its status record until
    # it expires (3 s): the state this test is about begins then.
    wait_until(lambda: not cluster_stats()[0], 10, what="earlier clusters' records to expire")
    html = operator_client.get(URL).content.decode()
    assert 'id="pilot-no-clusters"' in html and "No worker cluster is reporting" in html


def test_queue_depth_and_oldest_message_of_the_broker_in_use(owner):
    assert queue_state(timezone.now()).waiting == 0
    first = task_trigger(owner=owner, key="q1", workflow="demo.echo", payload={}).task
    task_trigger(owner=owner, key="q2", workflow="demo.echo", payload={})
    enqueue_rollback_unsafe([first.pk], front=True)  # a retry goes first on Redis
    state = queue_state(timezone.now())
    assert state.waiting == 3 and not state.error
    assert state.oldest_enqueued_at is not None
    assert state.oldest_enqueued_at <= Task.objects.get(pk=first.pk).created_at + timedelta(
        seconds=1)
    assert state.broker == ("ORM (database)" if Conf.ORM else "Redis")


def test_the_panel_needs_view_all_tasks_and_says_so(django_user_model):
    from django.test import Client

    from tests.admin.conftest import _staff

    client = Client()
    client.force_login(_staff(django_user_model, "own-only", perms=("view_task",)))
    response = client.get(URL)
    assert response.status_code == 403
    assert "workflows.view_all_tasks" in response.content.decode()


def test_stuck_is_one_rule_a_lease_run_out_or_a_worker_no_cluster_reports(owner):
    from types import SimpleNamespace

    from workflows.admin.workers import tasks_stuck

    now = timezone.now()

    def leased(owner_name, lease_left):
        return SimpleNamespace(pk=owner_name, lease_owner=owner_name, started_at=now,
                               lease_expires_at=now + timedelta(seconds=lease_left))

    alive, dead, late = leased("node-a:1", 30), leased("node-z:9", 30), leased("node-a:2", -5)
    stuck = tasks_stuck(now, [alive, dead, late], {"node-a:1", "node-a:2"})
    assert [(s.task.pk, s.worker_gone, s.lease_expired) for s in stuck] == [
        ("node-a:2", False, True), ("node-z:9", True, False)]
    assert stuck[0].text == "its lease ran out"
    # The clusters' status unreadable: nobody can say a worker is gone, the lease still decides.
    assert [s.task.pk for s in tasks_stuck(now, [alive, dead, late], None)] == ["node-a:2"]
