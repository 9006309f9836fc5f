"""A TCP proxy that loses answers: for its first `drop` connections it forwards
the request, reads the server's whole answer (so the server has committed and
replied), then closes the client's connection without sending a byte of it —
what a load balancer timing out, or a network cut at the wrong moment, does.
Later connections are forwarded both ways untouched. Loopback only."""

from __future__ import annotations

import socket
import threading


class DroppingProxy:
    def __init__(self, upstream_port: int, *, drop: int = 1):
        self.upstream_port = upstream_port
        self.drop = drop
        self.dropped: list[bytes] = []  # the answers the client never saw
        self.connections = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        self._server.close()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> DroppingProxy:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                lose_answer = self.connections <= self.drop
            thread = threading.Thread(target=self._serve, args=(client, lose_answer),
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, client: socket.socket, lose_answer: bool) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
        client.settimeout(30)
        try:
            forward = threading.Thread(target=_pipe, args=(client, upstream), daemon=True)
            forward.start()
            if lose_answer:
                # Read the answer to its end: gunicorn's sync workers close the
                # connection after each response.
                answer = b""
                while chunk := upstream.recv(65536):
                    answer += chunk
                self.dropped.append(answer)
            else:
                _pipe(upstream, client)
        finally:
            for sock in (client, upstream):
                # shutdown first: a plain close() would wait for the other
                # thread's recv() on the socket before the peer sees the end.
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass
