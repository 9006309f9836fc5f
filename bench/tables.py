"""The workloads' answers (bench/out/results.json) as report sections, and the
goals of issues 7 and 16 measured against them: medians over repetitions, min–max,
ratios of medians against the baselines measured in the same run."""

from __future__ import annotations

import os

from bench.baseline import BASELINE
from bench.report import MISSING, Goal, Section, median, number, ratio, spread, times

E2E_SYSTEMS = [("pilot", "orm"), ("baseline", "orm"), ("rawdefault", "orm"), ("raw", "orm"),
               ("pilot", "redis"), ("baseline", "redis"), ("rawdefault", "redis"),
               ("raw", "redis"), ("dbos", None), ("procrastinate", None)]
LABELS = {"pilot": "PILOT (test.noop3)",
          "baseline": f"PILOT before issues 10 and 16 ({BASELINE})",
          "rawdefault": "raw django-q2, its defaults (3 rows)",
          "raw": "raw django-q2, PILOT's tuned cluster (3 rows)",
          "dbos": "DBOS Transact (3 steps)", "procrastinate": "Procrastinate (3 rows)"}
BROKERS = {"orm": "ORM (PostgreSQL)", "redis": "Redis", None: "its own (PostgreSQL)"}


def _variant(http: dict | None, name: str) -> list[dict]:
    return (http or {}).get("variants", {}).get(name, [])


def _values(items: list[dict], key: str) -> list:
    return [item.get(key) for item in items if item]


def trigger_section(r: dict, goals: list[Goal]) -> list[Section]:
    http = r.get("http")
    ceiling = _variant(http, "ceiling")
    base_rps, base_p99 = median(_values(ceiling, "rps")), median(_values(ceiling, "p99_ms"))
    rows = []
    labels = {"ceiling": "bare DRF insert (ceiling)", "new": "trigger, new keys",
              "replay": "trigger, 100 % replays", "mixed": "trigger, 50/50 mixed"}
    for name, label in labels.items():
        items = _variant(http, name)
        rps, p99 = median(_values(items, "rps")), median(_values(items, "p99_ms"))
        rows.append([label, spread(_values(items, "rps")), spread(_values(items, "p50_ms"), 1),
                     spread(_values(items, "p99_ms"), 1), times(ratio(rps, base_rps)),
                     times(ratio(p99, base_p99)), sum(_values(items, "non_2xx"))])
        if name == "ceiling":
            continue
        if name in ("new", "replay"):
            target = 0.95 if name == "new" else 1.0
            value = ratio(rps, base_rps)
            goals.append(Goal(f"{label}: req/s vs ceiling", times(value), f"≥ {target}×",
                              None if value is None else value >= target))
        value = ratio(p99, base_p99)
        goals.append(Goal(f"{label}: p99 vs ceiling p99", times(value), "≤ 1.2×",
                          None if value is None else value <= 1.2))
    notes = []
    if http:
        notes = [f"gunicorn {http['gunicorn_workers']} sync workers; wrk, 2 threads, "
                 f"{http['concurrency']} connections, {r['plan']['trigger_seconds']} s per "
                 f"variant and repetition, variants interleaved; "
                 f"{len(ceiling)} repetition(s).",
                 f"Broker: {http['broker']}; the trigger throttle counts in the "
                 f"{http['throttle_cache']} cache (PILOT_TRIGGER_RATE raised so it never "
                 "refuses). No workers run: triggers only enqueue.",
                 "The ceiling has the same token authentication and add_task permission, "
                 "validates the body and inserts one comparable row (bench/ceiling)."]
    header = ["workload", "req/s median (min–max)", "p50 ms", "p99 ms", "req/s vs ceiling",
              "p99 vs ceiling", "non-2xx"]
    return [Section("1. Trigger endpoint (POST /api/v1/tasks)", header, rows, notes)]


def batch_section(r: dict, goals: list[Goal]) -> list[Section]:
    http = r.get("http")
    batch, single = _variant(http, "batch"), _variant(http, "new")
    tasks_per_s = median(_values(batch, "items_per_s"))
    single_rps = median(_values(single, "rps"))
    value = ratio(tasks_per_s, single_rps)
    goals.append(Goal("batch tasks/s vs single new-key triggers", times(value), "≥ 10×",
                      None if value is None else value >= 10))
    rows = [["POST /api/v1/tasks/batch, 1000 items", spread(_values(batch, "items_per_s")),
             spread(_values(batch, "p50_ms"), 0), times(value)],
            ["POST /api/v1/tasks, one per request (new keys)", spread(_values(single, "rps")),
             spread(_values(single, "p50_ms"), 1), "1.00×"]]
    notes = [f"Batch: one client per gunicorn worker, each sending {r['plan']['batches']} "
             "batch(es) of 1000 new keys per repetition; tasks/s over the whole burst."]
    return [Section("2. Batch trigger", ["how", "tasks/s median (min–max)",
                                         "latency p50 ms (per request)", "vs single"],
                    rows, notes)]


