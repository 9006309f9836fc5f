"""A URLconf with one view that fails, for the technical 500 page's test."""

from django.urls import include, path


def boom(request):
    # Built at run time: the page shows source lines too, and those are not secret.
    redis_location = "redis://:" + "-".join(["frame", "secret", "pw"]) + "@cache.internal/0"  # noqa: F841
    raise RuntimeError("something broke")


urlpatterns = [
    path("boom", boom),
    path("", include("pilot.urls")),
]
