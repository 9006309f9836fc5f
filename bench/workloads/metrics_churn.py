"""A week of worker churn, then `/metrics`: does the scrape stay fast?

Every recycled worker process leaves its Prometheus multiprocess files (a
counter and a histogram file) in PROMETHEUS_MULTIPROC_DIR. Here:

1. one real process does what a django-q2 worker does in its life (500
   tasks of three steps over five workflows: claims with their queue lag, step
   durations, transitions) through PILOT's own event listener, and exits: its
   files are the template;
2. they are copied for `--recycles` dead processes (pids above pid_max, so
   surely dead; written sparse like the originals), and for `--live` live ones
   (sleeping children), which is what a machine's directory holds after a week
   at ~10 runs/s (10 000 recycles);
3. measured, each `--reps` times:
   - before: what a scrape cost before compaction existed — prometheus-client's
     MultiProcessCollector over every file;
   - the first `GET /metrics` (Django's test client, the real view and its
     database gauges), which compacts the dead processes' files first;
   - steady: `GET /metrics` again, then after every further churn of
     `--more` recycles (compacted by that scrape);
4. checked: every counter and histogram total is the same before and after.

Prints one BENCH-RESULT line (bench/common.py). Run alone by
`make bench BENCH_ONLY=metrics`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIFE = """
import django, random
django.setup()
from workflows.observability.events import emit
random.seed(7)
workflows = [f"shop.flow{n}" for n in range(5)]
for n in range(500):
    workflow = workflows[n % 5]
    emit("task_claimed", workflow=workflow, queue_lag_seconds=random.random() / 5)
    emit("task_transitioned", workflow=workflow, from_state="pending", to_state="running")
    for step in ("fetch", "transform", "write"):
        emit("step_finished", workflow=workflow, step=step,
             duration_ms=random.expovariate(1 / 40))
    outcome = "failed" if n % 50 == 0 else "succeeded"
    emit("task_transitioned", workflow=workflow, from_state="running", to_state=outcome)
    emit("task_triggered", workflow=workflow, outcome="created")
emit("dispatcher_action", action="recovered", count=1)
"""


def one_life(directory: Path) -> dict[str, bytes]:
    """{type: the used bytes of its file} of one real worker's life."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run([sys.executable, "-c", LIFE], env=env, capture_output=True,
                          text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"the worker's life failed:\n{done.stderr[-3000:]}")
    templates = {}
    for path in directory.glob("*.db"):
        typ = path.name.split("_")[0]
        data = path.read_bytes()
        used = int.from_bytes(data[:4], sys.byteorder)
        templates[typ] = data[:used]
        path.unlink()
    return templates


def plant(directory: Path, templates: dict[str, bytes], pids) -> int:
    """Files for `pids` as their processes would leave them (1 MiB, sparse)."""
    n = 0
    for pid in pids:
        for typ, used in templates.items():
            with open(directory / f"{typ}_{pid}.db", "wb") as out:
                out.write(used)
                out.truncate(1024 * 1024)
            n += 1
    return n


def totals(directory: Path) -> dict[str, float]:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in registry.collect() for s in family.samples}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recycles", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=12)
    parser.add_argument("--more", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="pilot-metrics-churn-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    directory = root / "metrics"
    directory.mkdir()
    template_dir = root / "template"
    template_dir.mkdir()
    templates = one_life(template_dir)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.live)]
    try:
        files = plant(directory, templates, range(pid_max + 1, pid_max + 1 + args.recycles))
        files += plant(directory, templates, [p.pid for p in sleepers])
        expected = totals(directory)

        # Before: the whole directory read by every scrape.
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        def old_scrape():
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(directory))
            generate_latest(registry)

        before = [timed(old_scrape) for _ in range(args.reps)]

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        import django

        django.setup()
        from django.test import Client

        client = Client()

        def scrape():
            response = client.get("/metrics")
            assert response.status_code == 200, response.status_code

        first = timed(scrape)
        files_after = len(list(directory.glob("*.db")))
        steady = [timed(scrape) for _ in range(args.reps)]
        churned = []
        next_pid = pid_max + 1 + args.recycles
        for _ in range(args.reps):
            plant(directory, templates, range(next_pid, next_pid + args.more))
            next_pid += args.more
            churned.append(timed(scrape))
        # Every planted process holds the same counts: after the churn, each
        # total is the one before times (planted + grown) / planted.
        grown, planted = args.reps * args.more, args.recycles + args.live
        after = totals(directory)
        mismatched = [key for key, value in expected.items()
                      if "_created" not in key
                      and abs(after.get(key, 0.0) * planted / (planted + grown)
                              - value) > 1e-6 * max(1.0, abs(value))]
        from bench.common import emit_result

        emit_result({
            "recycles": args.recycles, "live": args.live, "files_before": files,
            "files_after": files_after, "more": args.more,
            "before_s": before, "first_s": first, "steady_s": steady, "churned_s": churned,
            "totals_kept": not mismatched and len(after) == len(expected),
            "mismatched": mismatched[:5],
        })
        print(f"before {statistics.median(before):.3f} s, first {first:.3f} s, "
              f"steady {statistics.median(steady):.4f} s, with churn "
              f"{statistics.median(churned):.4f} s", file=sys.stderr)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
