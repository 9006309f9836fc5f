"""`make bench`: every workload of issues 7 and 16 against PILOT, its baselines
(the peers, and PILOT itself before those issues: bench/baseline.py) in
one run, several repetitions, a table of medians, min–max and ratios with every
goal marked met or NOT met, written to bench/results.md.

    .venv/bin/python -m bench.run               the full run (~25 minutes)
    BENCH_QUICK=1 .venv/bin/python -m bench.run  short runs, to check the harness
    BENCH_ONLY=embedded .venv/bin/python -m bench.run
                                                 only section 9 (embedded mode, ~5 minutes),
                                                 replaced in bench/results.md in place
    BENCH_ONLY=metrics .venv/bin/python -m bench.run
                                                 only section 10 (/metrics after 10 000
                                                 worker recycles, ~1 minute), likewise
    BENCH_ONLY=waiting .venv/bin/python -m bench.run
                                                 only section 11 (parked tasks, signals,
                                                 timers on both brokers, ~3 minutes), likewise
    BENCH_ONLY=fanout .venv/bin/python -m bench.run
                                                 only section 13 (1 000 children of one
                                                 parent on both brokers, ~2 minutes), likewise

Each workload is a script run as its own process with the environment it
needs (bench/workloads/, bench/peers/); this module only orders them, keeps
the clock and turns their JSON answers into tables (bench/tables.py,
bench/report.py). A
workload that fails is reported as such and the run goes on. End-to-end
repetitions stop early when the next one would overrun BENCH_BUDGET_MINUTES
(default 35, so the full plan gets its 3 even on a slow day); the table says
how many ran. Raw answers go to bench/out/results.json, logs of every process
to bench/out/logs/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import time

from bench import baseline, report
from bench.common import (
    BENCH_PY,
    LOGS,
    OUT,
    PILOT_PY,
    ROOT,
    db_url,
    parse_result,
    pilot_env,
    quick,
    run_checked,
)
from bench.common import log as say
from bench.profile_summary import summarise
from bench.report import Goal, Section
from bench.tables import (
    E2E_SYSTEMS,
    EMBEDDED_TITLE,
    FANOUT_TITLE,
    METRICS_TITLE,
    WAITING_TITLE,
    admin_section,
    batch_section,
    burst_section,
    cleanup_section,
    e2e_section,
    embedded_section,
    fanout_section,
    lag_section,
    metrics_section,
    per_run_section,
    profile_section,
    queries_section,
    scaling_section,
    trigger_section,
    waiting_section,
)

RESULTS_MD = ROOT / "bench" / "results.md"


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    trigger_reps: int
    trigger_seconds: int   # per variant and repetition
    batches: int           # per client (one per gunicorn worker) and repetition
    e2e_reps: int
    e2e_runs: int
    scaling_runs: int
    scaling_reps: int      # repetitions of PILOT's and raw django-q2's 1- and 2-worker runs
    paced_runs: int
    pace: float            # triggers per second for the unloaded queue lag
    cleanup_tasks: int
    cleanup_seconds: int
    profile_runs: int
    embedded_reps: int
    embedded_seconds: int  # per trigger load, database and repetition
    embedded_runs: int     # end-to-end runs per database and repetition
    admin_tasks: int       # tasks seeded for the console's page budgets
    admin_reps: int
    burst_runs: int        # the one big burst (duplicate deliveries under a backlog)
    wal_runs: int          # runs whose WAL records are read back (pg_walinspect)
    metrics_recycles: int  # worker recycles simulated before /metrics is scraped
    metrics_reps: int
    waiting_reps: int = 2      # per broker (bench/workloads/waiting.py)
    waiting_runs: int = 1000   # short runs, alone and beside the parked tasks
    waiting_parked: int = 500
    waiting_signals: int = 100
    waiting_timers: int = 300
    fanout_reps: int = 2       # per broker (bench/workloads/fanout.py)
    fanout_children: int = 1000


FULL = Plan("full", trigger_reps=3, trigger_seconds=8, batches=3, e2e_reps=3, e2e_runs=2000,
            scaling_runs=1000, scaling_reps=3, paced_runs=200, pace=20, cleanup_tasks=100_000,
            cleanup_seconds=10, profile_runs=500, embedded_reps=3, embedded_seconds=5,
            embedded_runs=1000, admin_tasks=100_000, admin_reps=15, burst_runs=20_000,
            wal_runs=2000, metrics_recycles=10_000, metrics_reps=5)
QUICK = Plan("quick", trigger_reps=2, trigger_seconds=3, batches=1, e2e_reps=1, e2e_runs=300,
             scaling_runs=200, scaling_reps=1, paced_runs=60, pace=20, cleanup_tasks=10_000,
             cleanup_seconds=3, profile_runs=200, embedded_reps=1, embedded_seconds=3,
             embedded_runs=200, admin_tasks=10_000, admin_reps=5, burst_runs=2000,
             wal_runs=300, metrics_recycles=1000, metrics_reps=3, waiting_reps=1,
             waiting_runs=200, waiting_parked=100, waiting_signals=20, waiting_timers=50,
             fanout_reps=1, fanout_children=200)
EMBEDDED_SQLITE = OUT / "embedded.sqlite3"


class Bench:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.started = time.monotonic()
        self.budget = float(os.environ.get("BENCH_BUDGET_MINUTES", "35")) * 60
        self.results: dict = {"plan": dataclasses.asdict(plan), "e2e": []}
        self.failures: list[str] = []
        self.last_rep = 0.0  # seconds the last end-to-end repetition took
        self.baseline_ready = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def workload(self, name: str, module: str, *args, env: dict, python=PILOT_PY,
                 timeout: float = 900, cwd=ROOT) -> dict | None:
        say(f"[{self.elapsed():5.0f}s] {name}")
        try:
            return parse_result(run_checked([python, "-m", module, *args], env=env,
                                            timeout=timeout, name=name, cwd=cwd))
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            self.failures.append(f"{name}: {str(exc).strip()[:1500]}")
            say(f"  FAILED: {str(exc).strip()[:600]}")
            return None

    # --- the run -------------------------------------------------------------------------

    def run(self) -> None:
        p = self.plan
        if self.workload("prepare", "bench.workloads.prepare", env=pilot_env("orm")) is None:
            raise SystemExit("could not prepare the bench database:\n" + self.failures[-1])
        self.prepare_baseline()
        for broker in ("orm", "redis"):
            self.results[f"queries_{broker}"] = self.workload(
                f"queries-{broker}", "bench.workloads.queries",
                env=pilot_env(broker, DJANGO_ALLOWED_HOSTS="localhost,127.0.0.1,testserver"))
        wal = ("bench.workloads.wal", "--runs", p.wal_runs)
        self.results["wal"] = self.workload("wal", *wal, env=pilot_env("redis"))
        if self.baseline_ready:
            self.results["wal_baseline"] = self.workload(
                "wal-baseline", *wal, cwd=baseline.TREE,
                env=pilot_env("redis", **baseline.env_overrides()))
        self.results["admin_pages"] = self.workload(
            "admin-pages", "bench.workloads.admin_pages", "--tasks", p.admin_tasks,
            "--reps", p.admin_reps, env=pilot_env("orm"))
        self.results["http"] = self.workload(
            "trigger-endpoint", "bench.workloads.http", "--reps", p.trigger_reps,
            "--seconds", p.trigger_seconds, "--batches", p.batches, env=pilot_env("redis"))
        self.results["cleanup"] = self.workload(
            "cleanup", "bench.workloads.cleanup", "--tasks", p.cleanup_tasks,
            "--seconds", p.cleanup_seconds, env=pilot_env("redis"))
        self.scaling()
        self.results["paced"] = [self.e2e(system, broker, p.paced_runs, pace=p.pace,
                                          name=f"lag-paced-{system}-{broker}")
                                 for system in ("pilot", "rawdefault")
                                 for broker in ("orm", "redis")]
        self.results["burst"] = self.e2e("pilot", "redis", p.burst_runs, name="burst")
        self.profile()
        self.end_to_end()
        self.embedded()
        self.metrics()
        self.waiting()
        self.fanout()

    def fanout(self) -> None:
        """Section 13: a parent fanning out to children (bench/workloads/fanout.py),
        each broker in turn, repetitions interleaved."""
        p = self.plan
        results: dict = {"orm": [], "redis": []}
        self.results["fanout"] = results
        for rep in range(p.fanout_reps):
            for broker, reps in results.items():
                reps.append(self.workload(
                    f"fanout-{broker}-{rep + 1}", "bench.workloads.fanout",
                    "--children", p.fanout_children, env=pilot_env(broker)))

    def waiting(self) -> None:
        """Section 11: parked tasks, signals and timers (bench/workloads/waiting.py),
        each broker in turn, repetitions interleaved."""
        p = self.plan
        results: dict = {"orm": [], "redis": []}
        self.results["waiting"] = results
        for rep in range(p.waiting_reps):
            for broker, reps in results.items():
                reps.append(self.workload(
                    f"waiting-{broker}-{rep + 1}", "bench.workloads.waiting",
                    "--runs", p.waiting_runs, "--parked", p.waiting_parked,
                    "--signals", p.waiting_signals, "--timers", p.waiting_timers,
                    env=pilot_env(broker, PILOT_DEMO_WORKFLOWS="true")))

    def metrics(self) -> None:
        """Section 10: /metrics after a week of worker churn (bench/workloads/metrics_churn.py)."""
        p = self.plan
        self.results["metrics_churn"] = self.workload(
            "metrics-churn", "bench.workloads.metrics_churn", "--recycles", p.metrics_recycles,
            "--reps", p.metrics_reps, env=pilot_env("orm"))

    def prepare_baseline(self) -> None:
        """The engine before issues 10 and 16 (bench/baseline.py), its database
        migrated by its own code; without it the table says the baseline is missing."""
        try:
            tree = baseline.tree()
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on without it
            self.failures.append(f"baseline tree: {exc}")
            self.baseline_ready = False
            return
        self.baseline_ready = self.workload(
            "prepare-baseline", "bench.workloads.prepare",
            env=pilot_env("orm", **baseline.env_overrides()), cwd=tree) is not None

    def embedded(self) -> None:
        """Section 9: `make run`'s configuration on SQLite and on PostgreSQL,
        repetitions interleaved (bench/workloads/embedded.py, then e2e)."""
        p = self.plan
        urls = {"postgres": db_url(), "sqlite": f"sqlite:///{EMBEDDED_SQLITE}"}
        results: dict = {db: {"http": [], "e2e": []} for db in urls}
        self.results["embedded"] = results
        prepared = self.workload("prepare-sqlite", "bench.workloads.prepare",
                                 env=pilot_env("orm", DATABASE_URL=urls["sqlite"]))
        if prepared is None:
            return
        for rep in range(p.embedded_reps):
            for db, url in urls.items():
                env = pilot_env("orm", DATABASE_URL=url, PILOT_DEMO_WORKFLOWS="true")
                results[db]["http"].append(self.workload(
                    f"embedded-triggers-{db}-{rep + 1}", "bench.workloads.embedded",
                    "--seconds", p.embedded_seconds, "--hold", 1, env=env))
                results[db]["e2e"].append(self.e2e(
                    "pilot", "orm", p.embedded_runs, name=f"embedded-e2e-{db}-{rep + 1}",
                    database=url))

    def scaling(self) -> None:
        """Section 6: PILOT and raw django-q2 (the same tuned cluster, the machine's
        own reference) at 1 and 2 workers, repetitions interleaved; PILOT at 4 once."""
        p, runs = self.plan, []
        for rep in range(p.scaling_reps):
            for system in ("pilot", "raw"):
                runs += [self.e2e(system, "redis", p.scaling_runs, workers=w,
                                  name=f"scaling-{system}-{w}-workers-{rep + 1}") for w in (1, 2)]
        runs.append(self.e2e("pilot", "redis", p.scaling_runs, workers=4,
                             name="scaling-pilot-4-workers"))
        self.results["scaling"] = runs

    def e2e(self, system: str, broker: str | None, runs: int, *, workers: int = 2,
            pace: float = 0.0, name: str, extra: tuple = (),
            database: str | None = None) -> dict | None:
        if system == "baseline":
            if not self.baseline_ready:
                return None
            args = ["--system", "pilot", "--runs", runs, "--workers", workers, *extra]
            return self.workload(name, "bench.workloads.e2e", *args, cwd=baseline.TREE,
                                 env=pilot_env(broker, **baseline.env_overrides()))
        if system in ("pilot", "raw", "rawdefault"):
            args = ["--system", system, "--runs", runs, "--workers", workers, *extra]
            if pace:
                args += ["--pace", pace]
            env = pilot_env(broker, **({"DATABASE_URL": database} if database else {}))
            if system == "rawdefault":
                env["DJANGO_SETTINGS_MODULE"] = "bench.settings_qdefaults"
            return self.workload(name, "bench.workloads.e2e", *args, env=env)
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

    def profile(self) -> None:
        """py-spy over the cluster: today's engine, then the baseline's."""
        for system, key, name in (("pilot", "profile", "profile-worker.txt"),
                                  ("baseline", "profile_baseline",
                                   "profile-worker-baseline.txt")):
            path = OUT / name
            path.unlink(missing_ok=True)
            result = self.e2e(system, "redis", self.plan.profile_runs, name=key,
                              extra=("--profile", str(path)))
            self.results[key] = {"result": result, "path": str(path),
                                 "summary": summarise(path).lines() if path.exists() else []}


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



def preflight(only: str | None) -> None:
    """Fail at once, with the reason, when a server or tool the run needs is missing."""
    import socket

    needed = ((("PostgreSQL", 5432),) if only in ("embedded", "metrics")
              else (("PostgreSQL", 5432), ("Redis", 6379)))
    for what, port in needed:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
        except OSError:
            raise SystemExit(f"{what} is not listening on 127.0.0.1:{port}; start it "
                             "(.ci/run shows how) and run make bench again") from None
    if shutil.which("wrk") is None and only not in ("waiting", "fanout"):
        raise SystemExit("wrk is missing: apt-get install wrk (make bench does it)")
    if not BENCH_PY.exists() and not only:
        raise SystemExit("bench/.venv is missing: run `make bench`, which creates it")


def main() -> None:
    only = os.environ.get("BENCH_ONLY") or None
    if only is not None and only not in ALONE:
        raise SystemExit(f"BENCH_ONLY={only!r}: the sections that run alone are "
                         + ", ".join(repr(name) for name in ALONE))
    preflight(only)
    plan = QUICK if quick() else FULL
    for stale in (LOGS, OUT / "probe"):  # the last run's logs; bench/out is ours alone
        shutil.rmtree(stale, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    bench = Bench(plan)
    if only:
        only_section(bench, load_start, only)
        return
    bench.run()
    results = bench.results
    results["failures"] = bench.failures
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    goals: list[Goal] = []
    sections = [*trigger_section(results, goals), *batch_section(results, goals),
                *e2e_section(results, goals), *lag_section(results, goals),
                *burst_section(results, goals), *per_run_section(results, goals),
                *cleanup_section(results, goals), *scaling_section(results, goals),
                *queries_section(results, goals), *admin_section(results, goals),
                *profile_section(results), *embedded_section(results),
                *metrics_section(results, goals), *waiting_section(results, goals),
                *fanout_section(results, goals)]
    if bench.failures:
        sections.append(Section("Workloads that failed", ["workload and error (see "
                                                          "bench/out/logs/)"],
                                [[f.splitlines()[0][:300]] for f in bench.failures]))
    meta = machine_meta(plan, load_start, os.getloadavg(), bench.elapsed() / 60)
    title = "PILOT benchmarks"
    print(report.render_text(title, meta, sections, goals))
    kept = kept_sections(RESULTS_MD.read_text() if RESULTS_MD.exists() else "")
    markdown = report.render_markdown(title, meta, sections, goals, [
        "Produced by `make bench` (bench/run.py); raw figures in bench/out/results.json."])
    for kept_title, kept_section in kept:
        markdown = splice_section(markdown, kept_title, kept_section)
    RESULTS_MD.write_text(markdown)
    say(f"wrote {RESULTS_MD.relative_to(ROOT)} in {bench.elapsed() / 60:.1f} min")


# The sections that run alone (BENCH_ONLY): number, title, the run, the table.
ALONE = {
    "embedded": (9, EMBEDDED_TITLE, lambda bench: bench.embedded(),
                 lambda results, goals: embedded_section(results)),
    "metrics": (10, METRICS_TITLE, lambda bench: bench.metrics(), metrics_section),
    "waiting": (11, WAITING_TITLE, lambda bench: bench.waiting(), waiting_section),
    "fanout": (13, FANOUT_TITLE, lambda bench: bench.fanout(), fanout_section),
}


def only_section(bench: Bench, load_start, only: str) -> None:
    """Run section `only` alone and put it into bench/results.md in place of
    the last one (the other sections stay as the last full run left them); its
    goals become notes of the section (the goals table is the full run's)."""
    number, title, run, table = ALONE[only]
    if bench.workload("prepare", "bench.workloads.prepare", env=pilot_env("orm")) is None:
        raise SystemExit("could not prepare the bench database:\n" + bench.failures[-1])
    run(bench)
    results = bench.results
    results["failures"] = bench.failures
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"results-{only}.json").write_text(json.dumps(results, indent=1, default=str))
    goals: list[Goal] = []
    sections = table(results, goals)
    sections[0].notes += [f"Goal — {g.name}: {g.figure} (target {g.target}): {g.verdict}."
                          for g in goals]
    if bench.failures:
        sections.append(Section("Workloads that failed", ["workload and error (see "
                                                          "bench/out/logs/)"],
                                [[f.splitlines()[0][:300]] for f in bench.failures]))
    meta = [m.split("; peers")[0] + "." if "; peers" in m else m  # no peers ran
            for m in machine_meta(bench.plan, load_start, os.getloadavg(),
                                  bench.elapsed() / 60)]
    print(report.render_text(title, meta, sections, []))
    section = report.render_markdown("x", [], sections, [], [])
    section = section[section.index(f"## {title}"):]
    section = section.replace("\n\n", f"\n\nMeasured alone (BENCH_ONLY={only}), not in "
                              "the run above:\n\n" + "\n".join(f"- {m}" for m in meta)
                              + "\n\n", 1)
    RESULTS_MD.write_text(splice_section(RESULTS_MD.read_text(), title, section))
    say(f"updated section {number} of {RESULTS_MD.relative_to(ROOT)} in "
        f"{bench.elapsed() / 60:.1f} min")
    if bench.failures:
        raise SystemExit(f"a workload of section {number} failed:\n" + bench.failures[-1])


