"""Schemathesis against the live schema: every API operation, a few hundred
generated requests (valid and invalid), through the real WSGI application.
No response may be a 5xx, and every response must match what the schema says
(status codes, content types, bodies, headers)."""

import contextlib
import json

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from workflows.accounts import api_client_create

pytestmark = pytest.mark.django_db

# Loaded from the running application, as a client would see it (at import,
# before any database exists to hold a token: the schema is opened for it).
with override_settings(PILOT_API_DOCS_PUBLIC=True):
    schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json",
                                            get_wsgi_application())


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """Requests go straight to the WSGI application, so Django's request
    signals would close the test's connection (and its transaction) between
    requests; Django's own test client disconnects them the same way."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(db):
    return api_client_create("schemathesis")[1]


def documented_refusal(case) -> bool:
    """Requests OpenAPI cannot describe as invalid but that are rightly a 400:
    a made-up pagination cursor (an opaque string); a payload holding a NUL
    character anywhere (no database can store it); a trigger whose key is in
    neither the Idempotency-Key header nor the body's task_id (OpenAPI cannot say
    "one of the two"); a header and a task_id that name different keys; a
    callback_url, whose host must resolve to public addresses and whose client
    needs a signing secret (this one has none), which no schema can say; a retry
    naming both `from_step` and `from_start` (two optional fields that exclude
    each other), or a `from_step` its task's workflow does not have."""
    if case.query and "cursor" in case.query:
        return True
    if (case.operation.path.endswith("/retry") and isinstance(case.body, dict)
            and case.body.get("from_step") is not None):
        return True
    if isinstance(case.body, dict) and "\\u0000" in json.dumps(case.body):
        return True
    if isinstance(case.body, dict) and "callback_url" in json.dumps(case.body):
        return True
    if case.operation.path != "/api/v1/tasks" or case.method != "POST":
        return False
    header = (case.headers or {}).get("Idempotency-Key")
    body_key = case.body.get("task_id") if isinstance(case.body, dict) else None
    if header is None and body_key is None:
        return True
    return header is not None and body_key is not None and header.strip('"') != body_key


@schema.parametrize()
@hypothesis_settings(max_examples=40, deadline=None, derandomize=True,
                     # One API token per test, shared by its examples (intended);
                     # a database round trip per example is not slow generation.
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])
def test_every_operation_conforms_and_never_fails_with_5xx(case, token):
    excluded = [positive_data_acceptance] if documented_refusal(case) else None
    # Each generated request starts from the same database: a key used by one
    # example must not turn a later, unrelated example into a legitimate 422.
    with contextlib.suppress(_Isolated), transaction.atomic():
        case.call_and_validate(headers={"Authorization": f"Token {token}"},
                               excluded_checks=excluded)
        raise _Isolated


class _Isolated(Exception):
    """Rolls an example's writes back."""
