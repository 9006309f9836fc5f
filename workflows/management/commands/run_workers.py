"""`manage.py run_workers`: PILOT's django-q2 `qcluster`, stopped within a bound.

The cluster runs with Q_CLUSTER_NAME=PILOT_Q_CLUSTER_NAME, so in a host project
it is PILOT's ALT_CLUSTERS entry (PILOT's limits, PILOT's queue) and the host's
own tasks are not touched (workflows.cluster)."""

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from workflows.cluster import worker_environment
from workflows.conf import pilot_settings
from workflows.engine import STOP_FLAG_ENV, stop_announce
from workflows.observability.metrics import multiprocess_dir
from workflows.observability.multiproc import COMPACT_EVERY_SECONDS, compact
from workflows.processes import STOP_SIGNALS, Child
from workflows.selectors import tasks_in_flight

log = logging.getLogger("pilot.workers")


class Command(BaseCommand):
    help = ("Run PILOT's django-q2 worker cluster: qcluster with Q_CLUSTER_NAME set to "
            "PILOT_Q_CLUSTER_NAME (PILOT_Q_WORKERS processes in the standalone project). On "
            "SIGTERM, SIGINT or SIGHUP its workers start no new step (a task whose step "
            "finishes is released and resumes at its next step on the next start); it says "
            "which tasks it waits for, lets their steps run for up to PILOT_STOP_SECONDS, then "
            "ends the cluster with SIGKILL: an interrupted task resumes from its last "
            "checkpoint once its lease expires. Exits 1 if the cluster dies by itself.")

    def handle(self, *args, **options):
        stop = threading.Event()
        received: list[int] = []

        def request_stop(signum, frame):
            received.append(signum)
            stop.set()

        for sig in STOP_SIGNALS:
            signal.signal(sig, request_stop)
        connections.close_all()  # nothing held while the cluster runs
        # The flag that tells the cluster's workers to start no new step (engine/shutdown.py).
        flags = tempfile.mkdtemp(prefix="pilot-workers.")
        flag = os.path.join(flags, "stopping")
        try:
            cluster = Child.start("qcluster", qcluster_command(),
                                  env={**qcluster_environment(), STOP_FLAG_ENV: flag})
            self.supervise(cluster, stop, received, flag)
        finally:
            shutil.rmtree(flags, ignore_errors=True)

    def supervise(self, cluster: Child, stop: threading.Event, received: list[int],
                  flag: str) -> None:
        compacted = time.monotonic()
        while not stop.wait(0.2):
            if not cluster.alive:
                cluster.kill()  # whatever it left behind
                raise CommandError(f"qcluster exited by itself (code {cluster.returncode})")
            if time.monotonic() - compacted >= COMPACT_EVERY_SECONDS:
                compacted = time.monotonic()
                metrics_compact()
        cluster_stop(cluster, grace=pilot_settings.PILOT_STOP_SECONDS,
                     reason=signal.Signals(received[0]).name, flag=flag)


def metrics_compact() -> None:
    """Fold the metrics files of recycled workers (observability.multiproc), so
    a machine that runs only workers does not pile them up between scrapes."""
    directory = multiprocess_dir()
    if directory:
        try:
            compact(directory)
        except OSError as exc:  # a full or missing tmpfs must not stop the workers
            log.warning("metrics compaction failed: %s", exc)


def qcluster_command() -> list[str]:
    """`qcluster` run the way this command was: by the same manage.py script,
    else `python -m django` with this process's settings module."""
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else None
    if script and os.path.exists(script):
        return [sys.executable, os.path.abspath(script), "qcluster"]
    return [sys.executable, "-m", "django", "qcluster", "--settings",
            settings.SETTINGS_MODULE]


def qcluster_environment() -> dict[str, str]:
    """This process's environment, plus what makes the cluster PILOT's
    (Q_CLUSTER_NAME: an ALT_CLUSTERS entry gets PILOT's limits), the settings
    module and this process's import path (the project need not be installed)."""
    env = {**os.environ, **worker_environment()}
    env.setdefault("DJANGO_SETTINGS_MODULE", settings.SETTINGS_MODULE)
    first = [p for p in sys.path[:1] if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [*first, os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]))
    return env


def cluster_stop(cluster: Child, *, grace: float, reason: str, flag: str | None = None) -> bool:
    """Stop `cluster` (a running qcluster in its own process group) within about
    `grace` seconds: raise its workers' stop `flag` (they start no new step,
    engine/shutdown.py), log what it is waiting for, SIGTERM the qcluster main
    process only (it then stops its sentinel, which lets the workers finish
    their current steps), and SIGKILL the whole group if it has not exited by
    then. True if it stopped by itself."""
    started = time.monotonic()
    if flag:
        stop_announce(flag)
    tasks = _in_flight(cluster.group())
    log.info("%s: stopping the workers; %s (up to %s s)%s", reason, _waiting_for(tasks),
             f"{grace:g}", "; they start no new step: a task resumes at its next step on "
             "the next start" if flag and tasks else "")
    cluster.terminate()
    if cluster.wait(started + grace):
        cluster.kill()  # leftovers of the group, if any
        log.info("workers stopped in %.1f s", time.monotonic() - started)
        return True
    cluster.kill()
    log.warning("workers had not stopped after %s s: ended them (SIGKILL)%s", f"{grace:g}",
                "; what they were running resumes from its last checkpoint once its lease "
                "expires (PILOT_LEASE_SECONDS) and workers run again" if tasks != [] else "")
    return False


def _in_flight(pids: list[int]) -> list | None:
    """The tasks whose lease one of `pids` holds (a lease names its worker
    `host:pid`, see engine.leases.worker_id); None if the database did not answer."""
    host = socket.gethostname()
    try:
        return list(tasks_in_flight(worker_ids=[f"{host}:{pid}" for pid in pids])[:10])
    except DatabaseError as exc:
        log.warning("could not read the tasks in flight: %s", str(exc)[:200])
        return None
    finally:
        connections.close_all()


def _waiting_for(tasks: list | None) -> str:
    """What the stop waits for, in words."""
    if tasks is None:
        return "waiting for the workers to finish their tasks"
    if not tasks:
        return "waiting for the workers to stop (no task running)"
    described = ", ".join(
        f"{task.pk} ({task.workflow}" + (f", step {task.current_step}" if task.current_step
                                         else "") + ")" for task in tasks)
    plural = "s" if len(tasks) > 1 else ""
    return f"waiting for the worker{plural} to finish task{plural} {described}"
