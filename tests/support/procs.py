"""Real processes for acceptance tests: `qcluster`, `run_dispatcher`, gunicorn.

Each runs in its own session (so its own process group): killing the group
with SIGKILL takes the django-q2 sentinel, pusher, monitor and every worker
down at once, as a machine crash would. Everything started is stopped at the
end of the test, by PID.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def log_file(name: str) -> Path:
    """Where a started process logs: test-artifacts/<name>.log, prefixed with the
    pytest-xdist worker's id when the suite runs on several (two workers' tests may
    start processes of the same name at the same time)."""
    ARTIFACTS.mkdir(exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return ARTIFACTS / (f"{worker}-{name}.log" if worker else f"{name}.log")


def database_url() -> str:
    """The URL of the database this test runs on (the test database)."""
    s = connection.settings_dict
    if s["ENGINE"] != "django.db.backends.postgresql":
        raise RuntimeError("real-process tests run on PostgreSQL")
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def process_env(**overrides) -> dict:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PILOT_Q_CLUSTER_NAME": settings.Q_CLUSTER["name"],
        "PILOT_LEASE_SECONDS": "3",
        "PILOT_HEARTBEAT_SECONDS": "0.5",
        "PILOT_DISPATCHER_POLL_SECONDS": "0.2",
        "PILOT_REENQUEUE_SECONDS": "3",
        "PILOT_Q_WORKERS": "2",
        # Worker processes drain the queue after each message, as in production.
        "PILOT_TEST_DRAIN_SECONDS": "5",
        "PYTHONUNBUFFERED": "1",
    })
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    else:
        env.pop("REDIS_URL", None)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class Proc:
    def __init__(self, name: str, args: list[str], env: dict):
        self.name, self.args, self.env = name, args, env
        self.log_path = log_file(name)
        self.popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig) -> None:
        if self.popen is not None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would, and reap it."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(10)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.popen is None:
            return None
        if self.alive:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.signal_group(signal.SIGKILL)  # leftovers of the group
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def manage(name: str, *args: str, env: dict) -> Proc:
    return Proc(name, [sys.executable, "manage.py", *args], env)


# Numbers the processes of every Fleet of this pytest process: each gets a log of its
# own (a number per Fleet made a later test's process append to an earlier test's
# log, whose tracebacks its checks then read as its own).
_STARTED = itertools.count(1)


class Fleet:
    """The processes of one test; `stop_all()` in a finally/fixture teardown."""

    def __init__(self, **env_overrides):
        self.env = process_env(**env_overrides)
        self.procs: list[Proc] = []

    @staticmethod
    def _name(kind: str) -> str:
        return f"{kind}-{os.getpid()}-{next(_STARTED)}"

    def start(self, kind: str, *args: str) -> Proc:
        proc = manage(self._name(kind), kind, *args, env=self.env).start()
        self.procs.append(proc)
        return proc

    def start_process(self, kind: str, args: list[str], **env) -> Proc:
        """Any other process (e.g. gunicorn) in this fleet's environment."""
        proc = Proc(self._name(kind), args, {**self.env, **env}).start()
        self.procs.append(proc)
        return proc

    def workers(self) -> Proc:
        return self.start("qcluster")

    def dispatcher(self) -> Proc:
        return self.start("run_dispatcher")

    def web(self, workers: int = 3) -> tuple[Proc, str]:
        """gunicorn serving the app on a free loopback port; returns (proc, base URL)
        once it answers /healthz."""
        port = free_port()
        proc = Proc(self._name("web"),
                    [sys.executable, "-m", "gunicorn", "pilot.wsgi", "-w", str(workers),
                     "-b", f"127.0.0.1:{port}", "--graceful-timeout", "5",
                     "--access-logfile", "-"], self.env).start()
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{url}/healthz"), 30, what="gunicorn to start")
        return proc, url

    def stop_all(self, timeout: float = 3) -> None:
        """SIGTERM every process group at once, give them `timeout` seconds
        together to stop cleanly, then SIGKILL what is left."""
        live = [p for p in self.procs if p.alive]
        for proc in live:
            proc.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in live:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def rss_kib(pid: int) -> int:
    """Resident set size of one process, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def group_pids(pgid: int) -> list[int]:
    """Every process in process group `pgid` (a fleet member and its children)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def wait_until(condition, timeout: float, interval: float = 0.1, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
