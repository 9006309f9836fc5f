"""Each SQL rule written once (docs/design.md, "The store"): store/sql.py spells
every rule of the hot statements in one fragment and composes the statements
from them; nothing splices a text into another by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from workflows.engine.store import sql
from workflows.engine.store.postgres import QUERIES

STORE = Path(sql.__file__).parent
SOURCE = (STORE / "sql.py").read_text()

# Each rule, by a phrase only its fragment contains.
RULES = {
    "the fence": "id = %(task_id)s AND lease_token = %(token)s",
    "the lease's end": "make_interval(secs => %(lease_seconds)s)",
    "the audit row": "INSERT INTO workflows_tasktransition",
    "the claim": "attempts = t.attempts + 1",
    "the take-over": "SET lease_token = t.lease_token + 1, lease_owner",
    "the exact cap check": "pilot_claim_slot_v2(",
    "the caps' choice": "blocked_groups AS (",
    "the candidates' filter": "FROM blocked_workflows))",
    "the outbox row": "INSERT INTO workflows_webhookdelivery",
    "the step rows": "jsonb_to_recordset(%(steps)s::jsonb)",
}


def every_statement() -> dict[str, str]:
    sets = '"updated_at" = %(v0)s'
    return {**QUERIES, **{
        f"transition[steps={steps},claim={claim}]": sql.transition_statement(
            sets, with_steps=steps, then_claim=claim)
        for steps, claim in ((False, False), (True, False), (True, True))}}


def test_each_rule_is_written_once() -> None:
    counts = {rule: SOURCE.count(phrase) for rule, phrase in RULES.items()}
    assert counts == dict.fromkeys(RULES, 1)


def test_the_statements_use_the_rules() -> None:
    """The phrases are not dead text: the statements that need a rule carry it."""
    statements = every_statement()
    uses = {rule: sorted(name for name, text in statements.items() if phrase in text)
            for rule, phrase in RULES.items()}
    assert uses["the fence"] == sorted(["write_steps", "write_steps_renew", "renew", "check",
                                        "save_progress", *(n for n in statements
                                                           if n.startswith("transition"))])
    assert set(uses["the audit row"]) >= {"claim", "claim_next", "resume",
                                          "resume_after_cancel"}
    assert set(uses["the claim"]) == {"claim", "claim_next",
                                      "transition[steps=True,claim=True]"}
    assert set(uses["the exact cap check"]) == {"claim", "claim_next", "resume",
                                                "transition[steps=True,claim=True]"}
    assert set(uses["the outbox row"]) == {n for n in statements if n.startswith("transition")}
    # The claim inside a success is the queue's claim, rule for rule.
    claim_next = statements["claim_next"]
    with_claim = statements["transition[steps=True,claim=True]"]
    for fragment in (sql.claimed("prior", sql.SLOT_FREE), sql.BLOCKED, sql.UNBLOCKED):
        assert fragment in claim_next and fragment in with_claim


def test_no_text_is_spliced_into_another_by_name() -> None:
    """No str.replace on statement text in the PostgreSQL store, and no
    placeholder left in any statement it runs."""
    for module in ("postgres.py", "sql.py"):
        tree = ast.parse((STORE / module).read_text())
        replaces = [node.lineno for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "replace"]
        assert replaces == [], (module, replaces)
    for name, text in every_statement().items():
        assert not re.search(r"\{\w[\w:]*\}", text), name
