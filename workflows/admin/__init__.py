"""The operator console (SPEC §9), in the Django admin.

- `tasks`: the task list and the read-only task page, registered on the site;
- `actions` + `confirm`: cancel / retry / retry from start, with a dry run;
- `trigger`, `dashboard`, `workflows_page`: the console's own pages;
- `stats`: the dashboard's reads; `chart`, `timeline`, `diagram`: SVG pictures.

Admin code never changes a task: every change is an engine call.
"""

from django.contrib import admin

from workflows.admin import tasks  # noqa: F401  (registers TaskAdmin)

admin.site.site_header = "PILOT operator console"
admin.site.site_title = "PILOT"
admin.site.index_title = "Operator console"
admin.site.index_template = "pilot/admin/index.html"