def _e2e(r: dict, system: str, broker: str | None) -> list[dict]:
    return [x["result"] for x in r["e2e"]
            if x["system"] == system and x["broker"] == broker and x["result"]]


def e2e_section(r: dict, goals: list[Goal]) -> list[Section]:
    raw = {b: median(_values(_e2e(r, "rawdefault", b), "runs_per_s")) for b in ("orm", "redis")}
    tuned = {b: median(_values(_e2e(r, "raw", b), "runs_per_s")) for b in ("orm", "redis")}
    pilot = {b: median(_values(_e2e(r, "pilot", b), "runs_per_s")) for b in ("orm", "redis")}
    baseline = {b: median(_values(_e2e(r, "baseline", b), "runs_per_s"))
                for b in ("orm", "redis")}
    peers = {s: median(_values(_e2e(r, s, None), "runs_per_s")) for s in ("dbos",
                                                                           "procrastinate")}
    rows, reps = [], 0
    for system, broker in E2E_SYSTEMS:
        items = _e2e(r, system, broker)
        reps = max(reps, len(items))
        rate = median(_values(items, "runs_per_s"))
        vs_raw = times(ratio(rate, raw[broker])) if broker else MISSING
        vs_tuned = times(ratio(rate, tuned[broker])) if broker else MISSING
        rss = [i.get("rss", {}) for i in items]
        worker_rss = max((x.get("worker", 0) for x in rss), default=None)
        others = [v for x in rss for k, v in x.items() if k not in ("worker", "workers_seen")]
        per_run = [i.get("per_run", {}) for i in items]
        extra = sum(_values(items, "extra_messages")) if system in ("pilot", "baseline") \
            else MISSING
        before = baseline[broker] if system == "pilot" and broker else None
        rows.append([LABELS[system], BROKERS[broker], spread(_values(items, "runs_per_s"), 1),
                     vs_raw, vs_tuned, times(ratio(rate, before)) if before else MISSING,
                     number(worker_rss, 1), number(max(others, default=None), 1),
                     number(median(_values(per_run, "commits")), 1),
                     number(median([(p.get("inserted", 0) + p.get("updated", 0)
                                     + p.get("deleted", 0)) for p in per_run if p]), 1),
                     number(median(_values(per_run, "wal_bytes"))),
                     extra, len(items)])
    for broker in ("orm", "redis"):
        value = ratio(pilot[broker], raw[broker])
        goals.append(Goal(f"end to end, {BROKERS[broker]} broker: PILOT vs raw django-q2",
                          times(value), "≥ 0.8×", None if value is None else value >= 0.8))
    for broker, target in (("orm", 0.9), ("redis", 1.0)):
        value = ratio(pilot[broker], tuned[broker])
        goals.append(Goal(f"end to end, {BROKERS[broker]} broker: PILOT vs raw django-q2 on "
                          "PILOT's tuned cluster", times(value), f"≥ {target}×",
                          None if value is None else value >= target))
    pilot_rss = [i.get("rss", {}).get("worker") for b in ("orm", "redis")
                 for i in _e2e(r, "pilot", b)]
    pilot_rss = [x for x in pilot_rss if x]
    goals.append(Goal("peak RSS per PILOT worker process", number(max(pilot_rss, default=None),
                                                                   1) + " MB", "≤ 80 MB",
                      None if not pilot_rss else max(pilot_rss) <= 80))
    for broker in ("orm", "redis"):
        value = ratio(pilot[broker], peers["dbos"])
        goals.append(Goal(f"end to end, {BROKERS[broker]} broker: PILOT vs DBOS",
                          times(value), "≥ 1.4×", None if value is None else value >= 1.4))
    value = ratio(pilot["redis"], peers["procrastinate"])
    goals.append(Goal("end to end, Redis broker: PILOT vs Procrastinate", times(value),
                      "≥ 1.0×", None if value is None else value >= 1))
    notes = [f"{r['plan']['e2e_runs']} runs per repetition, from the first trigger to the "
             "last run's final write (read from the database); qcluster with 2 workers "
             "(+ run_dispatcher for PILOT). Raw django-q2 twice: with django-q2's defaults "
             "(results saved, the baseline of the issue's reference figures and of the goal) "
             "and on PILOT's tuned cluster settings (no result rows: the ceiling). "
             "DBOS and Procrastinate with 2 worker processes (bench/peers/).",
             "Peak RSS is VmHWM from /proc, sampled every 0.25 s; 'other' is the largest of "
             "the qcluster sentinel/pusher/monitor and the dispatcher.",
             "Transactions and rows per run: pg_stat_database of the system's database over "
             "the timed part (so broker polling, the dispatcher and the peers' own "
             "bookkeeping count too, not only the runs' statements).",
             "Extra messages: messages the dispatcher sent again for pending tasks (none is "
             "lost here, so each was a duplicate), over all repetitions.",
             f"PILOT before: commit {BASELINE}, the engine before the correctness and the "
             "performance issues, with today's bench code (bench/baseline.py), in this run.",
             "WAL bytes/run: the server's WAL position over the timed part, per run "
             "(server-wide: anything else writing on the server counts too)."]
    header = ["system", "broker", "runs/s median (min–max)", "vs raw django-q2 (defaults)",
              "vs raw (tuned)", "vs PILOT before",
              "peak RSS worker MB", "peak RSS other MB", "DB transactions/run",
              "rows written/run", "WAL bytes/run", "extra messages", "reps"]
    return [Section("3. End to end: 3-step runs, trigger to all succeeded", header, rows,
                    notes)]


