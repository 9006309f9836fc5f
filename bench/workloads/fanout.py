"""Fan-out and fan-in (docs/writing-workflows.md, "Children"): one parent
starting `--children` child tasks, on a real `qcluster` and `run_dispatcher`.

    python -m bench.workloads.fanout --children 1000

1. Independent: `--children` runs of `test.noop3` triggered in batches of
   1 000, timed from the first trigger to the last finish (the baseline).
2. Children: one `test.fanout` whose step `spawn` starts the same number of
   `test.noop3` children (batches of 1 000 through the batch trigger), waits
   for them (`gather`) and runs a last step (`after`). Figures: the time to
   start them all (the spawn step's start to its checkpoint), the children's
   rate (spawn's start to the last child's finish), and the time from the
   last child's ending to the parent's next step (`after` starting: the
   settle's wake, a claim, the gather's record).

Times are the database's. Needs the test app (bench/settings.py).
"""

from __future__ import annotations

import argparse

from bench.common import emit_result
from bench.common import log as say
from bench.workloads import pilotdb
from bench.workloads.waiting import _until, finished, short_runs, start_cluster, trigger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    pilotdb.setup()
    broker, tag, procs = start_cluster("fan", args.workers)
    try:
        trigger(f"{tag}-warm", "test.noop3", 1)
        finished(f"{tag}-warm", 1, procs)
        independent = short_runs(f"{tag}-alone", args.children, procs)
        say(f"  {args.children} independent runs: {independent:.0f} runs/s")
        figures = fan_out(f"{tag}-parent", args.children, procs)
        say(f"  {args.children} children: started in {figures['start_all_ms']:.0f} ms, "
            f"{figures['children_runs_per_s']:.0f} runs/s, parent's next step "
            f"{figures['last_child_to_next_step_ms']:.0f} ms after the last child")
    finally:
        for proc in procs:
            proc.stop(timeout=5)
    emit_result({"broker": broker, "workers": args.workers, "children": args.children,
                 "independent_runs_per_s": round(independent, 1), **figures,
                 "children_vs_independent": round(figures["children_runs_per_s"]
                                                  / independent, 2)})


def fan_out(key: str, n: int, procs) -> dict:
    from django.db.models import Max

    from workflows.engine.triggers import task_trigger
    from workflows.models import StepCheckpoint, Task, TaskTransition

    parent = task_trigger(owner=pilotdb.owner(), workflow="test.fanout",
                          payload={"children": n}, key=key).task
    _until(lambda: Task.objects.get(pk=parent.pk).state == "succeeded", procs,
           f"{key}: the parent did not succeed")
    parent.refresh_from_db()
    if parent.result != {"children": n}:
        raise RuntimeError(f"{key}: the parent gathered {parent.result}, not {n}")
    steps = {s.name: s for s in StepCheckpoint.objects.filter(task=parent)}
    last_child = Task.objects.filter(parent=parent).aggregate(m=Max("finished_at"))["m"]
    wakes = TaskTransition.objects.filter(task=parent, transition="wake").count()
    if wakes != 1:
        raise RuntimeError(f"{key}: the parent was woken {wakes} times")
    spawn = steps["spawn"]
    return {
        "start_all_ms": round((spawn.finished_at - spawn.started_at).total_seconds() * 1000, 1),
        "children_runs_per_s": round(n / (last_child - spawn.started_at).total_seconds(), 1),
        "last_child_to_next_step_ms": round(
            (steps["after"].started_at - last_child).total_seconds() * 1000, 1),
        "parent_wakes": wakes,
    }


if __name__ == "__main__":
    main()
