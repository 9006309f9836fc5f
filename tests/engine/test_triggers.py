"""The idempotent trigger engine: every row of the SPEC §6 decision table, key
handling, validation, expiry, batches. (Races with real threads are in
tests/concurrency.)"""

import math
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.factories import make_task
from tests.support.helpers import queued_task_ids
from workflows.engine.triggers import TriggerRequest, task_trigger, task_trigger_many
from workflows.models import Task, TaskReplay, TaskTransition
from workflows.rules.errors import (
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    PayloadTooLarge,
    TaskCancelled,
    UnknownWorkflow,
    ValidationFailed,
)
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

ECHO = {"msg": "hi"}


@pytest.fixture
def trigger(owner, django_capture_on_commit_callbacks):
    """task_trigger for `owner`, with after-commit enqueues run (Redis broker)."""

    def call(key="k-1", workflow="demo.echo", payload=None, who=None, **kw):
        with django_capture_on_commit_callbacks(execute=True):
            return task_trigger(owner=who or owner, key=key, workflow=workflow,
                                payload=ECHO if payload is None else payload, **kw)

    return call


def test_a_new_key_creates_a_pending_task_and_enqueues_it_once(trigger, owner):
    out = trigger(trace_id="trace-1")
    assert (out.outcome, out.http_status, out.replayed) == ("created", 202, False)
    task = Task.objects.get()
    assert (task.pk, task.state, task.owner, task.idempotency_key) == (
        out.task.pk, S.PENDING, owner, "k-1")
    assert (task.workflow, task.payload, task.source, task.trace_id) == (
        "demo.echo", ECHO, "api", "trace-1")
    assert task.max_attempts == 3 and task.enqueued_at is not None
    assert queued_task_ids() == [str(task.pk)]


@pytest.mark.parametrize("state", [S.PENDING, S.RUNNING, S.RETRYING, S.SUCCEEDED])
def test_same_request_replays_an_active_or_succeeded_task(trigger, owner, state):
    existing = make_task(owner, state=state, key="k-1", payload=ECHO)
    out = trigger()
    assert (out.outcome, out.http_status, out.replayed) == ("replayed", 200, True)
    assert out.task.pk == existing.pk
    existing.refresh_from_db()
    assert existing.state == state
    assert existing.replays == 1 and existing.last_replayed_at is not None
    assert out.task.replays == 1
    assert queued_task_ids() == []
    assert Task.objects.count() == 1


def test_replay_of_a_succeeded_task_returns_the_cached_result(trigger, owner):
    make_task(owner, state=S.SUCCEEDED, key="k-1", payload=ECHO)
    assert trigger().task.result == {"ok": True}


def test_replays_are_counted_and_logged_with_their_time(trigger):
    first = trigger()
    for _ in range(4):
        trigger()
    first.task.refresh_from_db()
    assert first.task.replays == 4
    log = list(TaskReplay.objects.filter(task=first.task).values_list("workflow", "count"))
    assert log == [("demo.echo", 1)] * 4


def test_same_request_restarts_a_failed_task_through_retry(trigger, owner):
    existing = make_task(owner, state=S.FAILED, key="k-1", payload=ECHO, max_attempts=3)
    out = trigger()
    assert (out.outcome, out.http_status, out.replayed) == ("restarted", 202, False)
    existing.refresh_from_db()
    assert existing.state == S.PENDING
    assert (existing.attempts, existing.max_attempts) == (1, 1 + 3)
    audit = TaskTransition.objects.filter(task=existing).latest("id")
    assert (audit.transition, audit.from_state, audit.to_state, audit.actor) == (
        "retry", "failed", "pending", "user:client-a")
    assert queued_task_ids() == [str(existing.pk)]


@pytest.mark.parametrize("state", [S.CANCELLING, S.CANCELLED])
def test_cancelled_tasks_are_refused(trigger, owner, state):
    existing = make_task(owner, state=state, key="k-1", payload=ECHO)
    with pytest.raises(TaskCancelled) as exc:
        trigger()
    assert (exc.value.code, exc.value.http_status) == ("task_cancelled", 409)
    existing.refresh_from_db()
    assert existing.state == state and existing.replays == 0
    assert queued_task_ids() == []


@pytest.mark.parametrize("state", list(S))
def test_a_different_request_with_a_used_key_is_refused_in_every_state(trigger, owner, state):
    existing = make_task(owner, state=state, key="k-1", payload=ECHO)
    with pytest.raises(IdempotencyKeyReused) as exc:
        trigger(payload={"msg": "different"})
    assert (exc.value.code, exc.value.http_status) == ("idempotency_key_reused", 422)
    with pytest.raises(IdempotencyKeyReused):
        trigger(workflow="demo.flaky", payload={"fail_times": 0})
    existing.refresh_from_db()
    assert existing.state == state and existing.replays == 0
    assert Task.objects.count() == 1


