"""`make bench-scale SIZE=0.1M,1M`: PILOT with a day of retained history at each
size (issue 34), side by side, written to bench/results.md as section 12.

    .venv/bin/python -m bench.scale 0.1M,1M [--reps 7]

Runs bench/workloads/scale.py once per size (its own database, filled with the
scale study's generator, dropped afterwards) and tabulates every row of the
issue's table per size with its growth factor (largest size ÷ smallest). The
"study" column is the scale study's figure at 10 M on main at 27fabad (review 3,
reports/scale.md), another run on this machine: a reference, not a baseline.
The baseline measured in each run is Django's own admin list of users. 10 M
takes ~15 minutes to fill and ~25 GB of disk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import report
from bench.common import OUT, PILOT_PY, ROOT, log, parse_result
from bench.report import Section
from bench.run import RESULTS_MD, splice_section

TITLE = "12. A day of history: the console, the scrape and cleanup at 0.1 M–10 M retained tasks"
PAGE_BUDGET_MS = 300
METRICS_BUDGET_MS = 100
# The scale study on 27fabad (reports/scale.md, its run 2 for the engine rows):
# the same rows before issue 34, another run on this machine — a reference.
STUDY = {
    100_000: {"trigger new p50": 2.24, "trigger replay p50": 2.35, "claim p50": 1.99,
              "list default": 81, "key search": 147, "failed + workflow": 80,
              "page 100": 157, "task page": 25, "dashboard": 317, "dashboard live": 264,
              "workers & queue": 51, "metrics": 19, "cleanup tasks/s": 2424},
    1_000_000: {"trigger new p50": 2.49, "trigger replay p50": 2.45, "claim p50": 1.91,
                "list default": 340, "key search": 667, "failed + workflow": 231,
                "page 100": 319, "task page": 13, "dashboard": 1947, "dashboard live": 1997,
                "workers & queue": 34, "metrics": 81, "cleanup tasks/s": 1919},
    10_000_000: {"trigger new p50": 2.94, "trigger replay p50": 2.46, "claim p50": 1.72,
                 "list default": 3294, "key search": 9544, "failed + workflow": 3685,
                 "page 100": 4383, "task page": 23, "dashboard": 20563,
                 "dashboard live": 19713, "workers & queue": 35, "metrics": 1361,
                 "cleanup tasks/s": 1577},
}


def size_of(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def label(n: int) -> str:
    return f"{n / 1_000_000:g} M" if n >= 100_000 else f"{n:,}".replace(",", " ")


def rows_of(result: dict) -> dict[str, float]:
    rows = {"trigger new p50": result["trigger"]["new"]["p50_ms"],
            "trigger replay p50": result["trigger"]["replay"]["p50_ms"],
            "claim p50": result["claim"]["p50_ms"]}
    rows.update({name: p["median_ms"] for name, p in result["pages"].items()})
    rows["cleanup tasks/s"] = result["cleanup"]["tasks_per_s"]
    rows["trigger p99, no cleanup"] = result["cleanup"]["trigger_baseline"]["p99_ms"]
    rows["trigger p99, during cleanup"] = result["cleanup"]["trigger_during"]["p99_ms"]
    return rows


def spaced(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ")


def churn_note(n: int, result: dict) -> str:
    """What a size's churn (triggers, claims, cleanup) left and VACUUM gave back."""
    def mib(stage: str, part: str) -> str:
        return spaced(sum(t[part] for t in result[stage].values()) / 2**20)

    churned = result["sizes_churned"]
    task = churned["workflows_task"]
    pct = (f"; task heap {task['dead_pct']} % dead, {task['free_pct']} % free "
           "(pgstattuple_approx)" if "dead_pct" in task else "")
    return (f"{label(n)}: hot tables' heap {mib('sizes_filled', 'heap')} → "
            f"{mib('sizes_churned', 'heap')} → {mib('sizes_vacuumed', 'heap')} MiB, their "
            f"indexes {mib('sizes_filled', 'indexes')} → {mib('sizes_churned', 'indexes')} → "
            f"{mib('sizes_vacuumed', 'indexes')} MiB (filled → after the churn → vacuumed); "
            f"{spaced(sum(t['dead'] for t in churned.values()))} dead tuples after the "
            f"churn{pct}; VACUUM (ANALYZE) {sum(result['vacuum_seconds'].values()):.1f} s "
            f"(task {result['vacuum_seconds']['workflows_task']} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", help="comma-separated, e.g. 0.1M,1M,10M")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    sizes = [size_of(s) for s in args.sizes.split(",")]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings",
           "DJANGO_SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
           "PILOT_Q_CLUSTER_NAME": os.environ.get("PILOT_Q_CLUSTER_NAME", "pilot-bench-scale"),
           "PYTHONPATH": str(ROOT)}
    load_start, started = os.getloadavg(), time.monotonic()
    results = []
    for n in sizes:
        log(f"bench-scale: {label(n)} tasks")
        run = subprocess.run([str(PILOT_PY), "-m", "bench.workloads.scale", "--tasks", str(n),
                              "--reps", str(args.reps)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True, check=False)
        if run.returncode:
            raise SystemExit(f"bench.workloads.scale --tasks {n} failed ({run.returncode})")
        results.append(parse_result(run.stdout))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results-scale.json").write_text(json.dumps(results, indent=1))

    per_size = [rows_of(r) for r in results]
    header = ["operation (median ms; cleanup: tasks/s)"]
    for n in sizes:
        header += [label(n), f"{label(n)}, study"]
    if len(sizes) > 1:
        header.append(f"× ({label(sizes[-1])} ÷ {label(sizes[0])})")
    rows = []
    for name in per_size[0]:
        values = [r[name] for r in per_size]
        row = [name]
        for n, value in zip(sizes, values, strict=True):
            study = STUDY.get(n, {}).get(name)
            row += [f"{value:g}", "–" if study is None else f"{study:g}"]
        if len(sizes) > 1:
            row.append(f"×{values[-1] / values[0]:.2f}" if values[0] else "–")
        rows.append(row)
    largest = per_size[-1]
    pages = [k for k in largest if k not in ("trigger new p50", "trigger replay p50",
                                               "claim p50", "metrics", "cleanup tasks/s")
             and not k.startswith(("baseline", "trigger p99"))]
    over = [k for k in pages if largest[k] > PAGE_BUDGET_MS]
    fills = ", ".join(f"{label(n)} {r['fill_seconds']} s"
                      for n, r in zip(sizes, results, strict=True))
    disk = ", ".join(f"{r['database_bytes'] / 2**30:.2f} GiB" for r in results)
    notes = [
        f"Each size: its own database filled by tests/support/history.py (the study's "
        f"generator): fill {fills}; database {disk}.",
        "Triggers and claims in process (p50 of 300 each); pages through Django's test "
        f"client, median of {args.reps} after a warm-up; /metrics with "
        "PILOT_METRICS_TASKS_TTL=0; cleanup_tasks (its defaults: batches of 1 000, "
        "--yield-ratio 1) over the expired 10 % while another process triggers "
        f"{results[0]['cleanup']['load_per_s']:g} new keys/s; that load's trigger p99 in "
        "the 10 s before the cleanup and while it ran.",
        "Churn (the triggers, claims and cleanup above) and vacuum: "
        + "; ".join(churn_note(n, r) for n, r in zip(sizes, results, strict=True)) + ".",
        "The dashboard reads the activity the dispatcher folds (engine/activity.py): "
        "first fold of the day " + ", ".join(f"{label(n)} {r['first_fold_seconds']} s"
                                             for n, r in zip(sizes, results, strict=True))
        + "; a pass once caught up " + ", ".join(f"{r['fold_pass_ms']} ms" for r in results)
        + ".",
        f"At {label(sizes[-1])}: pages over {PAGE_BUDGET_MS} ms: "
        f"{', '.join(over) if over else 'none'}; /metrics {largest['metrics']:g} ms "
        f"(budget {METRICS_BUDGET_MS}).",
        f"Load average {load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"took {(time.monotonic() - started) / 60:.1f} min. Produced by `make bench-scale "
        f"SIZE={args.sizes}` (bench/scale.py); raw figures in bench/out/results-scale.json.",
    ]
    section = Section(TITLE, header, rows, notes)
    print(report.render_text(TITLE, [], [section], []))
    markdown = report.render_markdown("x", [], [section], [], [])
    markdown = markdown[markdown.index(f"## {TITLE}"):]
    RESULTS_MD.write_text(splice_section(RESULTS_MD.read_text(), TITLE, markdown))
    log(f"wrote section 12 of {RESULTS_MD.relative_to(ROOT)}")
    sys.exit(0)


if __name__ == "__main__":
    main()
