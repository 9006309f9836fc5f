"""Strict JSON-typed serializer fields for workflow payload schemas.

PILOT stores a payload exactly as the client sent it (that is what its
fingerprint covers), so validation must not quietly coerce: DRF's own fields
accept "5" for an integer and `false` for a float, which would pass the
trigger and then break the step that does arithmetic on it. These fields
accept only the JSON type they name.
"""

from rest_framework import serializers


class JSONInteger(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class JSONNumber(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class JSONBoolean(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class JSONString(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
