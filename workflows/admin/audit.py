"""Console actions as Django admin `LogEntry` rows, where Django users look:
"Recent actions" on the admin index and each task's History page.

The engine's TaskTransition rows remain the audit trail of the task itself
(who, when, from → to, why); these entries say, in Django's own log, that a
person did it from the console. Written after the engine call committed, and
only for tasks it changed (a refusal changed nothing, so it logs nothing).
"""

from __future__ import annotations

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry


def console_action_log(user, tasks: list, message: str, *, added: bool = False) -> int:
    """One LogEntry per task in `tasks` (Task rows as the engine returned
    them), in one INSERT; returns how many were written."""
    if not tasks:
        return 0
    entries = LogEntry.objects.log_actions(user_id=user.pk, queryset=tasks,
                                           action_flag=ADDITION if added else CHANGE,
                                           change_message=message[:2000])
    return len(entries)


def action_message(action_label: str, reason: str, *, scope: str = "") -> str:
    """"Cancel through the console (filter-wide): reason" — plain text, which
    LogEntry shows as is."""
    text = f"{action_label} through the console"
    if scope:
        text += f" ({scope})"
    return f"{text}: {reason}" if reason else text