LAG_P99_MS = {"redis": 25, "orm": 100}  # paced, PILOT (issue 16)


def lag_section(r: dict, goals: list[Goal]) -> list[Section]:
    rows = []
    paced = [item for item in r.get("paced") or [] if item]
    rows.extend([LABELS[item["system"]], BROKERS[item["broker"]],
                 f"paced, {number(item['paced'])} triggers/s, {item['runs']} runs",
                 number(item["lag_p50_ms"], 1), number(item["lag_p99_ms"], 1)]
                for item in paced)
    for broker, target in LAG_P99_MS.items():
        value = next((i["lag_p99_ms"] for i in paced
                      if i["system"] == "pilot" and i["broker"] == broker), None)
        goals.append(Goal(f"queue lag p99, paced, {BROKERS[broker]} broker",
                          MISSING if value is None else f"{number(value, 1)} ms",
                          f"≤ {target} ms", None if value is None else value <= target))
    for system, broker in E2E_SYSTEMS:
        items = _e2e(r, system, broker)
        if items:
            rows.append([LABELS[system], BROKERS[broker],
                         f"burst of {r['plan']['e2e_runs']} (backlog)",
                         spread(_values(items, "lag_p50_ms"), 0),
                         spread(_values(items, "lag_p99_ms"), 0)])
    notes = ["PILOT: Task.created_at to the first StepCheckpoint's started_at. Raw "
             "django-q2 and Procrastinate: enqueue time to the first row's write. DBOS: "
             "workflow created_at to started_at_epoch_ms.",
             "In a burst every run waits behind the backlog, so burst lag is mostly queueing; "
             "the paced rows are the lag of an unloaded system.",
             "Paced: the first run after the one warm-up run usually lands on the other, "
             "still cold worker (a new database connection whose statements are prepared and "
             "planned on first use: ~20 ms against ~4 ms), so a p99 over fewer than ~100 runs "
             "is that one run; hence 200."]
    return [Section("4. Queue lag: trigger to first step start", ["system", "broker", "load",
                                                                  "p50 ms", "p99 ms"],
                    rows, notes)]


def cleanup_section(r: dict, goals: list[Goal]) -> list[Section]:
    c = r.get("cleanup")
    if not c:
        goals.append(Goal("trigger p99 during cleanup vs without", MISSING, "≤ 2×", None))
        return [Section("5. Cleanup under trigger load", ["—"], [["the workload failed"]])]
    value = ratio(c["with"]["p99_ms"], c["without"]["p99_ms"])
    name = "trigger p99 during cleanup vs without"
    if c["standin"]:
        name += " (STAND-IN cleanup)"
    goals.append(Goal(name, times(value), "≤ 2×", None if value is None else value <= 2))
    rows = [["new-key triggers alone", number(c["without"]["rps"]),
             number(c["without"]["p50_ms"], 1), number(c["without"]["p99_ms"], 1), "1.00×"],
            ["new-key triggers while cleanup runs", number(c["with"]["rps"]),
             number(c["with"]["p50_ms"], 1), number(c["with"]["p99_ms"], 1), times(value)]]
    what = ("a STAND-IN (bench/workloads/cleanup_standin.py: 1000-row batches through "
            "workflows.engine.cleanup.tasks_delete), because this checkout has no "
            "cleanup_tasks command yet" if c["standin"] else f"`python {c['command']}`")
    notes = [f"{number(c['tasks'])} expired tasks (3 steps, 2 transitions each) deleted by "
             f"{what}: {number(c['cleanup_seconds'], 1)} s, {number(c['deleted_per_s'])} "
             f"tasks/s, {c['remaining']} left, exit code {c['exit_code']}.",
             f"Load: wrk, 16 connections, new keys; 'with' is {c['windows']} window(s) of 2 s "
             f"while the cleanup ran (it ran during {c['overlap'] * 100:.0f} % of them). "
             "One repetition."]
    return [Section("5. Cleanup under trigger load", ["load", "req/s", "p50 ms", "p99 ms",
                                                      "p99 vs alone"], rows, notes)]