# Sections another target writes (not part of a full run), kept across one.
KEPT_PREFIXES = ("## 12. ",)  # make bench-scale (bench/scale.py)


def kept_sections(markdown: str) -> list[tuple[str, str]]:
    """(title, text) of each section of `markdown` that a full run keeps."""
    lines = markdown.splitlines(keepends=True)
    found = []
    for i, line in enumerate(lines):
        if line.startswith(KEPT_PREFIXES):
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].startswith("## ") or lines[j].startswith("Produced by")),
                       len(lines))
            found.append((line[3:].rstrip(), "".join(lines[i:end])))
    return found


def splice_section(markdown: str, title: str, section: str) -> str:
    """`markdown` with its `## title` section (up to the next `## ` heading or
    the closing "Produced by" line) replaced by `section`, or `section` added
    before that closing line."""
    lines = markdown.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"## {title}"), None)
    footer = next((i for i, line in enumerate(lines) if line.startswith("Produced by")),
                  len(lines))
    if start is None:
        start = end = footer
    else:
        end = next((i for i in range(start + 1, len(lines))
                    if lines[i].startswith("## ") or lines[i].startswith("Produced by")),
                   len(lines))
    return "".join(lines[:start]) + section.rstrip("\n") + "\n\n" + "".join(lines[end:])


if __name__ == "__main__":
    main()
