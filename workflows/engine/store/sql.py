"""PILOT's hot statements on PostgreSQL, one per verb, each complete in one round
trip (docs/design.md, "The store"), composed from named fragments: each rule —
the fence, the lease's end, the claim, the audit row, the caps' choice, the step
rows, the outbox row — is written once, here, as a constant or a function that
returns its text, and each statement is that composition (no text is spliced
into another by name). Parameters are named (%(name)s). Every time is the
database's own (statement_timestamp()); every worker write names the exact
lease token it holds.

The portable store (orm.py) does the same with Django's ORM; the contract suite
(tests/engine/store/) runs both and compares the rows they leave. postgres.py
runs these, prepared once per connection.
"""

from __future__ import annotations

import functools

from workflows.engine.store.orm import UPSERT_GUARD, UPSERT_ON_CONFLICT, UPSERT_SET

# --- the rules, each once -------------------------------------------------------------------

# The fence: the task is still ours — the one predicate every worker write names.
FENCED = "id = %(task_id)s AND lease_token = %(token)s"

# The end of a lease taken or extended now.
LEASE_END = "statement_timestamp() + make_interval(secs => %(lease_seconds)s)"

# A claim's "due and claimable": pending, or retrying with its backoff elapsed,
# with an attempt left. The time test is on an expression, not the column, so the
# queue is read in claim order from pilot_task_claim_idx (priority DESC,
# next_attempt_at) and the scan stops at the first due, free row. On the column,
# the planner multiplies the selectivity of the state by that of next_attempt_at
# (set only on the active set, so the two are one condition), expects two due
# rows, and reads every due task from pilot_task_due_idx to sort them: 1.7 ms at
# 2 000 due, growing with the backlog, against 0.05 ms (bench/results.md, 12).
DUE = ("state IN ('pending', 'retrying')\n"
       "       AND next_attempt_at + interval '0' <= statement_timestamp()\n"
       "       AND attempts < max_attempts")

# What every returned task row carries besides its columns.
RETURNED = ("RETURNING t.*, prior.state AS pilot_from_state, "
            "prior.enqueued_at AS pilot_enqueued_at,\n"
            "              statement_timestamp() AS pilot_db_now")


def audit(source: str, transition: str, from_state: str, to_state: str, actor: str,
          reason: str, *, name: str = "audit", at: str = "statement_timestamp()",
          returning: bool = False) -> str:
    """The audit row of a change (TaskTransition), one per task row of `source`."""
    back = "\n    RETURNING id" if returning else ""
    return f"""{name} AS (
    INSERT INTO workflows_tasktransition (task_id, transition, from_state, to_state, actor,
                                          reason, at)
    SELECT id, {transition}, {from_state}, {to_state}, {actor}, {reason}, {at}
      FROM {source}{back}
)"""


def claimed(sources: str, condition: str) -> str:
    """The claim of the `prior` row: running, attempts + 1, a new token, this
    worker's lease; where `condition` (the caps' decision) holds."""
    return f"""claimed AS (
    UPDATE workflows_task AS t
       SET state = 'running', attempts = t.attempts + 1, lease_token = t.lease_token + 1,
           lease_owner = %(worker)s,
           lease_expires_at = {LEASE_END},
           next_attempt_at = NULL, enqueued_at = NULL,
           started_at = COALESCE(t.started_at, statement_timestamp()),
           updated_at = statement_timestamp()
      FROM {sources}
     WHERE t.id = prior.id AND {condition}
    {RETURNED}
)"""


def claim_audit(actor: str, *, name: str = "audit") -> str:
    return audit("claimed", "'claim'", "pilot_from_state", "'running'", actor,
                 "'attempt ' || attempts || ' of ' || max_attempts", name=name)


def resumed(sources: str, condition: str) -> str:
    """A take-over of the compensation phase: a new token, this worker's lease."""
    return f"""resumed AS (
    UPDATE workflows_task AS t
       SET lease_token = t.lease_token + 1, lease_owner = %(worker)s,
           lease_expires_at = {LEASE_END},
           next_attempt_at = NULL, enqueued_at = NULL, updated_at = statement_timestamp()
      FROM {sources}
     WHERE {condition}
    {RETURNED}
)"""


