"""A host project's own drf-spectacular schema with PILOT mounted beside its
API: PILOT's endpoints (and their `Task`, `Problem`… components) are in it
unless the host adds PILOT's preprocessing hook, and then a host serializer
named `TaskSerializer` is the only `Task` (docs/embedding.md, "Names")."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import patched_settings
from rest_framework import serializers
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response


class TaskSerializer(serializers.Serializer):  # the host's own "Task"
    title = serializers.CharField()
    done = serializers.BooleanField()


class HostTasks(GenericAPIView):
    schema = AutoSchema()
    serializer_class = TaskSerializer

    def get(self, request):
        return Response({"title": "ship it", "done": False})


PATTERNS = [path("api/todo/", HostTasks.as_view()),
            path("pilot/api/", include("workflows.api.urls"))]


def host_schema(**patches) -> dict:
    with patched_settings({"TITLE": "Shop API", **patches}):
        return SchemaGenerator(patterns=PATTERNS).get_schema(request=None, public=True)


def test_without_the_hook_pilots_endpoints_join_the_hosts_schema():
    assert "/pilot/api/tasks" in host_schema()["paths"]


def test_the_hook_leaves_the_host_its_own_schema():
    schema = host_schema(PREPROCESSING_HOOKS=["workflows.api.schema.exclude_pilot_endpoints"])
    assert list(schema["paths"]) == ["/api/todo/"]
    assert set(schema["components"]["schemas"]["Task"]["properties"]) == {"title", "done"}
    assert "Problem" not in schema["components"]["schemas"]
