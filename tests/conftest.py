"""Shared fixtures and the rules that keep CI honest.

Tests marked `postgres` need PostgreSQL (row locks, SKIP LOCKED); `redis` ones
need a Redis broker. Locally they are skipped with a reason when the server is
not configured; with PILOT_REQUIRE_POSTGRES=1 (set by .ci/run) a skip of either
is a failure, so CI can never pass by not running them.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.db import connections


def _on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def _required() -> bool:
    return os.environ.get("PILOT_REQUIRE_POSTGRES") == "1"


def pytest_collection_modifyitems(config, items):
    missing = {
        "postgres": None if _on_postgres() else "needs DATABASE_URL=postgres://…",
        "redis": None if settings.REDIS_URL else "needs REDIS_URL=redis://…",
    }
    for item in items:
        for marker, reason in missing.items():
            if reason and item.get_closest_marker(marker):
                if _required():
                    raise pytest.UsageError(
                        f"{item.nodeid} is marked {marker} but {reason} is not set, and "
                        "PILOT_REQUIRE_POSTGRES=1 forbids skipping it")
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not _required() or reporter is None:
        return
    skipped = [r for r in reporter.stats.get("skipped", [])
               if any(m in r.keywords for m in ("postgres", "redis"))]
    if skipped:
        reporter.write_line(f"FAIL: {len(skipped)} postgres/redis test(s) skipped in CI",
                            red=True)
        session.exitstatus = 1


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("client-a", password="pw-client-a")


@pytest.fixture
def other_owner(django_user_model):
    return django_user_model.objects.create_user("client-b", password="pw-client-b")


@pytest.fixture(autouse=True)
def _empty_redis_queue():
    """Each test starts with an empty Redis queue (the ORM broker's queue lives
    in the test database, which every test gets fresh)."""
    if settings.REDIS_URL:
        from tests.support.helpers import purge_queue

        purge_queue()
    yield


@pytest.fixture
def temp_workflow():
    """Register throwaway workflows for one test: `temp_workflow("t.x", **options)`
    returns the Workflow (add steps to it); all are unregistered afterwards."""
    from workflows.registry import registry

    names = []

    def define(name, **options):
        workflow = registry.define(name, **options)
        names.append(name)
        return workflow

    yield define
    for name in names:
        registry.unregister(name)


# A real browser: Debian's chromium driven by Playwright (its own browser
# download does not work here; `make test` installs chromium).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def page(monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running on this thread; the ORM
    # calls a test makes between browser steps are still plain synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from tests.support.procs import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        yield page
        browser.close()
        # While Playwright's loop runs, Django keeps the test's ORM connection in
        # a separate (async-context) slot; close it here, or it outlives the test
        # and blocks dropping the test database.
        connections.close_all()
