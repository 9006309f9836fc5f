"""Django tasks that only the tests define (tests/django_tasks/). Nothing imports
this module at start-up: a worker process finds these tasks by name
(workflows.django_tasks._load), as it finds a host project's."""

from workflows.django_tasks import heartbeat, task
from workflows.sdk import RetryableError


@task
def greet(name, *, punctuation="!"):
    return f"hello {name}{punctuation}"


@task(takes_context=True)
def whoami(context, label):
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task(max_attempts=2)
def always_fails(reason):
    raise ValueError(reason)


@task(takes_context=True, max_attempts=3)
def fails_once(context, n):
    if context.attempt == 1:
        raise RetryableError("not yet")
    return n


@task
async def doubled(x):
    return x * 2


@task
def spread(first, *rest, **extra):
    return {"first": first, "rest": list(rest), "extra": extra}


@task
def returns_a_set():
    return {1, 2}


@task
def beats(times):
    for _ in range(times):
        heartbeat()
    return times
