"""Health probes and scrapers get an answer whatever Host they send.

A load balancer, kubelet or Prometheus addresses a node by its IP
(`Host: 10.0.0.5:8000`), which is not — and must not be — in ALLOWED_HOSTS;
Django's host check would answer 400. `ProbeMiddleware`, placed before every
middleware that reads the host (SecurityMiddleware, CommonMiddleware, CSRF),
serves exactly the paths where the project mounted PILOT's probe views
(`workflows.urls.probe_urls`) itself and returns — found by the view objects,
never by a URL name, so a project's own route named `metrics` (or one that
shadows the path) goes down the normal chain like every other path, so ALLOWED_HOSTS keeps
protecting everything else (the admin's links and password-reset mails, the
API's Location headers).

These three views build no URL from the host, set no cookie and need no
session or CSRF protection (GET only, no authentication but /metrics' own
bearer token), so nothing they do depends on the middleware they skip. They are
exempt from the HTTPS redirect for the same reason (SECURE_REDIRECT_EXEMPT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import NoReverseMatch, Resolver404, get_resolver

# The probe views, made once where they are mounted (workflows/urls.py) and
# named here: ProbeMiddleware finds their paths by these very objects.
PROBE_VIEWS: list[Callable[..., Any]] = []


def probe(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `view` as one of PILOT's probes (served whatever the Host)."""
    PROBE_VIEWS.append(view)
    return view


class ProbeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self._paths: frozenset[str] | None = None

    def probe_paths(self) -> frozenset[str]:
        """The paths (path_info) at which the root URLconf resolves to one of
        PILOT's probe views (reversed by the view object, then resolved back:
        a path an earlier route of the project's own takes is not a probe's)."""
        if self._paths is None:
            resolver, paths = get_resolver(), set()
            # Load the project's URLconf first: mounting the probes (probe_urls)
            # is what names their views here, and the first request of a fresh
            # process may be a probe.
            _ = resolver.url_patterns
            for view in PROBE_VIEWS:
                try:
                    # Django reverses a view object too; its stubs know only names.
                    path = "/" + resolver.reverse(view)  # type: ignore[arg-type]
                    if resolver.resolve(path).func is view:
                        paths.add(path)
                except (NoReverseMatch, Resolver404):
                    continue
            self._paths = frozenset(paths)
        return self._paths

    def __call__(self, request):
        if request.path_info not in self.probe_paths():
            return self.get_response(request)
        match = get_resolver().resolve(request.path_info)
        request.resolver_match = match
        response = match.func(request, *match.args, **match.kwargs)
        if callable(getattr(response, "render", None)):
            response = response.render()
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
        return response
