"""`PilotClient`: trigger workflows idempotently, wait for them, steer them.

Every trigger carries an idempotency key — the caller's, or one generated here
— and the client re-sends the *same* key when it retries, so a lost answer, a
throttle or a restart of PILOT can never start a run twice: the server replays.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from pilot_client.errors import (
    IdempotencyKeyInvalid,
    PilotConnectionError,
    WaitTimeout,
    error_from_problem,
)
from pilot_client.models import BatchItemResult, Signal, SignalResult, Task, TriggerResult
from pilot_client.retry import (
    RETRY_CODES,
    RETRY_STATUSES_ALWAYS,
    RETRY_STATUSES_IF_SAFE,
    RetryPolicy,
    parse_retry_after,
)

__version__ = "0.1.0"

API = "/api/v1"  # where the standalone PILOT serves its API (a bare origin's path)
MAX_BATCH = 1000  # the server's limit per request; longer batches are split
# The request never reached the server: retrying anything is safe.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def new_key() -> str:
    """A fresh idempotency key (a random UUID)."""
    return str(uuid.uuid4())


def api_root(base_url: str) -> str:
    """The URL the API's paths (`/tasks`...) are appended to: `base_url` itself
    when it has a path (where a host mounted the API), else its origin plus
    /api/v1 (the standalone server). Query and fragment are refused: they
    would be lost."""
    parts = urlsplit(base_url)
    if parts.query or parts.fragment:
        raise ValueError("base_url must not have a query or a fragment")
    path = parts.path.rstrip("/")
    return base_url.rstrip("/") + ("" if path else API)


def _check_key(key: Any) -> str:
    # Only what cannot travel in an HTTP header is refused here; every other
    # rule is the server's (it answers 400 idempotency_key_invalid).
    if not isinstance(key, str) or not all(0x20 <= ord(c) <= 0x7E for c in key):
        raise IdempotencyKeyInvalid(
            "an idempotency key must be a string of visible ASCII characters",
            status=400, problem={"code": "idempotency_key_invalid"})
    return key


class PilotClient:
    """A client for one PILOT server and one API token (`create_api_client`).

    Retries (exponential backoff with full jitter, at least Retry-After):
    - triggers and batches on connection errors, lost answers, timeouts, 429,
      502/503/504 and 409 `conflict` — safe, because the key is re-sent;
    - reads (`get`, `list`, `wait`) on the same;
    - `cancel` and `retry` only when the request surely did nothing (connection
      refused, 429, 503); after a lost answer they raise PilotConnectionError,
      since sending them again could act on a later state of the task.

    `base_url` is where the API is: the standalone server's origin
    (`https://pilot.example.com`, whose API is at /api/v1), or, for PILOT
    inside a host project, the URL the host mounted `workflows.api.urls` at
    (`https://shop.example.com/pilot/api`): a URL with a path is taken as the
    API root, `tasks` and the rest hang off it.

    Errors are typed per problem `code` (pilot_client.errors). Usable as a
    context manager; `close()` releases the connection pool.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0,
                 retry: RetryPolicy | None = None, http_client: httpx.Client | None = None,
                 user_agent: str | None = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http(s) URL, e.g. https://pilot.example.com")
        if not token:
            raise ValueError("token is required (create one with manage.py create_api_client)")
        self.base_url = base_url.rstrip("/")
        self.api_url = api_root(base_url)
        self.retry_policy = retry or RetryPolicy()
        headers = {"Authorization": f"Token {token}", "Accept": "application/json",
                   "User-Agent": user_agent or f"pilot-client/{__version__}"}
        self._http = http_client or httpx.Client(timeout=timeout)
        self._headers = headers
        self._sleep = time.sleep

    # --- triggers --------------------------------------------------------------------------

    def trigger(self, workflow: str, payload: Any = None,
                key: str | None = None, *, derive_key: bool = False,
                callback_url: str | None = None, run_after: datetime | str | None = None,
                priority: int | None = None) -> TriggerResult:
        """Start `workflow` with `payload` once for `key` (`POST <api>/tasks`).

        Without `key` a new one is generated (read it back from `.key`); with
        `derive_key=True` none is sent and the server derives it from the
        workflow's key fields. Either way every retry re-sends the same request,
        so the run starts at most once. Raises a PilotAPIError subclass when
        refused (e.g. UnknownWorkflow, ValidationError, IdempotencyKeyReused,
        TaskCancelled) and PilotConnectionError when the server could not be
        reached within the retries — calling again with `.key` is then safe.
        `callback_url`: where PILOT POSTs the task when it ends (a signed
        webhook: `verify_webhook`); without it, the client's default endpoint.
        `run_after`: not before this time (an aware datetime or ISO 8601 text
        with an offset); `priority`: -100..100, the highest claimed first."""
        headers = {}
        if not derive_key:
            key = _check_key(new_key() if key is None else key)
            headers["Idempotency-Key"] = key
        elif key is not None:
            raise ValueError("pass either key or derive_key=True, not both")
        # Sent as given: the server validates it (ValidationError), not this client.
        body = {"workflow": workflow, "payload": {} if payload is None else payload}
        if callback_url is not None:
            body["callback_url"] = callback_url
        _start_options(body, run_after, priority)
        response, attempts = self._request("POST", "/tasks", json=body, headers=headers,
                                           safe_to_resend=True, key=key)
        task = Task.from_json(response.json())
        replayed = response.headers.get("Idempotent-Replayed", "").strip().lower() == "true"
        return TriggerResult(task=task, replayed=replayed, status=response.status_code,
                             key=key if key is not None else task.idempotency_key,
                             attempts=attempts)

    def batch(self, items: Iterable[Mapping[str, Any]]) -> list[BatchItemResult]:
        """Trigger many runs (`POST /api/v1/tasks/batch`), one result per item in
        input order. Each item is a mapping with `workflow`, `payload` and
        optionally `key` (or `idempotency_key`), `callback_url`, `run_after` and
        `priority`; items without a key get a
        generated key, kept across retries. A refused item does not raise: its
        result carries the typed error. More than 1000 items go in several
        requests."""
        prepared = []
        for item in items:
            key = item.get("key", item.get("idempotency_key"))
            prepared.append({"idempotency_key": _check_key(new_key() if key is None else key),
                             "workflow": item["workflow"],
                             "payload": item.get("payload", {})})
            if item.get("callback_url") is not None:
                prepared[-1]["callback_url"] = item["callback_url"]
            _start_options(prepared[-1], item.get("run_after"), item.get("priority"))
        results: list[BatchItemResult] = []
        for start in range(0, len(prepared), MAX_BATCH):
            chunk = prepared[start:start + MAX_BATCH]
            response, _ = self._request("POST", "/tasks/batch", json={"tasks": chunk},
                                        safe_to_resend=True)
            for sent, result in zip(chunk, response.json()["results"], strict=True):
                results.append(_batch_item(sent["idempotency_key"], result))
        return results

    # --- reads -----------------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """One task with its steps; NotFound for an unknown (or another client's) task."""
        response, _ = self._request("GET", f"/tasks/{task_id}", safe_to_resend=True)
        return Task.from_json(response.json())

    def list(self, *, state: str | Iterable[str] | None = None, workflow: str | None = None,
             idempotency_key: str | None = None, created_after: str | None = None,
             created_before: str | None = None, parent: str | None = None,
             page_size: int | None = None) -> Iterator[Task]:
        """The client's tasks, newest first, following the cursor pages lazily.
        `state` may be one state or several; times are ISO 8601 strings;
        `parent`: only that task's children."""
        params: dict[str, str] = {}
        if state is not None:
            params["state"] = state if isinstance(state, str) else ",".join(state)
        for name, value in (("workflow", workflow), ("idempotency_key", idempotency_key),
                            ("created_after", created_after),
                            ("created_before", created_before), ("parent", parent),
                            ("page_size", page_size)):
            if value is not None:
                params[name] = str(value)
        while True:
            response, _ = self._request("GET", "/tasks", params=params,
                                        safe_to_resend=True)
            page = response.json()
            for item in page.get("results", []):
                yield Task.from_json(item)
            cursor = _cursor_of(page.get("next"))
            if cursor is None:
                return
            params = {**params, "cursor": cursor}

    def wait(self, task_id: str, timeout: float = 60.0, *, poll: float = 0.2,
             max_poll: float = 2.0) -> Task:
        """Poll the task until it has finished (succeeded, failed or cancelled) and
        return it — check `.succeeded`. Polls start every `poll` seconds and slow
        down to `max_poll`. Raises WaitTimeout (with the last `.task` seen) after
        `timeout` seconds; the task itself goes on."""
        deadline = time.monotonic() + timeout
        interval = poll
        while True:
            task = self.get(task_id)
            if task.finished:
                return task
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"task {task_id} is still {task.state} after {timeout:g}s",
                                  task=task)
            self._sleep(min(interval, left))
            interval = min(max_poll, interval * 1.5)

    # --- operator actions -----------------------------------------------------------------

    def cancel(self, task_id: str, reason: str | None = None) -> Task:
        """Cancel a task (`cancelling` while a step or compensations are in flight,
        else `cancelled`). InvalidTransition when it has already finished."""
        body = {"reason": reason} if reason else {}
        response, _ = self._request("POST", f"/tasks/{task_id}/cancel", json=body,
                                    safe_to_resend=False)
        return Task.from_json(response.json())

    def retry(self, task_id: str, from_start: bool = False,
              from_step: str | None = None) -> Task:
        """Run a failed or cancelled task again: from its checkpoints, from the
        first step with `from_start=True`, or from the step named `from_step`
        (it and every later one run again; ValidationError for a step its
        workflow does not have). InvalidTransition for another state."""
        body: dict = {"from_start": bool(from_start)}
        if from_step is not None:
            body["from_step"] = from_step
        response, _ = self._request("POST", f"/tasks/{task_id}/retry", json=body,
                                    safe_to_resend=False)
        return Task.from_json(response.json())

    def signal(self, task_id: str, name: str, payload: Any = None,
               key: str | None = None) -> SignalResult:
        """Send signal `name` with `payload` (default {}) to a task
        (`POST /api/v1/tasks/{id}/signals/{name}`): what its wait step waits
        for. Stored before the answer; kept if the task does not wait for it
        yet; consumed once. Without `key` a new one is generated (read it back
        from `.key`); every retry re-sends the same key, so it is sent at most
        once. Raises NotFound, ValidationError, IdempotencyKeyReused (the key
        with another payload), TaskFinished (a new signal to an ended task)."""
        key = _check_key(new_key() if key is None else key)
        response, _ = self._request(
            "POST", f"/tasks/{task_id}/signals/{name}",
            json={"payload": {} if payload is None else payload},
            headers={"Idempotency-Key": key}, safe_to_resend=True, key=key)
        replayed = response.headers.get("Idempotent-Replayed", "").strip().lower() == "true"
        return SignalResult(signal=Signal.from_json(response.json()["signal"]),
                            replayed=replayed, status=response.status_code, key=key)

    # --- plumbing --------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PilotClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _request(self, method: str, path: str, *, safe_to_resend: bool,
                 json: Any = None, params: Mapping[str, str] | None = None,
                 headers: Mapping[str, str] | None = None,
                 key: str | None = None) -> tuple[httpx.Response, int]:
        """Send one request with the retry rules of the class docstring; returns
        the successful response and the number of attempts it took."""
        policy = self.retry_policy
        url = self.api_url + path
        all_headers = {**self._headers, **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, url, json=json, params=params,
                                              headers=all_headers)
            except httpx.TransportError as exc:
                resendable = safe_to_resend or isinstance(exc, _NOT_SENT)
                if not resendable or attempt > policy.max_retries:
                    outcome = "" if isinstance(exc, _NOT_SENT) else \
                        " (the request may have been processed)"
                    raise PilotConnectionError(
                        f"{method} {url} failed after {attempt} attempt(s){outcome}: "
                        f"{type(exc).__name__}: {exc}", key=key, attempts=attempt) from exc
                self._sleep(policy.delay(attempt - 1))
                continue
            if response.status_code < 400:
                return response, attempt
            error = _error_of(response)
            retryable = (response.status_code in RETRY_STATUSES_ALWAYS
                         or (safe_to_resend and (response.status_code in RETRY_STATUSES_IF_SAFE
                                                 or error.code in RETRY_CODES)))
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if not retryable or attempt > policy.max_retries or (
                    retry_after is not None and retry_after > policy.max_retry_after):
                raise error
            self._sleep(policy.delay(attempt - 1, retry_after))


def _error_of(response: httpx.Response):
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"detail": response.text[:500]} if response.text else {}
    return error_from_problem(response.status_code, problem, response.headers)


def _batch_item(key: str, result: Mapping[str, Any]) -> BatchItemResult:
    status = int(result.get("status", 0))
    if "task" in result:
        return BatchItemResult(status=status, key=key, task=Task.from_json(result["task"]),
                               replayed=bool(result.get("replayed")))
    return BatchItemResult(status=status, key=key, error=error_from_problem(status, result))


def _cursor_of(next_url: str | None) -> str | None:
    if not next_url:
        return None
    values = parse_qs(urlsplit(next_url).query).get("cursor")
    return values[0] if values else None


def _start_options(body: dict, run_after: Any, priority: Any) -> None:
    """A trigger's `run_after` (a datetime sent as ISO 8601) and `priority`,
    when given; the server validates them."""
    if run_after is not None:
        body["run_after"] = run_after.isoformat() if isinstance(run_after, datetime) \
            else run_after
    if priority is not None:
        body["priority"] = priority
