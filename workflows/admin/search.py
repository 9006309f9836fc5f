"""The task list's search box and time ranges (docs/console.md, "Finding tasks").

One term per search, one of:

- a task id, or its first 8+ hex characters: the id (a primary-key range);
- `payload.<key>[.<key>…]=<value>`: tasks whose payload has that value at
  that key path. The value is JSON when it parses as a JSON scalar (`42`,
  `true`, `null`, `"42"`), else the text as typed; a number, boolean or null
  also matches the same text stored as a string (`order_id=42` finds `"42"` too).
  On PostgreSQL a containment (`payload @> '{"order_id": 42}'`) served by
  pilot_task_payload_gin_idx (migration 0030); elsewhere a JSON key lookup;
- `error:<text>`: tasks whose last error contains the text (any case). No
  index serves a substring: newest first, the page stops after 50 matches, so
  it is cheap when matches are common and scans when they are rare — narrow
  it with a state, workflow or time range;
- anything else: the start of an idempotency key (case-sensitive, like keys).

Time ranges: `created_at__gte/__lt` and `finished_at__gte/__lt` (list_params
checks them), from the list's small form or its presets. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid
from datetime import datetime, timedelta

from django.db.models import Q
from django.db.models.fields.json import KeyTransform
from django.http import QueryDict

from workflows.database import is_postgresql

PAYLOAD = re.compile(r"payload((?:\.[^.=\s]+)+)=(.*)", re.S)
ERROR_PREFIX = "error:"
MAX_DEPTH = 8
RANGES = ("created_at__gte", "created_at__lt", "finished_at__gte", "finished_at__lt")
PRESETS = (("last 15 minutes", timedelta(minutes=15)), ("last hour", timedelta(hours=1)),
           ("last 24 hours", timedelta(hours=24)))
NOT_FILTERS = {"before", "p", "all"}  # positions in the list, not the view


@dataclasses.dataclass(frozen=True)
class PayloadTerm:
    path: tuple[str, ...]
    values: tuple  # the JSON value, then its text form when that differs


def payload_term(term: str) -> PayloadTerm | str | None:
    """The payload search `term` asks for; None if it is not one; a problem
    (text) if it is one that cannot be searched."""
    match = PAYLOAD.fullmatch(term)
    if match is None:
        return "needs a key path and a value: payload.<key>=<value>" \
            if term.startswith("payload.") else None
    path = tuple(match.group(1)[1:].split("."))
    if len(path) > MAX_DEPTH:
        return f"has a key path deeper than {MAX_DEPTH} levels"
    raw = match.group(2).strip()
    value = _json_scalar(raw)
    if isinstance(value, dict | list):
        return "compares one value (a number, text, true, false or null), not an object or list"
    values: tuple = (value,) if isinstance(value, str) else (value, raw)
    return PayloadTerm(path, values)


def _json_scalar(raw: str):
    """`raw` as JSON when it is JSON a database can compare (finite numbers,
    integers within 64 bits), else `raw` itself as text."""
    def refuse(constant):
        raise ValueError(constant)  # NaN, Infinity: not JSON to PostgreSQL

    try:
        value = json.loads(raw, parse_constant=refuse)
    except ValueError:
        return raw
    if isinstance(value, float) and not math.isfinite(value):  # 1e999
        return raw
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        return raw
    return value


def search_problem(term: str) -> str:
    """Why `term` cannot be searched ("" when it can): list_params refuses it so."""
    if len(term) > 255:
        return "is longer than 255 characters"
    parsed = payload_term(term.strip())
    if isinstance(parsed, str):
        return parsed
    if term.strip().startswith(ERROR_PREFIX) and not term.strip()[len(ERROR_PREFIX):].strip():
        return "needs the text to look for after error:"
    return ""


def _nested(path: tuple[str, ...], value) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def _payload_filter(queryset, term: PayloadTerm):
    if is_postgresql():
        match = Q()
        for value in term.values:
            match |= Q(payload__contains=_nested(term.path, value))
        return queryset.filter(match)
    expression: str | KeyTransform = "payload"
    for key in term.path:
        expression = KeyTransform(key, expression)
    match = Q()
    for value in term.values:
        match |= Q(pilot_key=value)
    return queryset.alias(pilot_key=expression).filter(match)


def search_tasks(queryset, term: str):
    """`queryset` narrowed to the tasks `term` finds (see the module docstring)."""
    term = term.strip()
    if not term:
        return queryset
    try:
        return queryset.filter(Q(pk=uuid.UUID(term)) | Q(idempotency_key=term))
    except ValueError:
        pass
    parsed = payload_term(term)
    if isinstance(parsed, PayloadTerm):
        return _payload_filter(queryset, parsed)
    if isinstance(parsed, str):
        return queryset.none()  # refused by list_params before it gets here
    if term.startswith(ERROR_PREFIX):
        return queryset.filter(error__icontains=term[len(ERROR_PREFIX):].strip())
    match = Q(idempotency_key__startswith=term)
    compact = term.replace("-", "").lower()
    if len(compact) >= 8 and all(c in "0123456789abcdef" for c in compact):
        match |= Q(pk__in=_uuid_prefix_range(queryset, compact))
    return queryset.filter(match)


def _uuid_prefix_range(queryset, prefix: str):
    """Ids starting with hex `prefix`, as a range on the primary key (an index
    scan on every database, where LIKE on a uuid column would not be)."""
    low = uuid.UUID(prefix.ljust(32, "0")[:32])
    high = uuid.UUID(prefix.ljust(32, "f")[:32])
    return queryset.filter(pk__gte=low, pk__lte=high).values("pk")


def blank_ranges_dropped(params: QueryDict) -> QueryDict:
    """The list's parameters without the time-range boxes left empty (the
    form sends every box; an empty one means no bound)."""
    if not any(name in params and not any(params.getlist(name)) for name in RANGES):
        return params
    kept = params.copy()
    for name in RANGES:
        if name in kept and not any(kept.getlist(name)):
            del kept[name]
    return kept


def view_query(params: QueryDict) -> str:
    """The current filter as a query string, without the list position."""
    kept = params.copy()
    for name in NOT_FILTERS:
        kept.pop(name, None)
    return kept.urlencode()


def time_range_context(params: QueryDict, now: datetime) -> dict:
    """The range form's boxes (their values, the other filters as hidden
    fields) and the preset links, relative to `now` (the database's time)."""
    others = [(name, value) for name, values in params.lists()
              if name not in RANGES and name not in NOT_FILTERS for value in values]
    presets = []
    for field in ("created_at", "finished_at"):
        for label, span in PRESETS:
            query = QueryDict(mutable=True)
            for name, value in others:
                query.appendlist(name, value)
            query[f"{field}__gte"] = (now - span).isoformat(timespec="seconds")
            presets.append({"field": field, "label": label, "query": query.urlencode()})
    boxes = [(name, name.replace("_at__gte", ", from").replace("_at__lt", ", before"),
              params.get(name, "")) for name in RANGES]
    return {"pilot_range_boxes": boxes,
            "pilot_range_hidden": others, "pilot_range_presets": presets}
