"""`Authorization: Token <key>` against PILOT's hashed tokens (models.token).

DRF's TokenAuthentication, looking the key up by its SHA-256 instead of in
plain text. A missing, unknown or malformed key, or one of an inactive user,
is a 401 `not_authenticated` (api.problems), as with DRF's own class.
"""

from __future__ import annotations

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from workflows.models.token import ApiToken, token_digest


class ApiTokenAuthentication(TokenAuthentication):
    keyword = "Token"
    model = ApiToken

    def authenticate_credentials(self, key):
        try:
            token = ApiToken.objects.select_related("user").get(digest=token_digest(key))
        except ApiToken.DoesNotExist:
            raise AuthenticationFailed("Invalid token.") from None
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return token.user, token
