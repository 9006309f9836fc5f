"""A throwaway PostgreSQL server of a test's own, to stop and restart at will.

The machine's shared PostgreSQL (port 5432) serves every other test and other
people's work: it is never restarted. A test that needs a database outage gets
its own cluster instead:

    with PgCluster() as pg:                    # initdb + start on a free port
        url = pg.create_database("pilot")      # postgres://postgres@127.0.0.1:PORT/pilot
        ...
        pg.restart()                           # pg_ctl restart -m fast
        pg.crash_restart()                     # stop -m immediate (no shutdown checkpoint), start
        pg.stop(); pg.start()                  # an outage of any length in between

Everything lives in one temporary directory owned by the `postgres` OS user
(initdb refuses to run as root), removed on exit; the server listens on
127.0.0.1 only, with trust authentication and fsync off (a test's data must
survive a server crash, never a power cut).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import psycopg

OS_USER = "postgres"


def _bindir() -> str:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "pg_ctl")):
            return candidate
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(os.path.realpath(found))
    raise RuntimeError("PostgreSQL server binaries (pg_ctl, initdb) not found")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self, *, port: int | None = None, max_connections: int = 100):
        self.port = port or _free_port()
        self.max_connections = max_connections
        self.bindir = _bindir()
        self.root = tempfile.mkdtemp(prefix="pilot-pg-")
        self.datadir = os.path.join(self.root, "data")
        self.logfile = os.path.join(self.root, "server.log")
        self._initialised = False

    # --- lifecycle ------------------------------------------------------------------------

    def _as_postgres(self, *args: str, check: bool = True, timeout: float = 120):
        command = [os.path.join(self.bindir, args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", OS_USER, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True,
                               timeout=timeout)

    def init(self) -> PgCluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, user=OS_USER)
        self._as_postgres("initdb", "-D", self.datadir, "--auth=trust", "-U", "postgres",
                          "--no-sync", "-E", "UTF8")
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.root}'\n"
                       f"max_connections = {self.max_connections}\n"
                       # Commits reach the kernel before they are acknowledged
                       # (synchronous_commit stays on), so a process crash loses
                       # nothing committed; only an OS crash could, and that is
                       # not what these tests simulate.
                       "fsync = off\nfull_page_writes = off\n")
        self._initialised = True
        return self

    def _pg_ctl(self, *args: str, timeout: float = 60):
        return self._as_postgres("pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w",
                                 "-t", str(int(timeout)), *args, timeout=timeout + 10)

    def start(self) -> PgCluster:
        if not self._initialised:
            self.init()
        self._pg_ctl("start")
        self.wait_ready()
        return self

    def stop(self, mode: str = "fast") -> None:
        """`fast`: disconnect clients, shut down cleanly; `immediate`: abort at once,
        as a crash would (crash recovery runs at the next start)."""
        self._pg_ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self._pg_ctl("restart", "-m", mode)
        self.wait_ready()

    def crash_restart(self) -> None:
        self.stop("immediate")
        self.start()

    @property
    def running(self) -> bool:
        return self._as_postgres("pg_ctl", "-D", self.datadir, "status",
                                 check=False).returncode == 0

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        if self._initialised and self.running:
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # --- use ----------------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def query(self, database: str, sql: str, params=None) -> list[tuple]:
        """Run one statement on a fresh connection; the rows it returned."""
        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def log(self) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""
