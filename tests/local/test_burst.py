"""`make run` under an upstream system's burst: 100 connections at once, all
with the same key, ten rounds. gunicorn (threads, a listen backlog of 2048)
answers every one; SQLite (IMMEDIATE transactions, WAL, a busy timeout) never
says `database is locked`; idempotency holds: one task per round, 99 replays."""

from __future__ import annotations

import http.client
import json
import sqlite3
import threading
from contextlib import closing

import pytest

from tests.local.conftest import skip_on_postgres

pytestmark = [pytest.mark.slow, skip_on_postgres]

CLIENTS = 100
ROUNDS = 10


def trigger(port: int, token: str, key: str, payload: dict) -> tuple[int, str, str]:
    """One POST /api/v1/tasks on a fresh connection: (status, replayed header, task id)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/api/v1/tasks",
                     body=json.dumps({"workflow": "demo.echo", "payload": payload}),
                     headers={"Authorization": f"Token {token}", "Idempotency-Key": key,
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read() or b"{}")
        return response.status, response.getheader("Idempotent-Replayed", ""), \
            body.get("id", "")
    finally:
        conn.close()


def test_a_burst_of_identical_triggers_gets_one_task_per_round_and_no_connection_errors(
        local_run):
    run = local_run()
    barrier = threading.Barrier(CLIENTS)
    answers: list[list] = [[] for _ in range(ROUNDS)]
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        for r in range(ROUNDS):
            barrier.wait(timeout=120)  # all 100 connect at once, round after round
            try:
                answer = trigger(run.port, run.token, f"burst-{r}", {"round": r})
            except (OSError, http.client.HTTPException, ValueError) as exc:
                answer = None
                with lock:
                    errors.append(f"round {r}: {type(exc).__name__}: {exc}")
            with lock:
                answers[r].append(answer)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)

    assert errors == []
    for r, round_answers in enumerate(answers):
        statuses = sorted(status for status, _, _ in round_answers)
        assert statuses == [200] * (CLIENTS - 1) + [202], f"round {r}: {statuses}"
        replays = [replayed for status, replayed, _ in round_answers if status == 200]
        assert replays == ["true"] * (CLIENTS - 1), f"round {r}"
        assert len({task_id for _, _, task_id in round_answers}) == 1, f"round {r}"
    with closing(sqlite3.connect(run.database)) as db:  # `with connect()` does not close
        rows = db.execute("SELECT idempotency_key, COUNT(*) FROM workflows_task "
                          "GROUP BY idempotency_key ORDER BY idempotency_key").fetchall()
    assert rows == [(f"burst-{r}", 1) for r in range(ROUNDS)]
    log = run.log()
    assert "database is locked" not in log
    assert '" 500 ' not in log  # gunicorn's access log line of a server error
