"""A project that mounts PILOT's API somewhere else (tests/api/test_embedding.py)."""

from django.urls import include, path

from workflows.urls import probe_urls

urlpatterns = [
    path("elsewhere/pilot/", include("workflows.api.urls")),
    *probe_urls("ops/"),
]
