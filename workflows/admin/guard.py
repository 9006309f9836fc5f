"""Every console list takes only the query parameters its own controls produce
(docs/security.md, "No secret is an oracle").

Django's admin passes any lookup on a model's own fields from the query string
to the database: `?secret__startswith=whsec_A` on the client webhooks list
filters by the signing secret, and the row count answers yes or no — a
view-only operator recovered a client's whole secret that way, one character
at a time. And a value the database refuses (a NUL, which PostgreSQL's text
cannot hold) is a 500 when the page renders.

`GuardedChangelist`, mixed into every PILOT admin (the task list has its own,
stricter `list_params`), lets through exactly what the list's filters, date
hierarchy, search, ordering, pagination and pop-ups produce — each filter's
`expected_parameters()` — and drops anything else with a message naming it, as
the task list does. Behind it, `lookup_allowed` refuses (400) any lookup
that names a secret, a token digest or a password, whatever produced it.
`guard_stock_admins` puts the same guard on Django's own user and group lists
when the site shows Django's stock admins for them (the standalone project).
"""

from __future__ import annotations

import re

from django.contrib import admin, messages
from django.contrib.admin import FieldListFilter
from django.contrib.admin.options import IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.utils import NotRelationField, get_fields_from_path
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, ORDER_VAR, PAGE_VAR, SEARCH_VAR
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpResponseRedirect, QueryDict

from workflows.admin.list_params import moment_problem

# Fields whose value must never be filtered, searched or sorted on: they sign,
# authenticate or hash a password. By name, on every model the console shows.
SENSITIVE_FIELDS = frozenset({"secret", "previous_secret", "digest", "password"})

# The list's own controls: presence or a short value.
_CONTROLS = {SEARCH_VAR, ORDER_VAR, PAGE_VAR, ALL_VAR, ERROR_FLAG, IS_FACETS_VAR,
             IS_POPUP_VAR, TO_FIELD_VAR}
MAX_VALUE_LENGTH = 255
_SURROGATE = re.compile("[\ud800-\udfff]")
_ORDER = re.compile(r"[0-9.\-]{0,50}")
_PAGE = re.compile(r"[0-9]{1,9}")
_INTEGER = re.compile(r"-?[0-9]{1,18}")  # within bigint


def lookup_is_sensitive(lookup: str) -> bool:
    """Whether a lookup path (`owner__pilot_webhook__secret__regex`) names a
    sensitive field anywhere along it."""
    return any(part in SENSITIVE_FIELDS for part in lookup.split("__"))


def filter_parameters(model_admin, request) -> set[str]:
    """The query parameters the list's filters and date hierarchy produce."""
    names: set[str] = set()
    model = model_admin.model
    for list_filter in model_admin.get_list_filter(request):
        if callable(list_filter):
            spec = list_filter(request, {}, model, model_admin)
        else:
            if isinstance(list_filter, (tuple, list)):
                field_path, filter_class = list_filter
            else:
                field_path, filter_class = list_filter, FieldListFilter.create
            field = get_fields_from_path(model, field_path)[-1]
            spec = filter_class(field, request, {}, model, model_admin, field_path=field_path)
        names |= set(spec.expected_parameters() or ())
    hierarchy = model_admin.get_date_hierarchy(request) \
        if hasattr(model_admin, "get_date_hierarchy") else model_admin.date_hierarchy
    if hierarchy:
        names |= {f"{hierarchy}__{part}" for part in ("year", "month", "day")}
    return names


def _target(model, name: str) -> tuple[object, str]:
    """(the field a filter parameter compares, its lookup), or (None, "")."""
    parts = name.split("__")
    for cut in range(len(parts), 0, -1):
        try:
            field = get_fields_from_path(model, "__".join(parts[:cut]))[-1]
        except (FieldDoesNotExist, NotRelationField):
            continue
        return field, "__".join(parts[cut:])
    return None, ""


def _field_value_problem(field, lookup: str, value: str) -> str:
    """What the database could not compare `value` with, by the field's type:
    a date outside what it stores, an integer beyond bigint."""
    if lookup == "isnull" or field is None:
        return ""
    if field.is_relation and field.target_field is not None:
        field = field.target_field
    values = value.split(",") if lookup == "in" else [value]
    if isinstance(field, (models.DateTimeField, models.DateField)):
        return next(filter(None, map(moment_problem, values)), "")
    if isinstance(field, (models.IntegerField, models.AutoField)) and not all(
            _INTEGER.fullmatch(v) for v in values):
        return "must be a whole number"
    return ""


def _value_problem(model, name: str, value: str) -> str:
    if "\x00" in value:
        return "contains a NUL character"
    if _SURROGATE.search(value):
        return "contains an unpaired surrogate character"
    if len(value) > MAX_VALUE_LENGTH:
        return f"is longer than {MAX_VALUE_LENGTH} characters"
    if name == ORDER_VAR:
        return "" if _ORDER.fullmatch(value) else "is not a column order"
    if name == PAGE_VAR:
        return "" if _PAGE.fullmatch(value) else "must be a page number"
    if name in _CONTROLS:
        return ""
    field, lookup = _target(model, name)
    return _field_value_problem(field, lookup, value)


def changelist_params_check(model_admin, request) -> tuple[QueryDict, dict[str, str]]:
    """(the parameters that may reach the ChangeList, {name: why another was
    dropped}). Names in the problems are printable (NULs shown as \\x00)."""
    allowed = _CONTROLS | filter_parameters(model_admin, request)
    kept = QueryDict(mutable=True)
    problems: dict[str, str] = {}
    for name, values in request.GET.lists():
        if name not in allowed or lookup_is_sensitive(name):  # NULs, surrogates too
            problem = "is not a filter of this list"
        else:
            problem = next(filter(None, (_value_problem(model_admin.model, name, v)
                                         for v in values)), "")
        if problem:
            problems[name.encode("unicode_escape").decode("ascii")[:60]] = problem
        else:
            kept.setlist(name, values)
    return kept, problems


class GuardedChangelist:
    """Mixin for a ModelAdmin: its list takes only its own controls' parameters."""

    def changelist_view(self, request, extra_context=None):
        if self.has_view_or_change_permission(request):  # else Django's 403 as before
            kept, problems = changelist_params_check(self, request)
            if problems:
                messages.error(request, "Filter ignored — " + "; ".join(
                    f"{name} {why}" for name, why in problems.items()) + ".")
                query = kept.urlencode()
                return HttpResponseRedirect(request.path + (f"?{query}" if query else ""))
        return super().changelist_view(request, extra_context)

    def lookup_allowed(self, lookup, value, request=None):
        if lookup_is_sensitive(lookup):
            return False  # DisallowedModelAdminLookup: a 400, whatever produced it
        return super().lookup_allowed(lookup, value, request)


def guarded(admin_class: type) -> type:
    """`admin_class` with the guard in front (a subclass of the same name)."""
    return type(admin_class.__name__, (GuardedChangelist, admin_class), {
        "__module__": __name__, "__doc__": admin_class.__doc__})


def guard_stock_admins(site=admin.site) -> None:
    """Django's own User and Group admins, when `site` shows exactly those, get
    the guard: `?password__startswith=` would otherwise be an oracle on password
    hashes, and `?username=%00` a 500. A project's own admin for them is its own."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.admin import GroupAdmin, UserAdmin
    from django.contrib.auth.models import Group

    for model, stock in ((get_user_model(), UserAdmin), (Group, GroupAdmin)):
        current = site._registry.get(model)
        if current is not None and type(current) is stock:
            site.unregister(model)
            site.register(model, guarded(stock))
