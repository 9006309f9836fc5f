"""The API's schema and docs pages, behind the API's own authentication.

The schema describes every operation and the docs page renders it; they are
the same information as `GET …/workflows`, so they ask for the same thing: a
token (`Authorization: Token …`) or a session (a browser logged into the
admin). An anonymous browser on the docs page is sent to the admin's login
page and back. PILOT_API_DOCS_PUBLIC=true opens both to anyone (off by default).

Both carry their drf-spectacular settings (`SPECTACULAR`, applied per request
with drf-spectacular's `custom_settings`) and describe PILOT's routes only, at
the paths where the project mounted them (`reverse()`): a host project's own
SPECTACULAR_SETTINGS and API are neither needed nor described.
"""

from __future__ import annotations

import threading

from django.contrib.auth.views import redirect_to_login
from django.urls import NoReverseMatch, get_script_prefix, include, path, reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import patched_settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated
from rest_framework.permissions import AllowAny, IsAuthenticated

from workflows.api.base import AUTHENTICATION_CLASSES, documented
from workflows.api.problems import problem_exception_handler
from workflows.api.renderers import SafeJSONRenderer
from workflows.conf import pilot_settings

SPECTACULAR = {
    "TITLE": "PILOT API",
    "VERSION": "1",
    "DESCRIPTION": (
        "Trigger workflows idempotently and follow their runs.\n\n"
        "**Idempotency.** Every trigger carries a key, in the `Idempotency-Key` header "
        "(bare, or quoted as an RFC 8941 string: both are the same key) or in the body's "
        "`task_id`. Keys are 1-255 visible ASCII characters and scoped to the calling "
        "client. Re-sending the same request with the same key never runs the workflow "
        "again: a pending, running, retrying or succeeded task is returned with "
        "`Idempotent-Replayed: true` (200); a failed one is restarted from its checkpoints "
        "(202); a cancelled one is refused (409 `task_cancelled`). The same key with a "
        "different workflow or payload is refused (422 `idempotency_key_reused`).\n\n"
        "**Expiry.** A key is remembered until its task has finished and the workflow's "
        "`idempotency_ttl` (24 hours unless the workflow says otherwise; see "
        "`GET /workflows`) has passed; after that the same key starts a new task. A task "
        "that has not finished never expires.\n\n"
        "**Errors** are `application/problem+json` with a stable `code`."
    ),
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": None,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "workflows.api.schema.strict_request_bodies"],
    "ENUM_NAME_OVERRIDES": {"TaskStateEnum": "workflows.rules.states.TaskState",
                            "StepStateEnum": "workflows.rules.states.StepState"},
}

def _mounted(name: str) -> str | None:
    """The path of route `name` below the script prefix, without the leading
    slash ("api/v1/workflows"), or None when the project did not mount it."""
    try:
        url = reverse(name)
    except NoReverseMatch:
        return None
    return url[len(get_script_prefix()):]


def api_prefix() -> str:
    """Where the project mounted the API ("api/v1/"), from reverse()."""
    workflows = _mounted("pilot_api:workflows")
    if workflows is None:
        raise NoReverseMatch("PILOT's API (workflows.api.urls) is not mounted")
    return workflows[: -len("workflows")]


def pilot_urlconf() -> list:
    """PILOT's routes only, each at the path the project mounted it: the API
    under its prefix, and the probes (healthz, readyz) where they are."""
    from workflows.api.health import HealthzView, ReadyzView

    patterns = [path(api_prefix(), include("workflows.api.urls"))]
    for name, view in (("healthz", HealthzView), ("readyz", ReadyzView)):
        mounted = _mounted(f"pilot_{name}")
        if mounted is not None:
            patterns.append(path(mounted, view.as_view(), name=name))
    return patterns


class _FollowsApiAuth:
    authentication_classes = AUTHENTICATION_CLASSES
    schema = AutoSchema()

    def get_permissions(self):
        return [AllowAny()] if pilot_settings.PILOT_API_DOCS_PUBLIC else [IsAuthenticated()]

    def get_exception_handler(self):
        return problem_exception_handler


# drf-spectacular applies custom settings by patching its one global settings
# object for the duration of a request: two threads of one process doing so at
# once could leave PILOT's settings in place for the project's own schema views.
# Schema and docs requests are rare; they take turns.
_PATCHED = threading.Lock()


class SchemaView(_FollowsApiAuth, SpectacularAPIView):
    custom_settings = SPECTACULAR

    @documented(exclude=True)
    def get(self, request, *args, **kwargs):
        self.urlconf = pilot_urlconf()
        with _PATCHED:
            return super().get(request, *args, **kwargs)

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        # A problem is JSON, whatever format (YAML, ?format=json) was negotiated.
        self.request.accepted_renderer = SafeJSONRenderer()
        self.request.accepted_media_type = "application/json"
        return response


class DocsView(_FollowsApiAuth, SpectacularSwaggerView):
    title = SPECTACULAR["TITLE"]  # type: ignore[assignment]  # a str

    @documented(exclude=True)
    def get(self, request, *args, **kwargs):
        with _PATCHED, patched_settings(SPECTACULAR):
            return super().get(request, *args, **kwargs)

    def handle_exception(self, exc):
        if isinstance(exc, NotAuthenticated | AuthenticationFailed):
            try:
                login = reverse("admin:login")
            except NoReverseMatch:  # no admin site in this project: answer the 401
                return super().handle_exception(exc)
            return redirect_to_login(self.request.get_full_path(), login)
        return super().handle_exception(exc)
