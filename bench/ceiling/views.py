"""The ceiling: the cheapest honest DRF endpoint that does what a trigger must
at least do. Same authentication (token) and permission (workflows.add_task)
as POST /api/v1/tasks; validate the body, insert one row, answer 201 with it.
No idempotency decision, no throttle, no enqueue: that is what PILOT adds."""

from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from bench.ceiling.models import BareTask
from workflows.api.permissions import CanTrigger

try:
    from workflows.api.base import AUTHENTICATION_CLASSES
except ImportError:  # the baseline engine (bench/baseline.py): DRF's global setting
    from rest_framework.settings import api_settings

    AUTHENTICATION_CLASSES = api_settings.DEFAULT_AUTHENTICATION_CLASSES


class BareInSerializer(serializers.Serializer):
    workflow = serializers.CharField(max_length=100)
    payload = serializers.DictField()


class BareOutSerializer(serializers.ModelSerializer):
    class Meta:
        model = BareTask
        fields = ["id", "idempotency_key", "workflow", "payload", "state", "created_at"]


class BareInsertView(APIView):
    authentication_classes = AUTHENTICATION_CLASSES
    permission_classes = [IsAuthenticated, CanTrigger]

    def post(self, request):
        data = BareInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = BareTask.objects.create(owner=request.user,
                                      idempotency_key=request.headers.get("Idempotency-Key", ""),
                                      **data.validated_data)
        return Response(BareOutSerializer(row).data, status=status.HTTP_201_CREATED)
