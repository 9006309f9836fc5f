"""How actors appear in the audit trail (TaskTransition.actor).

Transitions themselves are persisted by the store (`store().transition`),
together with their audit row, in one transaction or statement.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser


def actor_for(user: AbstractBaseUser | None) -> str:
    """How a user appears in the audit trail."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "system"
    return f"user:{user.get_username()}"
