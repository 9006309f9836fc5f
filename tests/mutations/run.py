"""The mutation check (`make mutate`; its CI subset in `make test`): does the suite bite?

Each mutant below is one deliberate bug in the engine, written as exact text
replacements, filed under the promise of docs/guarantees.md it would break. For
each, one at a time, the script:

1. exports the committed tree (`git archive HEAD`) into a temporary directory —
   the working tree is never written, so Ctrl-C or a crash cannot leave a bug
   behind;
2. applies the mutant's replacements there; a pattern that is not found exactly
   once stops the script (a refactor must not silently turn a mutant into a
   no-op — tests/unit/test_mutation_catalogue.py checks that on every run);
3. runs the mutant's small, named selection of tests against PostgreSQL and
   Redis (DATABASE_URL, REDIS_URL — required), on a copy of the baseline's
   test database (a mutant of a migration — a schema function — gets a test
   database migrated from its own tree instead);
4. records whether it was killed (a test failed) and which tests caught it.

Before the mutants, the union of all selections runs once on the unmutated
copy: a kill only counts if the same tests pass without the bug. Mutants run
on LANES lanes side by side (each its own database and queue). Prints a table
(markdown) and exits non-zero if any mutant survived.

    DATABASE_URL=postgres://... REDIS_URL=redis://... make mutate
    .venv/bin/python -m tests.mutations.run --ci        the subset make test runs:
                                                        one mutant per promise
    .venv/bin/python -m tests.mutations.run --only enqueue-before-commit
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    path: str
    replacements: tuple[tuple[str, str], ...]  # (exact old text, new text), each found once
    tests: tuple[str, ...]  # pytest node ids (or files) that must catch it
    promise: str = ""  # the promise of docs/guarantees.md it breaks (PROMISES)
    ci: bool = False  # in the subset `make test` runs (--ci): one per promise

    @property
    def migration(self) -> bool:
        """A bug in a migration (a schema function): its tests need a database
        migrated from the mutated tree."""
        return self.path.startswith("workflows/migrations/")


# The promises of docs/guarantees.md the mutants are filed under.
PROMISES = {
    "triggers": "N identical triggers: one task, one enqueue, N-1 replays, no deadlock",
    "replays": "every replay counted once",
    "atomic": "an atomic step's effects exactly once; a succeeded checkpoint never downgraded",
    "fence": "a worker that lost the task writes nothing more",
    "crash": "a crash loses nothing and repeats no finished step",
    "saga": "compensations run once, and every finished step's effect is undone",
    "time": "every decision by the database's clock",
    "isolation": "task_run never raises",
    "messages": "a message exists only for a change that committed, and work under way "
                "goes first",
    "fairness": "one client cannot take every worker",
    "liveness": "nothing stuck: a lost message or a lost reply strands no task",
    "webhooks": "every ending gets its webhook delivery, sent by one sender at a time",
    "schedules": "one task per schedule slot",
    "children": "a step's children start once each, and their last ending wakes the parent once",
}


MUTANTS = (
    Mutant(
        "drop-fence-predicate",
        "a step write no longer checks the lease token (write_steps' fence)",
        "workflows/engine/store/sql.py",
        (('''"write_steps": f"""WITH fence AS (
    SELECT id FROM workflows_task
     WHERE {FENCED}
       FOR SHARE''', '''"write_steps": f"""WITH fence AS (
    SELECT id FROM workflows_task
     WHERE id = %(task_id)s
       FOR SHARE'''),),
        ("tests/windows/test_fencing.py::"
         "test_every_write_of_a_running_worker_is_refused_after_every_token_change",
         "tests/concurrency/test_execution_races.py::"
         "test_a_stale_token_is_refused_while_the_new_holder_writes"),
        promise="fence", ci=True,
    ),
    Mutant(
        "new-step-rows-without-upsert",
        "a step write inserts the rows it did not see with a plain INSERT (a retry racing "
        "its own first try fails on the unique (task, index))",
        "workflows/engine/store/sql.py",
        (("""                                   WHERE s.task_id = (SELECT id FROM {source})))
    {UPSERT_ON_CONFLICT}
)""", """                                   WHERE s.task_id = (SELECT id FROM {source})))
)"""),),
        ("tests/engine/store/test_contract.py::"
         "test_a_step_write_retried_while_its_first_try_is_still_open_lands_once",),
        promise="atomic", ci=False,
    ),
    Mutant(
        "fold-inserts-a-new-row",
        "the replay log's fold deletes a group and inserts its sum as a new row (a cleanup "
        "deleting the task meanwhile cannot see that row and fails on the foreign key)",
        "workflows/engine/store/sql.py",
        (("""), kept AS (
    UPDATE workflows_taskreplay AS r SET count = ranked.total
      FROM ranked
     WHERE r.id = ranked.id AND ranked.place = 1 AND ranked.members > 1
    RETURNING 1
), removed AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place > 1
    RETURNING 1
)""", """), kept AS (
    INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
    SELECT r.task_id, r.workflow, ranked.total, r.at
      FROM ranked JOIN workflows_taskreplay AS r ON r.id = ranked.id
     WHERE ranked.place = 1 AND ranked.members > 1
    RETURNING 1
), replaced AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place = 1 AND ranked.members > 1
), removed AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place > 1
    RETURNING 1
)"""),),
        ("tests/windows/test_replay_fold_windows.py::"
         "test_a_cleanup_deleting_the_task_inside_a_folds_window_deletes_every_row",),
        promise="replays", ci=True,
    ),
    Mutant(
        "fold-without-row-locks",
        "the replay log's fold reads its group without locking it (two folders count it twice)",
        "workflows/engine/store/sql.py",
        (("""                AND r.at >= found.hour AND r.at < found.hour + interval '1 hour'
       FOR UPDATE OF r SKIP LOCKED""",
          """                AND r.at >= found.hour AND r.at < found.hour + interval '1 hour'"""),),
        ("tests/windows/test_replay_fold_windows.py::"
         "test_a_replay_and_a_second_fold_inside_a_folds_window_count_once",),
        promise="replays", ci=False,
    ),
    Mutant(
        "transition-without-fence",
        "a transition (succeed, fail, retry, ...) no longer checks the lease token",
        "workflows/engine/store/sql.py",
        (("""    UPDATE workflows_task SET {sets}
     WHERE {FENCED}""", """    UPDATE workflows_task SET {sets}
     WHERE id = %(task_id)s"""),),
        ("tests/windows/test_fencing.py::"
         "test_every_write_of_a_running_worker_is_refused_after_every_token_change",),
        promise="fence", ci=False,
    ),
    Mutant(
        "recover-live-leases",
        "the dispatcher recovers leases a minute before they expire",
        "workflows/engine/dispatcher.py",
        (("lost = Q(lease_expires_at__lt=now) if unrenewed is None",
          "lost = Q(lease_expires_at__lt=now + timedelta(seconds=60)) if unrenewed is None"),),
        ("tests/engine/test_dispatcher.py::"
         "test_an_expired_lease_is_recovered_and_the_lost_attempt_counts",),
        promise="crash", ci=False,
    ),
    Mutant(
        "switch-recovers-renewed-leases",
        "after a database switch the dispatcher takes leases their owners renewed there",
        "workflows/engine/dispatcher.py",
        (("tasks = [t for t in tasks if t.lease_expires_at == unrenewed[t.pk]]",
          "tasks = list(tasks)"),),
        ("tests/engine/test_database_switch.py::"
         "test_a_lease_renewed_after_the_switch_is_left_to_its_live_owner",),
        promise="fence", ci=False,
    ),
    Mutant(
        "skip-on-conflict",
        "a trigger's INSERT loses ON CONFLICT DO NOTHING (the key dedupe)",
        "workflows/engine/store/sql.py",
        (("    ON CONFLICT (owner_id, idempotency_key) DO NOTHING\n    RETURNING created_at",
          "    RETURNING created_at"),),
        # (The 200-thread race in tests/concurrency/test_trigger_races.py catches it
        # too, but needs ~230 connections; these need one.)
        ("tests/engine/test_triggers.py::test_replays_are_counted_and_logged_with_their_time",
         "tests/engine/test_triggers.py::test_same_request_replays_an_active_or_succeeded_task"),
        promise="triggers", ci=True,
    ),
    Mutant(
        "enqueue-before-commit",
        "the Redis push happens inside the trigger's transaction, not after its commit",
        "workflows/engine/enqueue.py",
        (("        transaction.on_commit(lambda: _push_after_commit(ids, front, func))",
          "        _push_after_commit(ids, front, func)"),),
        ("tests/engine/test_triggers.py::"
         "test_a_rolled_back_trigger_leaves_no_task_and_no_message",),
        promise="messages", ci=True,
    ),
    Mutant(
        "retries-behind-the-backlog",
        "the dispatcher's messages for work under way queue behind new triggers",
        "workflows/engine/enqueue.py",
        (("    elif front:\n", "    elif False:\n"),),
        ("tests/engine/test_dispatcher.py::"
         "test_due_retries_go_ahead_of_a_backlog_of_new_triggers",),
        promise="messages", ci=False,
    ),
    Mutant(
        "no-attempt-on-recover",
        "recovering an expired lease gives the lost attempt back (a poison task loops)",
        "workflows/engine/dispatcher.py",
        (("""                move(task, "recover", at=now, actor=actor,
                     reason=f"{reason}; retry in {delay:.3f}s",""",
          """                move(task, "recover", at=now, actor=actor,
                     set_fields={"attempts": task.attempts - 1},
                     reason=f"{reason}; retry in {delay:.3f}s","""),),
        ("tests/engine/test_dispatcher.py::"
         "test_a_poison_task_that_kills_every_worker_ends_failed_after_max_attempts",),
        promise="crash", ci=False,
    ),
    Mutant(
        "overwrite-succeeded-checkpoint",
        "a failed record may overwrite a succeeded step checkpoint",
        "workflows/rules/states.py",
        (("    StepState.FAILED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED),",
          "    StepState.FAILED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED,\n"
          "                       StepState.SUCCEEDED),"),),
        ("tests/engine/store/test_contract.py::test_a_step_row_only_moves_forward",),
        promise="atomic", ci=False,
    ),
    Mutant(
        "replay-list-drifts",
        "the one-statement replay forgets a replayable state (compensating): a re-trigger "
        "then pays the general path's locks and statements",
        "workflows/engine/store/sql.py",
        (("       AND (state IN ('pending', 'running', 'retrying', 'waiting', 'compensating')",
          "       AND (state IN ('pending', 'running', 'retrying', 'waiting')"),),
        ("tests/engine/test_triggers.py::"
         "test_the_one_statement_replay_takes_exactly_the_replayable_states",),
        promise="replays", ci=False,
    ),
    Mutant(
        "compensate-twice",
        "the compensation phase no longer skips steps already compensated",
        "workflows/engine/run/compensation.py",
        (("            if cp.state not in TO_COMPENSATE or not cp.compensable:",
          "            if not cp.compensable:"),),
        ("tests/windows/test_saga_windows.py::"
         "test_a_retryable_compensation_error_waits_its_backoff_then_any_worker_resumes",
         "tests/windows/test_saga_windows.py::"
         "test_a_crash_while_a_failure_compensates_resumes_the_compensations_not_the_steps"),
        promise="saga", ci=False,
    ),
    Mutant(
        "python-clock",
        "the dispatcher compares against the process clock instead of the database's",
        "workflows/engine/dispatcher.py",
        (("    now = store().db_now()\n    report = DispatchReport(db_now=now)",
          "    now = __import__('django.utils.timezone', fromlist=['now']).now()\n"
          "    report = DispatchReport(db_now=now)"),),
        ("tests/windows/test_database_time.py",),
        promise="time", ci=True,
    ),
    Mutant(
        "signal-escapes-task-run",
        "a worker signal (LeaseLost, CancelRequested) escapes task_run",
        "workflows/engine/run/driver.py",
        (("        except WorkerSignal as signal:  # every path handles its own; never let one "
          "escape\n            self._lost(signal)",
          "        except WorkerSignal:\n            raise"),),
        ("tests/windows/test_isolation.py::test_task_run_returns_normally_whatever_is_raised_"
         "inside_it",),
        promise="isolation", ci=True,
    ),
    # --- the survivors of review turn 3's test audit (M1-M6; M7 with the webhooks) ----
    Mutant(
        "trigger-insert-in-request-order",
        "a batch trigger inserts its new keys in request order, not key order (two batches "
        "sharing keys in opposite orders deadlock; the retry hid it) — audit M1",
        "workflows/engine/store/orm.py",
        (("bulk_create(sorted(tasks, key=lambda t: t.idempotency_key),",
          "bulk_create(list(tasks),"),),
        ("tests/concurrency/test_trigger_races.py::"
         "test_two_batches_of_the_same_keys_in_opposite_orders_interleaved_do_not_deadlock",
         "tests/concurrency/test_trigger_races.py::"
         "test_overlapping_batches_racing_do_not_deadlock_or_duplicate"),
        promise="triggers", ci=True,
    ),
    Mutant(
        "recover-drops-step-progress",
        "the dispatcher's recover also clears the interrupted step's cursor (the next "
        "attempt starts the step over) — audit M2",
        "workflows/engine/store/orm.py",
        (("""            state=StepState.FAILED, error=error, finished_at=at)""",
          """            state=StepState.FAILED, error=error, finished_at=at, progress=None)"""),),
        ("tests/windows/test_crash_windows.py::"
         "test_a_crash_mid_step_resumes_from_the_cursor_it_saved",),
        promise="crash", ci=True,
    ),
    Mutant(
        "atomic-step-reruns-on-transient-error",
        "an atomic step's transaction is run again after a connection error, before asking "
        "whether it committed — audit M3",
        "workflows/engine/run/held.py",
        (("""                if not isinstance(exc, Exception) or isinstance(exc, Interrupted):
                    raise