def resume_audit(reason: str) -> str:
    return audit("resumed", "'resume'", "pilot_from_state", "pilot_from_state", "%(actor)s",
                 reason)


# The exact cap check of one claim (pilot_claim_slot_v2, migration 0018): its
# decision, under the client's and the workflow's locks; over a cap, the task
# keeps waiting and is marked as owed a message (enqueued_at NULL: this one is
# consumed).
def slot_free(row: str = "", *, undo: bool = False) -> str:
    """The exact check for the task `row` (a table alias and a dot, or none)."""
    undoing = "true" if undo else "false"
    return f"pilot_claim_slot_v2({row}owner_id, {row}workflow, %(caps)s::jsonb, {undoing})"


def slot_decided(undo: bool) -> str:
    return f"""slot AS (
    SELECT id, {slot_free(undo=undo)} AS free
      FROM prior
), deferred AS (
    UPDATE workflows_task AS t SET enqueued_at = NULL
      FROM slot
     WHERE t.id = slot.id AND NOT slot.free AND t.enqueued_at IS NOT NULL
)"""


SLOT_FREE = slot_free("prior.")

# The caps' choice for the queue (caps.py): the clients' cap groups and the
# workflows at their caps for a new run, from the tasks as this statement sees
# them — held (running, or a compensation phase under a live lease) and, for
# the clients' groups, undo work waiting for a worker; a task the same
# statement is finishing, %(task_id)s, no longer counts. A choice, not the
# decision: pilot_claim_slot_v2 decides under its locks. No caps (NULL):
# nothing is blocked, and the tasks are not even read.
BLOCKED = """running AS (
    SELECT owner_id, workflow,
           CASE WHEN jsonb_exists(%(caps)s::jsonb -> 'own', workflow) THEN workflow ELSE ''
           END AS grp,
           state = 'running' OR lease_expires_at > statement_timestamp() AS held
      FROM workflows_task
     WHERE %(caps)s::jsonb IS NOT NULL AND id IS DISTINCT FROM %(task_id)s
       AND (state = 'running'
            OR (state IN ('compensating', 'cancelling')
                AND (lease_expires_at > statement_timestamp() OR next_attempt_at IS NULL
                     OR next_attempt_at <= statement_timestamp())))
), blocked_groups AS (
    SELECT owner_id, grp FROM running GROUP BY owner_id, grp
    HAVING count(*) >= COALESCE(NULLIF(
        CASE WHEN grp = '' THEN (%(caps)s::jsonb ->> 'client')::integer
             ELSE (%(caps)s::jsonb -> 'own' ->> grp)::integer END, 0), 2147483647)
), blocked_workflows AS (
    SELECT workflow FROM running WHERE held GROUP BY workflow
    HAVING count(*) >= COALESCE(NULLIF((%(caps)s::jsonb -> 'total' ->> workflow)::integer, 0),
                                2147483647)
),"""

# The candidates' filter against BLOCKED: two arrays computed once (InitPlans)
# and tested per candidate as a plain filter, so the candidates are still read
# in claim order from pilot_task_claim_idx and the scan stops at the first free one (an
# anti-join sorted every due task first: 20 ms at 5 000 due). Both sides are
# expressions, not columns: the column's statistics (one workflow in every row)
# made the planner expect the filter to drop every row and sort instead.
UNBLOCKED = """AND c.owner_id::text || ':'
    || CASE WHEN jsonb_exists(%(caps)s::jsonb -> 'own', c.workflow) THEN c.workflow ELSE '' END
    <> ALL (ARRAY(SELECT owner_id::text || ':' || grp FROM blocked_groups))
AND c.workflow::text || '' <> ALL (ARRAY(SELECT workflow FROM blocked_workflows))"""


def next_due(*, after: str = "") -> str:
    """The queue's next due task, skipping rows other claims hold and tasks whose
    client or workflow is at its cap (BLOCKED, as of this statement's
    snapshot); `after`: a condition it waits for (the finishing write)."""
    return f"""{BLOCKED} prior AS (
    SELECT id, state, enqueued_at, owner_id, workflow FROM workflows_task AS c
     WHERE {after}{DUE}
       {UNBLOCKED}
     ORDER BY priority DESC, next_attempt_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
)"""


