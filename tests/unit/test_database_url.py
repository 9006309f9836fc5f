"""DATABASE_URL parsing (pilot/database_url.py): libpq's multi-host form is read as
libpq writes it; what libpq or PILOT would refuse later is refused at start-up with
a message that names what is wrong."""

import os
import subprocess
import sys

import pytest

from pilot.database_url import DatabaseURLError, parse_database_url
from tests.support.procs import ROOT

RW = "target_session_attrs=read-write"


def test_libpq_multi_host_url_puts_the_lists_in_host_and_port():
    db = parse_database_url(f"postgres://app:s%40cret@h1:5432,h2:5433,h3:5434/pilot?{RW}")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["HOST"], db["PORT"]) == ("h1,h2,h3", "5432,5433,5434")
    assert (db["USER"], db["PASSWORD"], db["NAME"]) == ("app", "s@cret", "pilot")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write"}


def test_a_host_without_its_port_gets_the_default_and_ipv6_keeps_its_address():
    db = parse_database_url(f"postgresql://app@[::1]:6432,db2/pilot?{RW}&sslmode=require")
    assert (db["HOST"], db["PORT"]) == ("::1,db2", "6432,5432")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write", "sslmode": "require"}


@pytest.mark.parametrize("query, ports", [
    (f"port=5432,5433&{RW}", "5432,5433"),
    (f"port=6000&{RW}", "6000,6000"),
    (RW, "5432,5432"),
])
def test_the_port_query_form_libpq_also_reads(query, ports):
    db = parse_database_url(f"postgres://app@h1,h2/pilot?{query}")
    assert (db["HOST"], db["PORT"]) == ("h1,h2", ports)
    assert "port" not in db["OPTIONS"]


def test_a_single_host_url_is_read_as_before():
    db = parse_database_url("postgres://app:pw@db.internal:5432/pilot")
    assert (db["HOST"], db["PORT"], db["NAME"]) == ("db.internal", 5432, "pilot")
    assert parse_database_url("sqlite:////tmp/x.sqlite3")["NAME"] == "/tmp/x.sqlite3"


@pytest.mark.parametrize("url, why", [
    (f"postgres://app@h1:5432,h2:54x/pilot?{RW}", "port '54x' of host h2 is not a number"),
    (f"postgres://app@h1:5432,h2:70000/pilot?{RW}", "port '70000' of host h2 is not a number"),
    (f"postgres://app@h1,,h2/pilot?{RW}", "host 2 of the host list is empty"),
    (f"postgres://app@h1,:5433/pilot?{RW}", "host 2 of the host list is empty"),
    (f"postgres://app@h1,h2,h3/pilot?port=1,2&{RW}", "3 hosts but 2 ports in ?port="),
    (f"postgres://app@h1:1,h2/pilot?port=3&{RW}", "both beside the hosts and as ?port="),
    ("postgres://app@h1,h2/pilot", "2 hosts without target_session_attrs=read-write"),
    ("postgres://app@h1,h2/pilot?target_session_attrs=any", "2 hosts without"),
    ("postgres://app@h1/pilot?target_session_attrs=prefer-standby", "read-only standby"),
    ("postgres://app@h1/pilot?target_session_attrs=rw", "not one of libpq's values"),
    ("mysql://app@h1,h2/pilot", "libpq's) form, not mysql://"),
])
def test_bad_urls_are_refused_with_the_reason(url, why):
    with pytest.raises(DatabaseURLError) as exc:
        parse_database_url(url)
    assert str(exc.value).startswith("DATABASE_URL is not a valid database URL: ")
    assert why in str(exc.value)


def test_the_password_is_not_in_the_refusal():
    with pytest.raises(DatabaseURLError) as exc:
        parse_database_url("postgres://app:hunter2-secret@h1,h2/pilot")
    assert "hunter2" not in str(exc.value)


def _start(url: str, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PILOT_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "pilot.settings", "DJANGO_DEBUG": "true",
                "DATABASE_URL": url})
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_start_up_refuses_a_bad_multi_host_url_with_a_clear_error():
    done = _start(f"postgres://app@h1:5432,h2:oops/pilot?{RW}", "")
    assert done.returncode != 0
    assert ("DatabaseURLError: DATABASE_URL is not a valid database URL: "
            "port 'oops' of host h2 is not a number from 1 to 65535") in done.stderr


@pytest.mark.postgres
@pytest.mark.django_db
def test_libpq_skips_a_dead_host_of_the_list_and_connects_to_the_live_one():
    """A real connection through settings: the first host of the list has nothing
    listening, libpq (psycopg) goes on to the next one, which takes writes."""
    from django.db import connection
    live = connection.settings_dict  # the test database
    if "," in str(live["HOST"]):
        pytest.skip("the suite's own DATABASE_URL is already a list")
    auth = live["USER"] + (f":{live['PASSWORD']}" if live["PASSWORD"] else "")
    url = (f"postgres://{auth}@127.0.0.1:1,{live['HOST']}:{live['PORT'] or 5432}/"
           f"{live['NAME']}?{RW}")
    done = _start(url, "from django.db import connection; c = connection.cursor(); "
                       "c.execute('SELECT inet_server_port(), pg_is_in_recovery()'); "
                       "print(c.fetchone())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"({int(live['PORT'] or 5432)}, False)"
