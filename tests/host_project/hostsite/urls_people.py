"""PILOT's API under a path of the host's choosing, not /pilot/api/ nor /api/v1/."""

from django.contrib import admin
from django.urls import include, path

from workflows.urls import admin_password_change_urls, probe_urls

urlpatterns = [
    path("admin/", include(admin_password_change_urls())),
    path("admin/", admin.site.urls),
    path("tools/pilot/api/", include("workflows.api.urls")),
    *probe_urls("ops/"),
]
