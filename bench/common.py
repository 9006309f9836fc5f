"""What every part of the benchmark shares: where things are, the environment
of the processes it starts, starting and stopping them, peak RSS, percentiles.

Standard library only: the PILOT virtualenv (.venv) and the peers' own
(bench/.venv, DBOS and Procrastinate) both import it.

Everything runs on loopback against a dedicated PostgreSQL database and a
dedicated Redis DB number, under its own django-q2 cluster name, so nothing
collides with test suites running on the same servers. Every process is
started in its own session (process group) and stopped by its group id.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
LOGS = OUT / "logs"
PILOT_PY = ROOT / ".venv" / "bin" / "python"
BENCH_PY = ROOT / "bench" / ".venv" / "bin" / "python"

PG_SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
# BENCH_DB: another pilot_bench* database, when two benchmarks share a server.
DB_NAME = os.environ.get("BENCH_DB", "pilot_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/3")
CLUSTER_NAME = "pilot-bench"
CLIENT_NAME = "bench-client"
RESULT_PREFIX = "BENCH-RESULT "


def db_url(name: str = DB_NAME) -> str:
    return f"{PG_SERVER}/{name}"


def quick() -> bool:
    return os.environ.get("BENCH_QUICK", "").lower() in ("1", "true", "yes")


def pilot_env(broker: str, **overrides) -> dict:
    """Environment of a PILOT process: bench settings, the bench database, the
    broker asked for ("orm" or "redis"; Redis also holds the throttle cache)."""
    if broker not in ("orm", "redis"):
        raise ValueError(f"broker must be orm or redis, not {broker!r}")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update({
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DJANGO_SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
        "DATABASE_URL": db_url(),
        "PILOT_Q_CLUSTER_NAME": CLUSTER_NAME,
        # The throttle still counts every trigger; the limit just never bites.
        "PILOT_TRIGGER_RATE": "1000000000/min",
        # One client is the whole workload, as in the peers' runs: the per-client
        # cap (fairness between clients; default workers - 1) would idle a worker.
        "PILOT_MAX_RUNNING_PER_CLIENT": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
    })
    if broker == "redis":
        env["REDIS_URL"] = REDIS_URL
    env.update({k: str(v) for k, v in overrides.items()})
    return env


# --- results between processes ---------------------------------------------------------

def emit_result(result: dict) -> None:
    """A workload's answer to the orchestrator: one JSON line on stdout."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise RuntimeError("the workload printed no result line")


# --- processes -------------------------------------------------------------------------

class Proc:
    """A process in its own session; its output goes to bench/out/logs/NAME.log."""

    def __init__(self, name: str, args: list, env: dict | None = None):
        self.name, self.args, self.env = name, [str(a) for a in args], env
        self.popen: subprocess.Popen | None = None
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{name}.log"

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def _signal_group(self, sig) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the leader (qcluster, gunicorn and the dispatcher then stop
        their children in order), SIGKILL the group after `timeout` or once the
        leader is gone (leftovers), reap the leader."""
        if self.popen is None:
            return
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # leftovers (workers of a dead leader)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def run_checked(args: list, env: dict | None = None, timeout: float = 600,
                name: str | None = None, cwd: Path = ROOT) -> str:
    """Run a command to completion in its own session (in `cwd`: the tree whose
    modules `python -m` imports); return its stdout. Its stderr goes to the
    log; a failure raises with the log's tail."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name or Path(str(args[0])).name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([str(a) for a in args], cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"{args[:3]} timed out after {timeout}s; see {log_path}") from None
    text = stdout.decode(errors="replace")
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{args[:4]} exited {proc.returncode}; log {log_path}:\n{tail}")
    return text


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid` (read from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid:  # state ppid pgrp ...
            pids.append(int(entry))
    return pids


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM) in MB, None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler(threading.Thread):
    """Reads the peak RSS of every process in the watched groups every 0.25 s,
    so processes that exit early (recycled workers) are counted too."""

    def __init__(self, procs: dict[str, Proc]):
        super().__init__(daemon=True)
        self.procs = procs
        self.peaks: dict[int, tuple[str, float]] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.25):
            self.sample()

    def sample(self) -> None:
        for label, proc in self.procs.items():
            if proc.popen is None:
                continue
            for pid in group_pids(proc.pid):
                mb = peak_rss_mb(pid)
                if mb is not None:
                    old = self.peaks.get(pid, (label, 0.0))[1]
                    self.peaks[pid] = (label, max(old, mb))

    def stop(self) -> dict[int, tuple[str, float]]:
        self.sample()
        self._halt.set()
        self.join(2)
        return self.peaks


# --- waiting and statistics ------------------------------------------------------------

def wait_for(condition, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def percentile(values, p: float) -> float | None:
    """Nearest-rank percentile of `values` (p in 0..100); None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
