"""The webhook outbox, part of the store contract (docs/webhooks.md, "The
outbox"): an ending (succeeded, failed, cancelled) of a task with an endpoint
writes its delivery row with the transition — the same statement on
PostgreSQL, the same transaction on the ORM store — and returns its message id
in the transition's fact, which the engine enqueues on commit (announce);
nothing else does, and a task without an endpoint pays nothing. Run on both
stores, like the rest of the contract."""

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from tests.factories import make_task, transition_kwargs
from tests.support.helpers import purge_queue, queued_webhooks
from workflows.engine.announce import announce
from workflows.engine.enqueue import uses_orm_broker
from workflows.engine.store import rows
from workflows.models import Task, WebhookDelivery
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

URL = "https://receiver.example.com/hooks"
LEASE = timedelta(seconds=60)


def deliveries(task_id) -> list[tuple]:
    return list(WebhookDelivery.objects.filter(task_id=task_id).order_by("id").values_list(
        "task_state", "restarts", "url", "state", "attempts", "claim_token", "body"))


def db_now():
    return Task.objects.annotate(n=Now()).values_list("n", flat=True)[:1].get()


def kind(sql: str) -> str:
    """'INSERT workflows_webhookdelivery', 'BEGIN', …: a statement's verb and table."""
    verb = sql.lstrip().split(None, 1)[0].upper()
    if verb.startswith("--"):  # a statement may open with a comment
        verb = re.sub(r"^(\s*--[^\n]*\n)+", "", sql).split(None, 1)[0].upper()
    match = re.search(r'(?:INTO|UPDATE|FROM)\s+"?(\w+)', sql)
    return f"{verb} {match.group(1)}" if verb in ("INSERT", "UPDATE", "SELECT") and match \
        else verb


def apply(store_, task, name, **overrides):
    kwargs = {**transition_kwargs(name, task), **overrides}
    return store_.transition(task, name, at=db_now(), actor="test", **kwargs)


# Each ending, from the state it leaves.
ENDINGS = {
    "succeed": (S.RUNNING, "succeed", {}, S.SUCCEEDED),
    "fail_running": (S.RUNNING, "fail", {}, S.FAILED),
    "fail_compensating": (S.COMPENSATING, "fail", {}, S.FAILED),
    "finish_cancel": (S.CANCELLING, "finish_cancel", {}, S.CANCELLED),
    "cancel_pending": (S.PENDING, "cancel", {}, S.CANCELLED),
    "cancel_retrying": (S.RETRYING, "cancel", {}, S.CANCELLED),
}


@pytest.mark.parametrize("case", ENDINGS)
def test_every_ending_of_a_task_with_an_endpoint_writes_one_delivery_with_it(
        any_store, owner, case):
    start, name, kwargs, ended = ENDINGS[case]
    task = make_task(owner, state=start, callback_url=URL)
    purge_queue()
    before = db_now()
    fact = apply(any_store, task, name, **kwargs)
    assert task.state == ended
    assert deliveries(task.pk) == [(ended, 0, URL, "pending", 0, 0, None)]
    row = WebhookDelivery.objects.get(task_id=task.pk)
    assert before <= row.created_at <= db_now()
    assert row.next_attempt_at == row.created_at == row.enqueued_at  # due now, message sent
    assert row.give_up_at - row.created_at == timedelta(hours=24)
    assert row.message_id == f"{task.pk}:{ended}:0"
    assert fact.delivery == row.message_id and fact.to_state == ended
    assert queued_webhooks() == []  # the store sends nothing: the engine acts on the fact
    announce(fact)
    assert queued_webhooks() == [row.message_id]


NOT_ENDINGS = {
    "claim": (S.PENDING, "claim"),
    "schedule_retry": (S.RUNNING, "schedule_retry"),
    "recover": (S.RUNNING, "recover"),
    "compensate": (S.RUNNING, "compensate"),
    "cancel_running": (S.RUNNING, "cancel"),
    "retry_failed": (S.FAILED, "retry"),
    "retry_cancelled": (S.CANCELLED, "retry"),
    "resume": (S.COMPENSATING, "resume"),
    "defer": (S.CANCELLING, "defer"),
}


@pytest.mark.parametrize("case", NOT_ENDINGS)
def test_a_transition_that_does_not_end_the_task_writes_no_delivery(any_store, owner, case):
    start, name = NOT_ENDINGS[case]
    task = make_task(owner, state=start, callback_url=URL)
    existing = deliveries(task.pk)  # a finished starting point has its own ending's row
    purge_queue()
    fact = apply(any_store, task, name)
    assert task.state not in (S.SUCCEEDED, S.FAILED, S.CANCELLED)
    assert deliveries(task.pk) == existing
    assert fact.delivery is None
    announce(fact)
    assert queued_webhooks() == []


