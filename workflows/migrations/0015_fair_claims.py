"""The function a PostgreSQL claim checks the caps with (docs/design.md, "Fairness").

`pilot_claim_slot(client, workflow, caps)` — true when a task of `workflow`
owned by `client` may start under `caps` (workflows/engine/caps.py). It takes a
transaction-scoped advisory lock per client (and per capped workflow) before
counting, and being VOLATILE plpgsql, each count runs on a fresh snapshot: a
claim that waited for the lock sees the claim that held it. Other databases
need no function (SQLite has one writer; the portable store counts itself).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION pilot_claim_slot(p_owner anyelement, p_workflow text, p_caps jsonb)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_own integer := (p_caps -> 'own' ->> p_workflow)::integer;
    v_cap integer := COALESCE(v_own, (p_caps ->> 'client')::integer, 0);
    v_total integer := COALESCE((p_caps -> 'total' ->> p_workflow)::integer, 0);
    v_running integer;
BEGIN
    IF p_caps IS NULL THEN
        RETURN true;
    END IF;
    IF v_cap > 0 THEN
        PERFORM pg_advisory_xact_lock(1346980913, hashtext(p_owner::text));
        IF v_own IS NOT NULL THEN
            SELECT count(*) INTO v_running FROM workflows_task
             WHERE state = 'running' AND owner_id = p_owner AND workflow = p_workflow;
        ELSE
            SELECT count(*) INTO v_running FROM workflows_task
             WHERE state = 'running' AND owner_id = p_owner
               AND NOT jsonb_exists(COALESCE(p_caps -> 'own', '{}'::jsonb), workflow);
        END IF;
        IF v_running >= v_cap THEN
            RETURN false;
        END IF;
    END IF;
    IF v_total > 0 THEN
        PERFORM pg_advisory_xact_lock(1346980914, hashtext(p_workflow));
        SELECT count(*) INTO v_running FROM workflows_task
         WHERE state = 'running' AND workflow = p_workflow;
        IF v_running >= v_total THEN
            RETURN false;
        END IF;
    END IF;
    RETURN true;
END
$fn$;
"""

DROP = "DROP FUNCTION IF EXISTS pilot_claim_slot(anyelement, text, jsonb);"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0014_api_token_hashed"),
    ]

    operations = [
        migrations.RunPython(create, drop, elidable=False),
    ]
