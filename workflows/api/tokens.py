"""`Authorization: Token <key>` against PILOT's hashed tokens (models.token).

DRF's TokenAuthentication, looking the key up by its SHA-256 instead of in
plain text. A missing, unknown or malformed key, one past its `expires_at`
(a rotation's overlap ended, or its own expiry), or one of an inactive user,
is a 401 `not_authenticated` (api.problems), as with DRF's own class.
"""

from __future__ import annotations

from django.utils import timezone
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from workflows.accounts import is_system_owner
from workflows.models.token import ApiToken, token_digest


class ApiTokenAuthentication(TokenAuthentication):
    keyword = "Token"
    model = ApiToken

    def authenticate(self, request):
        """DRF's, except that `Authorization: Token` with nothing after it (an
        empty `$TOKEN` in a new shell) says so, not "No credentials provided"."""
        header = get_authorization_header(request).split()
        if len(header) == 1 and header[0].lower() == self.keyword.lower().encode():
            raise AuthenticationFailed(
                "Invalid token header: the token after 'Token' is empty (an unset or empty "
                "shell variable, such as $TOKEN in a new terminal?).")
        return super().authenticate(request)

    def authenticate_credentials(self, key):
        try:
            token = ApiToken.objects.select_related("user").get(digest=token_digest(key))
        except ApiToken.DoesNotExist:
            raise AuthenticationFailed("Invalid token.") from None
        if token.expires_at is not None and token.expires_at <= timezone.now():
            raise AuthenticationFailed("Token expired.")
        if is_system_owner(token.user):  # a token made before names were refused
            raise AuthenticationFailed("Invalid token.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return token.user, token