# The webhook outbox row of an ending: due now, its message counted as sent
# (the engine enqueues it on commit; the dispatcher sends it again if that is
# lost), given up after give_up_seconds, with the task's owner and traceparent
# (a delivery outlives its task: docs/webhooks.md), read from the task's row as
# this statement sees it (neither changes in a transition). Unique per (task,
# state, restarts). %(deliver)s is true only for an ending of a task with an
# endpoint: a one-time filter, nothing to do for every other transition.
DELIVER = """deliver AS (
    INSERT INTO workflows_webhookdelivery
           (task_id, owner_id, traceparent, task_state, restarts, url, state, attempts,
            last_error, attempt_log, claim_token, claimed_by, next_attempt_at, enqueued_at,
            give_up_at, created_at)
    SELECT t.id, t.owner_id, t.traceparent, %(to_state)s, %(restarts)s, %(callback_url)s,
           'pending', 0, '', '[]'::jsonb, 0, '', statement_timestamp(), statement_timestamp(),
           statement_timestamp() + make_interval(secs => %(give_up_seconds)s),
           statement_timestamp()
      FROM changed JOIN workflows_task AS t ON t.id = changed.id
     WHERE %(deliver)s
    ON CONFLICT (task_id, task_state, restarts) DO NOTHING
)"""


def step_rows(source: str) -> str:
    """The rows of the %(steps)s JSON array, written for the task of `source`
    (the fence: the task's row, there only while it carries the token). Those
    already stored are moved forward by a plain UPDATE (the portable upsert's
    SET and WHERE, so a succeeded step is never downgraded); only the others go
    through the upsert. One upsert for all would do the same, but for a row that
    exists it first locks it, a WAL record of its own (a step's finish rewrites
    the row its start inserted: ~54 bytes a step, bench/results.md section 3d).
    The upsert stays for the new rows: a row a writer with our token inserted
    but had not committed when this statement began (our own earlier try of
    this write, still running on a connection we lost) is then updated, not a
    unique violation. The task's stored indexes are read once through its
    (task, index) key: a NOT EXISTS there was planned as a hash anti-join over
    the whole table."""
    return f"""step_rows AS (
    SELECT {source}.id AS task_id, v.*
      FROM {source},
           jsonb_to_recordset(%(steps)s::jsonb)
               AS v("index" int, name text, state text, output jsonb, attempts int,
                    compensable bool, compensation_attempts int, error text,
                    started_at timestamptz, finished_at timestamptz, failures jsonb)
), steps_updated AS (
    UPDATE workflows_stepcheckpoint SET {UPSERT_SET}
      FROM step_rows AS excluded
     WHERE workflows_stepcheckpoint.task_id = (SELECT id FROM {source})
       AND workflows_stepcheckpoint.task_id = excluded.task_id
       AND workflows_stepcheckpoint."index" = excluded."index"
       AND ({UPSERT_GUARD})
), steps_inserted AS (
    INSERT INTO workflows_stepcheckpoint
           (task_id, "index", name, state, output, attempts, compensable,
            compensation_attempts, error, started_at, finished_at, failures)
    SELECT n.task_id, n."index", n.name, n.state, n.output, n.attempts, n.compensable,
           n.compensation_attempts, n.error, n.started_at, n.finished_at,
           COALESCE(n.failures, '[]'::jsonb)
      FROM step_rows AS n
     WHERE n."index" <> ALL (ARRAY(SELECT s."index" FROM workflows_stepcheckpoint AS s
                                   WHERE s.task_id = (SELECT id FROM {source})))
    {UPSERT_ON_CONFLICT}
)"""


def changed(sets: str) -> str:
    """A transition django-fsm applied in memory: `sets`, its diff (the columns
    it changed), written only where the task still carries the token it was
    read with."""
    return f"""changed AS (
    UPDATE workflows_task SET {sets}
     WHERE {FENCED}
    RETURNING id
)"""


TRANSITION_AUDIT = audit("changed", "%(transition)s", "%(from_state)s", "%(to_state)s",
                         "%(actor)s", "%(reason)s", at="%(at)s", returning=True)


