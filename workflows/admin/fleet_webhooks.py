"""Completion webhooks across every task (docs/webhooks.md, "In the console"):
which deliveries fail, to which endpoints, and re-sending them in bulk.

- `WebhookDeliveryAdmin`: every delivery, newest first (the primary key, or
  the filter's own index: pilot_delivery_state_id_idx,
  pilot_delivery_endpoint_id_idx, pilot_delivery_owner_id_idx), filtered by
  health (failing = retrying or failed), endpoint and client; each row links
  to its task. Counts are exact up to EXACT_COUNT_UP_TO, estimated beyond.
- its action "Re-send…": a dry run (how many, to which endpoints, which
  would be refused because an attempt is in flight, the newest one by one),
  then, confirmed with a reason, the single Re-send's engine call
  (`delivery_resend`) once per delivery, each in its own transaction, logged
  in Django's admin log on each task like the single one;
- `failing_summary(now)`: the dashboard's "Webhooks failing" card — the
  deliveries retrying or given up whose last attempt was in the last 24 h
  (pilot_delivery_failing_idx), by endpoint;
- `with_health(queryset)`: the client webhooks list's health columns.

Reads only; every change is `delivery_resend`. Registered by
WorkflowsConfig.ready().
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ALL_VAR, ORDER_VAR
from django.db.models import Count, Max, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from workflows.admin.audit import action_message, console_action_log
from workflows.admin.clock import console_now
from workflows.admin.deliveries import can_resend
from workflows.admin.forms import ReasonForm
from workflows.admin.guard import GuardedChangelist
from workflows.admin.paging import EstimatedCountPaginator, UnfilteredShowsNoShowAll
from workflows.admin.text import count_text, seconds_text, state_badge, timestamp
from workflows.engine import delivery_resend
from workflows.models import ClientWebhook, DeliveryState, Task, WebhookDelivery, WebhookEndpoint
from workflows.models.webhook import FAILING_DELIVERY
from workflows.rules.errors import PilotError
from workflows.selectors import can_view_all

FAILING = FAILING_DELIVERY
WINDOW = timedelta(hours=24)
MAX_RESEND = 500  # one confirmation re-sends at most this many: narrow the filter first
SHOWN = 25  # the dry run lists the newest this many one by one
CONFIRM_FIELD = "confirmed"


def failing_summary(now) -> dict:
    """Deliveries retrying or failed whose last attempt was in the 24 h
    before `now`, counted by state and by endpoint (the 10 with most)."""
    recent = WebhookDelivery.objects.filter(FAILING, last_attempt_at__gte=now - WINDOW)
    by_state = dict(recent.values_list("state").annotate(n=Count("id")).order_by())
    endpoints = list(recent.values("endpoint").annotate(
        n=Count("id"), since=Min("last_attempt_at"), last=Max("last_attempt_at"))
        .order_by("-n", "endpoint")[:10])
    paused = dict(WebhookEndpoint.objects.filter(
        key__in=[e["endpoint"] for e in endpoints], paused_until__gt=now)
        .values_list("key", "paused_until"))
    return {"retrying": by_state.get(DeliveryState.PENDING, 0),
            "failed": by_state.get(DeliveryState.FAILED, 0),
            "endpoints": [{**row, "paused_until": paused.get(row["endpoint"])}
                          for row in endpoints],
            "list_url": reverse("admin:workflows_webhookdelivery_changelist")}


def with_health(client_webhooks):
    """The ClientWebhook rows annotated with their default endpoint's health:
    `last_success` (the newest delivered delivery to that URL),
    `failing_since` (the first attempt of the oldest one retrying or given
    up) and `failing` (how many) — subqueries on pilot_delivery_owner_id_idx
    (the client's deliveries, newest first)."""
    mine = WebhookDelivery.objects.filter(owner_id=OuterRef("owner_id"), url=OuterRef("url"))
    failing = mine.filter(FAILING)
    return client_webhooks.annotate(
        last_success=Subquery(mine.filter(state=DeliveryState.DELIVERED).order_by("-id")
                              .values("delivered_at")[:1]),
        failing_since=Subquery(failing.order_by("id").values("created_at")[:1]),
        failing=Coalesce(Subquery(failing.order_by().values("owner_id")
                                  .annotate(n=Count("id")).values("n")[:1]), 0))



def by_id(queryset, value: str | None, lookup: str):
    """`queryset` filtered by `lookup` = the id `value` of a list parameter; no
    value, no filter; a value that is no id, no row (never a 500)."""
    if not value:
        return queryset
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return queryset.filter(id__lt=0)
    return queryset.filter(**{lookup: int(value)})

class HealthFilter(admin.SimpleListFilter):
    title = "health"
    parameter_name = "health"
    CHOICES = {
        "failing": ("failing (retrying or failed)", FAILING),
        "retrying": ("retrying", Q(state=DeliveryState.PENDING, attempts__gt=0)),
        "failed": ("failed (given up)", Q(state=DeliveryState.FAILED)),
        "pending": ("not attempted yet", Q(state=DeliveryState.PENDING, attempts=0)),
        "delivered": ("delivered", Q(state=DeliveryState.DELIVERED)),
    }

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in self.CHOICES.items()]

    def queryset(self, request, queryset):
        choice = self.CHOICES.get(self.value() or "")
        return queryset.filter(choice[1]) if choice else queryset


