"""Trigger endpoint and batch trigger under gunicorn, loaded by wrk.

    python -m bench.workloads.http --reps 3 --seconds 10 --batches 4

Variants, interleaved in every repetition so drift hits them alike:
`ceiling` (POST /bench/ceiling, one bare insert), `new` (a new Idempotency-Key
per request), `replay` (keys that exist), `mixed` (alternately). Then `batch`:
POST /api/v1/tasks/batch with 1000 new items per request, one client per
gunicorn worker, each sending `--batches` batches. Concurrency 16 otherwise.
No workers run: triggers only enqueue. The environment names the broker; run
it with REDIS_URL set, which also puts the trigger throttle's counter in Redis
(else in the database cache).
"""

from __future__ import annotations

import argparse
import os
import uuid

from bench.common import emit_result
from bench.common import log as say
from bench.workloads import pilotdb
from bench.workloads.load import Server, batch_load, wrk

REPLAY_KEYS = 1000
BATCH_SIZE = 1000
VARIANTS = ("ceiling", "new", "replay", "mixed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batches", type=int, default=4, help="per connection, per rep")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    pilotdb.setup()
    from django.conf import settings

    pilotdb.reset()
    token = pilotdb.token()
    results: dict = {v: [] for v in (*VARIANTS, "batch")}
    with Server(dict(os.environ), name=f"gunicorn-http-{uuid.uuid4().hex[:6]}") as server:
        _create_replay_keys(server, token)
        for mode in ("ceiling", "new"):  # warm every gunicorn worker's connections and caches
            wrk(server.url, mode=mode, token=token, prefix=f"warm-{mode}", seconds=2,
                connections=args.concurrency)
        for rep in range(args.reps):
            for mode in VARIANTS:
                load = wrk(server.url, mode=mode, token=token, prefix=f"r{rep}-{mode}",
                           seconds=args.seconds, connections=args.concurrency,
                           replay_keys=REPLAY_KEYS)
                results[mode].append(load.summary())
                say(f"  trigger {mode:8} rep {rep + 1}: {load.rps:.0f} req/s, "
                    f"p99 {load.percentile_ms(99)} ms, non-2xx {load.non_2xx}")
            load = batch_load(server, token=token, prefix=f"r{rep}-batch",
                              connections=server.workers, batches=args.batches, size=BATCH_SIZE)
            results["batch"].append(load.summary(per_request=BATCH_SIZE))
            say(f"  batch           rep {rep + 1}: {load.rps * BATCH_SIZE:.0f} tasks/s")
    emit_result({"variants": results, "gunicorn_workers": server.workers,
                 "concurrency": args.concurrency, "batch_size": BATCH_SIZE,
                 "broker": "redis" if settings.REDIS_URL else "orm",
                 "throttle_cache": "redis" if settings.REDIS_URL else "database"})


def _create_replay_keys(server: Server, token: str) -> None:
    """The keys `replay` and `mixed` send again: same workflow and payload as the
    Lua script's requests, so every replay is a 200."""
    tasks = [{"idempotency_key": f"replay-{i}", "workflow": "test.noop3", "payload": {"n": 1}}
             for i in range(REPLAY_KEYS)]
    results = server.post_json("/api/v1/tasks/batch", token, {"tasks": tasks})["results"]
    statuses = {r["status"] for r in results}
    if statuses - {200, 202}:
        raise RuntimeError(f"creating the replay keys failed: {statuses}")


if __name__ == "__main__":
    main()
