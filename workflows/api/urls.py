"""The API's routes (no trailing slashes), in the `pilot_api` namespace.

Mounted by the project wherever it likes (`/api/v1/` in the standalone
project): every URL PILOT hands out is built with `reverse("pilot_api:…")`.
"""

from django.urls import path, re_path

from workflows.api import views
from workflows.api.docs_views import DocsView, SchemaView
from workflows.api.problems import api_not_found

app_name = "pilot_api"

urlpatterns = [
    path("tasks", views.TaskCollectionView.as_view(), name="tasks"),
    path("tasks/batch", views.TaskBatchView.as_view(), name="tasks-batch"),
    path("tasks/<uuid:task_id>", views.TaskDetailView.as_view(), name="task-detail"),
    path("tasks/<uuid:task_id>/cancel", views.TaskCancelView.as_view(), name="task-cancel"),
    path("tasks/<uuid:task_id>/retry", views.TaskRetryView.as_view(), name="task-retry"),
    path("tasks/<uuid:task_id>/signals/<str:name>", views.TaskSignalView.as_view(),
         name="task-signal"),
    path("workflows", views.WorkflowListView.as_view(), name="workflows"),
    path("schema", SchemaView.as_view(), name="schema"),
    path("docs", DocsView.as_view(url_name="pilot_api:schema"), name="docs"),
    re_path(r"^[\s\S]*$", api_not_found),  # [\s\S]: paths may hold newlines too
]
