"""Deliveries through an egress proxy (PILOT_WEBHOOK_PROXY; issue 31, N7): a
real CONNECT proxy on loopback relays the attempt; it is asked for the address
PILOT checked, never the name, and a refusal is the attempt's error."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.support.slow_dns import slow_dns
from tests.webhooks.receiver import Receiver
from workflows.webhooks.http import post_once

BODY = b'{"id":"t"}'


class ConnectProxy:
    """A minimal HTTP CONNECT proxy: records each CONNECT line, then relays bytes
    both ways (or answers `refuse` instead)."""

    def __init__(self, refuse: str | None = None):
        self.refuse = refuse
        self.requests: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ConnectProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(1024)
            if not chunk:
                client.close()
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        self.requests.append(line)
        if self.refuse:
            client.sendall(f"HTTP/1.1 {self.refuse}\r\n\r\n".encode())
            client.close()
            return
        host, port = line.split(" ")[1].rsplit(":", 1)
        upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            source.close()  # each direction closes the socket it reads


@pytest.fixture(autouse=True)
def _loopback_allowed(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True


def test_a_delivery_goes_through_the_proxy_to_the_checked_address(settings):
    with Receiver() as receiver, ConnectProxy() as proxy, slow_dns("hooks.test", 0.0):
        settings.PILOT_WEBHOOK_PROXY = proxy.url
        port = receiver.url.split(":")[2].split("/")[0]
        answer = post_once(f"http://receiver.hooks.test:{port}/hooks", BODY,
                           {"webhook-id": "t:succeeded:0"}, timeout=5)
    assert (answer.ok, answer.status) == (True, 204), answer.error
    assert proxy.requests == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]  # the address, not the name
    [got] = receiver.received
    assert got.body == BODY and got.headers["host"] == f"receiver.hooks.test:{port}"


def test_a_proxy_that_refuses_is_the_attempts_error_and_nothing_is_sent(settings):
    with Receiver() as receiver, ConnectProxy(refuse="403 Forbidden") as proxy:
        settings.PILOT_WEBHOOK_PROXY = proxy.url
        answer = post_once(receiver.url, BODY, {}, timeout=5)
    assert answer.status is None and "the proxy refused CONNECT" in answer.error
    assert "403 Forbidden" in answer.error and receiver.received == []
