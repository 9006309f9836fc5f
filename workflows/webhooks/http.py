"""One delivery attempt: a POST to a checked address, within a total deadline,
following no redirect (docs/webhooks.md, "Delivery").

The host is resolved and every address checked (targets.target_addresses)
right before connecting, and the socket is opened to exactly such an address
— the request still names the host (Host header, TLS server name and
certificate check), so nothing can re-point the name between the check and
the connection. The whole attempt (connect, TLS, send, status line and
headers, the first bytes of the body) is bounded by `timeout`: a watchdog
shuts the socket down at the deadline, so a receiver trickling bytes cannot
hold a worker longer. A 3xx is an answer like any other non-2xx: not followed.
"""

from __future__ import annotations

import dataclasses
import http.client
import socket
import ssl
import threading
import time

from workflows.webhooks.targets import TargetRefused, target_addresses, target_parse

USER_AGENT = "PILOT-Webhooks/1"
# Read this much of an answer's body (for the error shown to the operator); the
# rest is not waited for.
ANSWER_BYTES = 4096
ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int | None   # the HTTP status, None when there was no answer
    error: str           # why it is not a success; "" for a 2xx
    ms: float            # how long the attempt took

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


_tls = None


def _tls_context() -> ssl.SSLContext:
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()
    return _tls


def _connect(target, addresses: list[str], deadline: float) -> socket.socket:
    last: OSError | None = None
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            return socket.create_connection((address, target.port), timeout=remaining)
        except OSError as exc:
            last = exc
    raise last or TimeoutError("no time left to connect")


def post_once(url: str, body: bytes, headers: dict, *,  # noqa: C901 - one request's outcomes
              timeout: float) -> Answer:
    """POST `body` to `url` once. Never raises: every failure is an Answer
    with `status` None (no answer) or a non-2xx status, and the reason."""
    started = time.monotonic()
    deadline = started + timeout

    def answer(status, error=""):
        return Answer(status, error[:ERROR_CHARS], round((time.monotonic() - started) * 1000, 1))

    try:
        target = target_parse(url)
        addresses = target_addresses(target)
    except TargetRefused as exc:
        return answer(None, f"refused: callback URL {exc}")
    sock = None
    watchdog = None
    try:
        sock = _connect(target, addresses, deadline)
        if target.scheme == "https":
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock = _tls_context().wrap_socket(sock, server_hostname=target.host)
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, (sock,))
        watchdog.daemon = True
        watchdog.start()
        conn = http.client.HTTPConnection(target.host, target.port)
        conn.sock = sock  # already connected, to the checked address
        conn.putrequest("POST", target.path, skip_host=True, skip_accept_encoding=True)
        for name, value in {"Host": target.host_header, "Content-Type": "application/json",
                            "User-Agent": USER_AGENT,
                            "Content-Length": str(len(body)), **headers}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        head = response.read(ANSWER_BYTES)
        status = response.status
        if 200 <= status < 300:
            return answer(status)
        if 300 <= status < 400:
            return answer(status, f"HTTP {status}: redirect to "
                                  f"{response.getheader('Location', '?')} not followed")
        return answer(status, f"HTTP {status}: {head.decode('utf-8', 'replace').strip()}")
    except TimeoutError:
        return answer(None, f"no answer within {timeout:g} s")
    except ssl.SSLError as exc:
        return answer(None, f"TLS: {exc}")
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline:
            return answer(None, f"no answer within {timeout:g} s")
        return answer(None, f"{type(exc).__name__}: {exc}")
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if sock is not None:
            sock.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
