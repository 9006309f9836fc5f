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
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from workflows.conf import pilot_settings
from workflows.rules.errors import ValidationFailed

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

    @property
    def endpoint(self) -> str:
        """`host:port`, the port always named: the receiver that delivery caps
        and the circuit breaker count by (docs/webhooks.md, "Slow and failing
        receivers"). The scheme is left out: http and https to one host:port are
        one server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


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
    default = 443 if scheme == "https" else 80
    return Target(scheme, host, default if port is None else port, path)


def endpoint_of(url: str) -> str:
    """The endpoint (`Target.endpoint`) of a URL; "" for one that cannot be
    parsed (it is refused at send time without a connection: nothing to count)."""
    try:
        return target_parse(url).endpoint
    except TargetRefused:
        return ""


def _literal(host: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


# IPv6 ranges refused whatever `ipaddress.is_global` says — its answers differ
# by Python patch level (2002::/16 was "global" on 3.11.7, not on Debian's 3.11.2):
_NEVER_PUBLIC = tuple(ipaddress.ip_network(n) for n in (
    "::/96",            # IPv4-compatible (deprecated): ::127.0.0.1
    "fec0::/10",        # site-local (deprecated, still routed by some stacks)
    "64:ff9b:1::/48",   # NAT64, local use (RFC 8215)
    "2001:db8::/32", "3fff::/20",  # documentation
    "100::/64",         # discard-only
))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries to its destination: mapped
    (::ffff:a.b.c.d), 6to4 (2002:AABB:CCDD::), NAT64 (64:ff9b::a.b.c.d) and
    Teredo (2001::/32: its server and its de-obfuscated client)."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip in _NAT64:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.teredo is not None:
        return list(ip.teredo)
    return []


def _ipv4_is_public(ip: ipaddress.IPv4Address) -> bool:
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def address_is_public(address) -> bool:
    """Globally routable and unicast. An IPv6 address that carries an IPv4 one
    (mapped, 6to4, NAT64, Teredo) is judged by that IPv4 address — all of them,
    for Teredo; the deprecated, documentation and local-use ranges of
    `_NEVER_PUBLIC` are never public."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_is_public(ip)
    if any(ip in network for network in _NEVER_PUBLIC):
        return False
    embedded = _embedded_ipv4(ip)
    if embedded:
        return all(_ipv4_is_public(v4) for v4 in embedded)
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


_PORT_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


def ports_parse(spec: str) -> list[tuple[int, int]]:
    """`443, 8000-8999` as [(443, 443), (8000, 8999)]; ValueError saying what
    is wrong (a port outside 1-65535, a range backwards, anything else)."""
    ranges = []
    for part in (p.strip() for p in spec.split(",")):
        match = _PORT_RANGE.fullmatch(part)
        if not match:
            raise ValueError(f"{part!r} is not a port or a range of ports (80, 8000-8999)")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"{part!r} is not within 1-65535, low to high")
        ranges.append((low, high))
    return ranges


def ports_allowed() -> Callable[[int], bool]:
    """PILOT_WEBHOOK_PORTS as a test: `443,8000-8999`; unset: any port but 0.
    A malformed value allows none (fail closed; `check` reports it: pilot.E031)."""
    spec = pilot_settings.PILOT_WEBHOOK_PORTS
    if not spec:
        return lambda port: 0 < port <= 65535
    try:
        ranges = ports_parse(str(spec))
    except ValueError:
        return lambda port: False
    return lambda port: any(low <= port <= high for low, high in ranges)


def target_port_check(target: Target) -> None:
    """TargetRefused for a port PILOT_WEBHOOK_PORTS does not allow (and port 0)."""
    if not ports_allowed()(target.port):
        allowed = pilot_settings.PILOT_WEBHOOK_PORTS
        raise TargetRefused(f"port {target.port} is not allowed"
                            + (f" (PILOT_WEBHOOK_PORTS: {allowed})" if allowed else ""))


def _allow_private() -> bool:
    return bool(pilot_settings.PILOT_WEBHOOK_ALLOW_PRIVATE)


def target_addresses(target: Target) -> list[str]:
    """The addresses to connect to for `target`, every one of them checked;
    TargetRefused if the host does not resolve or any address it resolves to is
    not public (unless PILOT_WEBHOOK_ALLOW_PRIVATE). One name answering with a
    public and a private address is refused as a whole."""
    target_port_check(target)
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
                    "(private, loopback, link-local and reserved targets are refused; "
                    "PILOT_WEBHOOK_ALLOW_PRIVATE=true allows them, for a local run or a test)")
    return addresses


