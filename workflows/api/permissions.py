"""Who may do what over the API (docs/design.md, "Who may do what").

Authentication is required everywhere (settings); triggering also needs
`workflows.add_task`. Reading, cancelling and retrying are scoped by the
engine and selectors (owner, or `view_all_tasks` / the transition permission).
"""

from rest_framework.permissions import BasePermission


class CanTrigger(BasePermission):
    message = "Triggering workflows needs the workflows.add_task permission"

    def has_permission(self, request, view):
        return bool(request.user and request.user.has_perm("workflows.add_task"))
