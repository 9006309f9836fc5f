"""The benchmark's URL map: the standalone project's, plus the ceiling's bare
insert endpoint under /bench/ (bench/settings.py)."""

from django.urls import include, path

from pilot.urls import urlpatterns as pilot_urlpatterns

urlpatterns = [
    path("bench/", include("bench.ceiling.urls")),
    *pilot_urlpatterns,
]
