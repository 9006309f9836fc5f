"""The mutation check (`make mutate`): does the suite bite?

Each mutant below is one deliberate bug in the engine, written as exact text
replacements. For each, one at a time, the script:

1. exports the committed tree (`git archive HEAD`) into a temporary directory —
   the working tree is never written, so Ctrl-C or a crash cannot leave a bug
   behind;
2. applies the mutant's replacements there; a pattern that is not found exactly
   `count` times stops the script (a refactor must not silently turn a mutant
   into a no-op);
3. runs the mutant's small, named selection of tests against PostgreSQL and
   Redis (DATABASE_URL, REDIS_URL — required);
4. records whether it was killed (a test failed) and which tests caught it.

Before the mutants, the union of all selections runs once on the unmutated
copy: a kill only counts if the same tests pass without the bug. Prints a
table (markdown) and exits non-zero if any mutant survived. Not part of
`make test`; see docs/testing.md for the last table.

    DATABASE_URL=postgres://... REDIS_URL=redis://... make mutate
    .venv/bin/python -m tests.mutations.run --only enqueue-before-commit
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    path: str
    replacements: tuple[tuple[str, str], ...]  # (exact old text, new text), each found once
    tests: tuple[str, ...]  # pytest node ids (or files) that must catch it


MUTANTS = (
    Mutant(
        "drop-fence-predicate",
        "a step write no longer checks the lease token (write_steps' fence)",
        "workflows/engine/store/queries.sql",
        (("""WITH fence AS (
    SELECT id FROM workflows_task
     WHERE id = %(task_id)s AND lease_token = %(token)s
       FOR SHARE
), {write_step_rows:fence}""", """WITH fence AS (
    SELECT id FROM workflows_task
     WHERE id = %(task_id)s
       FOR SHARE
), {write_step_rows:fence}"""),),
        ("tests/windows/test_fencing.py::"
         "test_every_write_of_a_running_worker_is_refused_after_every_token_change",
         "tests/concurrency/test_execution_races.py::"
         "test_a_stale_token_is_refused_while_the_new_holder_writes"),
    ),
    Mutant(
        "new-step-rows-without-upsert",
        "a step write inserts the rows it did not see with a plain INSERT (a retry racing "
        "its own first try fails on the unique (task, index))",
        "workflows/engine/store/queries.sql",
        (("""                                   WHERE s.task_id = (SELECT id FROM {source})))
    {on_conflict}
)""", """                                   WHERE s.task_id = (SELECT id FROM {source})))
)"""),),
        ("tests/engine/store/test_contract.py::"
         "test_a_step_write_retried_while_its_first_try_is_still_open_lands_once",),
    ),
    Mutant(
        "fold-inserts-a-new-row",
        "the replay log's fold deletes a group and inserts its sum as a new row (a cleanup "
        "deleting the task meanwhile cannot see that row and fails on the foreign key)",
        "workflows/engine/store/queries.sql",
        (("""), kept AS (
    UPDATE workflows_taskreplay AS r SET count = ranked.total
      FROM ranked
     WHERE r.id = ranked.id AND ranked.place = 1 AND ranked.members > 1
    RETURNING 1
), removed AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place > 1
    RETURNING 1
)""", """), kept AS (
    INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
    SELECT r.task_id, r.workflow, ranked.total, r.at
      FROM ranked JOIN workflows_taskreplay AS r ON r.id = ranked.id
     WHERE ranked.place = 1 AND ranked.members > 1
    RETURNING 1
), replaced AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place = 1 AND ranked.members > 1
), removed AS (
    DELETE FROM workflows_taskreplay AS r
     USING ranked
     WHERE r.id = ranked.id AND ranked.place > 1
    RETURNING 1
)"""),),
        ("tests/windows/test_replay_fold_windows.py::"
         "test_a_cleanup_deleting_the_task_inside_a_folds_window_deletes_every_row",),
    ),
    Mutant(
        "fold-without-row-locks",
        "the replay log's fold reads its group without locking it (two folders count it twice)",
        "workflows/engine/store/queries.sql",
        (("""                AND r.at >= found.hour AND r.at < found.hour + interval '1 hour'
       FOR UPDATE OF r SKIP LOCKED""",
          """                AND r.at >= found.hour AND r.at < found.hour + interval '1 hour'"""),),
        ("tests/windows/test_replay_fold_windows.py::"
         "test_a_replay_and_a_second_fold_inside_a_folds_window_count_once",),
    ),
    Mutant(
        "transition-without-fence",
        "a transition (succeed, fail, retry, ...) no longer checks the lease token",
        "workflows/engine/store/queries.sql",
        (("""nothing to do for every other task).
