"""A host's URLconf with its own routes named like PILOT's probes, one before and
one after probe_urls(), and one that takes a probe's path first."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.urls import path

from workflows.urls import probe_urls


@login_required
def business_metrics(request):
    return HttpResponse("the host's sales figures")


def host_readyz(request):
    return HttpResponse("the host's own readiness page")


urlpatterns = [
    path("dashboard/metrics/", business_metrics, name="metrics"),
    path("ops/readyz", host_readyz),  # the host took this path before PILOT's
    *probe_urls("ops/"),
    path("dashboard/health/", business_metrics, name="healthz"),
]
