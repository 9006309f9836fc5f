"""A throwaway highly available PostgreSQL of a test's own: one etcd and three
Patroni-managed PostgreSQL nodes with synchronous replication, from Debian's
packages (`patroni`, `etcd-server`; `make test` installs them when missing).

    with PatroniCluster() as ha:
        url = ha.create_database("pilot")   # the libpq multi-host URL, read-write
        ha.kill_node(ha.leader())           # the machine dies: Patroni, postmaster, backends
        ha.wait_leader(other_than=old)      # a replica is promoted
        ha.start_node(old)                  # the old primary rejoins (pg_rewind)
        ha.switchover()                     # planned: leader -> a synchronous replica

Ports of its own (free loopback ports chosen at start: three for PostgreSQL,
three for Patroni's REST API, two for etcd), everything under one temporary
directory owned by the `postgres` OS user (PostgreSQL refuses to run as root),
every process started here and ended by its PID on exit (`destroy`), the
directory removed. Trust authentication on
127.0.0.1 only; the recipe a user builds (passwords, SCRAM) is in
docs/operations.md, "High availability".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import psycopg

from tests.support.pgcluster import OS_USER, _bindir

NODES = ("n1", "n2", "n3")
PACKAGES = {"patroni": "patroni", "etcd": "etcd-server"}


def missing_packages() -> list[str]:
    return [package for command, package in PACKAGES.items() if shutil.which(command) is None]


def _node_config(root: str, name: str, bindir: str, pg_port: int, rest_port: int,
                 etcd_client: int) -> str:
    return f"""
