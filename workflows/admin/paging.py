"""The task list's paging at any retention (docs/design.md, "The console").

Django's admin pages with OFFSET and prints an exact COUNT(*); at 10 M
retained tasks the count alone took a second and OFFSET grows with the page
number. Here the count is exact up to `EXACT_COUNT_UP_TO` and the planner's
estimate beyond ("about 8.6 M tasks", `count_or_estimate`), and the list in
its default order (newest first) pages by keyset: `?before=<created_at>,<id>`
of the last row shown, so page 100 costs what page 1 does — an index range on
pilot_task_created_idx (or the filter's own `…_created_idx`) that stops after
one page.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import cached_property

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Q
from django.utils.dateparse import parse_datetime

from workflows.selectors import EXACT_COUNT_UP_TO, count_or_estimate

CURSOR = "before"


class EstimatedCountPaginator(Paginator):
    """A Paginator whose `count` is exact up to EXACT_COUNT_UP_TO rows and an
    estimate beyond (`exact` says which)."""

    exact = True

    @cached_property
    def count(self) -> int:
        n, self.exact = count_or_estimate(self.object_list, exact_up_to=EXACT_COUNT_UP_TO)
        return n


class UnfilteredShowsNoShowAll(ChangeList):
    """Without `show_full_result_count` (no second COUNT over the whole
    table) Django offers "(Show all)" beside the search box on every page,
    the unfiltered list included, where it leads back to the same list. An
    unfiltered, unsearched list is its own whole: say so, and the link goes."""

    def get_results(self, request):
        super().get_results(request)
        if not self.query and not self.has_active_filters:
            self.full_result_count = self.result_count


def cursor_text(task) -> str:
    return f"{task.created_at.isoformat()},{task.pk}"


def cursor_parse(value: str) -> tuple[datetime, uuid.UUID] | None:
    """(created_at, id) of a `before` value, or None if it is not one."""
    at, _, pk = value.partition(",")
    try:
        moment = parse_datetime(at)
        if moment is None or moment.utcoffset() is None:
            return None
        return moment, uuid.UUID(pk)
    except (ValueError, OverflowError):
        return None


def cursor_problem(value: str) -> str:
    return "" if cursor_parse(value) else "is not a position in the list (<created_at>,<id>)"


def older_than(queryset, cursor: tuple[datetime, uuid.UUID]):
    """Rows after `cursor` in the order (-created_at, -id). The plain
    `created_at <= at` bounds the index range; the OR settles ties."""
    at, pk = cursor
    return queryset.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk),
                           created_at__lte=at)
