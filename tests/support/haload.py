"""Load and a PILOT stack for tests/ha and `make bench-failover`: gunicorn, a
worker cluster and a dispatcher on a PatroniCluster's multi-host URL, and
clients that trigger distinct and duplicate keys of the atomic demo workflow,
retrying the same key on 503 as upstreams do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter

from tests.faults.client import request
from tests.support.procs import ROOT, Fleet, wait_until

COUNT = 5  # DemoOrder rows per task: the atomic step's
LEASE_SECONDS = 30  # long enough that a lease left to expire would show as a stall


def start_stack(ha, broker: str, *, redis_url: str = "", database: str | None = None) -> Fleet:
    """Migrate a fresh database on `ha`, create the client `upstream`, start a
    dispatcher, a worker cluster and gunicorn (2 workers). `broker`: "orm" or
    "redis" (on `redis_url`). The caller stops it (`stop_all`)."""
    name = database or f"pilot_{broker}"
    fleet = Fleet(DATABASE_URL=ha.create_database(name),
                  REDIS_URL=redis_url if broker == "redis" else "",
                  PILOT_Q_CLUSTER_NAME=f"pilot-ha-{broker}-{os.getpid()}",
                  PILOT_LEASE_SECONDS=LEASE_SECONDS, PILOT_HEARTBEAT_SECONDS=0.5,
                  PILOT_TEST_CACHE_PREFIX=f"pilot-ha-{os.getpid()}-{broker}")
    try:
        run = lambda *args: subprocess.run(  # noqa: E731
            [sys.executable, *args], cwd=ROOT, env=fleet.env, capture_output=True, text=True,
            timeout=180)
        migrated = run("manage.py", "migrate", "-v0")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        client = run("manage.py", "create_api_client", "upstream")
        assert client.returncode == 0, client.stderr
        fleet.token = re.search(r": token (\S+)", client.stdout).group(1)
        fleet.run, fleet.ha, fleet.db, fleet.broker = run, ha, name, broker
        fleet.dispatcher()
        fleet.workers()
        _, fleet.url = fleet.web(workers=2)
    except BaseException:
        fleet.stop_all()
        raise
    return fleet


class Load:
    """Clients that trigger distinct keys, and now and then a key again (a
    duplicate), each retried with the same key until acknowledged."""

    def __init__(self, stack, clients: int = 4, keys: int = 400):
        self.stack, self.keys = stack, keys
        self.lock = threading.Lock()
        self.acknowledged: dict[str, str] = {}
        self.duplicates: list[tuple[str, str, str]] = []  # key, first id, replay id
        self.phase = "warm-up"
        self.by_phase: dict[str, Counter] = {}
        self.first_2xx_after: dict[str, float] = {}
        self.fault_at: dict[str, float] = {}
        self.fault_wall: dict[str, float] = {}
        self.back_wall: dict[str, float] = {}  # when the new primary took writes
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(n,)) for n in range(clients)]
        self.threads.append(threading.Thread(target=self.probe))
        self.readyz: dict[str, Counter] = {}  # /readyz answers by phase, as a load balancer sees

    def probe(self) -> None:
        """A load balancer's readiness check, five times a second."""
        while not self.stop.is_set():
            try:
                status = request(self.stack.url, "GET", "/readyz", timeout=10).status
            except OSError:
                status = "no answer"
            with self.lock:
                self.readyz.setdefault(self.phase, Counter())[status] += 1
            time.sleep(0.2)

    def answer(self, status) -> None:
        with self.lock:
            phase = self.phase
            self.by_phase.setdefault(phase, Counter())[status] += 1
            if phase.endswith("-recovering") and status in (200, 202):
                # The service answers again: the switch is over for the clients.
                self.first_2xx_after[phase] = time.monotonic()
                self.phase = phase.replace("-recovering", "-after")

    def trigger(self, key: str) -> str | None:
        body = {"workflow": "demo.sync_orders",
                "payload": {"batch": key, "count": COUNT, "step_seconds": 0.05}}
        while not self.stop.is_set():
            try:
                r = request(self.stack.url, "POST", "/api/v1/tasks", token=self.stack.token,
                            headers={"Idempotency-Key": key}, body=body, timeout=20)
            except OSError:
                self.answer("no answer")
                time.sleep(0.2)
                continue
            self.answer(r.status)
            if r.status in (200, 202):
                return r.json()["id"]
            time.sleep(0.2)  # a 503: the same key again, as upstreams do
        return None

    def client(self, n: int) -> None:
        for i in range(self.keys):
            if self.stop.is_set():
                return
            key = f"c{n}-{i}"
            task_id = self.trigger(key)
            if task_id is None:
                return
            with self.lock:
                self.acknowledged[key] = task_id
            if i % 5 == 4:  # a duplicate of an earlier key
                again = f"c{n}-{i - 3}"
                replay = self.trigger(again)
                if replay is not None:
                    with self.lock:
                        self.duplicates.append((again, self.acknowledged[again], replay))
            time.sleep(0.5)  # ~8 triggers a second in all: what two worker processes keep up with

    def acked(self) -> int:
        with self.lock:
            return len(self.acknowledged)

    def more(self, n: int, what: str, timeout: float = 60) -> None:
        start = self.acked()
        wait_until(lambda: self.acked() >= start + n or self.done(), timeout, interval=0.05,
                   what=f"{n} more tasks acknowledged {what}")

    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads[:-1])

    def switch(self, name: str, fault) -> None:
        """`fault()` runs the switch and returns once the database takes writes."""
        with self.lock:
            self.phase = name
            self.fault_at[name] = time.monotonic()
            self.fault_wall[name] = time.time()
        fault()
        with self.lock:
            self.phase = f"{name}-recovering"
            self.back_wall[name] = time.time()
