"""Typed errors (pilot_client/errors.py): one class per problem code the API
can return, kept in step with the server's own list."""

from __future__ import annotations

import inspect

import pilot_client
import pytest
from pilot_client import ERRORS_BY_CODE, PilotAPIError, error_from_problem


def server_codes() -> set[str]:
    """Every problem code the server can answer with: its domain errors, the
    codes it gives DRF's and Django's exceptions, and its two fixed ones."""
    from workflows.api import problems
    from workflows.rules import errors

    domain = {cls.code for _, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.PilotError) and cls is not errors.PilotError}
    framework = {code for code, _ in problems._DRF.values()}
    return domain | framework | {"internal_error", "payload_too_large", "unavailable"}


def test_every_code_of_the_api_has_its_own_exception_class():
    assert server_codes() - set(ERRORS_BY_CODE) == set()
    assert len(set(ERRORS_BY_CODE.values())) == len(ERRORS_BY_CODE)
    for code, cls in ERRORS_BY_CODE.items():
        assert cls.code == code and issubclass(cls, PilotAPIError)
        assert getattr(pilot_client, cls.__name__) is cls  # exported


def test_a_problem_becomes_its_class_with_code_status_detail_and_the_document():
    problem = {"type": "https://pilot.dev/problems/validation_error", "title": "Invalid request",
               "status": 400, "detail": "The payload is not valid", "code": "validation_error",
               "errors": {"payload": {"count": ["This field is required."]}}}
    error = error_from_problem(400, problem, {"Content-Type": "application/problem+json"})
    assert isinstance(error, pilot_client.ValidationError)
    assert (error.code, error.status, error.detail, error.title) == (
        "validation_error", 400, "The payload is not valid", "Invalid request")
    assert error.problem == problem and error.errors == problem["errors"]
    assert error.headers == {"content-type": "application/problem+json"}
    assert str(error) == "400 validation_error: The payload is not valid"


def test_an_unknown_code_or_a_bare_error_still_raises_the_base_class():
    newer = error_from_problem(418, {"code": "teapot", "detail": "short and stout"})
    assert type(newer) is PilotAPIError and (newer.code, newer.status) == ("teapot", 418)
    bare = error_from_problem(502, None)
    assert type(bare) is PilotAPIError and bare.code == "http_502"


def test_throttled_reads_its_retry_after():
    error = error_from_problem(429, {"code": "throttled"}, {"Retry-After": "7"})
    assert isinstance(error, pilot_client.Throttled) and error.retry_after == 7.0


@pytest.mark.parametrize("cls", list(ERRORS_BY_CODE.values()))
def test_every_class_can_be_caught_as_a_pilot_error(cls):
    with pytest.raises(pilot_client.PilotError):
        raise cls("boom")
