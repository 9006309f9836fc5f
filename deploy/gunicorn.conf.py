"""gunicorn settings for PILOT's web processes:

    gunicorn -c deploy/gunicorn.conf.py pilot.wsgi

Environment: PORT (default 8000), PILOT_BIND_HOST (default 127.0.0.1: only a
proxy on this machine reaches it; set a private interface, or 0.0.0.0, to be
reached from elsewhere — the container image does),
WEB_CONCURRENCY (worker processes, default 2 x cores + 1), PILOT_WEB_THREADS
(threads per worker process, default 1; more than 1 makes them gthread workers),
PILOT_WEB_TIMEOUT (seconds a request may take, default 30), PILOT_STOP_SECONDS
(how long a stop lets requests in flight finish, default 8; below systemd's
TimeoutStopSec=10), PILOT_WEB_ACCESS_LOG (`-` for an access log on stdout, as
`make run` does; unset: none), PROMETHEUS_MULTIPROC_DIR (shared with the
machine's worker and dispatcher processes; see docs/operations.md "Metrics").
"""

import multiprocessing
import os

BIND_HOST = os.environ.get("PILOT_BIND_HOST") or "127.0.0.1"
bind = f"{BIND_HOST}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() * 2 + 1))
threads = int(os.environ.get("PILOT_WEB_THREADS", "1"))
timeout = int(os.environ.get("PILOT_WEB_TIMEOUT", "30"))
# SIGTERM: finish the requests in flight for at most this long, then exit; the
# whole stop stays within the bound of docs/operations.md "Stopping".
graceful_timeout = int(float(os.environ.get("PILOT_STOP_SECONDS", "8")))
# Heartbeat files on tmpfs: a slow disk must not make the arbiter kill workers.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# Request logs belong to the TLS proxy in front; the app logs its own events as JSON.
# A local run (no proxy) asks for them on stdout.
accesslog = os.environ.get("PILOT_WEB_ACCESS_LOG") or None
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
errorlog = "-"
# Trust X-Forwarded-* only from the proxies Django is told about (PILOT_TRUSTED_PROXIES);
# Django itself reads them, gunicorn needs not.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server):
    """Trusted proxies with gunicorn reachable from anywhere: any client can forge
    X-Forwarded-For past the proxy (docs/security.md, PILOT_TRUSTED_PROXIES)."""
    proxies = os.environ.get("PILOT_TRUSTED_PROXIES", "0").strip() or "0"
    if proxies != "0" and BIND_HOST in ("0.0.0.0", "::", "[::]"):
        server.log.warning(
            "PILOT_TRUSTED_PROXIES=%s while gunicorn listens on every interface (%s): unless "
            "a firewall lets only the proxy reach this port, clients can forge their address "
            "(docs/security.md). Bind the proxy's interface with PILOT_BIND_HOST.",
            proxies, BIND_HOST)


def child_exit(server, worker):
    """A dead worker's live gauges must not be summed any more (counters and
    histograms stay: what it counted did happen)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
