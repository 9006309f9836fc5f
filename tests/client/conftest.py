"""A live PILOT for the client's tests: gunicorn, a qcluster and a dispatcher
on the test database (tests/support/procs.py), started once for the package and shared
by its tests; each test makes its own API client (user + token)."""

from __future__ import annotations

import pytest

from tests.support.procs import Fleet


@pytest.fixture(scope="package")
def live_pilot(django_db_setup, django_db_blocker):
    """(fleet, base URL) of a running PILOT: 2 gunicorn workers, workers, dispatcher."""
    with django_db_blocker.unblock():
        # Webhooks to the tests' own loopback receivers are allowed.
        fleet = Fleet(PILOT_LOG_LEVEL="warning", PILOT_WEBHOOK_ALLOW_PRIVATE="true",
                      PILOT_WEBHOOK_FIRST_RETRY_SECONDS="0.2")
        try:
            fleet.workers()
            fleet.dispatcher()
            _, url = fleet.web(workers=2)
        except BaseException:
            fleet.stop_all()
            raise
    yield fleet, url
    fleet.stop_all()


@pytest.fixture
def api_client(transactional_db):
    """A fresh upstream client: (user, token) — committed, so the server sees it."""
    from workflows.accounts import api_client_create

    return api_client_create("upstream-client")


@pytest.fixture
def pilot(live_pilot, api_client):
    """A PilotClient for `api_client` against the live server, with short
    backoffs so retries do not slow the suite."""
    from pilot_client import PilotClient, RetryPolicy

    _, url = live_pilot
    client = PilotClient(url, api_client[1], retry=RetryPolicy(initial=0.05, max_delay=0.5))
    yield client
    client.close()