def scaling_section(r: dict, goals: list[Goal]) -> list[Section]:
    by: dict[tuple[str, int], list[dict]] = {}
    for item in r.get("scaling") or []:
        if item:
            by.setdefault((item["system"], item["workers"]), []).append(item)
    rate = {key: median(_values(items, "runs_per_s")) for key, items in by.items()}
    rows = [[LABELS[system], workers, spread(_values(items, "runs_per_s"), 1),
             times(ratio(rate[(system, workers)], rate.get((system, 1)))),
             number(max(filter(None, _values([i["rss"] for i in items], "worker")),
                        default=None), 1)]
            for (system, workers), items in sorted(by.items())]
    value = ratio(rate.get(("pilot", 2)), rate.get(("pilot", 1)))
    reference = ratio(rate.get(("raw", 2)), rate.get(("raw", 1)))
    goals.append(Goal("scaling: 2 worker processes vs 1", times(value), "≥ 1.7×",
                      None if value is None else value >= 1.7))
    reps = r["plan"].get("scaling_reps", 1)
    notes = [f"Redis broker, {r['plan']['scaling_runs']} runs each; 1 and 2 workers "
             f"{reps} repetition(s) interleaved (median, min–max), PILOT at 4 once; qcluster "
             f"with W workers (+ run_dispatcher for PILOT) on this machine's "
             f"{os.cpu_count()} cores.",
             f"Raw django-q2 on the same cluster settings is the machine's own reference: "
             f"2 vs 1 workers {times(reference)} (PILOT {times(value)}). PostgreSQL, Redis, "
             "the pusher and the monitor share the cores with the workers."]
    return [Section("6. Scaling: end-to-end rate by worker processes",
                    ["system", "workers", "runs/s", "vs 1 worker", "peak RSS worker MB"],
                    rows, notes)]


def queries_section(r: dict, goals: list[Goal]) -> list[Section]:
    orm, redis = r.get("queries_orm") or {}, r.get("queries_redis") or {}
    drained = (redis or orm).get("worker_run", {}).get("drained_per_run")
    goals.append(Goal("worker statements per 3-step run (backlog, steady state)",
                      number(drained, 2), "≤ 4", None if drained is None else drained <= 4))

    def cell(q: dict, *path) -> str:
        for key in path:
            q = q.get(key, {}) if isinstance(q, dict) else {}
        return MISSING if q == {} else str(q)

    def both(*path) -> list[str]:
        return [cell(orm, *path), cell(redis, *path)]

    rows = [["API trigger, new key (whole request)", *both("api_new_key", "statements"),
             *both("api_new_key", "transactions")],
            ["API trigger, replay (whole request)", *both("api_replay", "statements"),
             *both("api_replay", "transactions")],
            ["API batch of 100 (whole request)", *both("api_batch_100", "statements"),
             *both("api_batch_100", "transactions")],
            ["ceiling endpoint (whole request)", *both("ceiling", "statements"),
             *both("ceiling", "transactions")],
            ["worker: run_task of one test.noop3 run, nothing else due",
             *both("worker_run", "statements"), *both("worker_run", "transactions")],
            ["worker: per run while draining a backlog (success claims the next)",
             *both("worker_run", "drained_per_run"), MISSING, MISSING],
            ["django-q2 ORM broker per message (dequeue + ack)",
             cell(orm, "worker_run", "broker_per_message"), "(Redis)", MISSING, MISSING],
            ["raw django-q2 task (write3)", *both("raw_run", "statements"),
             *both("raw_run", "transactions")]]
    kinds = (redis or orm).get("worker_run", {}).get("kinds", {})
    notes = ["Statements include BEGIN and COMMIT: they are database round trips. Counted "
             "in-process with Django's CaptureQueriesContext (pg_stat_statements is not "
             "loaded on the shared server). PREPARE (once per connection and hot "
             f"statement: {cell(redis or orm, 'worker_run', 'prepares')} in this workload) "
             "is not counted per run.",
             "ORM column: the throttle counts in the database cache; Redis column: in Redis.",
             "One worker run: " + ", ".join(f"{n}× {k}" for k, n in kinds.items()) + "."]
    return [Section("7. Queries per PILOT run", ["what", "statements (ORM/DB cache)",
                                                 "statements (Redis)", "transactions (ORM)",
                                                 "transactions (Redis)"], rows, notes)]