scope: pilot-ha-test
namespace: /pilot-ha-test/
name: {name}
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd3:
  hosts: ["127.0.0.1:{etcd_client}"]
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 100
        max_wal_senders: 10
        max_replication_slots: 10
        wal_level: replica
        wal_log_hints: "on"
        hot_standby: "on"
        shared_buffers: 32MB
        synchronous_commit: "on"
        fsync: "off"
        full_page_writes: "on"
  initdb: [{{encoding: UTF8}}]
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {root}/pg/{name}
  bin_dir: {bindir}
  pgpass: {root}/run/pgpass-{name}
  authentication:
    superuser: {{username: postgres, password: unused}}
    replication: {{username: replicator, password: unused}}
    rewind: {{username: rewinder, password: unused}}
  parameters:
    unix_socket_directories: {root}/run
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
"""


class PatroniCluster:
    def __init__(self) -> None:
        missing = missing_packages()
        if missing:
            raise RuntimeError(f"the HA test needs the Debian packages {', '.join(missing)} "
                               "(`make test` installs them: `make ha-packages`)")
        # Free loopback ports, chosen now: two runs of the suite on one machine
        # (two worktrees' CI) never meet.
        ports = _free_ports(8)
        self.pg_ports = dict(zip(NODES, ports[0:3], strict=True))
        self.rest_ports = dict(zip(NODES, ports[3:6], strict=True))
        self.etcd_client, self.etcd_peer = ports[6], ports[7]
        self.bindir = _bindir()
        self.root = tempfile.mkdtemp(prefix="pilot-ha-")
        self.procs: dict[str, subprocess.Popen] = {}
        for sub in ("pg", "run", "logs", "etcd"):
            os.makedirs(os.path.join(self.root, sub))
        for name in NODES:
            with open(os.path.join(self.root, f"{name}.yml"), "w") as conf:
                conf.write(_node_config(self.root, name, self.bindir, self.pg_ports[name],
                                        self.rest_ports[name], self.etcd_client))
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", f"{OS_USER}:{OS_USER}", self.root], check=True)

    # --- processes ---------------------------------------------------------------------------

    def _spawn(self, key: str, args: list[str]) -> None:
        if os.geteuid() == 0:
            args = ["runuser", "-u", OS_USER, "--", *args]
        log = open(os.path.join(self.root, "logs", f"{key}.log"), "ab")  # noqa: SIM115
        self.procs[key] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start(self) -> PatroniCluster:
        self._spawn("etcd", [
            "etcd", "--name", "pilot-ha-etcd", "--data-dir", os.path.join(self.root, "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-cluster", f"pilot-ha-etcd=http://127.0.0.1:{self.etcd_peer}",
            "--initial-cluster-state", "new"])
        self._wait(lambda: self._get(f"http://127.0.0.1:{self.etcd_client}/health") is not None,
                   30, "etcd to answer")
        self.start_node("n1")
        self._wait(lambda: self.leader() == "n1", 90, "n1 to bootstrap as the primary")
        self.start_node("n2")
        self.start_node("n3")
        self.wait_replicas(2)
        return self

    def start_node(self, name: str) -> None:
        self._spawn(name, ["patroni", os.path.join(self.root, f"{name}.yml")])

    def postmaster_pid(self, name: str) -> int | None:
        try:
            with open(os.path.join(self.root, "pg", name, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def kill_node(self, name: str) -> None:
        """The machine dies: Patroni, its postmaster and every backend, SIGKILL at once."""
        pids = [self.procs[name].pid]
        postmaster = self.postmaster_pid(name)
        if postmaster:
            pids.append(postmaster)
            pids += _children(postmaster)
        pids += _children(self.procs[name].pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[name].wait(10)

    def destroy(self) -> None:
        """End every process started here, by PID; remove the directory."""
        for name in NODES:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                self.kill_node(name)
            postmaster = self.postmaster_pid(name)
            if postmaster:  # a postmaster that outlived its Patroni
                for pid in [postmaster, *_children(postmaster)]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        etcd = self.procs.get("etcd")
        if etcd is not None and etcd.poll() is None:
            os.killpg(etcd.pid, signal.SIGKILL)
            etcd.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        try:
            return self.start()
        except BaseException:
            print(self.logs())
            self.destroy()
            raise

    def __exit__(self, *exc) -> None:
        self.destroy()

    # --- state --------------------------------------------------------------------------------

    @staticmethod
    def _get(url: str, timeout: float = 2) -> dict | None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
                return json.loads(r.read() or b"{}")
        except (OSError, ValueError):
            return None

    def members(self) -> list[dict]:
        for name in NODES:
            if self.procs.get(name) is not None and self.procs[name].poll() is None:
                cluster = self._get(f"http://127.0.0.1:{self.rest_ports[name]}/cluster")
                if cluster:
                    return cluster.get("members", [])
        return []

    def leader(self) -> str | None:
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return member["name"]
        return None

    def sync_standbys(self) -> list[str]:
        return [m["name"] for m in self.members() if m.get("role") == "sync_standby"
                and m.get("state") in ("running", "streaming")]

    def wait_replicas(self, n: int, timeout: float = 90) -> None:
        self._wait(lambda: sum(1 for m in self.members() if m.get("role") != "leader"
                               and m.get("state") in ("running", "streaming")) >= n
                   and self.sync_standbys(), timeout, f"{n} replicas streaming, one synchronous")

    def writable(self) -> bool:
        """The multi-host URL reaches a primary that takes writes."""
        try:
            return self.query("postgres", "SELECT NOT pg_is_in_recovery()") == [(True,)]
        except psycopg.OperationalError:
            return False

    def wait_leader(self, *, other_than: str, timeout: float = 60) -> str:
        """A promoted leader other than `other_than`, once it takes writes."""
        self._wait(lambda: self.leader() not in (None, other_than) and self.writable(), timeout,
                   f"a new writable leader other than {other_than}")
        return self.leader()  # type: ignore[return-value]

    def switchover(self) -> tuple[str, str]:
        """A planned switchover to a synchronous standby; (old, new) leader."""
        old = self.leader()
        [candidate, *_] = self.sync_standbys()
        body = json.dumps({"leader": old, "candidate": candidate}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.rest_ports[old]}/switchover",
                                         data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310 - loopback
            assert r.status == 200, r.read()
        self._wait(lambda: self.leader() == candidate and self.writable(), 60,
                   f"{candidate} to lead")
        return old, candidate  # type: ignore[return-value]

    @staticmethod
    def _wait(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.2)

    # --- use ----------------------------------------------------------------------------------

    def url(self, database: str) -> str:
        hosts = ",".join(f"127.0.0.1:{self.pg_ports[n]}" for n in NODES)
        return f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def query(self, database: str, sql: str, params=None) -> list[tuple]:
        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(os.path.join(self.root, "logs"))):
            with open(os.path.join(self.root, "logs", name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)


def _free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports nothing listens on (held open together while
    chosen, so the kernel gives `n` different ones)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found
