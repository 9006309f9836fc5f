"""The host's own API view: it must keep the host's DRF defaults (its
permission, renderer and exception handler), whatever PILOT's views do."""

from rest_framework.decorators import api_view
from rest_framework.response import Response


@api_view(["GET"])
def ping(request):
    return Response({"pong": True, "user": request.user.get_username()})
