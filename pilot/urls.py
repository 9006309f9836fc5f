"""Top-level URL map."""

from django.contrib import admin
from django.urls import include, path

from workflows.api.health import HealthzView, ReadyzView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("workflows.api.urls")),
    path("healthz", HealthzView.as_view(), name="healthz"),
    path("readyz", ReadyzView.as_view(), name="readyz"),
]
