"""Workflows that only the tests register (tests/settings.py installs this app),
so that real worker processes started by the tests know them too."""

import os

from workflows.sdk import define_workflow

poison = define_workflow("test.poison", max_attempts=3, backoff_initial=0.1, backoff_max=0.2,
                         description="Kills the worker process that runs it, every time.")


@poison.step
def die(ctx):
    os._exit(1)


noop3 = define_workflow("test.noop3", max_attempts=3, backoff_initial=0.1, backoff_max=1,
                        description="Three checkpointed no-op steps (benchmarks).")


@noop3.step
def one(ctx):
    return 1


@noop3.step
def two(ctx):
    return 2


@noop3.step
def three(ctx):
    return 3


misuse = define_workflow("test.signals", max_attempts=2, backoff_initial=0.1, backoff_max=0.2,
                         description="A step that raises the engine's own control-flow "
                                     "signal (a BaseException django-q2 does not catch).")


@misuse.step
def signal(ctx):
    from workflows.sdk import LeaseLost

    raise LeaseLost("a workflow raising the worker's own signal")


fan = define_workflow("test.fanout", max_attempts=3, backoff_initial=0.1, backoff_max=1,
                      description="Starts `children` runs of test.noop3 (up to 10 000), "
                                  "waits for them, then one more step (benchmarks).")


@fan.step
def spawn(ctx):
    count = int(ctx.payload["children"])
    return len(ctx.start_children("test.noop3", [{"child": i} for i in range(count)]))


fan.wait_for_children("gather", output=len)


@fan.step
def after(ctx):
    return {"children": ctx.outputs["gather"]}
