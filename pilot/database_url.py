"""DATABASE_URL to Django's DATABASES["default"], including libpq's multi-host form.

dj-database-url reads one host per URL. A highly available PostgreSQL is reached
with libpq's list of hosts, written as libpq writes it,
`postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write`; libpq (through
psycopg) then tries each host in turn and keeps the first that takes writes.
Django passes HOST and PORT to psycopg unchanged, so the list becomes
HOST="h1,h2" and PORT="5432,5433" (docs/design.md, "On a highly available
PostgreSQL"; docs/operations.md, "High availability").

Every refusal is an ImproperlyConfigured that names DATABASE_URL and what is wrong,
never the password.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

DEFAULT_PG_PORT = "5432"

# libpq's target_session_attrs values; PILOT writes, so a session that may be a
# standby is refused.
_WRITABLE_SESSION_ATTRS = {"any", "read-write", "primary"}
_READ_ONLY_SESSION_ATTRS = {"read-only", "standby", "prefer-standby"}

_HOST_PORT = re.compile(r"^(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>[^:]*))?$")


class DatabaseURLError(ImproperlyConfigured):
    """DATABASE_URL cannot be used; the message says why."""


def _refuse(why: str) -> DatabaseURLError:
    return DatabaseURLError(f"DATABASE_URL is not a valid database URL: {why}")


def _port(raw: str, where: str) -> str:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise _refuse(f"port {raw!r} of {where} is not a number from 1 to 65535")
    return str(int(raw))


def _split_hosts(hostlist: str) -> tuple[list[str], list[str | None]]:
    """`h1:5432,[::1]:5433,h3` → (["h1", "::1", "h3"], ["5432", "5433", None])."""
    hosts: list[str] = []
    ports: list[str | None] = []
    for index, entry in enumerate(hostlist.split(","), start=1):
        match = _HOST_PORT.match(entry)
        host = match["host"].removeprefix("[").removesuffix("]") if match else ""
        if not match or not host:
            raise _refuse(f"host {index} of the host list is empty or malformed ({entry!r})")
        port = match["port"]
        hosts.append(host)
        ports.append(None if port in (None, "") else _port(port, f"host {host}"))
    return hosts, ports


def parse_database_url(url: str) -> dict[str, Any]:
    """The Django DATABASES entry for `url`: dj-database-url's, with libpq's
    multi-host list in HOST/PORT. Raises DatabaseURLError on what libpq or
    PILOT would refuse later, at start-up instead."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts: list[str] = []
    ports: list[str | None] = []
    if "," in hostlist:
        if parts.scheme not in ("postgres", "postgresql", "pgsql"):
            raise _refuse(f"a list of hosts is PostgreSQL's (libpq's) form, not {parts.scheme}://")
        # Hand dj-database-url one host and put the list back afterwards.
        hosts, ports = _split_hosts(hostlist)
        url = urlunsplit(parts._replace(netloc=f"{userinfo}@placeholder" if userinfo
                                        else "placeholder"))
    try:
        db: dict[str, Any] = dict(dj_database_url.parse(url))
    except ValueError as exc:  # dj_database_url.ParseError is one
        raise _refuse(str(exc)) from None
    if db["ENGINE"] != "django.db.backends.postgresql":
        return db

    options = db.setdefault("OPTIONS", {})
    if hosts:
        listed = str(options.pop("port", "") or "")
        if listed:
            # The ?port=p1,p2 form libpq also reads.
            if any(ports):
                raise _refuse("ports are given both beside the hosts and as ?port=; give one")
            given: list[str | None] = [_port(p, "?port=") for p in listed.split(",")]
            if len(given) not in (1, len(hosts)):
                raise _refuse(f"{len(hosts)} hosts but {len(given)} ports in ?port=")
            ports = given * len(hosts) if len(given) == 1 else given
        db["HOST"] = ",".join(hosts)
        db["PORT"] = ",".join(p or DEFAULT_PG_PORT for p in ports)

    _check_session_attrs(options.get("target_session_attrs"), len(hosts))
    return db


def _check_session_attrs(attrs: str | None, hosts: int) -> None:
    if attrs is not None and attrs not in _WRITABLE_SESSION_ATTRS:
        if attrs in _READ_ONLY_SESSION_ATTRS:
            raise _refuse(f"target_session_attrs={attrs} may connect to a read-only standby; "
                          "PILOT writes: use read-write")
        raise _refuse(f"target_session_attrs={attrs!r} is not one of libpq's values "
                      "(read-write, primary, any)")
    if hosts > 1 and attrs not in ("read-write", "primary"):
        raise _refuse(f"{hosts} hosts without target_session_attrs=read-write: libpq would "
                      "keep the first host that answers, which may be a read-only standby")
