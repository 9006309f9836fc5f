"""`make run` (bin/run-local): PILOT on this machine, embedded default.

    python -m pilot.localrun        (bin/run-local sets the environment first)

Migrates, resets the local admin and API token, then runs the three processes
of a deployment, each in its own session (workflows/processes.py):

- web: gunicorn with deploy/gunicorn.conf.py, as in production, on
  127.0.0.1:PILOT_PORT (default 8000), WEB_CONCURRENCY processes (default 2) of
  PILOT_WEB_THREADS threads (default 4), static files from whitenoise;
- workers: `manage.py run_workers` (qcluster, stopped within a bound);
- dispatcher: `manage.py run_dispatcher`.

It prints the admin password and the API token once the web server answers.

Stopping: SIGINT (Ctrl-C), SIGTERM or SIGHUP to this process, or a signal to
the `make` that runs it (PILOT_STOP_WITH=<make's pid>; make does not pass
SIGINT on, see processes.ParentWatch), or any of the three exiting. It says
what it waits for and is done within PILOT_STOP_SECONDS + 1 s: the workers end
their cluster themselves after PILOT_STOP_SECONDS, anything still running a
second later is SIGKILLed. See docs/operations.md.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workflows.processes import ParentWatch

ROOT = Path(__file__).resolve().parent.parent
POLL = 0.2


class _StopDuringSetup(Exception):
    """A stop signal arrived before any child process was started."""


class LocalRun:
    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.reason: str | None = None
        self.failed = False
        self.children: list = []
        self.starting = False
        self.stopping = False
        self.hurry = False
        self.metrics_dir: str | None = None
        self.watch: ParentWatch | None = None  # on the make running us, if any

    # --- signals ---------------------------------------------------------------------

    def on_signal(self, signum, frame) -> None:
        if self.stopping:
            self.hurry = True  # a second Ctrl-C: do not wait any longer
            return
        self.reason = self.reason or signal.Signals(signum).name
        if not self.starting:
            raise _StopDuringSetup

    # --- the run ---------------------------------------------------------------------

    def run(self) -> int:
        from workflows.processes import STOP_SIGNALS, ParentWatch

        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)
        # Watch the make that runs us from the start: it may be signalled during set-up.
        stop_with = os.environ.get("PILOT_STOP_WITH", "")
        if stop_with.isdigit() and int(stop_with) == os.getppid():
            self.watch = ParentWatch(int(stop_with))
        try:
            try:
                banner = self.setup()
                self.start()
            except _StopDuringSetup:
                self.say(f"{self.reason}: stopped before PILOT was started")
                return 0
            self.supervise(banner)
            return 1 if self.failed else 0
        finally:
            self.stop()

    def setup(self) -> str:
        """Migrate and reset the local credentials; returns the text that shows them."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # One metrics directory for the three processes, so /metrics on the web
            # server shows what the workers and the dispatcher counted too.
            self.metrics_dir = tempfile.mkdtemp(prefix="pilot-metrics.")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", interactive=False, verbosity=0)
        banner = io.StringIO()
        call_command("pilot_local_setup", port=self.port, stdout=banner, no_color=True)
        connections.close_all()
        return banner.getvalue()

    def start(self) -> None:
        from workflows.conf import pilot_settings
        from workflows.processes import Child

        self.starting = True
        py = sys.executable
        web_env = {**os.environ, "PORT": str(self.port), "PILOT_BIND_HOST": "127.0.0.1"}
        web_env.setdefault("WEB_CONCURRENCY", "2")
        web_env.setdefault("PILOT_WEB_THREADS", "4")
        web_env.setdefault("PILOT_WEB_ACCESS_LOG", "-")
        web_env.setdefault("PILOT_STOP_SECONDS", f"{pilot_settings.PILOT_STOP_SECONDS:g}")
        self.children.append(Child.start("workers", [py, "manage.py", "run_workers"], cwd=ROOT))
        self.children.append(Child.start("dispatcher", [py, "manage.py", "run_dispatcher"],
                                         cwd=ROOT))
        # No control socket: its one default path would be shared by every gunicorn
        # of this user (another `make run`, the tests).
        self.children.append(Child.start(
            "web server", [py, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
                           "--no-control-socket", "pilot.wsgi"], env=web_env, cwd=ROOT))

    def supervise(self, banner: str) -> None:
        """Until a stop is asked for or a child exits; prints `banner` once the
        web server answers."""
        ready_by = time.monotonic() + 60
        shown = False
        while self.reason is None:
            if self.watch is not None and (why := self.watch.signalled()):
                self.reason = why
                break
            dead = [child for child in self.children if not child.alive]
            if dead:
                self.reason = f"the {dead[0].name} exited (code {dead[0].returncode})"
                self.failed = True
                break
            if not shown and (_answers(f"{self.url}/healthz") or time.monotonic() > ready_by):
                self.say(banner.rstrip("\n") + "\n  Ctrl-C stops it (docs/operations.md).\n")
                shown = True
            time.sleep(POLL)

    def stop(self) -> None:
        """Stop every child within PILOT_STOP_SECONDS + 1 s (at once on a second
        signal), saying what it waits for; then remove the metrics directory."""
        self.stopping = True
        live = [child for child in self.children if child.alive]
        if live:
            from workflows.conf import pilot_settings

            grace = pilot_settings.PILOT_STOP_SECONDS
            started = time.monotonic()
            self.say(f"\n{self.reason}: stopping; waiting for {_names(live)} to stop (at "
                     f"most {grace + 1:g} s; the workers say which tasks they wait for; "
                     "Ctrl-C again ends them now)")
            for child in live:
                child.terminate()
            # The workers end their cluster after `grace` s; what is left half a second
            # later is killed, so that noticing the signal, the kills and our own exit
            # fit in the second the bound leaves.
            deadline = started + grace + 0.5
            while (any(child.alive for child in live) and time.monotonic() < deadline
                   and not self.hurry):
                time.sleep(0.05)
            for child in live:
                if child.alive:
                    self.say(f"the {child.name} did not stop in time: ending it (SIGKILL)")
        for child in self.children:
            child.kill()  # whatever is left in its process group
        if live:
            self.say(f"stopped in {time.monotonic() - started:.1f} s")
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)  # noqa: T201 - make run talks to its terminal


def _names(children) -> str:
    names = [f"the {child.name}" for child in children]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _port() -> int:
    raw = os.environ.get("PILOT_PORT", "").strip() or "8000"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SystemExit(f"PILOT_PORT={raw!r} is not a TCP port (1-65535)")
    port = int(raw)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise SystemExit(f"port {port} is in use (another `make run`?); set PILOT_PORT "
                             "to a free port, e.g. PILOT_PORT=8001 make run") from None
    return port


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot.settings")
    os.chdir(ROOT)
    code = LocalRun(_port()).run()
    # Everything we started has exited: skip the interpreter's teardown of a loaded
    # Django (0.5-2.5 s on a busy machine, after "stopped in"; review 3, ux.md §2 #2),
    # so the shell prompt comes back within the bound too.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
