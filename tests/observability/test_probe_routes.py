"""ProbeMiddleware serves PILOT's probe views, found by the view, never by a URL
name: a host's own routes named `metrics` or `healthz` keep their names and go
through every middleware (docs/embedding.md, step 4)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = [pytest.mark.urls("tests.observability.probe_host_urls"), pytest.mark.django_db]

BY_IP = {"HTTP_HOST": "10.1.2.3:8000"}


def test_the_hosts_route_names_stay_the_hosts():
    assert reverse("metrics") == "/dashboard/metrics/"
    assert reverse("healthz") == "/dashboard/health/"
    assert reverse("pilot_metrics") == "/ops/metrics"


def test_only_pilots_probe_views_skip_the_host_check():
    client = Client()
    assert client.get("/ops/metrics", **BY_IP).status_code == 200
    assert client.get("/ops/healthz", **BY_IP).status_code == 200
    # The host's views named like probes go down the whole chain: the host check
    # answers 400 (not a 500 from a login_required view run without its middleware).
    assert client.get("/dashboard/metrics/", **BY_IP).status_code == 400
    assert client.get("/dashboard/health/", **BY_IP).status_code == 400
    # A path the host's own route takes first is the host's, not a probe.
    assert client.get("/ops/readyz", **BY_IP).status_code == 400
    assert client.get("/ops/readyz").content == b"the host's own readiness page"
