"""Where a webhook may go: http(s) URLs to public addresses only, checked at
registration and again at each send (workflows/webhooks/targets.py)."""

import pytest
from django.test import override_settings

from workflows.rules.errors import ValidationFailed
from workflows.webhooks.targets import (
    TargetRefused,
    address_is_public,
    target_addresses,
    target_parse,
    target_validate,
    targets_check,
)


@pytest.mark.parametrize("url, parts", [
    ("https://hooks.example.com/pilot?x=1", ("https", "hooks.example.com", 443, "/pilot?x=1")),
    ("http://hooks.example.com", ("http", "hooks.example.com", 80, "/")),
    ("HTTPS://Hooks.Example.com:8443/a/b", ("https", "hooks.example.com", 8443, "/a/b")),
    ("http://[2606:4700::1111]:8080/x", ("http", "2606:4700::1111", 8080, "/x")),
    ("http://93.184.216.34/h#frag", ("http", "93.184.216.34", 80, "/h")),
])
def test_an_http_or_https_url_is_taken_apart(url, parts):
    target = target_parse(url)
    assert (target.scheme, target.host, target.port, target.path) == parts


def test_the_host_header_names_the_host_and_a_port_only_when_it_is_not_the_default():
    assert target_parse("https://a.example.com/x").host_header == "a.example.com"
    assert target_parse("http://a.example.com:8080/x").host_header == "a.example.com:8080"
    assert target_parse("http://[::1]:81/").host_header == "[::1]:81"


@pytest.mark.parametrize("url, reason", [
    ("", "non-empty"),
    (42, "non-empty string"),
    ("ftp://files.example.com/x", "http:// or https://"),
    ("javascript:alert(1)", "http:// or https://"),
    ("file:///etc/passwd", "http:// or https://"),
    ("https://user:secret@hooks.example.com/", "credentials"),
    ("https:///path-only", "must name a host"),
    ("https://hooks.example.com:99999/", "not a valid URL"),
    ("https://hooks.example.com/a b", "visible ASCII"),
    ("https://hooks.example.com/\x00", "visible ASCII"),
    ("https://bücher.example/", "visible ASCII"),
    ("https://h.example.com/" + "a" * 2000, "at most 2000"),
])
def test_anything_else_is_refused_with_the_reason(url, reason):
    with pytest.raises(TargetRefused, match=reason):
        target_parse(url)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::",
    "fe80::1", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2001:db8::1",
])
def test_private_loopback_link_local_and_other_non_public_addresses_are_not_public(address):
    assert not address_is_public(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700::1111",
                                     "::ffff:93.184.216.34"])
def test_globally_routable_unicast_addresses_are_public(address):
    assert address_is_public(address)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/", "http://localhost:9/hook",
                                 "https://169.254.169.254/latest/meta-data",
                                 "http://[::1]/", "http://10.0.0.8/"])
def test_a_non_public_target_is_refused_unless_allowed(url):
    with override_settings(PILOT_WEBHOOK_ALLOW_PRIVATE=False):
        with pytest.raises(TargetRefused, match="not a public address"):
            target_addresses(target_parse(url))
        with pytest.raises(ValidationFailed) as refused:
            target_validate(url)
    assert refused.value.code == "validation_error"
    assert "not a public address" in refused.value.errors["callback_url"][0]
    with override_settings(PILOT_WEBHOOK_ALLOW_PRIVATE=True):
        assert target_validate(url) == url
        assert target_addresses(target_parse(url))


def test_a_public_literal_needs_no_lookup_and_an_unknown_name_does_not_resolve():
    with override_settings(PILOT_WEBHOOK_ALLOW_PRIVATE=False):
        assert target_addresses(target_parse("https://93.184.216.34/x")) == ["93.184.216.34"]
        with pytest.raises(TargetRefused, match="does not resolve"):
            target_addresses(target_parse("https://no-such-host.invalid/x"))


