"""URL pieces a project mounts (docs/embedding.md):

    urlpatterns = [
        path("admin/", include(admin_password_change_urls())),   # before the admin
        path("admin/", admin.site.urls),
        path("pilot/api/", include("workflows.api.urls")),       # anywhere
        *probe_urls(),                                          # /healthz /readyz /metrics
    ]

The API's routes are named in the `pilot_api` namespace; PILOT builds every
URL it hands out (Location headers, the schema's paths, the console's links)
with `reverse()`, so the prefix is the project's choice.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from workflows.accounts.login_forms import admin_password_change
from workflows.api.health import HealthzView, ReadyzView
from workflows.observability.probes import probe
from workflows.observability.views import metrics_view


def admin_password_change_urls(site=None) -> list:
    """The admin's password change with the login guard's attempt limit on the
    current password (workflows/accounts/login_forms.py). Include it under the admin's
    prefix *before* `admin.site.urls`, so it wins; without it the admin's own
    view answers and `check` says so (pilot.W025)."""
    site = site or admin.site
    return [path("password_change/", site.admin_view(admin_password_change, cacheable=True),
                 name="pilot_password_change")]


# The probe views, made once: ProbeMiddleware finds their paths by these very
# objects, so a project's own route of the same name or path is never served
# in their place.
healthz_view = probe(HealthzView.as_view())
readyz_view = probe(ReadyzView.as_view())
probe(metrics_view)


def probe_urls(prefix: str = "") -> list:
    """Liveness, readiness and the Prometheus scrape, named `pilot_healthz`,
    `pilot_readyz` and `pilot_metrics` (prefixed: a project's own `metrics` route
    keeps its name). ProbeMiddleware serves these views whatever the Host."""
    return [path(f"{prefix}healthz", healthz_view, name="pilot_healthz"),
            path(f"{prefix}readyz", readyz_view, name="pilot_readyz"),
            path(f"{prefix}metrics", metrics_view, name="pilot_metrics")]