WITH changed AS (
    UPDATE workflows_task SET {sets}
     WHERE id = %(task_id)s AND lease_token = %(token)s""", """nothing to do for every other task).
WITH changed AS (
    UPDATE workflows_task SET {sets}
     WHERE id = %(task_id)s"""),),
        ("tests/windows/test_fencing.py::"
         "test_every_write_of_a_running_worker_is_refused_after_every_token_change",),
    ),
    Mutant(
        "recover-live-leases",
        "the dispatcher recovers leases a minute before they expire",
        "workflows/engine/dispatcher.py",
        (("Task.objects.filter(state=TaskState.RUNNING, lease_expires_at__lt=now)",
          "Task.objects.filter(state=TaskState.RUNNING, "
          "lease_expires_at__lt=now + timedelta(seconds=60))"),),
        ("tests/engine/test_dispatcher.py::"
         "test_an_expired_lease_is_recovered_and_the_lost_attempt_counts",),
    ),
    Mutant(
        "skip-on-conflict",
        "a trigger's INSERT loses ON CONFLICT DO NOTHING (the key dedupe)",
        "workflows/engine/store/queries.sql",
        (("    ON CONFLICT (owner_id, idempotency_key) DO NOTHING\n    RETURNING created_at",
          "    RETURNING created_at"),),
        # (The 200-thread race in tests/concurrency/test_trigger_races.py catches it
        # too, but needs ~230 connections; these need one.)
        ("tests/engine/test_triggers.py::test_replays_are_counted_and_logged_with_their_time",
         "tests/engine/test_triggers.py::test_same_request_replays_an_active_or_succeeded_task"),
    ),
    Mutant(
        "enqueue-before-commit",
        "the Redis push happens inside the trigger's transaction, not after its commit",
        "workflows/engine/enqueue.py",
        (("        transaction.on_commit(lambda: _push_after_commit(ids, front, func))",
          "        _push_after_commit(ids, front, func)"),),
        ("tests/engine/test_triggers.py::"
         "test_a_rolled_back_trigger_leaves_no_task_and_no_message",),
    ),
    Mutant(
        "retries-behind-the-backlog",
        "the dispatcher's messages for work under way queue behind new triggers",
        "workflows/engine/enqueue.py",
        (("    elif front:\n", "    elif False:\n"),),
        ("tests/engine/test_dispatcher.py::"
         "test_due_retries_go_ahead_of_a_backlog_of_new_triggers",),
    ),
    Mutant(
        "no-attempt-on-recover",
        "recovering an expired lease gives the lost attempt back (a poison task loops)",
        "workflows/engine/dispatcher.py",
        (("""                store().transition(task, "recover", at=now, actor=actor,
                                   reason=f"{reason}; retry in {delay:.3f}s",""",
          """                store().transition(task, "recover", at=now, actor=actor,
                                   set_fields={"attempts": task.attempts - 1},
                                   reason=f"{reason}; retry in {delay:.3f}s","""),),
        ("tests/engine/test_dispatcher.py::"
         "test_a_poison_task_that_kills_every_worker_ends_failed_after_max_attempts",),
    ),
    Mutant(
        "overwrite-succeeded-checkpoint",
        "a failed record may overwrite a succeeded step checkpoint",
        "workflows/states.py",
        (("    StepState.FAILED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED),",
          "    StepState.FAILED: (StepState.PENDING, StepState.RUNNING, StepState.FAILED,\n"
          "                       StepState.SUCCEEDED),"),),
        ("tests/engine/store/test_contract.py::test_a_step_row_only_moves_forward",),
    ),
    Mutant(
        "compensate-twice",
        "the compensation phase no longer skips steps already compensated",
        "workflows/engine/compensation.py",
        (("        if cp.state not in TO_COMPENSATE or not cp.compensable:",
          "        if not cp.compensable:"),),
        ("tests/windows/test_saga_windows.py::"
         "test_a_retryable_compensation_error_waits_its_backoff_then_any_worker_resumes",
         "tests/windows/test_saga_windows.py::"
         "test_a_crash_while_a_failure_compensates_resumes_the_compensations_not_the_steps"),
    ),
    Mutant(
        "python-clock",
        "the dispatcher compares against the process clock instead of the database's",
        "workflows/engine/dispatcher.py",
        (("    now = store().db_now()\n    report = DispatchReport(db_now=now)",
          "    now = __import__('django.utils.timezone', fromlist=['now']).now()\n"
          "    report = DispatchReport(db_now=now)"),),
        ("tests/windows/test_database_time.py",),
    ),
    Mutant(
        "signal-escapes-task-run",
        "a worker signal (LeaseLost, CancelRequested) escapes task_run",
        "workflows/engine/runner.py",
        (("        except WorkerSignal as signal:  # every path handles its own; never let one "
          "escape\n            self._lost(signal)",
          "        except WorkerSignal:\n            raise"),),
        ("tests/windows/test_isolation.py::test_task_run_returns_normally_whatever_is_raised_"
         "inside_it",),
    ),
)


def export_tree(target: Path) -> None:
    """The committed tree (HEAD) into `target`."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)


def mutated(mutant: Mutant, text: str) -> str:
    """`text` with the mutant's replacements; stops the script when a pattern is not
    found exactly once."""
    for old, new in mutant.replacements:
        found = text.count(old)
        if found != 1:
            raise SystemExit(f"mutant {mutant.name}: pattern found {found} times in "
                             f"{mutant.path} (expected exactly once):\n{old}")
        text = text.replace(old, new)
    return text


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.path
    path.write_text(mutated(mutant, path.read_text()))


FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run_tests(tree: Path, tests: tuple[str, ...], *, log: Path,
              timeout: float) -> tuple[int, list[str], float]:
    """pytest on `tests` in `tree`: (exit code, failed node ids, seconds)."""
    started = time.monotonic()
    with open(log, "w") as out:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                 "--reuse-db", *tests],
                cwd=tree, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                env={**os.environ, "PILOT_REQUIRE_POSTGRES": "1"}).returncode
        except subprocess.TimeoutExpired:
            code = -1
    failed = sorted(set(FAILED.findall(log.read_text(errors="replace"))))
    return code, failed, time.monotonic() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run only this mutant (repeatable)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds per test run (default 300)")
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("make mutate needs DATABASE_URL=postgres://… (and REDIS_URL=redis://…)")
    if not os.environ.get("REDIS_URL", "").startswith("redis"):
        raise SystemExit("make mutate needs REDIS_URL=redis://…")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(sorted(unknown))}")
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "workflows", "tests"],
                      cwd=ROOT).returncode != 0:
        print("note: uncommitted changes are not part of the check (it runs on HEAD)",
              file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="pilot-mutate-"))
    logs = work / "logs"
    logs.mkdir()
    rows, survived, broken = [], 0, False
    try:
        pristine = work / "pristine"
        pristine.mkdir()
        export_tree(pristine)
        for mutant in chosen:  # every pattern applies, before anything runs
            mutated(mutant, (pristine / mutant.path).read_text())
        selection = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        print(f"baseline: {len(selection)} test selection(s) on the unmutated tree ...",
              flush=True)
        code, failed, took = run_tests(pristine, ("--create-db", *selection),
                                       log=logs / "baseline.log", timeout=args.timeout * 2)
        if code != 0:
            print((logs / "baseline.log").read_text(errors="replace")[-5000:])
            raise SystemExit(f"the selection fails without any mutant (exit {code}): "
                             f"{failed}; nothing can be concluded")
        print(f"baseline passed in {took:.0f} s", flush=True)
        for mutant in chosen:
            tree = work / mutant.name
            shutil.copytree(pristine, tree, symlinks=True)
            apply(mutant, tree)
            code, failed, took = run_tests(tree, mutant.tests, log=logs / f"{mutant.name}.log",
                                           timeout=args.timeout)
            if code == 1 and failed:
                verdict = "killed"
            elif code == 0:
                verdict, survived = "SURVIVED", survived + 1
            else:
                verdict, broken = f"error (exit {code})", True
                print((logs / f"{mutant.name}.log").read_text(errors="replace")[-3000:])
            rows.append((mutant, verdict, failed, took))
            print(f"  {mutant.name}: {verdict} in {took:.0f} s", flush=True)
            shutil.rmtree(tree)
    finally:
        if args.keep:
            print(f"logs kept in {logs}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print("\n| mutant | bug | killed? | caught by |\n|---|---|---|---|")
    for mutant, verdict, failed, took in rows:
        caught = "<br>".join(f"`{f}`" for f in failed[:4]) or "—"
        if len(failed) > 4:
            caught += f"<br>and {len(failed) - 4} more"
        print(f"| `{mutant.name}` | {mutant.bug} ({mutant.path}) | {verdict} ({took:.0f} s) "
              f"| {caught} |")
    return 1 if survived or broken else 0


if __name__ == "__main__":
    sys.exit(main())