""",
          """                if not isinstance(exc, Exception) or isinstance(exc, Interrupted):
                    raise
                if isinstance(exc, TRANSIENT) and round_ < 3:
                    continue
"""),),
        ("tests/windows/test_commit_ambiguity.py::"
         "test_a_lost_reply_to_an_atomic_steps_commit_does_not_run_it_again",),
        promise="atomic", ci=True,
    ),
    Mutant(
        "transition-adopts-any-token-plus-one",
        "after a lost reply a worker adopts the task's next version without checking the "
        "change was its own — audit M4",
        "workflows/engine/run/held.py",
        (("if fresh.lease_token == token + 1 and self.last_change_was_ours(name):",
          "if fresh.lease_token == token + 1:"),),
        ("tests/windows/test_lost_replies.py::"
         "test_a_transition_lost_while_the_dispatcher_recovered_the_task_writes_nothing",),
        promise="fence", ci=True,
    ),
    Mutant(
        "cancel-takeover-drops-finished-in-flight-step",
        "the take-over after a cancel records the in-flight step failed even when its body "
        "returned (its effect is never compensated) — audit M5",
        "workflows/engine/run/compensation.py",
        (("""    if in_flight.output is not MISSING:
        return step_rows.succeeded(""",
          """    if False:
        return step_rows.succeeded("""),),
        ("tests/windows/test_saga_windows.py::"
         "test_a_cancel_noticed_at_a_plain_steps_record_compensates_that_step",),
        promise="saga", ci=True,
    ),
    Mutant(
        "claim-slot-without-workflow-lock",
        "the claim counts a workflow's held tasks without its advisory lock (two clients "
        "both take a concurrency=1 workflow's slot) — audit M6, a migration",
        "workflows/migrations/0018_caps_count_undo_work.py",
        (("        PERFORM pg_advisory_xact_lock(1346980914, hashtext(p_workflow));\n", ""),),
        ("tests/engine/test_caps.py::"
         "test_two_claims_for_a_workflows_last_concurrency_slot_are_decided_one_after_the_other",),
        promise="fairness", ci=True,
    ),
    Mutant(
        "schedule-pass-without-row-lock",
        "the scheduler takes a due schedule without locking it (two schedulers fire one "
        "slot) — audit M8",
        "workflows/engine/store/schedules.py",
        (("        return (PilotSchedule.objects.select_for_update(skip_locked=True, "
          "of=(\"self\",))",
          "        return (PilotSchedule.objects"),),
        ("tests/engine/test_schedules.py::"
         "test_a_schedule_locked_by_another_scheduler_is_passed_by_not_waited_for",),
        promise="schedules", ci=True,
    ),
    # --- liveness (issue 26) -----------------------------------------------------------------
    Mutant(
        "resend-only-when-the-fleet-is-idle",
        "a lost message is re-sent only when nobody has claimed anything for "
        "PILOT_REENQUEUE_SECONDS (review F1: a busy fleet strands it)",
        "workflows/engine/dispatcher.py",
        (("""               .exclude(blocked_q(Slots.now(caps()))))
    owners = list(""",
          """               .exclude(blocked_q(Slots.now(caps()))))
    from workflows.models import TaskTransition
    if TaskTransition.objects.filter(transition="claim", at__gte=_stale(now)).exists():
        return
    owners = list("""),),
        ("tests/engine/test_dispatcher.py::"
         "test_a_lost_message_is_resent_while_the_fleet_keeps_claiming_other_work",
         "tests/windows/test_liveness.py::"
         "test_a_lost_message_is_claimed_within_a_period_while_long_runs_keep_coming"),
        promise="liveness", ci=True,
    ),
    Mutant(
        "resends-oldest-overall",
        "the lost-message re-sends of a pass go to the oldest tasks overall (one client's "
        "pile of lost messages keeps every other client's waiting)",
        "workflows/engine/dispatcher.py",
        (("    chosen = [pk for owner_id in owners\n",
          "    chosen = [pk for owner_id in owners[:0]\n"),),
        ("tests/windows/test_liveness.py::"
         "test_one_clients_pile_of_lost_messages_does_not_keep_anothers_waiting",),
        promise="liveness", ci=False,
    ),
    Mutant(
        "claim-reply-not-adopted",
        "after a connection error a claim is simply tried again (review F3: the one that "
        "committed is left running under a lease nobody uses)",
        "workflows/engine/run/driver.py",
        (("""                held = held_by_me(self.store, self.worker, task_id=named, """
          """deadline=deadline)
                if held is not None:
                    return held""",
          """                continue"""),),
        ("tests/windows/test_lost_replies.py::"
         "test_a_claim_whose_reply_was_lost_is_adopted_and_runs_on_that_attempt",),
        promise="liveness", ci=False,
    ),
    Mutant(
        "owed-scan-takes-clients-at-their-cap",
        "the owed-message scan chooses its clients among all that are owed, those at their "
        "cap included (review F7: a client with a free slot beyond the batch waits)",
        "workflows/engine/dispatcher.py",
        (("    free = owed.exclude(blocked_q(slots))\n", "    free = owed\n"),),
        ("tests/windows/test_liveness.py::"
         "test_a_client_with_a_free_slot_is_served_whatever_the_clients_at_their_cap",),
        promise="liveness", ci=False,
    ),
    Mutant(
        "undo-work-uncounted",
        "compensation and cancel phases do not count toward their client's cap (security "
        "N5: one client's slow compensations hold every worker), a migration",
        "workflows/migrations/0018_caps_count_undo_work.py",
        (("""           AND (state = 'running'
                OR (state IN ('compensating', 'cancelling')
                    AND (lease_expires_at > v_now""",
          """           AND (state = 'running'
                OR (false
                    AND (lease_expires_at > v_now"""),),
        ("tests/engine/test_caps.py::test_a_held_compensation_phase_takes_its_clients_slot",
         "tests/engine/test_caps.py::"
         "test_undo_work_waiting_for_a_worker_goes_before_the_clients_new_runs"),
        promise="fairness", ci=False,
    ),
    Mutant(
        "cleanup-process-clock",
        "cleanup judges expiry by the process clock (review F4: a fast host deletes a live "
        "key and the retry runs again)",
        "workflows/engine/cleanup.py",
        (("    now = now or store().db_now()", "    now = now or timezone.now()"),),
        ("tests/windows/test_database_time.py::"
         "test_cleanup_judges_expiry_by_the_databases_clock",),
        promise="time", ci=False,
    ),
    Mutant(
        "webhook-claim-without-row-locks",
        "a webhook sender's claim reads the task and the delivery without locking them "
        "(two senders racing both claim one attempt)",
        "workflows/engine/store/deliveries.py",
        (("        task = Task.objects.select_for_update().filter(pk=task_id).first()\n"
          "        delivery = (WebhookDelivery.objects.select_for_update()"
          ".annotate(pilot_db_now=Now())",
          "        task = Task.objects.filter(pk=task_id).first()\n"
          "        delivery = (WebhookDelivery.objects.annotate(pilot_db_now=Now())"),),
        ("tests/engine/test_deliveries.py::"
         "test_a_second_sender_waits_at_the_row_locks_then_finds_the_attempt_claimed",),
        promise="webhooks", ci=True,
    ),
    Mutant(
        "webhook-slot-without-client-lock",
        "a webhook claim counts its client's attempts in flight without the client's lock "
        "(two claims racing both take the last slot)",
        "workflows/engine/webhook_slots.py",
        (("        _lock_client(delivery.owner_id)\n", ""),),
        ("tests/engine/test_webhook_slots.py::"
         "test_two_claims_for_the_last_slot_are_decided_one_after_the_other",),
        promise="webhooks", ci=False,
    ),
    Mutant(
        "webhook-resend-keeps-the-claim",
        "an operator's re-send leaves the claim token as it was (a slow sender's late outcome "
        "overwrites the re-send)",
        "workflows/engine/store/deliveries.py",
        (("            claim_token=F(\"claim_token\") + 1, resend_owed=True)",
          "            resend_owed=True)"),),
        ("tests/engine/test_deliveries.py::"
         "test_a_resend_moves_the_claim_on_so_a_stale_senders_late_outcome_is_refused",),
        promise="webhooks", ci=False,
    ),    Mutant(
        "stopping-worker-starts-the-next-step",
        "a step that ends while the workers are stopping starts the next step instead of "
        "releasing its task (the stop's grace runs new steps, which the SIGKILL then cuts "
        "off, and the task waits out its lease)",
        "workflows/engine/run/forward.py",
        (("        self.released = following is not None and stopping\n",
          "        self.released = False\n"),),
        ("tests/engine/test_shutdown.py::"
         "test_a_step_done_while_stopping_releases_the_task_and_the_next_run_resumes_after_it",),
        promise="crash", ci=False,
    ),
    Mutant(
        "release-spends-an-attempt",
        "a released task's resumption spends an attempt of its budget (a stop costs the "
        "task an attempt it did not lose)",
        "workflows/models/task.py",
        (("        self._release_lease()\n        self.max_attempts += 1\n"
          "        self.next_attempt_at = now\n        self.enqueued_at = None\n\n"
          "    @transition(field=state, source=S.WAITING, target=S.PENDING)\n",
          "        self._release_lease()\n"
          "        self.next_attempt_at = now\n        self.enqueued_at = None\n\n"
          "    @transition(field=state, source=S.WAITING, target=S.PENDING)\n"),),
        ("tests/engine/test_shutdown.py::"
         "test_a_step_done_while_stopping_releases_the_task_and_the_next_run_resumes_after_it",),
        promise="crash", ci=False,
    ),
    Mutant(
        "children-started-unfenced",
        "a step starts its children without holding the parent's row under its fence (a "
        "worker that lost the task still starts them)",
        "workflows/engine/run/held.py",
        (("                self.fenced(lambda lease: self.store.write_steps(lease, []))  "
          "# holds the row\n", ""),),
        ("tests/windows/test_children_windows.py::"
         "test_a_stale_worker_cannot_start_children_after_its_lease_was_lost",),
        promise="children", ci=True,
    ),
    Mutant(
        "child-ending-settles-nothing",
        "a child's ending does not settle its parent (the parent waits for the dispatcher's "
        "pass, or forever if it is not running)",
        "workflows/engine/announce.py",
        (("        settle_on_commit(move.parent_id, move.actor, step=move.parent_step)\n",
          "        pass\n"),),
        ("tests/windows/test_children_windows.py::"
         "test_the_last_two_children_ending_at_once_wake_their_parent_once",
         "tests/windows/test_children_windows.py::"
         "test_a_child_ending_while_its_parent_parks_waits_for_the_park_and_wakes_it"),
        promise="children", ci=False,
    ),
    Mutant(
        "children-wait-looks-without-the-lock",
        "the children wait reads its children without holding the parent's row (a child "
        "ending between the look and the park is missed: the parent waits forever)",
        "workflows/engine/run/waiting.py",
        (("        held.fenced(lambda lease: held.store.write_steps(lease, []))  "
          "# holds the row\n", ""),),
        ("tests/windows/test_children_windows.py::"
         "test_a_child_ending_while_its_parent_parks_waits_for_the_park_and_wakes_it",),
        promise="children", ci=False,
    ),
    Mutant(
        "settle-ignores-open-children",
        "a settle wakes the parent at the first child's ending, whatever is still open",
        "workflows/engine/announce.py",
        (("    if open_children_of(parent.pk, awaited.get(\"of_step\")).exists():\n"
          "        return False\n", ""),),
        ("tests/engine/test_children.py::"
         "test_a_child_ending_while_others_are_open_leaves_its_parent_parked",),
        promise="children", ci=False,
    ),
)


def export_tree(target: Path) -> None:
    """The committed tree (HEAD) into `target`."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)


def mutated(mutant: Mutant, text: str) -> str:
    """`text` with the mutant's replacements; stops the script when a pattern is not
    found exactly once."""
    for old, new in mutant.replacements:
        found = text.count(old)
        if found != 1:
            raise SystemExit(f"mutant {mutant.name}: pattern found {found} times in "
                             f"{mutant.path} (expected exactly once):\n{old}")
        text = text.replace(old, new)
    return text


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.path
    path.write_text(mutated(mutant, path.read_text()))


FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
LANES = 2  # mutants run side by side, each lane with its own databases and queue


@dataclasses.dataclass(frozen=True)
class Lane:
    """Where one lane's tests run: its own DATABASE_URL database (so its own test
    database, test_<name>) and its own queue."""

    number: int
    base_url: str

    @property
    def name(self) -> str:
        return f"{_database_of(self.base_url)}_mutate{self.number}"

    @property
    def test_database(self) -> str:
        return f"test_{self.name}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PILOT_REQUIRE_POSTGRES": "1",
                "DATABASE_URL": self.base_url.rsplit("/", 1)[0] + f"/{self.name}",
                "PILOT_Q_CLUSTER_NAME": f"pilot-mutate-{self.number}"}


def _database_of(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


def _admin(url: str, *statements: str) -> None:
    """Run statements on the server of `url` (its maintenance database), one by one."""
    import psycopg

    server = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(server.replace("postgres://", "postgresql://", 1),
                         autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def clone(template: str, lane: Lane) -> None:
    """The lane's test database, a fresh copy of `template` (the baseline's)."""
    _admin(lane.base_url, f'DROP DATABASE IF EXISTS "{lane.test_database}" WITH (FORCE)',
           f'CREATE DATABASE "{lane.test_database}" TEMPLATE "{template}"')


def run_tests(tree: Path, tests: tuple[str, ...], *, lane: Lane, log: Path, timeout: float,
              create_db: bool = False) -> tuple[int, list[str], float]:
    """pytest on `tests` in `tree` in `lane`: (exit code, failed node ids, seconds)."""
    started = time.monotonic()
    with open(log, "w") as out:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                 "--reuse-db", *(["--create-db"] if create_db else []), *tests],
                cwd=tree, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                env=lane.env()).returncode
        except subprocess.TimeoutExpired:
            code = -1
    failed = sorted(set(FAILED.findall(log.read_text(errors="replace"))))
    return code, failed, time.monotonic() - started


def verdict_of(code: int, failed: list[str]) -> str:
    if code == 1 and failed:
        return "killed"
    return "SURVIVED" if code == 0 else f"error (exit {code})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run only this mutant (repeatable)")
    parser.add_argument("--ci", action="store_true",
                        help="only the mutants marked ci: one per promise (make test)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds per test run (default 300)")
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = parser.parse_args(argv)
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith("postgres"):
        raise SystemExit("make mutate needs DATABASE_URL=postgres://… (and REDIS_URL=redis://…)")
    if not os.environ.get("REDIS_URL", "").startswith("redis"):
        raise SystemExit("make mutate needs REDIS_URL=redis://…")
    chosen = [m for m in MUTANTS if (not args.only or m.name in args.only)
              and (not args.ci or m.ci)]
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(sorted(unknown))}")
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "workflows", "tests"],
                      cwd=ROOT).returncode != 0:
        print("note: uncommitted changes are not part of the check (it runs on HEAD)",
              file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="pilot-mutate-"))
    logs = work / "logs"
    logs.mkdir()
    lanes = [Lane(n, base_url) for n in range(LANES)]
    template = f"{lanes[0].test_database}_pristine"
    rows: list[tuple[Mutant, str, list[str], float]] = []
    started = time.monotonic()
    try:
        pristine = work / "pristine"
        pristine.mkdir()
        export_tree(pristine)
        for mutant in chosen:  # every pattern applies, before anything runs
            mutated(mutant, (pristine / mutant.path).read_text())
        selection = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        print(f"baseline: {len(selection)} test selection(s) on the unmutated tree ...",
              flush=True)
        code, failed, took = run_tests(pristine, selection, lane=lanes[0], create_db=True,
                                       log=logs / "baseline.log", timeout=args.timeout * 2)
        if code != 0:
            print((logs / "baseline.log").read_text(errors="replace")[-5000:])
            raise SystemExit(f"the selection fails without any mutant (exit {code}): "
                             f"{failed}; nothing can be concluded")
        print(f"baseline passed in {took:.0f} s", flush=True)
        _admin(base_url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)',
               f'CREATE DATABASE "{template}" TEMPLATE "{lanes[0].test_database}"')

        def one(mutant: Mutant, lane: Lane) -> tuple[Mutant, str, list[str], float]:
            tree = work / mutant.name
            shutil.copytree(pristine, tree, symlinks=True)
            apply(mutant, tree)
            if not mutant.migration:
                clone(template, lane)
            code, failed, took = run_tests(tree, mutant.tests, lane=lane,
                                           create_db=mutant.migration,
                                           log=logs / f"{mutant.name}.log",
                                           timeout=args.timeout)
            shutil.rmtree(tree)
            verdict = verdict_of(code, failed)
            if verdict.startswith("error"):
                print((logs / f"{mutant.name}.log").read_text(errors="replace")[-3000:])
            print(f"  {mutant.name}: {verdict} in {took:.0f} s", flush=True)
            return mutant, verdict, failed, took

        import queue
        import threading

        todo: queue.Queue[Mutant] = queue.Queue()
        for mutant in chosen:
            todo.put(mutant)

        def lane_loop(lane: Lane) -> None:
            while True:
                try:
                    mutant = todo.get_nowait()
                except queue.Empty:
                    return
                rows.append(one(mutant, lane))

        threads = [threading.Thread(target=lane_loop, args=(lane,)) for lane in lanes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for lane in lanes:
            _admin(base_url, f'DROP DATABASE IF EXISTS "{lane.test_database}" WITH (FORCE)')
        _admin(base_url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
        if args.keep:
            print(f"logs kept in {logs}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    order = {m.name: i for i, m in enumerate(MUTANTS)}
    rows.sort(key=lambda row: order[row[0].name])
    print("\n| promise | mutant | bug | killed? | caught by |\n|---|---|---|---|---|")
    for mutant, verdict, failed, took in rows:
        caught = "<br>".join(f"`{f}`" for f in failed[:4]) or "—"
        if len(failed) > 4:
            caught += f"<br>and {len(failed) - 4} more"
        print(f"| {mutant.promise} | `{mutant.name}`{' (ci)' if mutant.ci else ''} | "
              f"{mutant.bug} ({mutant.path}) | {verdict} ({took:.0f} s) | {caught} |")
    survived = sum(verdict == "SURVIVED" for _, verdict, _, _ in rows)
    broken = any(verdict.startswith("error") for _, verdict, _, _ in rows)
    print(f"\n{len(rows)} mutants in {time.monotonic() - started:.0f} s: "
          f"{sum(v == 'killed' for _, v, _, _ in rows)} killed, {survived} survived")
    return 1 if survived or broken or len(rows) != len(chosen) else 0


if __name__ == "__main__":
    sys.exit(main())