# --- the statements -------------------------------------------------------------------------

STATEMENTS: dict[str, str] = {
    "db_now": "SELECT statement_timestamp()",

    # Tasks the caller holds and has decided may go (cleanup, an expired key's
    # re-trigger), their deliveries already seen to (DeliveryStore.outlive): the
    # steps, transitions, replays, signals and the tasks in one statement, each
    # child table reached through its task_id index (issue 34: a batch of 1 000
    # cost six round trips and 1 000-literal IN lists before). The foreign keys'
    # checks (deferred) run at commit and find no child left.
    "delete_tasks": """WITH steps AS (
    DELETE FROM workflows_stepcheckpoint WHERE task_id = ANY(%(ids)s::uuid[])
), transitions AS (
    DELETE FROM workflows_tasktransition WHERE task_id = ANY(%(ids)s::uuid[])
), replays AS (
    DELETE FROM workflows_taskreplay WHERE task_id = ANY(%(ids)s::uuid[])
), signals AS (
    DELETE FROM workflows_tasksignal WHERE task_id = ANY(%(ids)s::uuid[])
), tasks AS (
    DELETE FROM workflows_task WHERE id = ANY(%(ids)s::uuid[]) RETURNING 1
)
SELECT count(*) FROM tasks""",

    # The candidate row is locked first, so a racing claim waits and then finds
    # it no longer claimable (the WHERE is re-checked on the row it locks: due by
    # the clock then — clock_timestamp(), not this statement's start —, so a
    # claim that waited for a retry's lock finds the retried task due); then
    # the caps decide. No row back: nothing claimed.
    "claim": f"""WITH prior AS (
    SELECT id, state, enqueued_at, owner_id, workflow FROM workflows_task
     WHERE id = %(task_id)s AND attempts < max_attempts AND state IN ('pending', 'retrying')
       AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
       FOR UPDATE
), {slot_decided(False)}, {claimed("prior, slot", "slot.free")}, {claim_audit("%(actor)s")}
SELECT * FROM claimed""",

    # The queue: the next due task, the highest priority first, then in due
    # order (next_attempt_at: a pending task's is its trigger time or its
    # run_after), claimed like `claim` after the exact check.
    "claim_next": f"""WITH {next_due()}, {claimed("prior", SLOT_FREE)}, {claim_audit("%(actor)s")}
SELECT * FROM claimed""",

    # compensating or cancelling, no live lease, no backoff pending: the phase
    # taken over under a new token; undo work counts toward its client's cap.
    "resume": f"""WITH prior AS (
    SELECT id, state, enqueued_at, owner_id, workflow FROM workflows_task
     WHERE id = %(task_id)s AND state IN ('compensating', 'cancelling')
       AND (lease_expires_at IS NULL OR lease_expires_at < statement_timestamp())
       AND (next_attempt_at IS NULL OR next_attempt_at <= statement_timestamp())
       FOR UPDATE
), {slot_decided(True)}, {resumed("prior, slot", "t.id = prior.id AND slot.free")}, {
        resume_audit("'took the compensations over'")}
SELECT * FROM resumed""",

    # The worker whose running attempt held %(token)s takes the cancel of that
    # very attempt over: only if the cancel is the one change since (cancelling,
    # token + 1).
    "resume_after_cancel": f"""WITH prior AS (
    SELECT id, state, enqueued_at FROM workflows_task
     WHERE id = %(task_id)s AND state = 'cancelling' AND lease_token = %(token)s + 1
       FOR UPDATE
), {resumed("prior", "t.id = prior.id")}, {
        resume_audit("'its running attempt was cancelled: compensating it'")}
SELECT * FROM resumed""",

    # Fence (hold the task row FOR SHARE if it still carries our token: a cancel
    # waits for this write instead of slipping under it), then write the step
    # rows. "fenced" is false when the token is no longer the task's; then
    # nothing was written.
    "write_steps": f"""WITH fence AS (
    SELECT id FROM workflows_task
     WHERE {FENCED}
       FOR SHARE
), {step_rows("fence")}
SELECT EXISTS (SELECT FROM fence) AS fenced""",

    # write_steps that also extends the lease.
    "write_steps_renew": f"""WITH fence AS (
    UPDATE workflows_task
       SET lease_expires_at = {LEASE_END}
     WHERE {FENCED}
    RETURNING id
), {step_rows("fence")}
SELECT EXISTS (SELECT FROM fence) AS fenced""",

    # A heartbeat: extend the lease if the task still carries our token.
    "renew": f"""UPDATE workflows_task
   SET lease_expires_at = {LEASE_END}
 WHERE {FENCED}
RETURNING id""",

    # The read-only fence.
    "check": f"SELECT id FROM workflows_task WHERE {FENCED}",

    # A step's cursor, fenced like every other write.
    "save_progress": f"""WITH fence AS (
    SELECT id FROM workflows_task
     WHERE {FENCED}
       FOR SHARE
), saved AS (
    UPDATE workflows_stepcheckpoint AS s SET progress = %(progress)s::jsonb
      FROM fence
     WHERE s.task_id = fence.id AND s."index" = %(index)s
    RETURNING 1
)
SELECT EXISTS (SELECT FROM fence) AS fenced""",

    # Why a fenced write was refused: the task's state and token now.
    "task_version": "SELECT state, lease_token FROM workflows_task WHERE id = %(task_id)s",

    # A trigger, new key or replay, in one statement. `created`: insert the
    # pending task unless (owner, key) exists; the unique constraint arbitrates
    # between concurrent triggers. Its times are the database's. Its endpoint is
    # the trigger's callback_url, else the owner's default endpoint (a
    # primary-key probe in this statement), else none. Its idempotency TTL is its
    # workflow's now, fixed for its life. `rep`, only when nothing was inserted:
    # the task of that key if this is the same request in a state that replays
    # (REPLAYABLE_STATES, a success while unexpired) — logged as a replay
    # (append-only: the task row, which its worker fences on, is not written) and
    # returned with its steps and its replay count. FOR KEY SHARE: a cleanup
    # deleting this task either committed first (nothing replays here, the
    # general path makes a fresh task) or waits for this statement's commit (its
    # SKIP LOCKED passes this row by), so the replay's log row never points at a
    # task deleted under it. One row back: pilot_created_at set (created), or the
    # task's columns (replayed), or neither — the general path decides (an
    # expired key, a failed task to restart, cancelled, another request; or a row
    # another trigger inserted after this statement began).
    "create_or_replay": """WITH created AS (
    INSERT INTO workflows_task
           (id, owner_id, idempotency_key, workflow, payload, fingerprint, state, error,
            error_type, attempts, max_attempts, lease_token, lease_owner, source,
            trace_id, traceparent, callback_url, restarts, idempotency_ttl, priority,
            version, parent_id, parent_step, parent_index, children_count,
            created_at, updated_at, enqueued_at, next_attempt_at)
    VALUES (%(id)s, %(owner_id)s, %(key)s, %(workflow)s, %(payload)s::jsonb, %(fingerprint)s,
            'pending', '', '', 0, %(max_attempts)s, 0, '', %(source)s, %(trace_id)s,
            %(traceparent)s,
            COALESCE(NULLIF(%(callback_url)s, ''),
                     (SELECT url FROM workflows_clientwebhook WHERE owner_id = %(owner_id)s),
                     ''),
            0, %(idempotency_ttl)s, %(priority)s,
            %(version)s, %(parent_id)s, %(parent_step)s, %(parent_index)s, 0,
            statement_timestamp(), statement_timestamp(),
            statement_timestamp(), statement_timestamp())
    ON CONFLICT (owner_id, idempotency_key) DO NOTHING
    RETURNING created_at, callback_url
), rep AS (
    SELECT * FROM workflows_task
     WHERE NOT EXISTS (SELECT FROM created)
       AND owner_id = %(owner_id)s AND idempotency_key = %(key)s
       AND fingerprint = %(fingerprint)s
       AND (state IN ('pending', 'running', 'retrying', 'waiting', 'compensating')
            OR (state = 'succeeded'
                AND (expires_at IS NULL OR expires_at > statement_timestamp())))
       FOR KEY SHARE
), logged AS (
    INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
    SELECT id, workflow, 1, statement_timestamp() FROM rep
)
SELECT (SELECT created_at FROM created) AS pilot_created_at,
       (SELECT callback_url FROM created) AS pilot_created_callback_url,
       rep.*,
       (SELECT json_agg(json_build_object(
                   'index', s."index", 'name', s.name, 'state', s.state,
                   'attempts', s.attempts, 'output', s.output, 'error', s.error,
                   'started_at', s.started_at, 'finished_at', s.finished_at)
                ORDER BY s."index")
          FROM workflows_stepcheckpoint s WHERE s.task_id = rep.id) AS pilot_steps,
       1 + (SELECT COALESCE(sum(r.count), 0) FROM workflows_taskreplay r
             WHERE r.task_id = rep.id) AS pilot_replays,
       statement_timestamp() AS pilot_last_replayed_at
  FROM (SELECT 1) AS one LEFT JOIN rep ON true""",

    # The replay log's fold (replays.py), a batch in one statement: up to
    # %(batch)s (task, UTC hour) groups of more than one row at or after
    # %(since)s ('-infinity': the whole log), read in (task, hour) order so that
    # the scan stops at the batch; of each group, the rows this folder can lock
    # (SKIP LOCKED: another folder's are its own), the newest kept with their
    # summed count (an UPDATE, never an INSERT: a cleanup deleting the task
    # meanwhile waits for these locks and then deletes the kept row too), the
    # others deleted. Returns the groups folded, the rows removed and the groups
    # found.
    "fold_replays": """WITH found AS (
    SELECT task_id, date_trunc('hour', at, 'UTC') AS hour
      FROM workflows_taskreplay
     WHERE at >= %(since)s
     GROUP BY 1, 2
    HAVING count(*) > 1
     ORDER BY 1, 2
     LIMIT %(batch)s
), locked AS (
    SELECT r.id, r.task_id, r.count, r.at, found.hour
      FROM workflows_taskreplay AS r
      JOIN found ON r.task_id = found.task_id
                AND r.at >= found.hour AND r.at < found.hour + interval '1 hour'
       FOR UPDATE OF r SKIP LOCKED
), ranked AS (
    SELECT id, row_number() OVER newest AS place, count(*) OVER whole AS members,
           sum(count) OVER whole AS total
      FROM locked
    WINDOW whole AS (PARTITION BY task_id, hour),
           newest AS (PARTITION BY task_id, hour ORDER BY at DESC, id DESC)
), kept AS (
    UPDATE workflows_taskreplay AS r SET count = ranked.total
      FROM ranked
     WHERE r.id = ranked.id AND ranked.place = 1 AND ranked.members > 1
    RETURNING 1
), removed AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place > 1
    RETURNING 1
)
SELECT (SELECT count(*) FROM kept), (SELECT count(*) FROM removed), (SELECT count(*) FROM found)""",
}