def test_a_task_without_an_endpoint_gets_no_delivery_and_pays_no_statement(any_store, owner):
    """The ending costs what it cost before webhooks existed: on PostgreSQL one
    statement either way (the outbox insert is a one-time-filtered part of it);
    on the ORM store the insert (and, with the ORM broker, its queue row) only
    for the task with an endpoint."""
    counts = {}
    for url in ("", URL):
        task = make_task(owner, state=S.RUNNING, callback_url=url)
        kwargs, at = transition_kwargs("succeed", task), db_now()
        with CaptureQueriesContext(connection) as captured:  # the ending, and the engine's act
            announce(any_store.transition(task, "succeed", at=at, actor="test", **kwargs))
        # PREPARE: once per connection and statement, not per ending.
        counts[url] = [q["sql"] for q in captured.captured_queries
                       if not q["sql"].startswith("PREPARE ")]
    plain, with_endpoint = counts[""], counts[URL]
    if any_store.name == "postgresql":
        assert len(plain) == 1  # one statement, its deliver part off
        assert [kind(sql) for sql in with_endpoint if "django_q_ormq" not in sql
                and kind(sql) not in ("BEGIN", "COMMIT")] == [kind(plain[0])]
        assert kind(plain[0]) in ("WITH", "EXECUTE")
    else:
        assert not any("webhookdelivery" in sql for sql in plain)
        extra = Counter(map(kind, with_endpoint)) - Counter(map(kind, plain))
        # The outbox row; with the ORM broker also its queue row, written after
        # the commit when no transaction encloses the ending (its own BEGIN/COMMIT).
        assert extra.pop("INSERT workflows_webhookdelivery") == 1
        assert set(extra) <= {"INSERT django_q_ormq", "BEGIN", "COMMIT"}
        assert extra["INSERT django_q_ormq"] == (1 if uses_orm_broker() else 0)
    assert WebhookDelivery.objects.count() == 1


def test_a_refused_ending_writes_no_delivery(any_store, owner):
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    stale = Task.objects.get(pk=task.pk)
    apply(any_store, task, "schedule_retry")
    purge_queue()
    with pytest.raises(ConcurrentTransition):
        apply(any_store, stale, "succeed",
              steps=[rows.succeeded(0, "echo", 1, db_now(), compensable=False)])
    assert stale.state == S.RUNNING
    assert deliveries(task.pk) == [] and queued_webhooks() == []


def test_the_delivery_rolls_back_with_the_ending(any_store, owner):
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    purge_queue()

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        apply(any_store, task, "succeed")
        assert len(deliveries(task.pk)) == 1  # written inside the transaction
        raise Abort
    assert Task.objects.get(pk=task.pk).state == S.RUNNING
    assert deliveries(task.pk) == [] and queued_webhooks() == []


def test_each_restart_gives_the_next_ending_its_own_delivery(any_store, owner):
    task = make_task(owner, state=S.FAILED, callback_url=URL)  # ended once: failed:0
    for name in ("retry", "cancel"):  # restarted, then cancelled before it ran
        apply(any_store, task, name)
    assert task.restarts == 1
    for name in ("retry", "claim", "succeed"):
        apply(any_store, task, name)
    assert [(d[0], d[1]) for d in deliveries(task.pk)] == [
        (S.FAILED, 0), (S.CANCELLED, 1), (S.SUCCEEDED, 2)]
    assert [d.message_id for d in WebhookDelivery.objects.filter(task_id=task.pk)
            .order_by("id")] == [f"{task.pk}:failed:0", f"{task.pk}:cancelled:1",
                                 f"{task.pk}:succeeded:2"]


def test_the_unique_task_state_restarts_makes_a_second_insert_a_no_op(any_store, owner):
    """The arbiter behind the stable webhook id: even an ending written twice
    for one (state, restarts) leaves one row."""
    task = make_task(owner, state=S.RUNNING, callback_url=URL)
    apply(any_store, task, "succeed")
    # Put the row back where it was (what no transition can do: a second ending
    # for the same restart count), and end it again.
    Task.objects.filter(pk=task.pk).update(state=S.RUNNING, lease_token=task.lease_token)
    again = Task.objects.get(pk=task.pk)
    apply(any_store, again, "succeed")
    assert deliveries(task.pk) == [(S.SUCCEEDED, 0, URL, "pending", 0, 0, None)]


@pytest.mark.postgres
def test_the_literal_and_the_orm_outbox_rows_are_the_same(owner):
    from workflows.engine.store.orm import OrmStore
    from workflows.engine.store.postgres import PostgresStore

    results = []
    for store_ in (PostgresStore(), OrmStore()):
        task = make_task(owner, state=S.RUNNING, callback_url=URL)
        store_.transition(task, "fail", at=db_now(), actor="test", error="e", error_type="E",
                          now=db_now())
        row = WebhookDelivery.objects.filter(task_id=task.pk).values().get()
        for name in ("id", "task_id", "created_at", "next_attempt_at", "enqueued_at",
                     "give_up_at"):
            row.pop(name)
        results.append(row)
    assert results[0] == results[1]