def admin_section(r: dict, goals: list[Goal]) -> list[Section]:
    """The operator console's pages (bench/workloads/admin_pages.py)."""
    a = r.get("admin_pages")
    budgeted = ("task list (newest first)", "task page (50 steps, 150 transitions)", "dashboard")
    if not a:
        goals.extend(Goal(f"console: {name}", MISSING, "≤ 300 ms", None) for name in budgeted)
        return [Section("8. Operator console pages", ["—"], [["the workload failed"]])]
    pages = a["pages"]
    base = pages["baseline: Django's admin list of users"]["median_ms"]
    for name in budgeted:
        median_ms = pages[name]["median_ms"]
        goals.append(Goal(f"console: {name} at {number(a['tasks'])} tasks",
                          f"{number(median_ms, 1)} ms", f"≤ {a['budget_ms']} ms",
                          median_ms <= a["budget_ms"]))
    rows = [[name, number(p["median_ms"], 1), f"{number(p['min_ms'], 1)}–"
             f"{number(p['max_ms'], 1)}", times(ratio(p["median_ms"], base)), p["queries"]]
            for name, p in pages.items()]
    notes = [f"{number(a['tasks'])} tasks seeded in bulk in {a['seed_seconds']} s (3 steps, 2 "
             "transitions each, a replay for one in ten; 7 days; mostly succeeded), on their "
             "own database; ORM broker and database cache.",
             f"Each page rendered {a['reps']} times after 3 warm-ups through Django's test "
             "client in one process: the whole request, server side, no network. Median and "
             "min–max in ms; the ratio is against Django's own admin list of users, measured "
             "in the same run."]
    return [Section("8. Operator console pages (server-side render)",
                    ["page", "median ms", "min–max ms", "vs Django admin list",
                     "queries"], rows, notes)]


def burst_section(r: dict, goals: list[Goal]) -> list[Section]:
    """One big burst: messages sent again while a backlog drains (issue 16)."""
    b = r.get("burst")
    if not b:
        goals.append(Goal("burst: messages sent again", MISSING, "≤ 1 % of runs", None))
        return [Section("3b. A burst: duplicate deliveries", ["—"], [["the workload failed"]])]
    share = b["extra_messages"] / b["runs"]
    goals.append(Goal(f"burst of {number(b['runs'])}: messages sent again",
                      f"{b['extra_messages']} ({share * 100:.2f} %)", "≤ 1 % of runs",
                      share <= 0.01))
    goals.append(Goal(f"burst of {number(b['runs'])}: a message re-sent for a task only "
                      "queued behind others", str(b["extra_messages"]), "0",
                      b["extra_messages"] == 0))
    rows = [[number(b["runs"]), number(b["runs_per_s"], 1), b["extra_messages"],
             number(b["lag_p50_ms"] and b["lag_p50_ms"] / 1000, 1),
             number(b["lag_p99_ms"] and b["lag_p99_ms"] / 1000, 1)]]
    notes = ["PILOT, Redis broker, 2 workers + run_dispatcher, every run triggered at once "
             "(batches of 1000): the backlog waits far longer than PILOT_REENQUEUE_SECONDS. "
             "No message is lost here, so every message the dispatcher sent again (its "
             "`reenqueued` actions, read from its log) was for a task only queued."]
    return [Section("3b. A burst: duplicate deliveries",
                    ["runs", "runs/s", "messages sent again", "lag p50 s", "lag p99 s"],
                    rows, notes)]


def per_run_section(r: dict, goals: list[Goal]) -> list[Section]:
    """What one run costs the database, today against the baseline (issue 16)."""
    rows = []
    for broker in ("redis", "orm"):
        now = [i.get("per_run", {}) for i in _e2e(r, "pilot", broker)]
        before = [i.get("per_run", {}) for i in _e2e(r, "baseline", broker)]
        cells = []
        for key in ("wal_bytes", "commits", "inserted", "updated"):
            a, b = median(_values(now, key)), median(_values(before, key))
            cells += [number(a, 0 if key == "wal_bytes" else 2),
                      number(b, 0 if key == "wal_bytes" else 2), times(ratio(a, b))]
        rows.append([BROKERS[broker], *cells])
    notes = [f"Medians of the end-to-end repetitions (section 3): PILOT today and PILOT at "
             f"{BASELINE}, side by side. Redis broker: the database holds only PILOT's own "
             "writes; ORM broker: django-q2's queue rows count too.",
             "WAL from the server's WAL position (pg_current_wal_lsn, the figure "
             "pg_stat_wal.wal_bytes reports once sessions flush); rows from "
             "pg_stat_database."]
    header = ["broker", "WAL B/run", "before", "ratio", "transactions/run", "before", "ratio",
              "rows inserted/run", "before", "ratio", "rows updated/run", "before", "ratio"]
    sections = [Section("3c. Per run: WAL, transactions, rows (today vs before)", header, rows,
                        notes)]
    return sections + _wal_section(r, goals)


