"""Slow and failing receivers: the caps on webhook attempts in flight, and a
circuit breaker per endpoint (docs/webhooks.md, "Slow and failing receivers").

Deliveries run on the same django-q2 workers as task runs, and one attempt
holds its worker for up to PILOT_WEBHOOK_TIMEOUT_SECONDS. So:

- **Caps.** At most PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT attempts of one
  client (the delivery's owner) and PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT
  to one endpoint (`host:port`) are in flight at once (0: no cap). In flight
  means pending with a live claim (`claimed_until` > now). A claim decides
  exactly (`slot_take`): under the client's lock (PostgreSQL: a
  transaction-scoped advisory lock; SQLite: the one write lock the claim's
  transaction already holds), then the endpoint's row lock, it counts the
  attempts in flight with a statement of its own — on PostgreSQL that
  statement sees every claim committed before the lock was granted, so two
  claims racing for the last slot are decided one after the other. A claim
  over a cap sends nothing and leaves the delivery owed a message
  (`enqueued_at` NULL); the sender that frees a slot hands it on, else the
  dispatcher does, one message per free slot (deliveries.py).
- **Breaker.** PILOT_WEBHOOK_BREAKER_FAILURES failed attempts in a row to one
  endpoint (any delivery, any client) pause it for
  PILOT_WEBHOOK_BREAKER_SECONDS × 2^(trips − 1), at most
  PILOT_WEBHOOK_MAX_DELAY_SECONDS. While it is paused its deliveries are not
  attempted (their `give_up_at` runs on; an operator's re-send still goes).
  After the pause one attempt at a time probes it (its cap is 1 while its
  failures are at the threshold): a failure pauses it again for twice as long,
  a success closes it (`breaker_record`). The state is a row per endpoint
  (`WebhookEndpoint`), so every worker and dispatcher sees the same.

Lock order: task → delivery → client → endpoint row (a claim); delivery →
endpoint row (a record). Neither ever waits for a lock the other takes first.

`Slots` is the dispatcher's snapshot of the slots, used to choose which owed
deliveries get a message; it decides nothing (the claim does). Every time here
is the database's (the caller's `now`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from workflows.conf import pilot_settings
from workflows.database import serialize
from workflows.engine.store import store
from workflows.models import DeliveryState, WebhookDelivery, WebhookEndpoint
from workflows.webhooks.targets import endpoint_of

# The advisory lock a capped claim takes per client (pg_advisory_xact_lock(int,
# int)): the kind, then hashtext of the owner's id. The task caps use PIL1/PIL2.
LOCK_WEBHOOK_CLIENT = 0x50494C33  # "PIL3"

# Why a claim did not take a slot (delivery_send's outcome).
WAITING = "waiting"  # over a cap: owed a message when a slot frees
PAUSED = "paused"    # its endpoint's breaker is open


@dataclasses.dataclass(frozen=True)
class Limits:
    client: int     # attempts of one client in flight (0: no cap)
    endpoint: int   # attempts to one endpoint in flight (0: no cap)
    failures: int   # failed attempts in a row that pause an endpoint (0: no breaker)

    @classmethod
    def now(cls) -> Limits:
        return cls(int(pilot_settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT),
                   int(pilot_settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT),
                   int(pilot_settings.PILOT_WEBHOOK_BREAKER_FAILURES))

    def endpoint_cap(self, failures: int) -> int:
        """The endpoint's cap: 1 while it is being probed after a pause."""
        if self.failures and failures >= self.failures:
            return 1
        return self.endpoint


def in_flight(now: datetime) -> QuerySet[WebhookDelivery]:
    """The attempts in flight at `now` (pilot_delivery_claimed_idx)."""
    return WebhookDelivery.objects.filter(claimed_until__isnull=False, claimed_until__gt=now,
                                          state=DeliveryState.PENDING)


# --- the claim's exact decision -----------------------------------------------------------

def slot_take(delivery: WebhookDelivery, endpoint: str, now: datetime,
              limits: Limits) -> str:
    """Inside the claim's transaction, with `delivery` locked: "" if its
    attempt may go now, else why not — WAITING (its client or its endpoint has
    every slot in flight) or PAUSED (its endpoint's breaker is open and this is
    not an operator's re-send). Takes the client's lock, then the endpoint's row
    lock (creating the row), each only when there is something to decide."""
    if limits.client:
        _lock_client(delivery.owner_id)
        mine = in_flight(now).filter(owner_id=delivery.owner_id).exclude(pk=delivery.pk)
        if mine.count() >= limits.client:
            return WAITING
    if not endpoint or not (limits.endpoint or limits.failures):
        return ""
    row = _endpoint_locked(endpoint)
    if row.paused_until is not None and row.paused_until > now and not delivery.resend_owed:
        return PAUSED
    cap = limits.endpoint_cap(row.failures)
    if cap and in_flight(now).filter(endpoint=endpoint).exclude(pk=delivery.pk).count() >= cap:
        return WAITING
    return ""


