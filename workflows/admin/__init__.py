"""The operator console, in the Django admin (docs/console.md is its guide).

- `tasks`: the task list and the read-only task page, registered on the site;
  `task_page` + `phases`: what the task page shows; `list_params`: the list's
  query parameters, checked before they reach the database;
- `actions` + `confirm`: cancel / retry / retry from start, with a dry run;
  `bulk` + `bulk_views`: the same for everything matching a filter, in chunks;
  `audit`: console actions in Django's admin log;
- `trigger`, `dashboard` (with Workers & queue), `workflows_page`: the
  console's own pages; `live`: the JSON endpoint their live updates poll;
- `stats`, `workers`: reads; `pictures/` (`chart`, `timeline`, `diagram`): SVG
  pictures.

Admin code never changes a task: every change is an engine call.
"""

from django.contrib import admin

from workflows.admin import tasks  # noqa: F401  (registers TaskAdmin)
from workflows.conf import pilot_settings


def brand_admin_site(site=admin.site) -> None:
    """The operator console's look for a whole admin site: its header, title,
    index (links to the console's pages), login and app pages, no sidebar, and
    "View site" opening the console's index. Opt-in (PILOT_ADMIN_BRANDING): on in
    the standalone project, off in a host project, whose admin keeps its own
    name — PILOT's pages there carry the console's look by themselves."""
    from django.urls import reverse_lazy

    site.site_header = "PILOT operator console"
    site.site_title = "PILOT"
    site.index_title = "Operator console"
    site.index_template = "pilot/admin/index.html"
    # The console's favicon and script on the login and app pages too.
    site.login_template = "pilot/admin/login.html"
    site.app_index_template = "pilot/admin/app_index.html"
    # The task list needs the width (every column visible at 1440 px); the console's
    # pages link each other, and Home lists every model.
    site.enable_nav_sidebar = False
    # "View site" opens the console's index (every operator may see it; the task
    # list needs workflows.view_task): PILOT has no other site to view.
    site.site_url = reverse_lazy("admin:index")


if pilot_settings.PILOT_ADMIN_BRANDING:
    brand_admin_site()
