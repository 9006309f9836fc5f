"""/api/v1/schema and /api/v1/docs, behind the API's own authentication.

The schema describes every operation and the docs page renders it; they are
the same information as `GET /workflows`, so they ask for the same thing: a
token (`Authorization: Token …`) or a session (a browser logged into the
admin). An anonymous browser on /docs is sent to the admin's login page and
back. PILOT_API_DOCS_PUBLIC=true opens both to anyone (off by default).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.urls import reverse
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated
from rest_framework.permissions import AllowAny, IsAuthenticated

from workflows.api.renderers import SafeJSONRenderer


class _FollowsApiAuth:
    def get_permissions(self):
        return [AllowAny()] if settings.PILOT_API_DOCS_PUBLIC else [IsAuthenticated()]


class SchemaView(_FollowsApiAuth, SpectacularAPIView):
    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        # A problem is JSON, whatever format (YAML, ?format=json) was negotiated.
        self.request.accepted_renderer = SafeJSONRenderer()
        self.request.accepted_media_type = "application/json"
        return response


class DocsView(_FollowsApiAuth, SpectacularSwaggerView):
    def handle_exception(self, exc):
        if isinstance(exc, NotAuthenticated | AuthenticationFailed):
            return redirect_to_login(self.request.get_full_path(), reverse("admin:login"))
        return super().handle_exception(exc)
