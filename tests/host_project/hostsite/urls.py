"""The host's URLs: its admin, its own API, and PILOT's pieces where it wants
them (docs/embedding.md, step 4)."""

from django.contrib import admin
from django.urls import include, path
from shop.views import ping

from workflows.urls import admin_password_change_urls, probe_urls

urlpatterns = [
    path("admin/", include(admin_password_change_urls())),
    path("admin/", admin.site.urls),
    path("api/ping", ping),
    path("pilot/api/", include("workflows.api.urls")),
    *probe_urls("ops/"),
]