def _wal_section(r: dict, goals: list[Goal]) -> list[Section]:
    now, before = r.get("wal"), r.get("wal_baseline")
    a = now and now["run"]["bytes_per_run"]
    b = before and before["run"]["bytes_per_run"]
    value = ratio(a, b)
    goals.append(Goal("WAL bytes per run (this database's records): today vs before",
                      times(value), "≤ 0.60×", None if value is None else value <= 0.6))
    kinds = sorted(set((now or {}).get("run", {}).get("kinds", {}))
                   | set((before or {}).get("run", {}).get("kinds", {})))

    def cell(side, kind):
        return ((side or {}).get("run", {}).get("kinds", {}).get(kind) or [None])[0]

    rows = [["all (full-page images)",
             f"{number(a)} ({number(now and now['run']['fpi_per_run'])})",
             f"{number(b)} ({number(before and before['run']['fpi_per_run'])})",
             times(value)]]
    for kind in sorted(kinds, key=lambda k: -(cell(now, k) or 0) - (cell(before, k) or 0)):
        x, y = cell(now, kind), cell(before, kind)
        if max(x or 0, y or 0) >= 20:
            rows.append([kind, number(x), number(y), times(ratio(x, y))])
    trig = [number(side and side["trigger"]["bytes_per_run"]) for side in (now, before)]
    notes = [f"{(now or before or {}).get('runs', '?')} runs of test.noop3 triggered in one "
             "batch, then run in one process through run_task, after a CHECKPOINT (so both "
             "sides pay the same full-page images); WAL records read back with pg_walinspect, "
             "keeping those whose block belongs to the bench database. Commit records name no "
             "relation and are left out (one per transaction, ~30-50 B).",
             f"The trigger's own WAL per run, for reference: today {trig[0]} B, before "
             f"{trig[1]} B."]
    return [Section("3d. WAL per run by record kind (bytes per run)",
                    ["record kind and relation", "today", f"before ({BASELINE})", "ratio"],
                    rows, notes)]


def profile_section(r: dict) -> list[Section]:
    sections = []
    for key, what, path in (("profile", "today", "profile-worker.txt"),
                            ("profile_baseline", f"before ({BASELINE})",
                             "profile-worker-baseline.txt")):
        prof = r.get(key) or {}
        lines = prof.get("summary") or ["(no profile: py-spy failed or the run failed)"]
        notes = ["py-spy (--idle, 100 Hz) over the whole qcluster during a separate PILOT run "
                 f"(Redis broker, {r['plan']['profile_runs']} runs, not part of the figures); "
                 f"collapsed stacks in bench/out/{path} (speedscope opens them)."]
        sections.append(Section(f"9. Worker hot path profile, {what}", ["summary"],
                                [[line] for line in lines if line], notes))
    return sections


EMBEDDED_TITLE = "9. Embedded mode: `make run` on SQLite next to PostgreSQL"


def embedded_section(r: dict) -> list[Section]:
    emb = r.get("embedded") or {}
    http = {db: [x for x in (emb.get(db) or {}).get("http", []) if x]
            for db in ("postgres", "sqlite")}
    e2e = {db: [x for x in (emb.get(db) or {}).get("e2e", []) if x]
           for db in ("postgres", "sqlite")}

    def plain(db, key):
        return _values([x["plain"] for x in http[db]], key)

    def hold(db, key):
        return _values([x["hold"] for x in http[db]], key)

    base_rps = median(plain("postgres", "rps"))
    base_e2e = median(_values(e2e["postgres"], "runs_per_s"))
    rows = []
    for db, label in (("postgres", "PostgreSQL"), ("sqlite", "SQLite (the embedded default)")):
        rps, e2e_rate = median(plain(db, "rps")), median(_values(e2e[db], "runs_per_s"))
        rows.append([label, spread(plain(db, "rps")), spread(plain(db, "p50_ms"), 1),
                     spread(plain(db, "p99_ms"), 1), times(ratio(rps, base_rps)),
                     f"{spread(hold(db, 'rps'))} req/s; {spread(hold(db, 'p50_ms'), 0)} / "
                     f"{spread(hold(db, 'p99_ms'), 0)} / {spread(hold(db, 'max_ms'), 0)} ms",
                     spread(_values(e2e[db], "runs_per_s"), 1), times(ratio(e2e_rate, base_e2e)),
                     sum(_values([x["plain"] for x in http[db]], "non_2xx"))
                     + sum(_values([x["hold"] for x in http[db]], "non_2xx"))])
    plan = r["plan"]
    held = next((x["hold_seconds"] for db in http for x in http[db]), 1)
    notes = [
        "Both databases in `make run`'s configuration, measured side by side in this run: "
        "deploy/gunicorn.conf.py with 2 processes x 4 threads, the django-q2 ORM broker, the "
        "trigger throttle in the database cache; bench settings (DEBUG off, unlike `make "
        "run`). Triggers: wrk, 16 connections, new keys, "
        f"{plan['embedded_seconds']} s per load and repetition, databases interleaved, no "
        f"workers running; {len(http['sqlite'])} repetition(s).",
        f"Atomic step column: the same load while one worker runs demo.sync_orders runs "
        f"back to back, whose atomic `write` step keeps its transaction open {held:g} s "
        "(step_seconds).",
        f"End to end: {plan['embedded_runs']} runs of test.noop3 (3 steps) from the first "
        "trigger to the last finish, qcluster with 2 workers + run_dispatcher, as in section "
        "3.",
        "SQLite's limits: one writer at a time for the whole database. Every write "
        "transaction (a trigger, a claim, a checkpoint, the broker's dequeue) takes the write "
        "lock at BEGIN (IMMEDIATE) and the others queue behind it for up to "
        "PILOT_SQLITE_TIMEOUT (30 s) before failing with `database is locked`. A long atomic "
        "step holds that lock for its whole body, so triggers and every other worker wait "
        "for it (the atomic step column). No row locks (SELECT ... FOR UPDATE is a no-op; "
        "PILOT's concurrency guarantees are proven on PostgreSQL) and one machine only. "
        "Evaluate on SQLite; deploy on PostgreSQL.",
    ]
    header = ["database", "triggers/s median (min–max)", "p50 ms", "p99 ms",
              "triggers/s vs PostgreSQL",
              f"triggers while an atomic step holds {held:g} s: req/s; p50 / p99 / max",
              "end-to-end runs/s median (min–max)", "runs/s vs PostgreSQL", "non-2xx"]
    return [Section(EMBEDDED_TITLE, header, rows, notes)]


