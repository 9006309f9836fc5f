"""Claiming a task for execution (docs/design.md, "Execution").

A claim is one compare-and-set in the store: `pending`, or `retrying` and due
by the database's clock, with an attempt left → `running`, attempts + 1, a new
lease token and the lease, with its audit row. Of two workers racing for one
task (or a duplicate delivery, or a django-q2 redelivery) exactly one wins; the
others get None and do nothing. A claim that finds the row locked (a cancel in
progress) waits for it instead of dropping the delivery, then re-checks.

The compensation phase is claimed the same way (`store.resume`): a
`compensating` or `cancelling` task with no live lease and no pending backoff
goes to the claiming worker under a new token.
"""

from __future__ import annotations

from typing import Any

from workflows.engine.leases import lease_length
from workflows.engine.store import Claimed, store


def task_claim(*, task_id: Any, worker: str) -> Claimed | None:
    """Claim `task_id` for its steps, or None (missing, running, finished, a retry
    not yet due, no attempt left, or another claim won)."""
    return store().claim(task_id, worker=worker, lease=lease_length())


def task_resume(*, task_id: Any, worker: str) -> Claimed | None:
    """Take a compensating or cancelling task's compensations over, or None."""
    return store().resume(task_id, worker=worker, lease=lease_length())
