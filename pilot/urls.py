"""Top-level URL map."""

from django.conf import settings
from django.contrib import admin
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path

from workflows.api.health import HealthzView, ReadyzView
from workflows.login_forms import admin_password_change
from workflows.observability.views import metrics_view

urlpatterns = [
    # The admin's own view with an attempt limit on the current password
    # (workflows/login_forms.py); before admin.site.urls, so it wins.
    path("admin/password_change/", admin.site.admin_view(admin_password_change, cacheable=True),
         name="pilot_password_change"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("workflows.api.urls")),
    path("healthz", HealthzView.as_view(), name="healthz"),
    path("readyz", ReadyzView.as_view(), name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    # Browsers ask for /favicon.ico on pages that name no icon (the console's pages do);
    # resolved per request, so the static manifest is read only when it exists.
    path("favicon.ico", lambda request: HttpResponsePermanentRedirect(
        static("pilot/favicon.svg"))),
]

if settings.PILOT_BENCH_ENDPOINTS:  # the benchmark's baselines, see pilot/settings.py
    urlpatterns.append(path("bench/", include("bench.ceiling.urls")))