METRICS_TITLE = "10. `/metrics` after a week of worker churn"


def metrics_section(r: dict, goals: list[Goal]) -> list[Section]:
    m = r.get("metrics_churn")
    steady = median(m["steady_s"]) if m else None
    goals.append(Goal(f"/metrics after {m['recycles'] if m else 10_000} worker recycles",
                      f"{steady:.3f} s" if steady is not None else MISSING, "< 0.5 s",
                      None if steady is None else steady < 0.5 and m["totals_kept"]))
    if not m:
        return [Section(METRICS_TITLE, ["scrape", "seconds"], [["(the workload failed)", ""]])]
    before = median(m["before_s"])
    rows = [
        [f"before compaction existed: every file read ({m['files_before']} files)",
         spread(m["before_s"], 3), "1.00×"],
        ["first scrape, compacting them all at once (once)", f"{m['first_s']:.3f}",
         times(ratio(before, m["first_s"]))],
        [f"steady: every later scrape ({m['files_after']} files: the live processes' and "
         "the archives)", spread(m["steady_s"], 4), times(ratio(before, steady))],
        [f"steady with churn: {m['more']} more recycles before each scrape",
         spread(m["churned_s"], 4), times(ratio(before, median(m["churned_s"])))],
    ]
    notes = [
        f"{m['recycles']} dead worker processes' files (a week at ~10 runs/s with django-q2's "
        f"recycle of 500) and {m['live']} live ones, each the files of one real worker life "
        "(500 tasks, 3 steps, 5 workflows), in a tmpfs PROMETHEUS_MULTIPROC_DIR. Before: "
        "prometheus-client's MultiProcessCollector over the whole directory, which is what "
        "every scrape cost before. After: `GET /metrics` through the real view (database "
        "gauges included), which folds the dead processes' files into archives first "
        "(workflows/observability/multiproc.py). Ratios are 'before' over each row.",
        "Every counter and histogram total after compaction equals the one before: "
        + ("yes." if m["totals_kept"] else f"NO ({m['mismatched']})."),
        "In production the files never pile up: run_workers compacts every 60 s and every "
        "scrape compacts what died since the last one, so the one-off first row is what a "
        "directory left over from an older version costs once.",
    ]
    return [Section(METRICS_TITLE, ["scrape", "seconds (median, min–max)", "faster than before"],
                    rows, notes)]


WAITING_TITLE = "11. Waiting: parked tasks, signals, timers"


