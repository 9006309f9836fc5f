"""Transient or permanent: the one decision that says whether a rate limit
may degrade or must fail closed (workflows/observability/shared_cache.py)."""

import sqlite3
from contextlib import closing

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, ProgrammingError
from redis import exceptions as redis_errors

from workflows.observability.shared_cache import (
    PERMANENT,
    TRANSIENT,
    CacheFailure,
    CacheMisconfigured,
    cache_error_kind,
    cache_guarded,
    cache_strict,
)


@pytest.mark.parametrize("error", [
    redis_errors.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis_errors.TimeoutError("Timeout reading from socket"),
    redis_errors.BusyLoadingError("Redis is loading the dataset in memory"),
    redis_errors.ReadOnlyError("You can't write against a read only replica."),
    redis_errors.TryAgainError("TRYAGAIN"),
    redis_errors.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
    OperationalError("connection to server at \"db\" failed: Connection refused"),
    OperationalError("database is locked"),
    InterfaceError("connection already closed"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
], ids=repr)
def test_an_unreachable_store_is_transient(error):
    assert cache_error_kind(error) == TRANSIENT


@pytest.mark.parametrize("error", [
    redis_errors.AuthenticationError("WRONGPASS invalid username-password pair"),
    redis_errors.AuthorizationError("NOPERM"),
    redis_errors.NoPermissionError("this user has no permissions to run the 'incrby' command"),
    redis_errors.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
    redis_errors.ResponseError("ERR DB index is out of range"),
    ValueError("Redis URL must specify one of the following schemes (redis://, rediss://, "
               "unix://)"),
    ProgrammingError('relation "pilot_cache" does not exist'),
    OperationalError("no such table: pilot_cache"),
    PermissionError(13, "Permission denied"),
    TypeError("an unexpected bug"),
], ids=repr)
def test_a_misconfiguration_or_anything_unknown_is_permanent(error):
    assert cache_error_kind(error) == PERMANENT


def test_the_real_drivers_errors_classify_the_same():
    # Closed explicitly: Python 3.13 warns (ResourceWarning) of a connection left to the GC.
    with closing(sqlite3.connect(":memory:")) as db, \
            pytest.raises(sqlite3.OperationalError) as missing:
        db.execute("SELECT * FROM pilot_cache")
    assert cache_error_kind(OperationalError(str(missing.value))) == PERMANENT
    assert issubclass(psycopg.errors.UndefinedTable, psycopg.ProgrammingError)


def _raise(error):
    def call():
        raise error
    return call


def test_guarded_degrades_on_transient_and_fails_closed_on_permanent():
    assert cache_guarded("t", _raise(redis_errors.ConnectionError("down")), "fallback") \
        == "fallback"
    with pytest.raises(CacheMisconfigured) as refused:
        cache_guarded("t", _raise(redis_errors.AuthenticationError("WRONGPASS")), "fallback")
    assert (refused.value.code, refused.value.http_status) == ("unavailable", 503)
    assert cache_guarded("t", lambda: 7, None) == 7


def test_strict_raises_on_any_error_with_its_kind():
    for error, kind in ((redis_errors.ConnectionError("down"), TRANSIENT),
                        (ProgrammingError("no table"), PERMANENT)):
        with pytest.raises(CacheFailure) as failed:
            cache_strict("t", _raise(error))
        assert failed.value.kind == kind
