"""An expected 403 (a viewer opening a page they may not see) answers with the
403 page and logs one line, through one handler, without a traceback
(review 3, ux.md §2 #20: 28 lines of traceback, twice, into make run's terminal)."""

import logging

import pytest
from django.test import Client

from tests.admin.conftest import _staff
from workflows.observability.logging import TextFormatter

pytestmark = pytest.mark.django_db

URL = "/admin/workflows/task/dashboard/"


def printing_handlers(record: logging.LogRecord) -> list[logging.Handler]:
    """The handlers of the project's logging that would print `record`, as the
    logging module walks the loggers (pytest's own capture handlers aside)."""
    found, logger = [], logging.getLogger(record.name)
    while logger is not None:
        found += [h for h in logger.handlers
                  if not type(h).__module__.startswith("_pytest")
                  and record.levelno >= h.level and h.filter(record)]
        if not logger.propagate:
            break
        logger = logger.parent
    return found


def test_a_viewer_without_the_permission_gets_the_403_page_and_one_line(
        django_user_model, caplog, settings):
    settings.DEBUG = True  # make run's: Django's own console handler prints then
    user = _staff(django_user_model, "narrow", perms=("view_task",))
    client = Client()
    client.force_login(user)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.get(URL)
    assert response.status_code == 403
    assert b"workflows.view_all_tasks" in response.content  # the page says what is missing
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage() == f"Forbidden (Permission denied): {URL}"
    assert record.exc_info is None
    line = TextFormatter().format(record)
    assert "\n" not in line and "Traceback" not in line
    assert len(printing_handlers(record)) == 1  # root's console handler, not Django's too


def test_an_unexpected_error_keeps_its_traceback(caplog):
    logger = logging.getLogger("django.request")
    with caplog.at_level(logging.ERROR, logger="django.request"):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("Internal Server Error: /x", exc_info=True,
                         extra={"status_code": 500})
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info is not None
    assert "Traceback" in TextFormatter().format(record)
