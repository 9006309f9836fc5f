"""The caps count all the work a client makes the workers do (docs/design.md,
"Fairness"; workflows/engine/caps.py): `pilot_claim_slot_v2(client, workflow,
caps, undo)` replaces `pilot_claim_slot`.

A task is held while it is `running`, or in a compensation phase
(`compensating`, `cancelling`) under a live lease. A new run (`undo` false) may
start while the client's held tasks plus its undo work waiting for a worker (a
phase with no live lease and no backoff left) are under its cap — undo work goes
first; the take-over of a phase (`undo` true) while the held ones are. A
workflow's `concurrency` counts its held tasks over every client.

As before, a transaction-scoped advisory lock per client (and per capped
workflow) is taken before counting, and the function is VOLATILE plpgsql, so
each count runs on a fresh snapshot: a claim that waited for the lock sees the
claim that held it. Other databases need no function (SQLite has one writer;
the portable store counts itself, caps.slot_free_exact).
"""

import importlib

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION pilot_claim_slot_v2(p_owner anyelement, p_workflow text,
                                               p_caps jsonb, p_undo boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_own integer := (p_caps -> 'own' ->> p_workflow)::integer;
    v_cap integer := COALESCE(v_own, (p_caps ->> 'client')::integer, 0);
    v_total integer := COALESCE((p_caps -> 'total' ->> p_workflow)::integer, 0);
    v_now timestamptz := statement_timestamp();
    v_counted integer;
BEGIN
    IF p_caps IS NULL THEN
        RETURN true;
    END IF;
    IF v_cap > 0 THEN
        PERFORM pg_advisory_xact_lock(1346980913, hashtext(p_owner::text));
        SELECT count(*) INTO v_counted FROM workflows_task
         WHERE owner_id = p_owner
           AND (CASE WHEN v_own IS NOT NULL THEN workflow = p_workflow
                     ELSE NOT jsonb_exists(COALESCE(p_caps -> 'own', '{}'::jsonb), workflow)
                END)
           AND (state = 'running'
                OR (state IN ('compensating', 'cancelling')
                    AND (lease_expires_at > v_now
                         OR (NOT p_undo
                             AND (next_attempt_at IS NULL OR next_attempt_at <= v_now)))));
        IF v_counted >= v_cap THEN
            RETURN false;
        END IF;
    END IF;
    IF v_total > 0 THEN
        PERFORM pg_advisory_xact_lock(1346980914, hashtext(p_workflow));
        SELECT count(*) INTO v_counted FROM workflows_task
         WHERE workflow = p_workflow
           AND (state = 'running'
                OR (state IN ('compensating', 'cancelling') AND lease_expires_at > v_now));
        IF v_counted >= v_total THEN
            RETURN false;
        END IF;
    END IF;
    RETURN true;
END
$fn$;
DROP FUNCTION IF EXISTS pilot_claim_slot(anyelement, text, jsonb);
"""

DROP = "DROP FUNCTION IF EXISTS pilot_claim_slot_v2(anyelement, text, jsonb, boolean);"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        previous = importlib.import_module("workflows.migrations.0015_fair_claims")
        schema_editor.execute(previous.CREATE)
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0017_webhooks_outlive_tasks"),
    ]

    operations = [
        migrations.RunPython(create, drop, elidable=False),
    ]
