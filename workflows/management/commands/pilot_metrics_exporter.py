"""`manage.py pilot_metrics_exporter`: `/metrics` for a machine without a web process.

A machine that runs only `run_workers` (and perhaps `run_dispatcher`) has its
workers' counters in its PROMETHEUS_MULTIPROC_DIR but no gunicorn to serve
them. This serves the same page as the web's `/metrics` (the same bearer
token, PILOT_METRICS_TOKEN; the same compaction of dead processes' files) on
its own port, with nothing else: no admin, no API, no sessions.
"""

from __future__ import annotations

import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from prometheus_client import CONTENT_TYPE_LATEST

from workflows.conf import pilot_settings
from workflows.observability.metrics import exposition, multiprocess_dir
from workflows.observability.views import CLOSED, token_authorized


class _Handler(BaseHTTPRequestHandler):
    server_version = "pilot-metrics-exporter"

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, b"not found\n", "text/plain")
            return
        if not token_authorized(self.headers.get("Authorization", "")):
            if not pilot_settings.PILOT_METRICS_TOKEN:
                self._send(403, CLOSED.encode(), "text/plain")
                return
            self._send(401, b"a bearer token is required\n", "text/plain",
                       {"WWW-Authenticate": 'Bearer realm="metrics"'})
            return
        try:
            body = exposition()
        finally:
            connections.close_all()  # this thread's, if it read the database
        self._send(200, body, CONTENT_TYPE_LATEST)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - a scrape is not worth a log line
        pass


class Command(BaseCommand):
    help = ("Serve /metrics (Prometheus) on its own port, for a machine that runs only "
            "workers: the counters of every PILOT process on this machine "
            "(PROMETHEUS_MULTIPROC_DIR) and the gauges read from the database. "
            "PILOT_METRICS_TOKEN protects it as it protects the web's /metrics (without one "
            "it is closed unless DEBUG or PILOT_METRICS_PUBLIC).")

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1",
                            help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=9808, help="port (default 9808)")

    def handle(self, *args, bind, port, **options):
        if not multiprocess_dir():
            self.stderr.write("PROMETHEUS_MULTIPROC_DIR is not set: only this process's own "
                              "(empty) counters and the database gauges will be served")
        try:
            server = ThreadingHTTPServer((bind, port), _Handler)
        except OSError as exc:
            raise CommandError(f"cannot listen on {bind}:{port}: {exc}") from None
        server.daemon_threads = True

        def stop(signum, frame):
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"serving /metrics on {bind}:{server.server_address[1]}")
        self.stdout.flush()
        server.serve_forever(poll_interval=0.2)
        server.server_close()