def test_payload_key_order_does_not_matter(trigger):
    first = trigger(payload={"a": 1, "b": [1, 2]})
    assert trigger(payload={"b": [1, 2], "a": 1}).task.pk == first.task.pk


def test_keys_are_scoped_per_owner(trigger, other_owner):
    mine = trigger()
    theirs = trigger(who=other_owner, payload={"other": "payload"})
    assert theirs.outcome == "created" and theirs.task.pk != mine.task.pk
    assert Task.objects.count() == 2


def test_bare_and_quoted_keys_are_the_same_key(trigger):
    first = trigger(key="abc-123")
    again = trigger(key='"abc-123"')
    assert (again.outcome, again.task.pk) == ("replayed", first.task.pk)
    assert first.task.idempotency_key == "abc-123"


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_an_expired_key_behaves_as_new_before_cleanup(trigger, owner, state):
    old = make_task(owner, state=state, key="k-1", payload={"old": True})
    Task.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    out = trigger()  # even a different payload: the old request is forgotten
    assert out.outcome == "created" and out.task.pk != old.pk
    assert list(Task.objects.values_list("pk", flat=True)) == [out.task.pk]
    assert not TaskTransition.objects.filter(task_id=old.pk).exists()


def test_a_finished_task_before_expiry_still_replays(trigger, owner):
    old = make_task(owner, state=S.SUCCEEDED, key="k-1", payload=ECHO)
    Task.objects.filter(pk=old.pk).update(expires_at=timezone.now() + timedelta(seconds=30))
    assert trigger().task.pk == old.pk


def test_an_unfinished_task_never_expires(trigger, owner):
    old = make_task(owner, state=S.RUNNING, key="k-1", payload=ECHO)
    Task.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(days=9))
    assert trigger().outcome == "replayed"


def test_keys_are_derived_from_key_fields(trigger, temp_workflow):
    wf = temp_workflow("test.keyed", key_fields=("batch",))
    wf.add_step("only", lambda ctx: None)
    first = trigger(key=None, workflow="test.keyed", payload={"batch": "b1", "n": 1})
    assert len(first.task.idempotency_key) == 64
    again = trigger(key=None, workflow="test.keyed", payload={"n": 1, "batch": "b1"})
    assert (again.outcome, again.task.pk) == ("replayed", first.task.pk)
    with pytest.raises(IdempotencyKeyReused):
        trigger(key=None, workflow="test.keyed", payload={"batch": "b1", "n": 2})
    other = trigger(key=None, workflow="test.keyed", payload={"batch": "b2", "n": 1})
    assert other.outcome == "created"
    with pytest.raises(ValidationFailed):
        trigger(key=None, workflow="test.keyed", payload={"n": 1})
    explicit = trigger(key="mine", workflow="test.keyed", payload={"batch": "b1", "n": 1})
    assert explicit.outcome == "created"


@pytest.mark.parametrize("kwargs, error, code", [
    ({"key": None}, IdempotencyKeyMissing, "idempotency_key_missing"),
    ({"key": ""}, IdempotencyKeyInvalid, "idempotency_key_invalid"),
    ({"key": "x" * 256}, IdempotencyKeyInvalid, "idempotency_key_invalid"),
    ({"key": "with space"}, IdempotencyKeyInvalid, "idempotency_key_invalid"),
    ({"workflow": "nope.nothing"}, UnknownWorkflow, "unknown_workflow"),
    ({"workflow": None}, UnknownWorkflow, "unknown_workflow"),
    ({"payload": ["not", "an", "object"]}, ValidationFailed, "validation_error"),
    ({"payload": {"x": float("nan")}}, ValidationFailed, "validation_error"),
    # A lone surrogate, as the admin form or the CLI could pass it (the API refuses it first).
    ({"payload": {"x": "\ud800"}}, ValidationFailed, "validation_error"),
    ({"payload": {"\udfff": 1}}, ValidationFailed, "validation_error"),
    ({"workflow": "demo.sync_orders", "payload": {"batch": "b", "count": 0}},
     ValidationFailed, "validation_error"),
    ({"workflow": "demo.slow", "payload": {"steps": "many"}}, ValidationFailed,
     "validation_error"),
])
def test_bad_triggers_are_refused_with_a_code_and_change_nothing(trigger, kwargs, error, code):
    with pytest.raises(error) as exc:
        trigger(**kwargs)
    assert exc.value.code == code
    assert Task.objects.count() == 0
    assert queued_task_ids() == []