class EndpointFilter(admin.SimpleListFilter):
    """By receiver (`host:port`); the choices are the endpoints failing now
    (pilot_endpoint_failing_idx), any other is reached from a row's link."""

    title = "endpoint"
    parameter_name = "endpoint"

    def lookups(self, request, model_admin):
        keys = list(WebhookEndpoint.objects.filter(failures__gt=0)
                    .order_by("key").values_list("key", flat=True)[:50])
        if self.value() and self.value() not in keys:
            keys.append(self.value())
        return [(key, key) for key in keys]

    def queryset(self, request, queryset):
        return queryset.filter(endpoint=self.value()) if self.value() else queryset


class ClientFilter(admin.SimpleListFilter):
    """By client: the API clients with a webhook (ClientWebhook rows)."""

    title = "client"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        rows = ClientWebhook.objects.select_related("owner").order_by("owner_id")[:200]
        return [(str(row.owner_id), row.owner.get_username()) for row in rows]

    def queryset(self, request, queryset):
        return by_id(queryset, self.value(), "owner_id")


class OlderThan(admin.SimpleListFilter):
    """The list's position, `?before=<id>` of the last row shown: the next
    page is `id < before`, an index range that stops after one page — page
    100 costs what page 1 does (Django's pages are OFFSETs). Its box shows
    only on an older page (Django applies only filters that show)."""

    title = "position"
    parameter_name = "before"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, f"older than delivery {value}")] if value else []

    def queryset(self, request, queryset):
        return by_id(queryset, self.value(), "id__lt")


class DeliveryChangeList(UnfilteredShowsNoShowAll):
    """Newest first by keyset: links to the newest page and the next older
    one instead of numbered pages, in the default order."""

    def get_results(self, request):
        super().get_results(request)
        self.pilot_keyset = (ORDER_VAR not in self.params and ALL_VAR not in self.params
                             and self.page_num <= 1)
        if not self.pilot_keyset:
            return
        self.pilot_count = count_text(self.result_count, self.paginator.exact)
        self.pilot_newer_url = (self.get_query_string(remove=[OlderThan.parameter_name])
                                if OlderThan.parameter_name in self.params else None)
        rows = list(self.result_list)
        self.pilot_older_url = (self.get_query_string({OlderThan.parameter_name: rows[-1].pk})
                                if len(rows) == self.list_per_page else None)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(GuardedChangelist, admin.ModelAdmin):
    list_display = ["message", "state_badge", "task_link", "owner", "endpoint_link",
                    "attempts", "last_answer", "last_attempt", "next_attempt"]
    list_display_links = None  # a row links to its task; the delivery has no page of its own
    list_filter = [HealthFilter, EndpointFilter, ClientFilter, OlderThan]
    list_select_related = ["owner"]
    ordering = ["-id"]  # newest first, on the primary key or the filter's (…, id) index
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    actions = ["resend_selected"]

    def get_changelist(self, request, **kwargs):
        return DeliveryChangeList

    def has_view_permission(self, request, obj=None):
        return bool(request.user.is_active and request.user.is_staff
                    and can_view_all(request.user))

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # cleanup removes them once they ended

    def has_resend_permission(self, request):
        return can_resend(request.user)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # No page of its own: its task's page shows it attempt by attempt.
        delivery = WebhookDelivery.objects.filter(pk=object_id).first() \
            if object_id.isascii() and object_id.isdigit() and len(object_id) <= 18 else None
        if delivery is None or not self.has_view_permission(request):
            raise Http404("No such delivery")
        return HttpResponseRedirect(reverse("admin:workflows_task_change",
                                            args=[delivery.task_id]))

    @admin.display(description="event")
    def message(self, obj):
        # The task column carries the id; the whole webhook-id on hover.
        return format_html('<code title="webhook-id {}">{}:{}</code>', obj.message_id,
                           obj.task_state, obj.restarts)

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        retrying = obj.state == DeliveryState.PENDING and obj.attempts > 0
        return state_badge("retrying" if retrying else obj.state,
                           label="retrying" if retrying else None)

    @admin.display(description="task")
    def task_link(self, obj):
        if obj.detached_at is not None:
            return format_html("{} <span class='pilot-muted'>(deleted)</span>",
                               str(obj.task_id)[:8])
        url = reverse("admin:workflows_task_change", args=[obj.task_id])
        return format_html('<a href="{}#pilot-webhooks">{}</a>', url, str(obj.task_id)[:8])

    @admin.display(description="endpoint")
    def endpoint_link(self, obj):
        if not obj.endpoint:
            return format_html('<span class="pilot-wrap">{}</span>', obj.url)
        url = reverse("admin:workflows_webhookdelivery_changelist")
        return format_html('<a href="{}?{}" title="{}">{}</a>', url,
                           urlencode({"endpoint": obj.endpoint}), obj.url, obj.endpoint)

    @admin.display(description="last answer")
    def last_answer(self, obj):
        if not obj.attempts:
            return "–"
        # The error names the status already ("HTTP 500: …"); a bare status otherwise.
        answer = obj.last_error or (f"HTTP {obj.last_status}" if obj.last_status else "none")
        return format_html('<span class="pilot-wrap" title="{}">{}</span>', obj.last_error,
                           answer[:80])

    @admin.display(description="last attempt (UTC)", ordering="last_attempt_at")
    def last_attempt(self, obj):
        return timestamp(obj.last_attempt_at, ms=False)

    @admin.display(description="next attempt")
    def next_attempt(self, obj):
        if obj.state != DeliveryState.PENDING:
            return "–"
        # Relative, the ISO time on hover (this process's clock: a display only).
        wait = (obj.next_attempt_at - timezone.now()).total_seconds()
        return format_html('<span title="{}">{}</span>', timestamp(obj.next_attempt_at),
                           f"in {seconds_text(wait)}" if wait > 0 else "due")

    @admin.action(description="Re-send selected deliveries…", permissions=["resend"])
    def resend_selected(self, request, queryset):
        return bulk_resend_view(self, request, queryset)


