"""`make run`'s own processes on a temporary SQLite database and a free port.

`local_run()` starts bin/run-local (or `make run`) in its own session with the
environment a developer's shell would give it: the embedded default (SQLite,
ORM broker), no test settings. It waits for the banner with the credentials and
hands back what a developer would read off the terminal. Whatever is still
running at the end of the test is SIGKILLed, by PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.procs import ROOT, free_port
from workflows.processes import descendants

# Our own variables (and those of the `make test` running us): a developer's
# shell has none of them set.
_TEST_ONLY = ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY",
              "PILOT_Q_CLUSTER_NAME", "PROMETHEUS_MULTIPROC_DIR", "PILOT_REQUIRE_POSTGRES",
              "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


# `args` with SIGINT and SIGQUIT at their default action, as a shell at a terminal
# starts `make run` (the same process: exec). A suite started in the background by a
# non-interactive shell (a CI script's `cmd &`) inherits them ignored, and make leaves
# an ignored signal ignored: a Ctrl-C could then never reach it, which is not what
# these tests are about.
AS_FROM_A_TERMINAL = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.signal(signal.SIGQUIT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"]


@dataclasses.dataclass
class LocalRun:
    popen: subprocess.Popen
    port: int
    database: Path
    log_path: Path
    token: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> dict[int, str]:
        """Every process this run started (make, run-local and below), as
        {pid: start time}: a pid reused later by another process never matches."""
        pids = [self.popen.pid, *descendants(self.popen.pid)]
        return {pid: started for pid in pids if (started := start_time(pid))}


def start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def still_running(tree: dict[int, str]) -> list[int]:
    return [pid for pid, started in tree.items() if start_time(pid) == started]


def on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


# `make run` is the embedded default whatever the suite's database: these tests
# start their own SQLite database, so they run once, in the SQLite pass.
skip_on_postgres = pytest.mark.skipif(
    on_postgres(), reason="make run is SQLite-only; these run in `make test`'s SQLite pass")


def local_run_start(directory: Path, runs: list[LocalRun], *, via_make: bool = False,
                    database: Path | None = None, **env_overrides) -> LocalRun:
    """Start one `make run` (bin/run-local, or make itself) with its database and log
    in `directory`; wait for its banner. Appended to `runs` (local_run_stop ends them)."""
    port = free_port()
    database = database or directory / f"db-{len(runs)}.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in _TEST_ONLY}
    env.update({"DATABASE_URL": f"sqlite:///{database}", "PILOT_PORT": str(port),
                "PILOT_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in env_overrides.items()})
    # `-o .venv/.installed`: never reinstall the virtualenv from a test.
    args = (["make", "--no-print-directory", "-o", ".venv/.installed", "run"] if via_make
            else ["bin/run-local"])
    log_path = directory / f"run-{len(runs)}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen([*AS_FROM_A_TERMINAL, *args], cwd=ROOT, env=env,
                                 stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    run = LocalRun(popen, port, database, log_path)
    runs.append(run)
    deadline = time.monotonic() + 60
    while not (match := re.search(r"API token: (\S+)", run.log())):
        if popen.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"make run did not come up:\n{run.log()[-4000:]}")
        time.sleep(0.2)
    run.token = match.group(1)
    return run


@pytest.fixture
def local_run(tmp_path):
    runs: list[LocalRun] = []

    def start(*, via_make: bool = False, database: Path | None = None,
              **env_overrides) -> LocalRun:
        """A new run, on a new database unless given one (a restart)."""
        return local_run_start(tmp_path, runs, via_make=via_make, database=database,
                               **env_overrides)

    yield start
    local_run_stop(runs)


def local_run_stop(runs: list[LocalRun]) -> None:
    """SIGTERM each run, then SIGKILL whatever of its processes is still there, by PID."""
    for run in runs:
        leftovers = run.tree()
        if run.popen.poll() is None:
            run.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.popen.wait(15)
        for pid in still_running(leftovers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.popen.wait(5)
