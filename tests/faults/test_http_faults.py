"""Duplicate storms and lost responses against a real HTTP server and real
worker processes, on PostgreSQL. Each ends with the invariant checker."""

import random
import socket
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.client import request
from tests.faults.invariants import Observed, violations
from tests.support.procs import Fleet, wait_until
from workflows.accounts import api_client_create
from workflows.models import StepCheckpoint, Task
from workflows.rules.states import FINISHED_STATES

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet():
    """gunicorn (3 workers), qcluster and a dispatcher on the test database."""
    fleet = Fleet(PILOT_LEASE_SECONDS=3, PILOT_DISPATCHER_POLL_SECONDS=0.2)
    fleet.dispatcher()
    fleet.workers()
    fleet.web_proc, fleet.url = fleet.web()
    yield fleet
    fleet.stop_all()


def all_finished():
    return not Task.objects.exclude(state__in=FINISHED_STATES).exists()


def settled(quiet_seconds: float = 2.0):
    """Every task finished and no new one for `quiet_seconds`: a request whose
    client gave up may still reach the server (it sat in the listen backlog)
    and create its task after the clients are done."""
    state = {"count": -1, "since": 0.0}

    def check():
        count = Task.objects.count()
        if count != state["count"] or not all_finished():
            state.update(count=count, since=time.monotonic())
            return False
        return time.monotonic() - state["since"] >= quiet_seconds

    return check


def test_a_duplicate_storm_with_impatient_clients_runs_each_key_once(fleet):
    user, token = api_client_create("storm")
    rng = random.Random(7)
    observed = Observed()
    lock = threading.Lock()
    answers = defaultdict(list)  # key -> [(replayed, task id)] of the answers that arrived
    keys = [f"storm-{i}" for i in range(1000)]
    # Every fourth key is also sent by a second client at the same time: duplicates the
    # server must answer as replays, on top of the impatient clients' own retries. Four
    # impatient tries, then one that waits, as an upstream backing off does: the
    # abandoned requests still reach the server, and whatever the machine's speed most
    # keys get an answer to check (with 0.05-0.5 s for every try, a slow day with a
    # heavy test on the other pytest worker left 2 keys of 1 000 answered).
    plan = [(key, [rng.uniform(0.05, 0.5) for _ in range(4)] + [10.0])
            for key in keys + keys[::4]]
    rng.shuffle(plan)

    def send(key, timeouts):
        for timeout in timeouts:
            try:
                r = request(fleet.url, "POST", "/api/v1/tasks", token=token,
                            headers={"Idempotency-Key": key}, timeout=timeout,
                            body={"workflow": "demo.echo", "payload": {"key": key}})
            except OSError:
                continue  # gave up waiting: retry with the same key, as upstreams do
            with lock:
                if r.status >= 500:
                    observed.server_errors.append(f"{r.status} {key}")
                elif r.status in (200, 202):
                    observed.acknowledged[(user.pk, key)] = r.json()["id"]
                    replayed = {k.lower(): v for k, v in r.headers.items()}.get(
                        "idempotent-replayed")
                    answers[key].append((replayed, r.status, r.json()["id"]))
            return

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda item: send(*item), plan))
    wait_until(settled(), 180, interval=0.5, what="every stormed task to finish")
    assert violations(observed) == []
    # Not vacuous: most keys got an answer (their last try waits).
    assert len(observed.acknowledged) > 900
    assert Task.objects.count() <= 1000
    # The duplicates reached the server and were answered as replays of the one task:
    # per key one task id, at most one "created" answer (202, not replayed), every
    # other answer a 200 marked Idempotent-Replayed: true.
    replays = 0
    for key, seen in answers.items():
        assert len({task_id for _, _, task_id in seen}) == 1, (key, seen)
        created = [a for a in seen if a[:2] == ("false", 202)]
        assert len(created) <= 1, (key, seen)
        assert all(a[:2] in (("false", 202), ("true", 200)) for a in seen), (key, seen)
        replays += sum(1 for a in seen if a[0] == "true")
    assert replays >= 50, f"only {replays} replayed answers arrived"
    posts = fleet.web_proc.log().count('"POST /api/v1/tasks HTTP/1.1"')
    assert posts >= Task.objects.count() + replays, (posts, replays)
    print(f"\nstorm: {sum(len(a) for a in answers.values())} answers for "
          f"{Task.objects.count()} tasks, {replays} replays answered, {posts} POSTs served")
    # Zero duplicate executions: every task ran its step exactly once.
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    assert set(StepCheckpoint.objects.values_list("attempts", flat=True)) == {1}


def _read_message(sock) -> bytes:
    """One HTTP message (head + Content-Length body) from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class DroppingProxy:
    """Forwards one request to the server, reads the server's whole response
    (so the server has committed), then resets the client's connection without
    passing the response on: the response is lost in transit."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.forwarded = threading.Event()
        self.thread = threading.Thread(target=self._serve_one, daemon=True)
        self.thread.start()

    def _serve_one(self):
        try:
            client, _ = self.listener.accept()
            with client, socket.create_connection(("127.0.0.1", self.upstream_port)) as up:
                client.settimeout(10)
                up.settimeout(10)
                up.sendall(_read_message(client))
                if _read_message(up).startswith(b"HTTP/1."):
                    self.forwarded.set()
                # Abort (RST) instead of a clean close: the client sees a reset.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                  (1).to_bytes(4, "little") + (0).to_bytes(4, "little"))
        finally:
            self.listener.close()


def test_a_lost_response_is_answered_by_the_retry_with_the_original_task(fleet):
    user, token = api_client_create("lossy")
    proxy = DroppingProxy(int(fleet.url.rsplit(":", 1)[1]))
    body = {"workflow": "demo.sync_orders", "payload": {"batch": "lost-1", "count": 20}}
    with pytest.raises(OSError):
        request(f"http://127.0.0.1:{proxy.port}", "POST", "/api/v1/tasks", token=token,
                headers={"Idempotency-Key": "lost-1"}, body=body, timeout=10)
    proxy.thread.join(10)
    assert proxy.forwarded.is_set()
    assert Task.objects.filter(idempotency_key="lost-1").count() == 1  # it was committed
    retry = request(fleet.url, "POST", "/api/v1/tasks", token=token,
                    headers={"Idempotency-Key": "lost-1"}, body=body)
    assert retry.status == 200 and retry.headers["Idempotent-Replayed"] == "true"
    original = Task.objects.get(idempotency_key="lost-1")
    assert retry.json()["id"] == str(original.pk)
    wait_until(all_finished, 60, what="the task to finish")
    observed = Observed(acknowledged={(user.pk, "lost-1"): retry.json()["id"]})
    assert violations(observed) == []
    original.refresh_from_db()
    assert (original.state, original.replays, original.result) == ("succeeded", 1,
                                                                   {"written": 20})
