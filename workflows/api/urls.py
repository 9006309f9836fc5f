"""/api/v1/ routes, exactly as SPEC §8 writes them (no trailing slashes)."""

from django.urls import path, re_path

from workflows.api import views
from workflows.api.docs_views import DocsView, SchemaView
from workflows.api.problems import api_not_found

urlpatterns = [
    path("tasks", views.TaskCollectionView.as_view(), name="tasks"),
    path("tasks/batch", views.TaskBatchView.as_view(), name="tasks-batch"),
    path("tasks/<uuid:task_id>", views.TaskDetailView.as_view(), name="task-detail"),
    path("tasks/<uuid:task_id>/cancel", views.TaskCancelView.as_view(), name="task-cancel"),
    path("tasks/<uuid:task_id>/retry", views.TaskRetryView.as_view(), name="task-retry"),
    path("workflows", views.WorkflowListView.as_view(), name="workflows"),
    path("schema", SchemaView.as_view(), name="schema"),
    path("docs", DocsView.as_view(url_name="schema"), name="docs"),
    re_path(r"^[\s\S]*$", api_not_found),  # [\s\S]: paths may hold newlines too
]
