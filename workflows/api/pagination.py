"""Cursor pagination for task lists: stable under inserts, bounded page size."""

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class TaskCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound:
            # DRF answers a corrupt cursor with 404; it is a bad request.
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size):
            raise ValidationError({"page_size": [
                f"Must be an integer from 1 to {self.max_page_size}."]})
        return super().get_page_size(request)
