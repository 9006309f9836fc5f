"""One delivery attempt over real sockets: a 2xx is success, anything else is
a failure with its reason; no redirect is followed; the whole attempt — the
DNS lookup included — is bounded by one deadline, even against a receiver
that trickles bytes or a resolver that takes its time; a non-public target is
never connected to."""

import socket
import threading
import time

import pytest
from django.test import override_settings

from tests.support.slow_dns import slow_dns
from tests.webhooks.receiver import Receiver, Tarpit
from workflows.webhooks.http import USER_AGENT, post_once

BODY = b'{"id":"t"}'


@pytest.fixture(autouse=True)
def _loopback_allowed(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True


def test_a_2xx_is_success_and_the_request_is_what_was_asked():
    with Receiver() as receiver:
        answer = post_once(receiver.url + "?q=1", BODY, {"webhook-id": "t:succeeded:0"},
                           timeout=5)
    assert (answer.ok, answer.status, answer.error) == (True, 204, "")
    [got] = receiver.received
    assert got.body == BODY
    host = receiver.url.split("/")[2]
    assert (got.headers["host"], got.headers["content-type"], got.headers["user-agent"],
            got.headers["webhook-id"]) == (host, "application/json", USER_AGENT, "t:succeeded:0")


def test_an_error_status_is_a_failure_with_the_start_of_the_answer():
    with Receiver(lambda mid, n: (503, 0)) as receiver:
        answer = post_once(receiver.url, BODY, {}, timeout=5)
    assert (answer.ok, answer.status) == (False, 503)
    assert answer.error == "HTTP 503: ok"


def _redirecting_server(location: str):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(307)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_is_not_followed():
    with Receiver() as target:
        server = _redirecting_server(target.url)
        try:
            answer = post_once(f"http://127.0.0.1:{server.server_address[1]}/h", BODY, {},
                               timeout=5)
        finally:
            server.shutdown()
            server.server_close()
    assert (answer.ok, answer.status) == (False, 307)
    assert "not followed" in answer.error and target.url in answer.error
    assert target.received == []


def test_a_slow_receiver_costs_the_timeout_not_more():
    with Receiver(lambda mid, n: (200, 3.0)) as receiver:
        started = time.monotonic()
        answer = post_once(receiver.url, BODY, {}, timeout=0.5)
        took = time.monotonic() - started
    assert (answer.ok, answer.status) == (False, None)
    assert answer.error == "no answer within 0.5 s"
    assert took < 1.5


def test_a_receiver_trickling_its_answer_cannot_hold_the_sender():
    """One byte every 0.1 s never trips a per-read timeout; the deadline still holds."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        conn.recv(65536)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                if stop.is_set():
                    break
                conn.send(bytes([byte]))
                time.sleep(0.1)
        except OSError:
            pass
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    answer = post_once(f"http://127.0.0.1:{listener.getsockname()[1]}/", BODY, {}, timeout=1)
    took = time.monotonic() - started
    stop.set()
    listener.close()
    assert answer.status is None and "within 1 s" in answer.error
    assert took < 2.0


def test_nothing_listening_is_a_failure_without_a_status():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = post_once(f"http://127.0.0.1:{port}/", BODY, {}, timeout=2)
    assert answer.status is None and "ConnectionRefusedError" in answer.error


def test_a_non_public_target_is_refused_at_send_time_without_a_connection():
    with Receiver() as receiver, override_settings(PILOT_WEBHOOK_ALLOW_PRIVATE=False):
        answer = post_once(receiver.url, BODY, {}, timeout=2)
    assert answer.status is None
    assert answer.error.startswith("refused: callback URL host 127.0.0.1 resolves to 127.0.0.1")
    assert receiver.received == []


def test_a_slow_dns_lookup_is_inside_the_attempts_deadline_not_before_it():
    """A 3 s lookup under a 0.5 s timeout: the attempt ends at 0.5 s, saying
    why (it took the whole 3 s before the lookup was inside the deadline)."""
    with Receiver() as receiver, slow_dns("slow.test", 3.0) as lookups:
        port = receiver.url.split(":")[2].split("/")[0]
        started = time.monotonic()
        answer = post_once(f"http://hooks.slow.test:{port}/hooks", BODY, {}, timeout=0.5)
        took = time.monotonic() - started
    assert lookups[-1] == ("hooks.slow.test", 3.0)  # the fault landed
    assert (answer.ok, answer.status) == (False, None)
    assert answer.error == ("no answer within 0.5 s (the DNS lookup of hooks.slow.test did "
                            "not finish)")
    assert took < 1.0 and answer.ms < 1000
    assert receiver.received == []


def test_a_slow_lookup_and_a_slow_receiver_share_one_deadline():
    """0.4 s of DNS, then a receiver that never answers: the attempt still ends
    at its 1 s deadline, not 0.4 s + 1 s."""
    with Tarpit() as tarpit, slow_dns("slow.test", 0.4):
        started = time.monotonic()
        answer = post_once(f"http://tarpit.slow.test:{tarpit.port}/hooks", BODY, {},
                           timeout=1.0)
        took = time.monotonic() - started
    assert tarpit.accepted == 1  # it got as far as the receiver
    assert answer.status is None and answer.error == "no answer within 1 s"
    assert 0.9 < took < 1.3


def test_a_deadline_set_by_the_caller_is_the_one_kept():
    """The sender's attempt started at its claim: what the claim took is no
    longer the receiver's to use."""
    with Tarpit() as tarpit:
        started = time.monotonic()
        answer = post_once(tarpit.url, BODY, {}, timeout=5.0, deadline=started + 0.3)
        took = time.monotonic() - started
    assert answer.status is None and "no answer within 5 s" in answer.error
    assert took < 0.8
