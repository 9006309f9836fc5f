"""A day of retained history, generated in the database (issue 34): the scale
study's generator (review 3's scale-fill.sql, reports/scale.md; webhook rows
now carry their owner), run
through Django's connection so that `make bench-scale` and the plan test
(tests/admin/test_plans.py) fill the same rows.

Deterministic in i: task id md5('scale-task-'||i)::uuid; 20 owners
(scale-client-01..20); workflows demo.echo 40 %, demo.sync_orders 30 %,
demo.flaky 15 %, demo.slow 10 %, demo.saga 5 %; keys `ord-<9 digits>`; payloads
of ~190 B with their real fingerprint (so they replay). All but the newest 3 000
are finished (93 % succeeded, 5 % failed, 2 % cancelled), each with 3 steps, 4
transitions, 1 in 10 a replay row, 1 in 20 a delivered webhook; the newest 3 000
are 2 000 pending (due), 500 retrying (in backoff), 500 running (20 past their
lease). created_at rises with i: the oldest 10 % were created 26 h 40 min to
24 h 1 min before `anchor` and are expired (what cleanup deletes), the rest in
the last 23 h. PostgreSQL only; n must exceed 3 000.

With `rebuild_indexes`, the secondary indexes and unique constraints of the five
tables are dropped for the load and rebuilt from their own definitions (as
migrated) afterwards, and FK triggers are off while loading (the rows are
consistent by construction): 10 M tasks then fill in about 15 min.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import connection

TABLES = ("workflows_task", "workflows_stepcheckpoint", "workflows_tasktransition",
          "workflows_taskreplay", "workflows_webhookdelivery")

# The study's statements, `:n` and `:anchor` as parameters; {users} is the user table.
GENERATE = """
-- One row per i with every derived choice; a view so each INSERT reads it afresh.
CREATE TEMP VIEW gen AS
SELECT i, md5('scale-task-' || i)::uuid AS id,
       (SELECT array_agg(id ORDER BY username) FROM {users}
         WHERE username LIKE 'scale-client-%%')[1 + (i * 40503) %% 20] AS owner_id,
       CASE WHEN i <= %(n)s - 3000 THEN
                CASE WHEN h < 930 THEN 'succeeded' WHEN h < 980 THEN 'failed'
                     ELSE 'cancelled' END
            WHEN i <= %(n)s - 1000 THEN 'pending'
            WHEN i <= %(n)s - 500 THEN 'retrying'
            ELSE 'running' END AS state,
       CASE WHEN w < 40 THEN 'demo.echo' WHEN w < 70 THEN 'demo.sync_orders'
            WHEN w < 85 THEN 'demo.flaky' WHEN w < 95 THEN 'demo.slow'
            ELSE 'demo.saga' END AS workflow,
       CASE WHEN i <= %(n)s / 10
            THEN %(anchor)s::timestamptz - interval '26 hours 40 minutes'
                 + (i::float8 / (%(n)s / 10)) * interval '2 hours 39 minutes'
            ELSE %(anchor)s::timestamptz - interval '23 hours'
                 + ((i - %(n)s / 10)::float8 / (%(n)s - %(n)s / 10)) * interval '23 hours'
       END AS t,
       h, (i * 2246822519) %% 10 AS r, (i * 3266489917) %% 20 AS cb
  FROM (SELECT i, (i * 2654435761) %% 1000 AS h, (i * 2654435789) %% 100 AS w
          FROM generate_series(1::bigint, %(n)s) AS i) AS s;

INSERT INTO workflows_task (id, owner_id, idempotency_key, workflow, payload, fingerprint,
       state, result, error, error_type, attempts, max_attempts, next_attempt_at, lease_token,
       lease_owner, lease_expires_at, source, trace_id, created_at, updated_at, enqueued_at,
       started_at, finished_at, expires_at, callback_url, restarts, traceparent,
       idempotency_ttl)