@functools.lru_cache(maxsize=512)
def transition_statement(sets: str, *, with_steps: bool, then_claim: bool) -> str:
    """Persist a transition: its diff (`sets`) where the task still carries the
    token, the audit row with it or not at all, the step rows when `with_steps`
    (a step's success with the task's, a failed step with its retry), the
    outbox row of an ending (DELIVER), and — `then_claim`, a worker's last step
    — the claim of the next due task for the same worker, in one statement: a
    run costs one round trip at its end instead of two. No row back (or, with
    the claim, pilot_audit NULL): the task changed since it was read
    (ConcurrentTransition); with the claim and none due, its columns NULL."""
    parts = [changed(sets), TRANSITION_AUDIT]
    if with_steps:
        parts.append(step_rows("changed"))
    parts.append(DELIVER)
    if not then_claim:
        return "WITH " + ", ".join(parts) + "\nSELECT id FROM audit"
    parts += [next_due(after="EXISTS (SELECT FROM changed)\n       AND "),
              claimed("prior", SLOT_FREE), claim_audit("%(claim_actor)s", name="claim_audit")]
    return ("WITH " + ", ".join(parts)
            + "\nSELECT (SELECT id FROM audit) AS pilot_audit, claimed.*\n"
              "  FROM (SELECT 1) AS one LEFT JOIN claimed ON true")


__all__ = ["STATEMENTS", "transition_statement"]
