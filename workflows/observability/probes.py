"""Health probes and scrapers get an answer whatever Host they send.

A load balancer, kubelet or Prometheus addresses a node by its IP
(`Host: 10.0.0.5:8000`), which is not — and must not be — in ALLOWED_HOSTS;
Django's host check would answer 400. `ProbeMiddleware`, placed before every
middleware that reads the host (SecurityMiddleware, CommonMiddleware, CSRF),
serves exactly the routes named `healthz`, `readyz` and `metrics` itself and
returns; every other path goes down the normal chain, so ALLOWED_HOSTS keeps
protecting everything else (the admin's links and password-reset mails, the
API's Location headers).

These three views build no URL from the host, set no cookie and need no
session or CSRF protection (GET only, no authentication but /metrics' own
bearer token), so nothing they do depends on the middleware they skip. They are
exempt from the HTTPS redirect for the same reason (SECURE_REDIRECT_EXEMPT).
"""

from __future__ import annotations

from django.urls import NoReverseMatch, get_resolver

PROBE_ROUTES = ("healthz", "readyz", "metrics")


class ProbeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self._paths: frozenset[str] | None = None

    def probe_paths(self) -> frozenset[str]:
        """The paths (path_info) of the probe routes in the root URLconf."""
        if self._paths is None:
            resolver, paths = get_resolver(), set()
            for name in PROBE_ROUTES:
                try:
                    paths.add("/" + resolver.reverse(name))
                except NoReverseMatch:
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