def target_validate(url, *, field: str = "callback_url") -> str:
    """The registration check (trigger, default endpoint): the URL as given, or
    ValidationFailed (400 `validation_error`, errors under `field`). Resolves the
    host (unless PILOT_WEBHOOK_ALLOW_PRIVATE, where nothing needs checking)."""
    try:
        target = target_parse(url)
        target_port_check(target)
        if not _allow_private():
            target_addresses(target)
    except TargetRefused as exc:
        raise _refusal(field, exc) from None
    return url


# Lookup threads of trigger-time checks alive at once, over every request of the
# process: a resolver that never answers holds at most these, and a request that
# finds none free defers its names to the sender instead of waiting.
MAX_LOOKUP_THREADS = 32
LOOKUP_THREADS_PER_CALL = 8
_lookup_slots = threading.BoundedSemaphore(MAX_LOOKUP_THREADS)


def _refusal(field: str, exc: TargetRefused) -> ValidationFailed:
    text = str(exc)
    return ValidationFailed(f"{field} {text}", errors={field: [f"{text[:1].upper()}{text[1:]}."]})


def _resolve_all(targets: list[Target], seconds: float) -> dict[Target, TargetRefused | None]:
    """Each target resolved and checked (`target_addresses`) by a few daemon
    threads, all within one deadline `seconds` from now: {target: None (public),
    or the refusal}; a target whose lookup had not finished is left out."""
    pending = list(reversed(targets))
    verdicts: dict[Target, TargetRefused | None] = {}
    lock = threading.Lock()

    def work() -> None:
        try:
            while True:
                with lock:
                    if not pending or time.monotonic() >= deadline:
                        return
                    target = pending.pop()
                try:
                    target_addresses(target)
                    verdict: TargetRefused | None = None
                except TargetRefused as exc:
                    verdict = exc
                with lock:
                    verdicts[target] = verdict
        finally:
            _lookup_slots.release()

    deadline = time.monotonic() + seconds
    threads = []
    for _ in range(min(LOOKUP_THREADS_PER_CALL, len(targets))):
        if not _lookup_slots.acquire(blocking=False):
            break
        thread = threading.Thread(target=work, name="pilot-callback-dns", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        pending.clear()  # threads still in a lookup take no other name
        return dict(verdicts)


def targets_check(urls, *, field: str = "callback_url") -> dict[str, str | ValidationFailed]:
    """The registration check of every distinct URL of one call (a trigger or a
    batch): {url: url, or the ValidationFailed it gets}. Syntax, port and IP
    literals are checked at once; host names are resolved together, within one
    deadline of PILOT_WEBHOOK_RESOLVE_SECONDS for the whole call — a name
    answering with a non-public address, or not resolving, is refused. A name
    whose lookup has not finished by then is accepted: the sender resolves it
    again at every attempt, checks every address and connects only to those
    (`target_addresses`), so deferring costs no safety, and no slow resolver
    holds the request longer than the deadline (`callback_checks_deferred`)."""
    results: dict[str, str | ValidationFailed] = {}
    names: dict[Target, list[str]] = {}
    for url in dict.fromkeys(u for u in urls if isinstance(u, str)):
        try:
            target = target_parse(url)
            target_port_check(target)
            if not _allow_private() and _literal(target.host) is not None:
                target_addresses(target)
        except TargetRefused as exc:
            results[url] = _refusal(field, exc)
            continue
        results[url] = url
        if not _allow_private() and _literal(target.host) is None:
            # One lookup per host and port, whatever the paths.
            names.setdefault(dataclasses.replace(target, scheme="http", path="/"),
                             []).append(url)
    if names:
        verdicts = _resolve_all(list(names),
                                float(pilot_settings.PILOT_WEBHOOK_RESOLVE_SECONDS))
        deferred = 0
        for target, target_urls in names.items():
            if target not in verdicts:
                deferred += 1
                continue
            verdict = verdicts[target]
            if verdict is not None:
                for url in target_urls:
                    results[url] = _refusal(field, verdict)
        if deferred:
            from workflows.observability.events import Event, emit

            emit(Event.CALLBACK_CHECKS_DEFERRED, count=deferred, of=len(names),
                 seconds=pilot_settings.PILOT_WEBHOOK_RESOLVE_SECONDS)
    return results