def _lock_client(owner_id: Any) -> None:
    serialize(LOCK_WEBHOOK_CLIENT, str(owner_id))


def _endpoint_locked(key: str) -> WebhookEndpoint:
    return store().deliveries.endpoint_locked_in_tx(key)


# --- the breaker ---------------------------------------------------------------------------

def breaker_record(endpoint: str, *, ok: bool, now: datetime, error: str = "",
                   limits: Limits | None = None) -> datetime | None:
    """Count one attempt's outcome against its endpoint, in the caller's
    transaction (after the delivery's own record: the lock order). A success
    closes the breaker — one UPDATE, and none at all when it was closed
    already. A failure counts one more in a row (the row locked) and, at the
    threshold, pauses the endpoint unless it is paused already; returns the
    end of a pause it began (None otherwise)."""
    limits = limits or Limits.now()
    if not endpoint or not limits.failures:
        return None
    if ok:
        store().deliveries.endpoint_close(endpoint)
        return None
    row = _endpoint_locked(endpoint)
    row.failures += 1
    row.last_error, row.last_failure_at = error[:500], now
    opened = None
    if row.failures >= limits.failures and (row.paused_until is None or row.paused_until <= now):
        row.trips += 1
        opened = row.paused_until = now + pause_after(row.trips)
    store().deliveries.endpoint_save_in_tx(row)
    return opened


def pause_after(trips: int) -> timedelta:
    """How long the `trips`-th pause in a row lasts: doubling, capped."""
    first = float(pilot_settings.PILOT_WEBHOOK_BREAKER_SECONDS)
    longest = float(pilot_settings.PILOT_WEBHOOK_MAX_DELAY_SECONDS)
    return timedelta(seconds=min(longest, first * 2.0 ** min(trips - 1, 60)))


# --- the dispatcher's snapshot -------------------------------------------------------------

class Slots:
    """Which owed deliveries may get a message now: the attempts in flight
    and the messages on their way (sent since `stale`: each will try for a
    slot first) by client and endpoint, the endpoints paused, and those being
    probed (cap 1). A snapshot for choosing; `take` reserves as it goes."""

    def __init__(self, now: datetime, stale: datetime, limits: Limits | None = None):
        self.limits = limits or Limits.now()
        self.by_owner: Counter[Any] = Counter()
        self.by_endpoint: Counter[str] = Counter()
        self.paused: set[str] = set()
        self.failures: dict[str, int] = {}
        if not (self.limits.client or self.limits.endpoint or self.limits.failures):
            return
        busy = (WebhookDelivery.objects.filter(state=DeliveryState.PENDING)
                .filter(Q(claimed_until__isnull=False, claimed_until__gt=now)
                        | Q(enqueued_at__isnull=False, enqueued_at__gte=stale))
                .values_list("owner_id", "endpoint", "url").order_by())
        for owner_id, endpoint, url in busy:
            self.by_owner[owner_id] += 1
            self.by_endpoint[endpoint or endpoint_of(url)] += 1
        if self.limits.failures:
            for key, failures, paused_until in (WebhookEndpoint.objects.filter(failures__gt=0)
                                                .values_list("key", "failures", "paused_until")):
                self.failures[key] = failures
                if paused_until is not None and paused_until > now:
                    self.paused.add(key)

    def _endpoint_cap(self, endpoint: str) -> int:
        return self.limits.endpoint_cap(self.failures.get(endpoint, 0))

    def blocked_q(self) -> Q:
        """Matches the deliveries no message should go to now: those of a
        client or endpoint with every slot taken, and of a paused endpoint
        (but an operator's re-send). Matches nothing when nothing is."""
        blocked = Q(pk__in=[])
        if self.limits.client:
            full = [o for o, n in self.by_owner.items() if n >= self.limits.client]
            if full:
                blocked |= Q(owner_id__in=full)
        capped = [e for e, n in self.by_endpoint.items()
                  if e and self._endpoint_cap(e) and n >= self._endpoint_cap(e)]
        if capped:
            blocked |= Q(endpoint__in=capped)
        if self.paused:
            blocked |= Q(endpoint__in=sorted(self.paused), resend_owed=False)
        return blocked

    def take(self, owner_id: Any, endpoint: str, *, resend: bool = False) -> bool:
        """Reserve a slot for one delivery if the snapshot has one free."""
        if self.limits.client and self.by_owner[owner_id] >= self.limits.client:
            return False
        if endpoint:
            if endpoint in self.paused and not resend:
                return False
            cap = self._endpoint_cap(endpoint)
            if cap and self.by_endpoint[endpoint] >= cap:
                return False
        self.by_owner[owner_id] += 1
        self.by_endpoint[endpoint] += 1
        return True


__all__ = ["PAUSED", "WAITING", "Limits", "Slots", "breaker_record", "in_flight",
           "pause_after", "slot_take"]
