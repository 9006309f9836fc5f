"""A resolver that takes its time, for the attempts' deadline (docs/webhooks.md,
"Slow and failing receivers"): names under a test suffix resolve to 127.0.0.1,
but only after the given seconds — what a slow or unreachable DNS server does
to `getaddrinfo`, which no unprivileged test can make the machine's own
resolver do. Every other name resolves as usual.

In this process: `with slow_dns("slow.test", 3.0): ...`. In the processes a
test starts: PILOT_TEST_SLOW_DNS="slow.test=3" (tests/testapp installs it).
Each delayed lookup is counted in `LOOKUPS` (host, seconds), so a test can
assert the fault landed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

_real_getaddrinfo = socket.getaddrinfo
_delays: dict[str, float] = {}
_lock = threading.Lock()
LOOKUPS: list[tuple[str, float]] = []


def _getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else str(host or "")
    for suffix, seconds in list(_delays.items()):
        if name == suffix or name.endswith("." + suffix):
            with _lock:
                LOOKUPS.append((name, seconds))
            time.sleep(seconds)
            return _real_getaddrinfo("127.0.0.1", *args, **kwargs)
    return _real_getaddrinfo(host, *args, **kwargs)


def install(spec: str) -> None:
    """`suffix=seconds[,suffix=seconds…]`: names under each suffix take that long."""
    for part in filter(None, (p.strip() for p in spec.split(","))):
        suffix, seconds = part.split("=", 1)
        _delays[suffix.strip().lower()] = float(seconds)
    socket.getaddrinfo = _getaddrinfo


@contextlib.contextmanager
def slow_dns(suffix: str, seconds: float):
    install(f"{suffix}={seconds}")
    try:
        yield LOOKUPS
    finally:
        _delays.pop(suffix, None)
        if not _delays:
            socket.getaddrinfo = _real_getaddrinfo
