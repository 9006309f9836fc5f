"""A small HTTP client for fault scenarios: real TCP, per-request timeouts that
abandon the connection (as an impatient upstream does), and a record of what
it saw."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit


class Response:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


def request(base_url: str, method: str, path: str, *, token: str | None = None,
            body=None, headers: dict | None = None, timeout: float = 10.0) -> Response:
    """One request on a fresh connection. Raises OSError (timeout, reset) when
    no complete response arrived in time; the connection is closed either way."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    if token:
        all_headers["Authorization"] = f"Token {token}"
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers=all_headers)
        raw = conn.getresponse()
        return Response(raw.status, dict(raw.getheaders()), raw.read())
    except (TimeoutError, http.client.HTTPException) as exc:
        raise OSError(str(exc) or type(exc).__name__) from exc
    finally:
        conn.close()
