"""Where a webhook may go (docs/webhooks.md, "Targets"): an http or https URL
whose host resolves to public addresses only.

An endpoint is checked twice: when it is registered (a trigger's
`callback_url`, a client's default endpoint: `target_validate`) and again at
every send (`target_addresses`), because DNS may answer differently by then;
the sender then connects to exactly the address it checked, so a name cannot
be re-pointed between the check and the connection. Refused: loopback,
private (RFC 1918, ULA), link-local (cloud metadata at 169.254.169.254),
shared (CGNAT), multicast, reserved and unspecified addresses — everything
that is not globally routable — unless PILOT_WEBHOOK_ALLOW_PRIVATE (tests,
closed networks). URLs with credentials (`user:pass@`) are refused too: the
URL is shown on the task page and in the API.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from urllib.parse import urlsplit

from workflows.conf import pilot_settings
from workflows.errors import ValidationFailed

MAX_URL_LENGTH = 2000
_VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")


class TargetRefused(Exception):  # noqa: N818 - a refusal, with the reason to show
    """The endpoint may not (or cannot) be reached; the message says why."""


@dataclasses.dataclass(frozen=True)
class Target:
    scheme: str   # http | https
    host: str     # a DNS name or an IP literal (without brackets)
    port: int
    path: str     # path and query, as sent in the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def target_parse(url) -> Target:
    """The parts of an endpoint URL, or TargetRefused saying what is wrong with it."""
    if not isinstance(url, str) or not url:
        raise TargetRefused("must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"must be at most {MAX_URL_LENGTH} characters")
    if not _VISIBLE_ASCII.match(url):
        raise TargetRefused("must be visible ASCII without spaces (percent-encode the rest, "
                            "punycode for international host names)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TargetRefused("must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise TargetRefused("must not carry credentials (user:password@); authenticate the "
                            "delivery by its signature")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetRefused("must name a host")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _literal(host: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def address_is_public(address) -> bool:
    """Globally routable and unicast (an IPv4-mapped IPv6 address is judged as IPv4)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def _allow_private() -> bool:
    return bool(pilot_settings.PILOT_WEBHOOK_ALLOW_PRIVATE)


def target_addresses(target: Target) -> list[str]:
    """The addresses to connect to for `target`, every one of them checked;
    TargetRefused if the host does not resolve or any address it resolves to is
    not public (unless PILOT_WEBHOOK_ALLOW_PRIVATE). One name answering with a
    public and a private address is refused as a whole."""
    literal = _literal(target.host)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as exc:
            raise TargetRefused(f"host {target.host} does not resolve ({exc})") from None
        # IPv4 and IPv6 socket addresses start with the address as text
        addresses = list(dict.fromkeys(info[4][0].split("%", 1)[0] for info in infos))  # type: ignore[union-attr]  # noqa: E501
        if not addresses:
            raise TargetRefused(f"host {target.host} does not resolve")
    if not _allow_private():
        for address in addresses:
            if not address_is_public(address):
                raise TargetRefused(
                    f"host {target.host} resolves to {address}, which is not a public address "
                    "(private, loopback, link-local and reserved targets are refused)")
    return addresses


def target_validate(url, *, field: str = "callback_url") -> str:
    """The registration check (trigger, default endpoint): the URL as given, or
    ValidationFailed (400 `validation_error`, errors under `field`). Resolves the
    host (unless PILOT_WEBHOOK_ALLOW_PRIVATE, where nothing needs checking)."""
    try:
        target = target_parse(url)
        if not _allow_private():
            target_addresses(target)
    except TargetRefused as exc:
        raise ValidationFailed(f"{field} {exc}", errors={field: [f"{str(exc)[:1].upper()}"
                                                                 f"{str(exc)[1:]}."]}) from None
    return url
