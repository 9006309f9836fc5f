"""How actors appear in the audit trail (engine/audit.py)."""

import pytest
from django.contrib.auth.models import AnonymousUser

from workflows.engine.audit import actor_for


@pytest.mark.django_db
def test_a_user_is_named_and_nobody_is_the_system(owner):
    assert actor_for(owner) == f"user:{owner.get_username()}"
    assert actor_for(None) == "system"
    assert actor_for(AnonymousUser()) == "system"
