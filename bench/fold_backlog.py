"""How fast the dispatcher folds a backlog of the replay log, and how long each
fold holds up the dispatcher's pass (docs/design.md, "Dispatcher").

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pilot_bench_fold \\
        .venv/bin/python bench/fold_backlog.py [--rows 200000] [--tasks 2000] [--reps 2]

Uses its own database (created if missing, migrated, emptied first; the name
in DATABASE_URL must contain "bench"). A backlog is what a deployment upgrading
from a version without the fold has, or one whose dispatchers were down for
days: ROWS unfolded replay rows spread over TASKS tasks and the last 48 UTC
hours. Each repetition lays the same backlog down afresh and folds it to the
end, pass after pass, as the dispatcher loop does after a start (the whole
log; a pass that stopped at its batch goes on at the next), with

- the PostgreSQL store: a batch of groups in one statement (store/sql.py
  `fold_replays`), and
- the portable ORM store, one transaction per group: the way PILOT folded
  before, the baseline, measured in the same run.

Prints, per folder, the median time to fold the backlog, the rows folded per
second, the median and the longest pass (the dispatcher does nothing else
meanwhile), and the ratios; writes bench/out/fold_backlog.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The standalone benches' settings (environment defaults) come with it.
from bench.cleanup_latency import standalone_database  # noqa: E402 - after sys.path

HOURS = 48
MAX_PASSES = 100_000  # a bound, never reached: a pass folds at least one group


def lay_backlog(rows: int) -> None:
    """ROWS replay rows, one per (task, hour) slot in turn: row g goes to task
    g mod TASKS and to g mod 48 hours before now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workflows_taskreplay")
        cursor.execute("""
            WITH t AS (SELECT id, workflow, row_number() OVER (ORDER BY id) - 1 AS n
                         FROM workflows_task)
            INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
            SELECT t.id, t.workflow, 1, now() - make_interval(hours => g %% %s)
              FROM generate_series(1, %s) AS g
              JOIN t ON t.n = g %% (SELECT count(*) FROM t)""", [HOURS, rows])
        cursor.execute("VACUUM ANALYZE workflows_taskreplay")


def fold_to_the_end(folder) -> dict:
    """Pass after pass (the whole log, the store's own batch) until a fold
    finds fewer groups than its batch."""
    passes, removed = [], 0
    started = time.perf_counter()
    for _ in range(MAX_PASSES):
        t = time.perf_counter()
        _, gone, found = folder.fold_replays(since=None, batch=folder.fold_batch)
        passes.append(time.perf_counter() - t)
        removed += gone
        if found < folder.fold_batch:
            break
    return {"seconds": time.perf_counter() - started, "removed": removed,
            "passes": len(passes), "pass_median_ms": statistics.median(passes) * 1000,
            "pass_max_ms": max(passes) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--tasks", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    standalone_database()
    from django.contrib.auth import get_user_model

    from tests.factories import make_finished_tasks
    from workflows.engine.store.orm import OrmStore
    from workflows.engine.store.postgres import PostgresStore
    from workflows.models import Task, TaskReplay

    TaskReplay.objects.all().delete()
    Task.objects.all().delete()
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    make_finished_tasks(owner, args.tasks, key_prefix="fold")
    folders = {"postgres": PostgresStore(), "orm": OrmStore()}
    runs: dict[str, list[dict]] = {name: [] for name in folders}
    for rep in range(args.reps):
        for name, folder in folders.items():  # interleaved: drift hits both alike
            lay_backlog(args.rows)
            groups = TaskReplay.objects.values("task_id").distinct().count()
            run = fold_to_the_end(folder)
            left = TaskReplay.objects.count()
            total = sum(TaskReplay.objects.values_list("count", flat=True))
            if total != args.rows:
                sys.exit(f"{name}: the log counts {total} replays after the fold, not {args.rows}")
            run.update(rows_left=left, tasks_with_rows=groups)
            runs[name].append(run)
            print(f"rep {rep + 1} {name:8s}: {run['seconds']:7.1f} s, {run['passes']} passes, "
                  f"pass median {run['pass_median_ms']:.0f} ms, max {run['pass_max_ms']:.0f} ms,"
                  f" {args.rows} -> {left} rows", flush=True)

    def med(name, key):
        return statistics.median(r[key] for r in runs[name])

    summary = {name: {"seconds": round(med(name, "seconds"), 2),
                      "rows_per_second": round(med(name, "removed") / med(name, "seconds")),
                      "passes": med(name, "passes"),
                      "pass_median_ms": round(med(name, "pass_median_ms"), 1),
                      "pass_max_ms": round(med(name, "pass_max_ms"), 1),
                      "batch": folders[name].fold_batch}
               for name in folders}
    report = {"rows": args.rows, "tasks": args.tasks, "hours": HOURS, "reps": args.reps,
              "runs": runs, "summary": summary,
              "speedup": round(summary["orm"]["seconds"] / summary["postgres"]["seconds"], 1),
              "groups_per_ms_ratio": round(
                  (summary["postgres"]["batch"] / summary["postgres"]["pass_median_ms"])
                  / (summary["orm"]["batch"] / summary["orm"]["pass_median_ms"]), 1)}
    out = ROOT / "bench" / "out" / "fold_backlog.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nbacklog of {args.rows} replay rows over {args.tasks} tasks x {HOURS} hours, "
          f"medians of {args.reps}:")
    print("| folder | batch (groups) | to fold it all | rows/s | passes | pass median | "
          "longest pass |")
    print("|---|---|---|---|---|---|---|")
    for name, label in (("postgres", "PostgreSQL store, one statement a batch"),
                        ("orm", "ORM store, a transaction a group (before)")):
        s = summary[name]
        print(f"| {label} | {s['batch']} | {s['seconds']:.1f} s | {s['rows_per_second']:,} | "
              f"{s['passes']:g} | {s['pass_median_ms']:.0f} ms | {s['pass_max_ms']:.0f} ms |")
    print(f"\nto fold it all: {report['speedup']}x faster; groups folded per ms of a pass: "
          f"{report['groups_per_ms_ratio']}x")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
