"""A bounded soak on loopback (PILOT_SOAK_SECONDS, 150 in CI — worker kills
at 30 and 90 s; set it to 600 or more for a long one): ~20 clients of
two upstream systems trigger continuously through gunicorn — mostly new keys,
10 % re-sends of their own keys, 5 % the same key with another payload, 5 %
probes of the other system's task ids — while the worker process group is
SIGKILLed every minute from 30 s on. At the end: nothing lost, nothing duplicated, no
foreign read, no 5xx, no reused key accepted (200/202 instead of 422), and the
memory of the same long-lived processes — web, dispatcher, a worker group kept
out of the kill rotation — did not grow more than 10 % from minute 1 to the end."""

import os
import random
import signal
import threading
import time

import pytest

from tests.faults.client import request
from tests.faults.invariants import Observed, violations
from tests.support.procs import Fleet, group_pids, rss_kib, wait_until
from workflows.accounts import api_client_create
from workflows.models import Task
from workflows.rules.states import FINISHED_STATES

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECONDS = float(os.environ.get("PILOT_SOAK_SECONDS", "150"))
CLIENTS = 20


def payload_for(rng, key):
    if rng.random() < 0.2:
        return "demo.sync_orders", {"batch": key, "count": 5}
    return "demo.echo", {"key": key}


def test_a_soak_with_worker_kills_loses_nothing_duplicates_nothing_and_stays_flat():
    fleet = Fleet(PILOT_LEASE_SECONDS=3, PILOT_DISPATCHER_POLL_SECONDS=0.2)
    try:
        dispatcher = fleet.dispatcher()
        workers = fleet.workers()
        steady = fleet.workers()  # never killed: its long-lived processes are measured
        web, url = fleet.web(workers=2)
        systems = [api_client_create(f"soak-{name}") for name in ("a", "b")]
        observed = Observed()
        sent: dict = {0: [], 1: []}          # per system: (key, workflow, payload, task id)
        counts = {"requests": 0, "422": 0, "probes": 0}
        lock = threading.Lock()
        stop = threading.Event()

        def client(n: int):
            rng = random.Random(n)
            system = n % 2
            user, token = systems[system]
            i = 0
            while not stop.is_set():
                roll = rng.random()
                with lock:
                    mine, theirs = list(sent[system][-200:]), list(sent[1 - system][-200:])
                try:
                    if roll < 0.05 and theirs:                      # foreign-id probe
                        _, _, _, task_id = rng.choice(theirs)
                        r = request(url, "GET", f"/api/v1/tasks/{task_id}", token=token)
                        with lock:
                            counts["probes"] += 1
                            if r.status != 404:
                                observed.foreign_reads.append(f"{r.status} {task_id}")
                    elif roll < 0.10 and mine:                      # mismatched reuse
                        key, workflow, payload, _ = rng.choice(mine)
                        r = request(url, "POST", "/api/v1/tasks", token=token,
                                    headers={"Idempotency-Key": key},
                                    body={"workflow": workflow, "payload": {"other": key}})
                        with lock:
                            if r.status == 422:
                                counts["422"] += 1
                            elif r.status in (200, 202):
                                observed.wrong_answers.append(
                                    f"key {key} reused with another payload: {r.status}")
                    elif roll < 0.20 and mine:                      # re-send, same request
                        key, workflow, payload, task_id = rng.choice(mine)
                        r = request(url, "POST", "/api/v1/tasks", token=token,
                                    headers={"Idempotency-Key": key},
                                    body={"workflow": workflow, "payload": payload})
                        if r.status in (200, 202) and r.json()["id"] != task_id:
                            with lock:
                                observed.server_errors.append(f"re-send of {key} got "
                                                              f"another task")
                    else:                                           # new key
                        key = f"s{n}-{i}"
                        i += 1
                        workflow, payload = payload_for(rng, key)
                        r = request(url, "POST", "/api/v1/tasks", token=token,
                                    headers={"Idempotency-Key": key},
                                    body={"workflow": workflow, "payload": payload})
                        if r.status in (200, 202):
                            with lock:
                                sent[system].append((key, workflow, payload, r.json()["id"]))
                                observed.acknowledged[(user.pk, key)] = r.json()["id"]
                except OSError as exc:
                    with lock:
                        observed.server_errors.append(f"no answer: {exc}")
                    continue
                with lock:
                    counts["requests"] += 1
                    if r.status >= 500:
                        observed.server_errors.append(f"{r.status} {r.body[:200]!r}")
                time.sleep(rng.uniform(0.1, 0.3))

        def long_lived_rss() -> dict:
            return {kind: {pid: rss_kib(pid) for pid in group_pids(proc.popen.pid)}
                    for kind, proc in (("web", web), ("dispatcher", dispatcher),
                                       ("steady workers", steady))}

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        started = time.monotonic()
        for t in threads:
            t.start()
        rss_minute_1, next_kill = None, started + 30
        while time.monotonic() - started < SECONDS:
            time.sleep(1)
            if rss_minute_1 is None and time.monotonic() - started >= min(60, SECONDS / 2):
                rss_minute_1 = long_lived_rss()
            if time.monotonic() >= next_kill:
                workers.signal_group(signal.SIGKILL)
                workers.popen.wait(10)
                workers = fleet.workers()
                next_kill += 60
        stop.set()
        for t in threads:
            t.join(60)
        rss_end = long_lived_rss()
        wait_until(lambda: not Task.objects.exclude(state__in=FINISHED_STATES).exists(), 240,
                   interval=0.5, what="every soak task to finish")
        assert violations(observed) == []
        assert counts["probes"] > 0 and counts["422"] > 0
        # The same processes at both ends (a freshly restarted group would hide a
        # leak): every web process, the dispatcher, and the steady worker group's
        # processes that lived through (django-q2 recycles its workers after 500 tasks).
        growth, report = {}, []
        for kind, before in rss_minute_1.items():
            after = rss_end[kind]
            same = sorted(set(before) & set(after))
            if kind != "steady workers":
                assert same == sorted(before) == sorted(after), (kind, before, after)
            assert same, f"no {kind} process lived from minute 1 to the end"
            mib = (sum(before[p] for p in same) / 1024, sum(after[p] for p in same) / 1024)
            growth[kind] = mib[1] / mib[0] - 1
            report.append(f"{kind} ({len(same)}) {mib[0]:.1f} -> {mib[1]:.1f} MiB "
                          f"({growth[kind]:+.1%})")
        print(f"\nsoak {SECONDS:.0f}s: {counts['requests']} requests, "
              f"{len(observed.acknowledged)} tasks, {counts['422']} refused re-uses, "
              f"{counts['probes']} foreign probes; RSS of the same processes: "
              + ", ".join(report))
        assert all(g <= 0.10 for g in growth.values()), growth
    finally:
        fleet.stop_all()