def waiting_section(r: dict, goals: list[Goal]) -> list[Section]:
    """Section 11 (bench/workloads/waiting.py): per broker, repetitions' medians."""
    reps = {broker: [x for x in (r.get("waiting") or {}).get(broker, []) if x]
            for broker in ("orm", "redis")}

    def med(broker: str, key: str):
        return median([x[key] for x in reps[broker] if x.get(key) is not None])

    ratios = {b: ratio(med(b, "beside_parked_runs_per_s"), med(b, "alone_runs_per_s"))
              for b in reps}
    worst = min((v for v in ratios.values() if v is not None), default=None)
    goals.append(Goal("short runs' rate beside parked tasks / alone (a parked task holds no "
                      "worker)", f"{worst:.2f}" if worst is not None else MISSING, "≥ 0.90",
                      None if worst is None else worst >= 0.90))
    polls = [x["dispatcher_poll_s"] for b in reps for x in reps[b]]
    poll_ms = 1000 * (polls[0] if polls else 1.0)
    late = [med(b, "timer_wake_late_p99_ms") for b in reps]
    late = [v for v in late if v is not None]
    goals.append(Goal("timer wake-up lateness p99 (worst broker)",
                      f"{max(late):.0f} ms" if late else MISSING,
                      f"≤ poll + 50 ms = {poll_ms + 50:.0f} ms",
                      None if not late else max(late) <= poll_ms + 50))
    if not any(reps.values()):
        return [Section(WAITING_TITLE, ["figure", "value"], [["(the workload failed)", ""]])]
    rows = []
    for b in ("orm", "redis"):
        if not reps[b]:
            rows.append([b, "(failed)", "", "", "", "", ""])
            continue
        x = reps[b][0]
        alone, beside = med(b, "alone_runs_per_s"), med(b, "beside_parked_runs_per_s")
        rows.append([
            b, f"{number(alone)} → {number(beside)} runs/s beside {x['parked']} parked "
            f"({times(ratios[b])})",
            number(med(b, "signal_to_next_step_p50_ms"), 1),
            number(med(b, "signal_to_next_step_p99_ms"), 1),
            number(med(b, "timer_wake_late_p50_ms"), 1),
            number(med(b, "timer_wake_late_p99_ms"), 1),
            f"{number(med(b, 'timer_next_step_late_p50_ms'), 1)} / "
            f"{number(med(b, 'timer_next_step_late_p99_ms'), 1)}"])
    x = next(x for b in reps for x in reps[b])
    notes = [
        f"Medians of {max(len(v) for v in reps.values())} repetition(s) per broker, "
        f"{x['workers']} workers, a real qcluster, run_dispatcher and gunicorn. "
        f"Short runs: {x['runs']} runs of test.noop3 timed alone, then again beside "
        f"{x['parked']} demo.approval tasks parked at their signal wait (the ratio is beside "
        "over alone: 1.00× is a parked task costing nothing).",
        f"Signal: {x['signals']} parked tasks signalled over HTTP one at a time (20/s); from "
        "the 202 to the start of the step after the wait (apply).",
        f"Timers: {x['timers']} demo.timer runs due over ~4 s; lateness from each timer's "
        "recorded due time to its wake (the dispatcher's), and to the next step's start "
        f"(the worker's). The dispatcher polls every {poll_ms / 1000:g} s when idle and "
        "sleeps only until the next due time, so a timer is not late by a whole poll.",
    ]
    return [Section(WAITING_TITLE, ["broker", "short runs: alone → beside parked",
                                    "signal→step p50 ms", "p99 ms", "timer wake late p50 ms",
                                    "p99 ms", "timer→next step p50 / p99 ms"], rows, notes)]


FANOUT_TITLE = "13. Children: a fan-out of child tasks and its fan-in"


def fanout_section(r: dict, goals: list[Goal]) -> list[Section]:
    """Section 13 (bench/workloads/fanout.py): per broker, repetitions' medians."""
    reps = {broker: [x for x in (r.get("fanout") or {}).get(broker, []) if x]
            for broker in ("orm", "redis")}

    def med(broker: str, key: str):
        return median([x[key] for x in reps[broker] if x.get(key) is not None])

    if not any(reps.values()):
        return [Section(FANOUT_TITLE, ["figure", "value"], [["(the workload failed)", ""]])]
    ratios = [v for v in (med(b, "children_vs_independent") for b in reps) if v is not None]
    goals.append(Goal("child tasks' rate / the same number of independent triggers (worst "
                      "broker)", f"{min(ratios):.2f}" if ratios else MISSING, "≥ 0.80",
                      None if not ratios else min(ratios) >= 0.80))
    rows = []
    for b in ("orm", "redis"):
        if not reps[b]:
            rows.append([b, "(failed)", "", "", ""])
            continue
        rows.append([b, number(med(b, "start_all_ms"), 1),
                     f"{number(med(b, 'children_runs_per_s'))} vs "
                     f"{number(med(b, 'independent_runs_per_s'))} "
                     f"({times(med(b, 'children_vs_independent'))})",
                     number(med(b, "last_child_to_next_step_ms"), 1),
                     number(med(b, "parent_wakes"))])
    x = next(x for b in reps for x in reps[b])
    notes = [
        f"Medians of {max(len(v) for v in reps.values())} repetition(s) per broker, "
        f"{x['workers']} workers, a real qcluster and run_dispatcher. One test.fanout parent "
        f"starts {x['children']} test.noop3 children in its step spawn (the batch trigger's "
        "path, a constant handful of statements per batch of 1 000), waits for them (gather) "
        "and runs one more step (after).",
        "Start: spawn's start to its checkpoint. Rate: children finished per second from "
        f"spawn's start, beside {x['children']} independent test.noop3 runs triggered in "
        "batches of 1 000 (the baseline, timed from the first trigger). Next step: the last "
        "child's finish to `after` starting — the last ending's settle wakes the parent "
        "(once), a worker claims it, gather records the results.",
    ]
    return [Section(FANOUT_TITLE, ["broker", "start 1 000 children ms"
                                   if x["children"] == 1000 else "start all children ms",
                                   "children vs independent runs/s", "last child → parent's "
                                   "next step ms", "parent woken"], rows, notes)]
