"""Bench-only instrumentation of qcluster processes, active when
BENCH_PROBE_DIR is set: which pids are workers (for peak RSS per worker) and
what every delivery returned (PILOT's run_task says "skipped" for a duplicate
message). Off the workers' hot path: a worker touches one file once; the
counting happens in django-q2's monitor process."""

import json
import os
from collections import Counter
from pathlib import Path

from django_q.signals import post_execute, pre_execute

_seen_worker = False
_outcomes: Counter = Counter()


def connect() -> None:
    if os.environ.get("BENCH_PROBE_DIR"):
        pre_execute.connect(_worker_started_task, weak=False, dispatch_uid="bench-worker")
        post_execute.connect(_monitor_got_result, weak=False, dispatch_uid="bench-monitor")


def _dir() -> Path:
    return Path(os.environ["BENCH_PROBE_DIR"])


def _worker_started_task(sender, **kwargs) -> None:
    global _seen_worker
    if not _seen_worker:
        _seen_worker = True
        (_dir() / f"worker-{os.getpid()}").touch()


def _monitor_got_result(sender, task, **kwargs) -> None:
    _outcomes[str(task.get("result"))[:40]] += 1
    path = _dir() / f"monitor-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_outcomes))
    os.replace(tmp, path)
