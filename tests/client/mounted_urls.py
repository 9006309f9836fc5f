"""PILOT's API where a host might mount it: under a path of its own, not /api/v1."""

from django.urls import include, path

urlpatterns = [path("tools/pilot/api/", include("workflows.api.urls"))]