SELECT id, owner_id, 'ord-' || lpad(i::text, 9, '0'), workflow, canon::jsonb,
       encode(sha256(convert_to('{"payload":' || canon || ',"workflow":"' || workflow || '"}',
                                'UTF8')), 'hex'),
       state,
       CASE WHEN state = 'succeeded' THEN jsonb_build_object('rows', h, 'status', 'ok') END,
       CASE WHEN state IN ('failed', 'retrying')
            THEN 'RetryableError: upstream said no to order ' || i ELSE '' END,
       CASE WHEN state IN ('failed', 'retrying') THEN 'RetryableError' ELSE '' END,
       CASE state WHEN 'pending' THEN 0 WHEN 'retrying' THEN 1 WHEN 'running' THEN 1 ELSE 2 END,
       3,
       CASE state WHEN 'pending' THEN t WHEN 'retrying' THEN %(anchor)s::timestamptz
                                                            + interval '2 hours' END,
       CASE state WHEN 'pending' THEN 0 WHEN 'retrying' THEN 2 WHEN 'running' THEN 1 ELSE 4 END,
       CASE WHEN state = 'running' THEN 'scale-host:' || (i %% 8) ELSE '' END,
       CASE WHEN state = 'running'
            THEN %(anchor)s::timestamptz + CASE WHEN i %% 25 = 0 THEN interval '-30 s'
                                             ELSE interval '6 hours' END END,
       'api', md5('trace' || i),
       t, t + interval '3 s',
       CASE WHEN state = 'pending' THEN t END,
       CASE WHEN state <> 'pending' THEN t + interval '50 ms' END,
       CASE WHEN state IN ('succeeded', 'failed', 'cancelled') THEN t + interval '3 s' END,
       CASE WHEN state IN ('succeeded', 'failed', 'cancelled')
            THEN t + interval '3 s' + interval '1 day' END,
       CASE WHEN cb = 0 THEN 'https://hooks.example.com/pilot' ELSE '' END,
       0, '', interval '1 day'
  FROM (SELECT g.*, '{"note":"' || substr(repeat(md5(i::text), 5), 1, 150) || '","oref":' || i
                    || ',"user":"cust-' || (i %% 5000) || '"}' AS canon FROM gen g) AS x;

INSERT INTO workflows_stepcheckpoint (task_id, "index", name, state, output, progress, attempts,
       error, started_at, finished_at, compensable, compensation_attempts)
SELECT g.id, k, 'step' || k,
       CASE WHEN g.state = 'succeeded' OR k = 0 THEN 'succeeded'
            WHEN g.state = 'failed' AND k = 1 THEN 'failed'
            WHEN g.state = 'running' AND k = 1 THEN 'running'
            ELSE 'pending' END,
       CASE WHEN g.state = 'succeeded' OR k = 0
            THEN jsonb_build_object('rows', k * 10, 'cursor', md5(g.i::text || k)) END,
       NULL, CASE WHEN k = 1 AND g.state NOT IN ('pending', 'running') THEN 2 ELSE 1 END,
       CASE WHEN g.state = 'failed' AND k = 1 THEN 'RetryableError: upstream said no' ELSE '' END,
       g.t + k * interval '1 s',
       CASE WHEN g.state = 'succeeded' OR k = 0 THEN g.t + (k + 1) * interval '1 s' END,
       false, 0
  FROM gen g, generate_series(0, 2) AS k
 WHERE g.state IN ('succeeded', 'failed', 'cancelled')
    OR (g.state = 'running' AND k <= 1) OR (g.state = 'retrying' AND k <= 1);

INSERT INTO workflows_tasktransition (task_id, transition, from_state, to_state, actor, reason,
       at)
SELECT g.id,
       (ARRAY['claim', 'schedule_retry', 'claim',
              CASE g.state WHEN 'succeeded' THEN 'succeed' WHEN 'failed' THEN 'fail'
                           ELSE 'cancel' END])[k],
       (ARRAY['pending', 'running', 'retrying', 'running'])[k],
       (ARRAY['running', 'retrying', 'running', g.state])[k],
       'worker:scale-host:' || (g.i %% 8) || ':' || (1000 + g.i %% 16),
       (ARRAY['attempt 1 of 3', 'RetryableError; retry in 0.4s', 'attempt 2 of 3', ''])[k],
       g.t + (k - 1) * interval '700 ms'
  FROM gen g, generate_series(1, 4) AS k
 WHERE g.state IN ('succeeded', 'failed', 'cancelled')
    OR (g.state = 'running' AND k = 1) OR (g.state = 'retrying' AND k <= 2);

INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
SELECT id, workflow, 1, t + interval '2 s' FROM gen WHERE r = 0;

INSERT INTO workflows_webhookdelivery (task_id, owner_id, task_state, restarts, url, state,
       attempts,
       last_status, last_error, attempt_log, body, claim_token, claimed_by, claimed_until,
       next_attempt_at, enqueued_at, give_up_at, created_at, last_attempt_at, delivered_at)
SELECT id, owner_id, state, 0, 'https://hooks.example.com/pilot', 'delivered', 1, 200, '',
       jsonb_build_array(jsonb_build_object('at', t + interval '4 s', 'status', 200)),
       '{"type":"task.' || state || '","task":"' || id || '"}', 1, '', NULL,
       t + interval '3 s', NULL, t + interval '1 day', t + interval '3 s', t + interval '4 s',
       t + interval '4 s'
  FROM gen WHERE cb = 0 AND state IN ('succeeded', 'failed', 'cancelled');
"""


def _schema_to_rebuild(cursor) -> tuple[list[str], list[str]]:
    """(statements that drop the five tables' unique constraints and secondary
    indexes, statements that rebuild them as they were), from the catalog."""
    cursor.execute("""
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint
         WHERE contype = 'u' AND conrelid::regclass::text = ANY(%s)""", [list(TABLES)])
    constraints = cursor.fetchall()
    cursor.execute("""
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
          FROM pg_index i
         WHERE i.indrelid::regclass::text = ANY(%s) AND NOT i.indisprimary
           AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
    """, [list(TABLES)])
    indexes = cursor.fetchall()
    drops = [f'ALTER TABLE {t} DROP CONSTRAINT "{name}"' for t, name, _ in constraints]
    drops += [f"DROP INDEX {name}" for name, _ in indexes]
    rebuilds = [f'ALTER TABLE {t} ADD CONSTRAINT "{name}" {definition}'
                for t, name, definition in constraints]
    return drops, rebuilds + [definition for _, definition in indexes]


def history_fill(n: int, anchor: datetime, *, rebuild_indexes: bool = True) -> None:
    """Add `n` tasks of history (and their steps, transitions, replays and
    webhook deliveries) ending at `anchor` into an empty task table, then
    ANALYZE the tables (VACUUM ANALYZE outside a transaction)."""
    params = {"n": n, "anchor": anchor}
    users = get_user_model()._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO {users} (password, last_login, is_superuser, username, first_name,
                                 last_name, email, is_staff, is_active, date_joined)
            SELECT '!', NULL, false, 'scale-client-' || lpad(g::text, 2, '0'), '', '', '',
                   false, true, now()
              FROM generate_series(1, 20) g
            ON CONFLICT (username) DO NOTHING""")
        drops: list[str] = []
        rebuilds: list[str] = []
        if rebuild_indexes:
            drops, rebuilds = _schema_to_rebuild(cursor)
            cursor.execute("SET maintenance_work_mem = '512MB'")
            cursor.execute("SET session_replication_role = replica")
            for statement in drops:
                cursor.execute(statement)
        for statement in GENERATE.replace("{users}", users).split(";\n"):
            if statement.strip():
                cursor.execute(statement, params)
        if rebuild_indexes:
            cursor.execute("SET session_replication_role = origin")
            for statement in rebuilds:
                cursor.execute(statement)
            cursor.execute("RESET maintenance_work_mem")
        cursor.execute("DROP VIEW gen")
        if connection.in_atomic_block:
            cursor.execute(f"ANALYZE {', '.join(TABLES)}")
        else:
            for table in TABLES:
                cursor.execute(f"VACUUM ANALYZE {table}")
