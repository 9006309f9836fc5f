"""`make bench`: every workload of issue 7 against PILOT and its baselines in
one run, several repetitions, a table of medians, min–max and ratios with every
goal marked met or NOT met, written to bench/results.md.

    .venv/bin/python -m bench.run               the full run (~10 minutes)
    BENCH_QUICK=1 .venv/bin/python -m bench.run  short runs, to check the harness

Each workload is a script run as its own process with the environment it
needs (bench/workloads/, bench/peers/); this module only orders them, keeps
the clock and turns their JSON answers into tables (bench/report.py). A
workload that fails is reported as such and the run goes on. End-to-end
repetitions stop early when the next one would overrun BENCH_BUDGET_MINUTES
(default 11); the table says how many ran. Raw answers go to
bench/out/results.json, logs of every process to bench/out/logs/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import time

from bench import report
from bench.common import BENCH_PY, OUT, PILOT_PY, ROOT, parse_result, pilot_env, quick, run_checked
from bench.common import log as say
from bench.profile_summary import summarise
from bench.report import Goal, Section, median, number, ratio, spread, times

RESULTS_MD = ROOT / "bench" / "results.md"
MISSING = report.MISSING


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    trigger_reps: int
    trigger_seconds: int   # per variant and repetition
    batches: int           # per client (one per gunicorn worker) and repetition
    e2e_reps: int
    e2e_runs: int
    scaling_runs: int
    paced_runs: int
    pace: float            # triggers per second for the unloaded queue lag
    cleanup_tasks: int
    cleanup_seconds: int
    profile_runs: int


FULL = Plan("full", trigger_reps=3, trigger_seconds=8, batches=3, e2e_reps=3, e2e_runs=2000,
            scaling_runs=1000, paced_runs=60, pace=20, cleanup_tasks=100_000,
            cleanup_seconds=10, profile_runs=500)
QUICK = Plan("quick", trigger_reps=2, trigger_seconds=3, batches=1, e2e_reps=1, e2e_runs=300,
             scaling_runs=200, paced_runs=30, pace=20, cleanup_tasks=10_000,
             cleanup_seconds=3, profile_runs=200)
E2E_SYSTEMS = [("pilot", "orm"), ("raw", "orm"), ("pilot", "redis"), ("raw", "redis"),
               ("dbos", None), ("procrastinate", None)]
LABELS = {"pilot": "PILOT (test.noop3)", "raw": "raw django-q2 (3 rows)",
          "dbos": "DBOS Transact (3 steps)", "procrastinate": "Procrastinate (3 rows)"}
BROKERS = {"orm": "ORM (PostgreSQL)", "redis": "Redis", None: "its own (PostgreSQL)"}


class Bench:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.started = time.monotonic()
        self.budget = float(os.environ.get("BENCH_BUDGET_MINUTES", "11")) * 60
        self.results: dict = {"plan": dataclasses.asdict(plan), "e2e": []}
        self.failures: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def workload(self, name: str, module: str, *args, env: dict, python=PILOT_PY,
                 timeout: float = 900) -> dict | None:
        say(f"[{self.elapsed():5.0f}s] {name}")
        try:
            return parse_result(run_checked([python, "-m", module, *args], env=env,
                                            timeout=timeout, name=name))
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            self.failures.append(f"{name}: {str(exc).strip()[:1500]}")
            say(f"  FAILED: {str(exc).strip()[:600]}")
            return None

    # --- the run -------------------------------------------------------------------------

    def run(self) -> None:
        p = self.plan
        if self.workload("prepare", "bench.workloads.prepare", env=pilot_env("orm")) is None:
            raise SystemExit("could not prepare the bench database:\n" + self.failures[-1])
        for broker in ("orm", "redis"):
            self.results[f"queries_{broker}"] = self.workload(
                f"queries-{broker}", "bench.workloads.queries",
                env=pilot_env(broker, DJANGO_ALLOWED_HOSTS="localhost,127.0.0.1,testserver"))
        self.results["http"] = self.workload(
            "trigger-endpoint", "bench.workloads.http", "--reps", p.trigger_reps,
            "--seconds", p.trigger_seconds, "--batches", p.batches, env=pilot_env("redis"))
        self.results["cleanup"] = self.workload(
            "cleanup", "bench.workloads.cleanup", "--tasks", p.cleanup_tasks,
            "--seconds", p.cleanup_seconds, env=pilot_env("redis"))
        self.results["scaling"] = [self.e2e("pilot", "redis", p.scaling_runs, workers=w,
                                            name=f"scaling-{w}-workers") for w in (1, 2, 4)]
        self.results["paced"] = [self.e2e(system, broker, p.paced_runs, pace=p.pace,
                                          name=f"lag-paced-{system}-{broker}")
                                 for system in ("pilot", "raw") for broker in ("orm", "redis")]
        self.profile()
        self.end_to_end()

    def e2e(self, system: str, broker: str | None, runs: int, *, workers: int = 2,
            pace: float = 0.0, name: str, extra: tuple = ()) -> dict | None:
        if system in ("pilot", "raw"):
            args = ["--system", system, "--runs", runs, "--workers", workers, *extra]
            if pace:
                args += ["--pace", pace]
            return self.workload(name, "bench.workloads.e2e", *args, env=pilot_env(broker))
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        return self.workload(name, f"bench.peers.{system}_bench", "--runs", runs,
                             "--workers", workers, env=env, python=BENCH_PY)

    def end_to_end(self) -> None:
        """Repetitions of every system, interleaved so drift hits all alike; a
        repetition starts only if it fits in the budget (the first always runs)."""
        for rep in range(self.plan.e2e_reps):
            rep_started = time.monotonic()
            if rep and self.elapsed() + self.last_rep > self.budget:
                say(f"  budget: stopping after {rep} end-to-end repetition(s)")
                break
            for system, broker in E2E_SYSTEMS:
                result = self.e2e(system, broker, self.plan.e2e_runs,
                                  name=f"e2e-{system}-{broker or 'own'}-{rep + 1}")
                self.results["e2e"].append({"system": system, "broker": broker, "rep": rep,
                                            "result": result})
            self.last_rep = time.monotonic() - rep_started

    last_rep = 0.0

    def profile(self) -> None:
        path = OUT / "profile-worker.txt"
        path.unlink(missing_ok=True)
        result = self.e2e("pilot", "redis", self.plan.profile_runs, name="profile",
                          extra=("--profile", str(path)))
        self.results["profile"] = {"result": result, "path": str(path),
                                   "summary": summarise(path).lines() if path.exists() else []}


# --- tables ----------------------------------------------------------------------------

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
            target = 0.8 if name == "new" else 1.0
            value = ratio(rps, base_rps)
            goals.append(Goal(f"{label}: req/s vs ceiling", times(value), f"≥ {target}×",
                              None if value is None else value >= target))
        value = ratio(p99, base_p99)
        goals.append(Goal(f"{label}: p99 vs ceiling p99", times(value), "≤ 1.5×",
                          None if value is None else value <= 1.5))
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
             "batches of 1000 new keys per repetition; tasks/s over the whole burst."]
    return [Section("2. Batch trigger", ["how", "tasks/s median (min–max)",
                                         "latency p50 ms (per request)", "vs single"],
                    rows, notes)]


def _e2e(r: dict, system: str, broker: str | None) -> list[dict]:
    return [x["result"] for x in r["e2e"]
            if x["system"] == system and x["broker"] == broker and x["result"]]


def e2e_section(r: dict, goals: list[Goal]) -> list[Section]:
    raw = {b: median(_values(_e2e(r, "raw", b), "runs_per_s")) for b in ("orm", "redis")}
    pilot = {b: median(_values(_e2e(r, "pilot", b), "runs_per_s")) for b in ("orm", "redis")}
    peers = {s: median(_values(_e2e(r, s, None), "runs_per_s")) for s in ("dbos",
                                                                           "procrastinate")}
    rows, reps = [], 0
    for system, broker in E2E_SYSTEMS:
        items = _e2e(r, system, broker)
        reps = max(reps, len(items))
        rate = median(_values(items, "runs_per_s"))
        vs_raw = times(ratio(rate, raw[broker])) if broker else MISSING
        rss = [i.get("rss", {}) for i in items]
        worker_rss = max((x.get("worker", 0) for x in rss), default=None)
        others = [v for x in rss for k, v in x.items() if k not in ("worker", "workers_seen")]
        per_run = [i.get("per_run", {}) for i in items]
        dup = sum(i.get("deliveries", {}).get("skipped", 0) for i in items)
        rows.append([LABELS[system], BROKERS[broker], spread(_values(items, "runs_per_s"), 1),
                     vs_raw, number(worker_rss, 1), number(max(others, default=None), 1),
                     number(median(_values(per_run, "commits")), 1),
                     number(median([(p.get("inserted", 0) + p.get("updated", 0)
                                     + p.get("deleted", 0)) for p in per_run if p]), 1),
                     dup if system == "pilot" else MISSING, len(items)])
    for broker in ("orm", "redis"):
        value = ratio(pilot[broker], raw[broker])
        goals.append(Goal(f"end to end, {BROKERS[broker]} broker: PILOT vs raw django-q2",
                          times(value), "≥ 0.8×", None if value is None else value >= 0.8))
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
                      "> 1×", None if value is None else value > 1))
    notes = [f"{r['plan']['e2e_runs']} runs per repetition, from the first trigger to the "
             "last run's final write (read from the database); qcluster with 2 workers "
             "(+ run_dispatcher for PILOT), the same Q_CLUSTER settings for raw django-q2; "
             "DBOS and Procrastinate with 2 worker processes (bench/peers/).",
             "Peak RSS is VmHWM from /proc, sampled every 0.25 s; 'other' is the largest of "
             "the qcluster sentinel/pusher/monitor and the dispatcher.",
             "Transactions and rows per run: pg_stat_database of the bench database over the "
             "timed part (includes broker polling and the dispatcher, not only the runs).",
             "Duplicate deliveries: messages PILOT's run_task answered 'skipped' (a run "
             "delivered again, e.g. re-enqueued by the dispatcher after "
             "PILOT_REENQUEUE_SECONDS in the queue)."]
    header = ["system", "broker", "runs/s median (min–max)", "vs raw django-q2",
              "peak RSS worker MB", "peak RSS other MB", "DB transactions/run",
              "rows written/run", "duplicate deliveries", "reps"]
    return [Section("3. End to end: 3-step runs, trigger to all succeeded", header, rows,
                    notes)]


def lag_section(r: dict) -> list[Section]:
    rows = []
    for item in r.get("paced") or []:
        if item:
            rows.append([LABELS[item["system"]], BROKERS[item["broker"]],
                         f"paced, {number(item['paced'])} triggers/s",
                         number(item["lag_p50_ms"], 1), number(item["lag_p99_ms"], 1)])
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
             "the paced rows are the lag of an unloaded system."]
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


def scaling_section(r: dict) -> list[Section]:
    rows, base = [], None
    for item in r.get("scaling") or []:
        if not item:
            continue
        base = base or item["runs_per_s"]
        rows.append([item["workers"], number(item["runs_per_s"], 1),
                     times(item["runs_per_s"] / base), number(item["rss"].get("worker"), 1)])
    notes = [f"PILOT, Redis broker, {r['plan']['scaling_runs']} runs each, one repetition; "
             "qcluster with W workers + run_dispatcher on this machine's "
             f"{os.cpu_count()} cores."]
    return [Section("6. Scaling: end-to-end rate by worker processes",
                    ["workers", "runs/s", "vs 1 worker", "peak RSS worker MB"], rows, notes)]


def queries_section(r: dict) -> list[Section]:
    orm, redis = r.get("queries_orm") or {}, r.get("queries_redis") or {}

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
            ["worker: run_task of one test.noop3 run", *both("worker_run", "statements"),
             *both("worker_run", "transactions")],
            ["django-q2 ORM broker per message (dequeue + ack)",
             cell(orm, "worker_run", "broker_per_message"), "(Redis)", MISSING, MISSING],
            ["raw django-q2 task (write3)", *both("raw_run", "statements"),
             *both("raw_run", "transactions")]]
    kinds = (redis or orm).get("worker_run", {}).get("kinds", {})
    notes = ["Statements include BEGIN and COMMIT: they are database round trips. Counted "
             "in-process with Django's CaptureQueriesContext (pg_stat_statements is not "
             "loaded on the shared server).",
             "ORM column: the throttle counts in the database cache; Redis column: in Redis.",
             "One worker run: " + ", ".join(f"{n}× {k}" for k, n in kinds.items()) + "."]
    return [Section("7. Queries per PILOT run", ["what", "statements (ORM/DB cache)",
                                                 "statements (Redis)", "transactions (ORM)",
                                                 "transactions (Redis)"], rows, notes)]


def profile_section(r: dict) -> list[Section]:
    prof = r.get("profile") or {}
    lines = prof.get("summary") or ["(no profile: py-spy failed or the run failed)"]
    notes = ["py-spy (--idle, 100 Hz) over the whole qcluster during a separate PILOT run "
             f"(Redis broker, {r['plan']['profile_runs']} runs, not part of the figures); "
             "collapsed stacks in bench/out/profile-worker.txt (speedscope opens them)."]
    return [Section("8. Worker hot path profile", ["summary"], [[line] for line in lines if line],
                    notes)]


def machine_meta(plan: Plan, load_start, load_end, minutes: float) -> list[str]:
    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                                  check=False).stdout.strip()
        except OSError:
            return "?"

    commit = version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    pg = version(["psql", "-U", "postgres", "-h", "127.0.0.1", "-Atc", "SHOW server_version"])
    redis = version(["redis-cli", "-h", "127.0.0.1", "INFO", "server"])
    redis = next((x.split(":")[1] for x in redis.splitlines() if x.startswith("redis_version")),
                 "?")
    peers = version([str(BENCH_PY), "-c", "import importlib.metadata as m; "
                     "print(m.version('dbos'), m.version('procrastinate'))"]).split()
    ours = version([str(PILOT_PY), "-c", "import importlib.metadata as m; print(*[m.version(p) "
                    "for p in ('django', 'django-q2', 'gunicorn', 'psycopg')])"]).split()
    busy = load_start[0] > 0.5 or load_end[0] > os.cpu_count() * 1.5
    meta = [f"Mode: {plan.name}; commit {commit}; {time.strftime('%Y-%m-%d %H:%M %Z')}; "
            f"took {minutes:.1f} min.",
            f"Machine: {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, PostgreSQL {pg}, Redis {redis}; load average "
            f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end.",
            f"PILOT on Django {ours[0] if ours else '?'}, django-q2 "
            f"{ours[1] if len(ours) > 1 else '?'}, gunicorn {ours[2] if len(ours) > 2 else '?'}"
            f", psycopg {ours[3] if len(ours) > 3 else '?'}; peers (bench/.venv): DBOS "
            f"Transact {peers[0] if peers else '?'}, Procrastinate "
            f"{peers[1] if len(peers) > 1 else '?'}."]
    if plan.name == "quick":
        meta.append("QUICK MODE: short runs to check the harness; not figures to quote.")
    if busy:
        meta.append("The machine was not idle when this ran (see the load average): absolute "
                    "figures are noise; the ratios compare runs made side by side.")
    return meta



def main() -> None:
    plan = QUICK if quick() else FULL
    OUT.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    bench = Bench(plan)
    bench.run()
    results = bench.results
    results["failures"] = bench.failures
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    goals: list[Goal] = []
    sections = [*trigger_section(results, goals), *batch_section(results, goals),
                *e2e_section(results, goals), *lag_section(results),
                *cleanup_section(results, goals), *scaling_section(results),
                *queries_section(results), *profile_section(results)]
    if bench.failures:
        sections.append(Section("Workloads that failed", ["workload and error (see "
                                                          "bench/out/logs/)"],
                                [[f.splitlines()[0][:300]] for f in bench.failures]))
    meta = machine_meta(plan, load_start, os.getloadavg(), bench.elapsed() / 60)
    title = "PILOT benchmarks (issue 7)"
    print(report.render_text(title, meta, sections, goals))
    RESULTS_MD.write_text(report.render_markdown(title, meta, sections, goals, [
        "Produced by `make bench` (bench/run.py); raw figures in bench/out/results.json."]))
    say(f"wrote {RESULTS_MD.relative_to(ROOT)} in {bench.elapsed() / 60:.1f} min")


if __name__ == "__main__":
    main()
