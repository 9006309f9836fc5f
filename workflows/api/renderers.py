"""The API's JSON renderer: DRF's, and it never fails on what it renders.

Every input that could carry a lone surrogate (`"\\ud800"`) is refused with a
400 before it gets anywhere (api.serializers), but a response that echoes
something a client sent must not turn into a 500 because UTF-8 cannot encode
it. When it cannot, the body is rendered again with every non-ASCII character
as a JSON `\\uXXXX` escape: the same JSON value, always encodable.
"""

from __future__ import annotations

from rest_framework.renderers import JSONRenderer


class SafeJSONRenderer(JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            self.ensure_ascii = True  # this instance serves one response only
            return super().render(data, accepted_media_type, renderer_context)
