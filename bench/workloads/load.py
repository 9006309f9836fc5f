"""HTTP load: PILOT under gunicorn, driven by wrk (Debian package `wrk`) with
bench/wrk/trigger.lua, and batch triggers from a small threaded client (a
1000-item batch takes long enough that a fixed-duration run would cut off a
large share of requests in flight). Loopback only; bounded by duration or count."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

from bench.common import OUT, ROOT, Proc

LUA = ROOT / "bench" / "wrk" / "trigger.lua"
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
GUNICORN_WORKERS = int(os.environ.get("BENCH_GUNICORN_WORKERS", "4"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """gunicorn serving PILOT (sync workers, the default), with the bench endpoints.
    `threads` > 1: deploy/gunicorn.conf.py with that many threads per worker
    process (gthread), as `make run` serves (pilot/localrun.py)."""

    def __init__(self, env: dict, name: str, workers: int = GUNICORN_WORKERS,
                 threads: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        if threads > 1:
            env = {**env, "PORT": str(self.port), "PILOT_BIND_HOST": "127.0.0.1",
                   "WEB_CONCURRENCY": str(workers), "PILOT_WEB_THREADS": str(threads)}
            args = [GUNICORN, "-c", ROOT / "deploy" / "gunicorn.conf.py", "--no-control-socket",
                    "--log-level", "warning", "pilot.wsgi"]
        else:
            args = [GUNICORN, "pilot.wsgi:application", "--workers", workers,
                    "--bind", f"127.0.0.1:{self.port}", "--timeout", "120",
                    "--graceful-timeout", "5", "--log-level", "warning"]
        self.proc = Proc(name, args, env)

    def __enter__(self) -> Server:
        self.proc.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if not self.proc.alive or time.monotonic() > deadline:
                self.proc.stop()
                raise RuntimeError(f"gunicorn did not come up; see {self.proc.log_path}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.proc.stop()

    def post_json(self, path: str, token: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())


QUANTILES = 1000  # the Lua script writes latency:percentile(0.1 .. 100.0)


@dataclasses.dataclass
class Load:
    """One or more wrk runs: counts, and the latency distribution as weighted
    points (µs, weight): each run's 1000 quantiles, each weighing 1/1000 of the
    run's requests. For one run, p50 and p99 are wrk's own percentiles."""

    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    points: list

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile_ms(self, p: float) -> float | None:
        total = sum(w for _, w in self.points)
        if not total:
            return None
        rank, seen = p / 100 * total, 0.0
        ordered = sorted(self.points)
        for us, weight in ordered:
            seen += weight
            if seen >= rank * (1 - 1e-9):
                return us / 1000
        return ordered[-1][0] / 1000

    def summary(self, per_request: int = 1) -> dict:
        return {"rps": round(self.rps, 1), "items_per_s": round(self.rps * per_request, 1),
                "p50_ms": _round(self.percentile_ms(50)), "p99_ms": _round(self.percentile_ms(99)),
                "requests": self.requests, "seconds": round(self.seconds, 2),
                "non_2xx": self.non_2xx, "socket_errors": self.socket_errors}


def _round(value):
    return None if value is None else round(value, 1)


def merge(loads: list[Load]) -> Load:
    return Load(sum(x.requests for x in loads), sum(x.seconds for x in loads),
                sum(x.non_2xx for x in loads), sum(x.socket_errors for x in loads),
                [point for load in loads for point in load.points])


def wrk(url: str, *, mode: str, token: str, prefix: str, seconds: float,
        connections: int = 16, threads: int = 2, replay_keys: int = 1,
        timeout: str = "30s") -> Load:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk (make bench does it)")
    quantiles_path = OUT / f"wrk-{prefix}.quantiles"
    env = dict(os.environ, BENCH_WRK_QUANTILES=str(quantiles_path))
    args = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
            "--timeout", timeout, "-s", str(LUA), url, "--", mode, token, prefix,
            str(replay_keys)]
    done = subprocess.run(args, env=env, capture_output=True, text=True,
                          timeout=seconds + 120, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH-WRK ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-800:]}"
                           f"{done.stderr[-800:]}")
    stats = json.loads(line[len("BENCH-WRK "):])
    values = [int(float(x)) for x in quantiles_path.read_text().split()]
    quantiles_path.unlink()
    weight = stats["requests"] / QUANTILES
    return Load(stats["requests"], stats["duration_us"] / 1e6, stats["non_2xx"],
                stats["socket_errors"], [(us, weight) for us in values])


def batch_load(server: Server, *, token: str, prefix: str, connections: int, batches: int,
               size: int) -> Load:
    """`connections` clients each POST `batches` batches of `size` new keys, one
    after another; throughput is everything sent over the time from the first
    request to the last response."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(connections)

    def client(c: int) -> None:
        barrier.wait()
        for b in range(batches):
            tasks = [{"idempotency_key": f"{prefix}-{c}-{b}-{i}", "workflow": "test.noop3",
                      "payload": {"n": 1}} for i in range(size)]
            started = time.perf_counter()
            try:
                results = server.post_json("/api/v1/tasks/batch", token,
                                           {"tasks": tasks})["results"]
                bad = [r["status"] for r in results if r["status"] != 202]
            except OSError as exc:
                bad = [str(exc)]
            with lock:
                latencies.append(time.perf_counter() - started)
                if bad:
                    failures.append(f"{len(bad)} items: {bad[0]}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(connections)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return Load(len(latencies), elapsed, len(failures), 0,
                [(round(x * 1e6), 1.0) for x in latencies])