def test_a_refusal_names_the_field_it_is_about():
    with pytest.raises(ValidationFailed) as refused:
        target_validate("ftp://x.example.com/", field="webhook")
    assert set(refused.value.errors) == {"webhook"}
    assert refused.value.detail.startswith("webhook must be an http")


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32) for a server and a client, the client's
    address obfuscated (inverted) as RFC 4380 says."""
    import ipaddress

    value = (0x20010000 << 96) | (int(ipaddress.IPv4Address(server)) << 64) \
        | (0xFFFFFFFF ^ int(ipaddress.IPv4Address(client)))
    return str(ipaddress.IPv6Address(value))


@pytest.mark.parametrize("address", [
    "2002:7f00:1::", "2002:a9fe:a9fe::", "2002:a00:1::1", "2002:c0a8:101::",  # 6to4
    teredo("65.54.227.120", "127.0.0.1"), teredo("10.0.0.1", "8.8.8.8"),     # Teredo
    teredo("65.54.227.120", "169.254.169.254"),
    "fec0::1", "fec0:0:0:ffff::1", "feff::1",                                  # site-local
    "::127.0.0.1", "::10.0.0.1", "::8.8.8.8",                                  # IPv4-compatible
    "::ffff:7f00:1", "::ffff:169.254.169.254",                                 # IPv4-mapped
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1",                 # NAT64
    "64:ff9b:1::808:808", "3fff::1", "100::1",                     # local-use NAT64, docs, discard
])
def test_every_special_ipv6_range_is_judged_by_what_it_reaches(address):
    """Whatever this Python's `ipaddress.is_global` says (3.11.7 called 6to4 and
    site-local addresses global): issue 31, N7."""
    assert not address_is_public(address)
    with override_settings(PILOT_WEBHOOK_ALLOW_PRIVATE=False), \
            pytest.raises(ValidationFailed, match="not a public address"):
        target_validate(f"http://[{address}]/")


@pytest.mark.parametrize("address", ["2002:808:808::", "64:ff9b::808:808",
                                     teredo("65.54.227.120", "8.8.4.4")])
def test_a_6to4_nat64_or_teredo_address_of_a_public_ipv4_is_public(address):
    assert address_is_public(address)


def test_port_zero_is_refused_and_the_port_allow_list_holds(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(ValidationFailed, match="port 0 is not allowed"):
        target_validate("http://8.8.8.8:0/")
    assert target_validate("http://8.8.8.8:6379/") == "http://8.8.8.8:6379/"
    settings.PILOT_WEBHOOK_PORTS = "443, 8000-8999"
    for url in ("http://8.8.8.8:6379/", "http://8.8.8.8/", "https://8.8.8.8:9000/"):
        with pytest.raises(ValidationFailed, match="PILOT_WEBHOOK_PORTS: 443, 8000-8999"):
            target_validate(url)
    for url in ("https://8.8.8.8/", "http://8.8.8.8:8000/", "https://8.8.8.8:8999/x"):
        assert target_validate(url) == url
    with pytest.raises(TargetRefused, match="port 6379"):  # at send time too
        target_addresses(target_parse("http://8.8.8.8:6379/"))
    checked = targets_check(["http://8.8.8.8:6379/", "https://8.8.8.8/"])
    assert isinstance(checked["http://8.8.8.8:6379/"], ValidationFailed)
    assert checked["https://8.8.8.8/"] == "https://8.8.8.8/"


@pytest.mark.parametrize("spec", ["http", "0", "70000", "9000-8000", "443,,80", " - "])
def test_a_malformed_port_list_is_a_check_error_and_refuses_every_port(settings, spec):
    from workflows.checks import pilot_webhook_egress

    settings.PILOT_WEBHOOK_PORTS = spec
    assert [e.id for e in pilot_webhook_egress(None)] == ["pilot.E031"]
    with pytest.raises(ValidationFailed, match="not allowed"):
        target_validate("https://8.8.8.8/")


@pytest.mark.parametrize("proxy, ok", [("http://proxy.internal:3128", True),
                                       ("https://proxy.internal:3128", False),
                                       ("proxy.internal:3128", False), ("http://:99", False),
                                       ("http://p:99999", False)])
def test_the_proxy_setting_must_be_an_http_url(settings, proxy, ok):
    from workflows.checks import pilot_webhook_egress

    settings.PILOT_WEBHOOK_PROXY = proxy
    assert [e.id for e in pilot_webhook_egress(None)] == ([] if ok else ["pilot.E032"])
