"""Top-level URL map of the standalone project (a host project mounts the same
pieces where it likes: docs/embedding.md)."""

from django.contrib import admin
from django.http import HttpResponsePermanentRedirect, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from workflows.urls import admin_password_change_urls, probe_urls

urlpatterns = [
    # The admin's own view with an attempt limit on the current password
    # (workflows/accounts/login_forms.py); before admin.site.urls, so it wins.
    path("admin/", include(admin_password_change_urls())),
    path("admin/", admin.site.urls),
    path("api/v1/", include("workflows.api.urls")),
    *probe_urls(),
    # Browsers ask for /favicon.ico on pages that name no icon (the console's pages do);
    # resolved per request, so the static manifest is read only when it exists.
    # The bare host (and "View site" of an unbranded admin) opens the console.
    path("", lambda request: HttpResponseRedirect("/admin/")),
    path("favicon.ico", lambda request: HttpResponsePermanentRedirect(
        static("pilot/favicon.svg"))),
]
