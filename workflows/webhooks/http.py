"""One delivery attempt: a POST to a checked address, within a total deadline,
following no redirect (docs/webhooks.md, "Delivery").

The host is resolved and every address checked (targets.target_addresses)
right before connecting, and the socket is opened to exactly such an address
— the request still names the host (Host header, TLS server name and
certificate check), so nothing can re-point the name between the check and
the connection. The whole attempt — the DNS lookup, connect, TLS, send,
status line and headers, the first bytes of the body — is bounded by one
deadline, `timeout` from the call: the lookup runs in a thread the attempt
waits for only until the deadline (getaddrinfo cannot be interrupted; a
lookup still running then is left to finish on its own, holding nothing but
that thread), and a watchdog shuts the socket down at the deadline, so
neither a slow resolver nor a receiver trickling bytes can hold a worker
longer. A 3xx is an answer like any other non-2xx: not followed.

With PILOT_WEBHOOK_PROXY (deployments whose egress must go through a proxy)
the socket is a `CONNECT` tunnel through it to the same checked address; TLS
and the request go through the tunnel unchanged.
"""

from __future__ import annotations

import dataclasses
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from workflows.conf import pilot_settings
from workflows.webhooks.targets import Target, TargetRefused, target_addresses, target_parse

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


class LookupTimeout(Exception):  # noqa: N818 - a timeout, named for what timed out
    """The DNS lookup did not finish before the attempt's deadline."""


def _resolve(target: Target, deadline: float) -> list[str]:
    """`target_addresses(target)` within the deadline: an IP literal at once,
    a name in a daemon thread waited for until `deadline` (LookupTimeout)."""
    if _is_literal(target.host):
        return target_addresses(target)
    box: dict = {}

    def lookup() -> None:
        try:
            box["addresses"] = target_addresses(target)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting attempt
            box["error"] = exc

    thread = threading.Thread(target=lookup, name="pilot-webhook-dns", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        raise LookupTimeout(target.host)
    if "error" in box:
        raise box["error"]
    return box["addresses"]


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _connect(target, addresses: list[str], deadline: float) -> socket.socket:
    last: OSError | None = None
    proxy = pilot_settings.PILOT_WEBHOOK_PROXY
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            if proxy:
                return _tunnel(proxy, address, target.port, deadline)
            return socket.create_connection((address, target.port), timeout=remaining)
        except OSError as exc:
            last = exc
    raise last or TimeoutError("no time left to connect")


PROXY_HEAD_BYTES = 8192


def _tunnel(proxy: str, address: str, port: int, deadline: float) -> socket.socket:
    """A socket to `address`:`port` through the egress proxy (PILOT_WEBHOOK_PROXY,
    `http://host:port`): `CONNECT` to the checked address itself, not the name,
    so the proxy cannot be pointed elsewhere by DNS either. OSError when the
    proxy refuses."""
    parts = urlsplit(proxy)
    if parts.scheme != "http" or not parts.hostname:
        raise OSError(f"PILOT_WEBHOOK_PROXY must be http://host:port, not {proxy!r}")
    sock = socket.create_connection((parts.hostname, parts.port or 80),
                                    timeout=max(0.01, deadline - time.monotonic()))
    try:
        authority = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1024)
            if not chunk or len(head) > PROXY_HEAD_BYTES:
                raise OSError("the proxy closed the connection before answering CONNECT")
            head += chunk
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        if status_line.split(" ")[1:2] != ["200"]:
            raise OSError(f"the proxy refused CONNECT {authority}: {status_line[:100]}")
    except BaseException:
        sock.close()
        raise
    return sock


def post_once(url: str, body: bytes, headers: dict, *,  # noqa: C901 - one request's outcomes
              timeout: float, deadline: float | None = None) -> Answer:
    """POST `body` to `url` once, everything done by `deadline` (monotonic;
    default: `timeout` from now — a caller whose attempt started earlier, at
    its claim, passes that start + `timeout`). Never raises: every failure is
    an Answer with `status` None (no answer) or a non-2xx status, and the
    reason."""
    started = time.monotonic()
    deadline = started + timeout if deadline is None else deadline

    def answer(status, error=""):
        return Answer(status, error[:ERROR_CHARS], round((time.monotonic() - started) * 1000, 1))

    try:
        target = target_parse(url)
        addresses = _resolve(target, deadline)
    except TargetRefused as exc:
        return answer(None, f"refused: callback URL {exc}")
    except LookupTimeout:
        return answer(None, f"no answer within {timeout:g} s (the DNS lookup of "
                            f"{target.host} did not finish)")
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
