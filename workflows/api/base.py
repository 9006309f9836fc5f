"""What every PILOT API view carries itself, so that nothing global is required.

A host project keeps its own REST_FRAMEWORK settings (another default
permission, renderer, parser, exception handler, schema class); PILOT's views
do not read them:

- authentication: PILOT's hashed API tokens (`Authorization: Token …`) for
  upstream systems, the session for browser users — never Basic auth;
- permission: authenticated (views add theirs);
- parser: the bounded JSON parser (413 / 400, never a 500);
- renderer: JSON that never fails on what it renders;
- exception handler: every error is `application/problem+json` with a code;
- no throttles but the views' own, no versioning, drf-spectacular's AutoSchema.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView

from workflows.api.parsers import BoundedJSONParser
from workflows.api.problems import problem_exception_handler
from workflows.api.renderers import SafeJSONRenderer
from workflows.api.tokens import ApiTokenAuthentication

AUTHENTICATION_CLASSES = [ApiTokenAuthentication, SessionAuthentication]


class PilotAPIView(APIView):
    authentication_classes = AUTHENTICATION_CLASSES
    permission_classes = [IsAuthenticated]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [SafeJSONRenderer]
    throttle_classes: list = []
    content_negotiation_class = DefaultContentNegotiation
    versioning_class = None
    schema = AutoSchema()

    def get_exception_handler(self):
        return problem_exception_handler


def documented(**kwargs):
    """drf-spectacular's `extend_schema` for a view method, built on
    drf-spectacular's AutoSchema whatever the project's DEFAULT_SCHEMA_CLASS
    (on a method, extend_schema otherwise derives from that setting, and a host
    project's DRF default would break PILOT's schema)."""

    def decorator(method):
        method.kwargs = {"schema": AutoSchema}
        return extend_schema(**kwargs)(method)

    return decorator
