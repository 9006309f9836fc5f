"""Client webhooks in the console: each API client's default endpoint.

An operator changes the endpoint here (checked like a trigger's callback_url:
http(s), a public host); the change goes to workflows.accounts
(`client_webhook_ensure`), which writes it. The signing secret is never shown
on a page: `manage.py create_api_client NAME` prints it once when it creates
it, `--rotate-webhook-secret` issues a new one. Rows are created there too,
so there is no Add here, and no Delete (it would leave the client's
deliveries unsigned). Registered by WorkflowsConfig.ready().
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from workflows.accounts import client_webhook_check, client_webhook_ensure
from workflows.admin.guard import GuardedChangelist
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
    list_display = ["owner", "url", "updated_at"]
    search_fields = ["url"]  # and the owner's name: get_search_fields
    readonly_fields = ["owner", "secret_state", "created_at", "updated_at"]
    fields = ["owner", "url", "secret_state", "created_at", "updated_at"]

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
