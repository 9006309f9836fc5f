"""Identical enqueues of a keyed Django task at the same instant, on PostgreSQL,
with real threads and separate connections: PILOT's trigger makes one task, one
message, and every caller gets the same TaskResult id."""

import pytest

from tests.support.helpers import queued_task_ids, run_at_once
from workflows.demo.tasks import add, charge
from workflows.models import Task
from workflows.rules.errors import IdempotencyKeyReused

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

N = 50


def test_identical_enqueues_racing_share_one_task_and_one_message(enough_connections):
    charge.enqueue(0, 0)  # the `tasks` owner exists first (its creation is raced below)
    results = run_at_once(N, lambda i: charge.enqueue(order_id=42, amount=10))
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert len({r.id for r in results}) == 1
    task = Task.objects.get(pk=results[0].id)
    assert task.replays == N - 1
    assert queued_task_ids().count(str(task.pk)) == 1


def test_racing_enqueues_with_other_arguments_are_refused_but_one(enough_connections):
    charge.enqueue(0, 0)
    results = run_at_once(N, lambda i: charge.enqueue(order_id=43, amount=i % 3))
    unexpected = [r for r in results
                  if isinstance(r, BaseException) and not isinstance(r, IdempotencyKeyReused)]
    assert unexpected == []
    task = Task.objects.get(workflow="workflows.demo.tasks.charge", payload__kwargs__order_id=43)
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert {r.id for r in winners} == {str(task.pk)}
    assert len(winners) == len([i for i in range(N) if i % 3 == task.payload["kwargs"]["amount"]])


def test_the_first_enqueue_creates_its_owner_once_under_a_race(enough_connections):
    results = run_at_once(N, lambda i: add.enqueue(i, i))
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert Task.objects.filter(workflow="workflows.demo.tasks.add").count() == N
    assert Task.objects.values("owner").distinct().count() == 1
