"""Client webhooks in the console: each API client's default endpoint.

An operator changes the endpoint here (checked like a trigger's callback_url:
http(s), a public host); the change goes to workflows.accounts
(`client_webhook_ensure`), which writes it. The signing secret is never shown
on a page: `manage.py create_api_client NAME` prints it once when it creates
it, `--rotate-webhook-secret` issues a new one. Rows are created there too,
so there is no Add here, and no Delete (it would leave the client's
deliveries unsigned). The list shows each endpoint's health: its last
success, since when it fails and how many deliveries fail (linked to them).
Registered by WorkflowsConfig.ready().
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils.html import format_html

from workflows.accounts import client_webhook_check, client_webhook_ensure
from workflows.admin.fleet_webhooks import with_health
from workflows.admin.guard import GuardedChangelist
from workflows.admin.text import timestamp, timestamp_field
from workflows.models import ClientWebhook
from workflows.rules.errors import ValidationFailed


class ClientWebhookForm(forms.ModelForm):
    class Meta:
        model = ClientWebhook
        fields = ["url"]
        help_texts = {"url": "Tasks of this client triggered without a callback_url are "
                             "delivered here (those triggered from now on). Empty: none."}

    def clean_url(self):
        url = self.cleaned_data["url"].strip()
        try:
            client_webhook_check(url)
        except ValidationFailed as exc:
            raise ValidationError(exc.detail) from None
        return url


@admin.register(ClientWebhook)
class ClientWebhookAdmin(GuardedChangelist, admin.ModelAdmin):
    form = ClientWebhookForm
    list_display = ["owner", "url", "last_success_at", "failing_since_at", "failing_count",
                    "updated"]
    updated = timestamp_field("updated_at", "updated (UTC)")
    search_fields = ["url"]  # and the owner's name: get_search_fields
    readonly_fields = ["owner", "secret_state", "created_at", "updated_at"]
    fields = ["owner", "url", "secret_state", "created_at", "updated_at"]

    def get_queryset(self, request):
        return with_health(super().get_queryset(request))

    @admin.display(description="last success (UTC)")
    def last_success_at(self, obj):
        return timestamp(obj.last_success, ms=False) if obj.url else "–"

    @admin.display(description="failing since (UTC)")
    def failing_since_at(self, obj):
        return timestamp(obj.failing_since, ms=False) if obj.failing else "–"

    @admin.display(description="failing deliveries")
    def failing_count(self, obj):
        if not obj.failing:
            return "0"
        url = reverse("admin:workflows_webhookdelivery_changelist")
        return format_html('<a href="{}?{}" class="pilot-failing">{}</a>', url,
                           urlencode({"owner": obj.owner_id, "health": "failing"}), obj.failing)

    def get_search_fields(self, request):
        # The host's user model names its accounts by its USERNAME_FIELD (`email`...).
        return [f"owner__{get_user_model().USERNAME_FIELD}", *self.search_fields]

    @admin.display(description="signing secret")
    def secret_state(self, obj):
        return ("set — shown only once, by create_api_client; "
                "`manage.py create_api_client <name> --rotate-webhook-secret` replaces it")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        client_webhook_ensure(obj.owner, url=form.cleaned_data["url"])