def _plan(deliveries: list[WebhookDelivery], now) -> dict:
    in_flight = [d for d in deliveries if d.claimed_until is not None and d.claimed_until > now]
    by_endpoint: dict[str, int] = {}
    by_state: dict[str, int] = {}
    for d in deliveries:
        by_endpoint[d.endpoint or d.url] = by_endpoint.get(d.endpoint or d.url, 0) + 1
        by_state[d.state] = by_state.get(d.state, 0) + 1
    return {"count": len(deliveries) - len(in_flight), "in_flight": in_flight,
            "by_endpoint": sorted(by_endpoint.items(), key=lambda kv: (-kv[1], kv[0])),
            "by_state": sorted(by_state.items()), "shown": deliveries[:SHOWN]}


def bulk_resend_view(model_admin, request, queryset):
    """The dry run, then (confirmed, with a reason) `delivery_resend` per
    delivery; the outcome as a message on the list."""
    deliveries = list(queryset.order_by("-id")[:MAX_RESEND + 1])
    if len(deliveries) > MAX_RESEND:
        model_admin.message_user(request, f"At most {MAX_RESEND} deliveries are re-sent at once; "
                                 "narrow the filter (an endpoint, a client, failed only) "
                                 "first.", messages.ERROR)
        return None
    form = ReasonForm(request.POST if request.POST.get(CONFIRM_FIELD) == "yes" else None)
    if form.is_bound and form.is_valid():
        reason = form.cleaned_data["reason"]
        sent, refused = [], []
        for delivery in deliveries:
            try:
                sent.append(delivery_resend(delivery_id=delivery.pk, user=request.user,
                                            reason=reason))
            except PilotError as exc:
                refused.append(f"{delivery.message_id}: {exc.detail}")
        tasks = list(Task.objects.filter(pk__in={d.task_id for d in sent}))
        console_action_log(request.user, tasks, action_message(
            "Re-send webhook", reason, scope="selected deliveries"))
        model_admin.message_user(request, f"{len(sent)} webhook(s) will be sent again now.",
                                 messages.SUCCESS if sent else messages.WARNING)
        if refused:
            model_admin.message_user(request, f"{len(refused)} refused — " + "; ".join(
                refused[:10]) + ("; …" if len(refused) > 10 else ""), messages.ERROR)
        return None  # back to the list, with its filters
    back = reverse("admin:workflows_webhookdelivery_changelist")
    if request.GET:
        back += "?" + request.GET.urlencode()
    return TemplateResponse(request, "pilot/admin/resend_confirm.html", {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": "Re-send webhooks: what would happen", "plan": _plan(deliveries, console_now()),
        "deliveries": deliveries, "form": form, "confirm_field": CONFIRM_FIELD,
        "checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "select_across": request.POST.get("select_across") == "1", "cancel_url": back})
