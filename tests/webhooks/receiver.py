"""A real webhook receiver for tests: an HTTP server on a free loopback port,
in a thread of the test process, that records every request and answers as
the test scripts it (status and delay per attempt of each webhook-id). And a
tarpit: a port that accepts every connection and never answers."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass
class Received:
    n: int                # the attempt of this webhook-id, 1-based, as the receiver saw it
    message_id: str
    headers: dict         # lower-cased names
    body: bytes
    status: int           # what the receiver answered (or meant to: see `finished`)
    started: float
    finished: float | None = None


class Receiver:
    """`script(message_id, n) -> (status, delay seconds)` decides each answer
    (default: 204 at once). `url` is where to point callback_url."""

    def __init__(self, script=None, path: str = "/hooks"):
        self.script = script or (lambda message_id, n: (204, 0.0))
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.counts: dict = defaultdict(int)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                message_id = headers.get("webhook-id", "")
                with receiver.lock:
                    receiver.counts[message_id] += 1
                    n = receiver.counts[message_id]
                    status, delay = receiver.script(message_id, n)
                    record = Received(n, message_id, headers, body, status, time.monotonic())
                    receiver.received.append(record)
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender is gone (killed, or timed out)
                record.finished = time.monotonic()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, message_id: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.message_id == message_id]

    def ids(self) -> list[str]:
        with self.lock:
            return sorted({r.message_id for r in self.received})


class Tarpit:
    """A loopback port that accepts every TCP connection and then never reads
    nor answers — the slowest receiver there is. `accepted` counts the
    connections (the fault landed)."""

    def __init__(self, path: str = "/hooks"):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            with self.lock:
                self.accepted += 1
                self.held.append(conn)

    def __enter__(self) -> Tarpit:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        with self.lock:
            for conn in self.held:
                conn.close()
        self.listener.close()