def test_payload_validation_reports_per_field_errors(trigger):
    with pytest.raises(ValidationFailed) as exc:
        trigger(workflow="demo.sync_orders", payload={"batch": "b", "count": 0})
    assert set(exc.value.errors["payload"]) == {"count"}


def test_payload_size_is_capped(trigger, settings):
    settings.PILOT_MAX_PAYLOAD_BYTES = 100
    with pytest.raises(PayloadTooLarge) as exc:
        trigger(payload={"blob": "x" * 200})
    assert exc.value.http_status == 413
    assert trigger(payload={"blob": "x" * 50}).outcome == "created"


def test_payload_nesting_is_bounded(trigger):
    deep = current = {}
    for _ in range(40):
        current["x"] = {}
        current = current["x"]
    with pytest.raises(ValidationFailed, match="nested"):
        trigger(payload=deep)


def test_a_rolled_back_trigger_leaves_no_task_and_no_message(owner,
                                                             django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            task_trigger(owner=owner, key="k-1", workflow="demo.echo", payload=ECHO)
            raise RuntimeError("the caller's transaction fails after the trigger")
    assert Task.objects.count() == 0
    assert queued_task_ids() == []
    assert callbacks == []


# --- batches -------------------------------------------------------------------------------

def test_batch_gives_per_item_outcomes_in_input_order(owner, django_capture_on_commit_callbacks):
    existing = make_task(owner, state=S.SUCCEEDED, key="done", payload=ECHO)
    requests = [
        TriggerRequest("demo.echo", ECHO, "new-1"),
        TriggerRequest("demo.echo", ECHO, "done"),
        TriggerRequest("nope.nothing", ECHO, "bad-wf"),
        TriggerRequest("demo.echo", ECHO, "new-1"),            # repeat: replays item 0
        TriggerRequest("demo.echo", {"other": 1}, "new-1"),    # repeat, other payload: 422
        TriggerRequest("demo.echo", ECHO, "bad key"),
        TriggerRequest("demo.echo", {"other": 1}, "done"),
        TriggerRequest("demo.echo", ECHO, '"new-2"'),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        results = task_trigger_many(owner=owner, requests=requests)
    summary = [r.outcome if hasattr(r, "outcome") else r.code for r in results]
    assert summary == ["created", "replayed", "unknown_workflow", "replayed",
                       "idempotency_key_reused", "idempotency_key_invalid",
                       "idempotency_key_reused", "created"]
    assert results[3].task.pk == results[0].task.pk
    assert results[1].task.pk == existing.pk
    new_1 = Task.objects.get(idempotency_key="new-1")
    assert new_1.replays == 1 and new_1.source == "batch"
    existing.refresh_from_db()
    assert existing.replays == 1
    assert dict(TaskReplay.objects.values_list("task_id", "count")) == {new_1.pk: 1,
                                                                       existing.pk: 1}
    assert sorted(queued_task_ids()) == sorted([str(new_1.pk), str(results[7].task.pk)])


def test_batch_restarts_a_failed_task_once_then_replays_it(owner):
    failed = make_task(owner, state=S.FAILED, key="f", payload=ECHO)
    results = task_trigger_many(owner=owner, requests=[TriggerRequest("demo.echo", ECHO, "f"),
                                                       TriggerRequest("demo.echo", ECHO, "f")])
    assert [r.outcome for r in results] == ["restarted", "replayed"]
    failed.refresh_from_db()
    assert failed.state == S.PENDING and failed.replays == 1


def test_malformed_batches_are_refused(owner):
    with pytest.raises(ValidationFailed):
        task_trigger_many(owner=owner, requests=[])
    with pytest.raises(ValidationFailed):
        task_trigger_many(owner=owner,
                          requests=[TriggerRequest("demo.echo", {}, f"k{i}") for i in range(1001)])
    assert Task.objects.count() == 0


def test_a_thousand_item_batch_takes_a_bounded_number_of_queries(
        owner, django_assert_max_num_queries, django_capture_on_commit_callbacks):
    for i in range(100):
        make_task(owner, state=S.RUNNING, key=f"k{i}", payload=ECHO)
    requests = [TriggerRequest("demo.echo", ECHO, f"k{i}") for i in range(900)]
    requests += [TriggerRequest("demo.echo", ECHO, f"k{i}") for i in range(50)]   # repeats
    requests += [TriggerRequest("demo.echo", ECHO, "bad key") for i in range(50)]  # invalid
    # A constant number of statements on PostgreSQL; SQLite caps bind parameters
    # per statement, so its bulk INSERTs come in chunks (one per ~36 tasks).
    limit = connection.features.max_query_params
    chunks = 0 if limit is None else (math.ceil(900 / (limit // len(Task._meta.concrete_fields)))
                                      + math.ceil(800 / (limit // 3)))
    with django_capture_on_commit_callbacks(execute=True):
        with django_assert_max_num_queries(8 + chunks):
            results = task_trigger_many(owner=owner, requests=requests)
    outcomes = [getattr(r, "outcome", None) or r.code for r in results]
    assert outcomes.count("created") == 800
    assert outcomes.count("replayed") == 150
    assert outcomes.count("idempotency_key_invalid") == 50
    assert Task.objects.count() == 900
    assert len(queued_task_ids()) == 800


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_replay_never_writes_the_task_row_its_worker_fences_on(trigger):
    """Issue 10, item 11: a replay storm used to rewrite the task row (replays + 1)
    that the task's worker fences every write on. Now a replay only appends to
    its log: it goes through while another transaction holds the row, and the
    row is unchanged."""
    import threading

    from django.db import connection, connections, transaction

    first = trigger().task
    before = Task.objects.filter(pk=first.pk).values().get()
    holding, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            # An atomic step's fence, held until the step commits.
            with connection.cursor() as cursor:
                cursor.execute("SELECT id FROM workflows_task WHERE id = %s FOR SHARE",
                               [first.pk])
            holding.set()
            release.wait(30)
        connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            replays = [trigger() for _ in range(3)]
    finally:
        release.set()
        holder.join(30)
    assert [r.outcome for r in replays] == ["replayed"] * 3
    assert [r.task.replays for r in replays] == [1, 2, 3]
    assert Task.objects.filter(pk=first.pk).values().get() == before
    assert Task.objects.with_replays().get(pk=first.pk).pilot_replays == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_new_key_and_a_replay_are_one_statement_each(owner):
    """The trigger's fast path (sql.py create_or_replay): the insert, or the
    replay's lookup, log row, steps and count, in one round trip — a replay used
    to pay a failed insert first."""
    from django.test.utils import CaptureQueriesContext

    def statements(key):
        with CaptureQueriesContext(connection) as seen:
            outcome = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={"a": 1})
        return outcome, [q["sql"] for q in seen.captured_queries
                         if not q["sql"].startswith("PREPARE")]

    statements("warm")  # prepares the statement on this connection
    created, sql = statements("one")
    assert created.outcome == "created" and len(sql) == 1, sql
    replayed, sql = statements("one")
    assert replayed.outcome == "replayed" and len(sql) == 1, sql
    assert (replayed.task.pk, replayed.task.replays, replayed.task.state) == (
        created.task.pk, 1, S.PENDING)
    assert TaskReplay.objects.filter(task_id=created.task.pk).count() == 1
    # Not this request (another payload): nothing logged, the general path refuses it.
    with pytest.raises(IdempotencyKeyReused):
        task_trigger(owner=owner, key="one", workflow="demo.echo", payload={"a": 2})
    assert TaskReplay.objects.filter(task_id=created.task.pk).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_one_statement_replay_takes_exactly_the_replayable_states(owner):
    """The fast path's list of states it replays (sql.py create_or_replay)
    is REPLAYABLE_STATES, the general path's: a state only the SQL replays would
    replay what the engine restarts or refuses; a state only Python replays costs
    a second round trip. Every state, a re-trigger of the same request."""
    from django.test.utils import CaptureQueriesContext

    from tests.factories import PATHS
    from workflows.rules.states import REPLAYABLE_STATES

    assert set(PATHS) == set(S), "a state the factories cannot make"
    task_trigger(owner=owner, key="warm", workflow="demo.echo", payload={"n": 1})
    for state in S:
        task = make_task(owner, state=state, key=f"every-{state}")
        with CaptureQueriesContext(connection) as seen:
            try:
                outcome = task_trigger(owner=owner, key=task.idempotency_key,
                                       workflow="demo.echo", payload={"n": 1}).outcome
            except (IdempotencyKeyReused, TaskCancelled) as refused:
                outcome = type(refused).__name__
        statements = [q["sql"] for q in seen.captured_queries
                      if not q["sql"].startswith("PREPARE")]
        if state in REPLAYABLE_STATES:
            assert (outcome, len(statements)) == ("replayed", 1), (state, outcome, statements)
        else:
            assert outcome != "replayed", state
