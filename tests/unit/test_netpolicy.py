"""The network policy: which URLs the renderer and the webhook sender may reach. No I/O."""

from __future__ import annotations

import asyncio
import socket
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from server.netpolicy import NetworkPolicy, Resolver, Verdict, _getaddrinfo, classify
from server.netpolicy import origin as netpolicy_origin


async def never_called(host: str) -> list[str]:
    raise AssertionError(f"resolved {host!r} although the answer needed no DNS")


def resolver(table: dict[str, list[str]], asked: list[str] | None = None) -> Resolver:
    """A fake DNS: names in `table` resolve, anything else fails like getaddrinfo does."""

    async def resolve(host: str) -> list[str]:
        if asked is not None:
            asked.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


def decided(policy: NetworkPolicy, url: str) -> Verdict:
    """The static verdict, which must exist: these URLs need no DNS."""
    verdict = policy.check_url_static(url)
    assert verdict is not None, url
    return verdict


# (url, words the reason must contain); every one is decided without DNS.
BLOCKED = [
    # IPv4 literals
    ("http://127.0.0.1/", "127.0.0.1 is a loopback address"),
    ("https://127.255.255.254:8443/x", "loopback"),
    ("http://10.1.2.3/", "10.1.2.3 is a private address"),
    ("http://172.16.0.1/", "private"),
    ("http://172.31.255.255/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://169.254.10.1/", "169.254.10.1 is a link-local address"),
    ("http://100.100.100.200/", "cloud metadata"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://100.127.255.255/", "carrier-grade NAT"),
    ("http://0.0.0.0:8080/", "0.0.0.0 is an unspecified address"),
    ("http://224.0.0.1/", "multicast"),
    ("http://239.255.255.250/", "multicast"),
    ("http://255.255.255.255/", "broadcast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://192.0.2.1/", "reserved"),
    # IPv6 literals
    ("http://[::1]:8080/", "::1 is a loopback address"),
    ("http://[0:0:0:0:0:0:0:1]/", "loopback"),
    ("http://[::]/", ":: is an unspecified address"),
    ("http://[fc00::1]/", "private"),
    ("http://[fd12:3456::1]/", "private"),
    ("http://[fec0::1]/", "private"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("http://[FE80::ABCD]/", "link-local"),
    ("http://[fd00:ec2::254]/", "fd00:ec2::254 is a cloud metadata address"),
    ("http://[ff02::1]/", "multicast"),
    ("http://[2001:db8::1]/", "reserved"),
    ("http://[100::1]/", "reserved"),
    # IPv6 forms that carry an IPv4 address
    ("http://[::ffff:127.0.0.1]/", "loopback address (IPv4-mapped 127.0.0.1)"),
    ("http://[::ffff:7f00:1]/", "IPv4-mapped 127.0.0.1"),
    ("http://[::ffff:169.254.169.254]/", "cloud metadata"),
    ("http://[::ffff:10.0.0.1]/", "private"),
    ("http://[::127.0.0.1]/", "loopback address (IPv4-compatible 127.0.0.1)"),
    ("http://[::8.8.8.8]/", "reserved address (IPv4-compatible 8.8.8.8)"),
    ("http://[::ffff:0:10.0.0.1]/", "IPv4-translated 10.0.0.1"),
    ("http://[2002:7f00:1::]/", "loopback address (6to4 127.0.0.1)"),
    ("http://[2002:a00:1::1]/", "private address (6to4 10.0.0.1)"),
    ("http://[64:ff9b::10.0.0.1]/", "private address (NAT64 10.0.0.1)"),
    ("http://[64:ff9b::a9fe:a9fe]/", "cloud metadata address (NAT64 169.254.169.254)"),
    ("http://[64:ff9b:1::8.8.8.8]/", "private"),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "Teredo"),
    ("http://[2001::1]/", "Teredo"),
    # numeric IPv4 forms Chromium normalises
    ("http://2130706433/", "127.0.0.1 is a loopback address"),
    ("http://0x7f.1/", "127.0.0.1 is a loopback address"),
    ("http://0X7F.1/", "127.0.0.1"),
    ("http://0x7f000001/", "127.0.0.1"),
    ("http://017700000001/", "127.0.0.1"),
    ("http://0177.0.0.1/", "127.0.0.1"),
    ("http://127.000.000.001/", "127.0.0.1"),
    ("http://127.1/", "127.0.0.1"),
    ("http://127.0.1/", "127.0.0.1"),
    ("http://127.0.0.1./", "127.0.0.1"),
    ("http://0/", "0.0.0.0 is an unspecified address"),
    ("http://0x0a.0.0.1/", "10.0.0.1 is a private address"),
    ("http://3232235777/", "192.168.1.1 is a private address"),
    ("http://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254 is a cloud metadata address"),
    ("http://%31%32%37.0.0.1/", "127.0.0.1"),
    ("http://127.0.0.%31/", "127.0.0.1"),
    ("http://0x00000000000000000000000000000000000000007f000001/", "127.0.0.1"),
    # names that never reach DNS
    ("http://localhost/", "localhost is a loopback host name"),
    ("http://LOCALHOST:3000/", "localhost is a loopback host name"),
    ("http://localhost./", "loopback host name"),
    ("http://localhost../", "loopback host name"),
    ("http://app.localhost/", "app.localhost is a loopback host name"),
    ("http://a.b.LocalHost./", "loopback host name"),
    ("http://lo%63alhost/", "loopback host name"),
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata host name"),
    ("http://Metadata.Google.Internal./", "cloud metadata host name"),
    # the authority as Chromium reads it
    ("http://evil@127.0.0.1/", "127.0.0.1 is a loopback address"),
    ("http://user:pass@10.0.0.1:8080/", "10.0.0.1 is a private address"),
    ("http://good.example.com@127.0.0.1/", "loopback"),
    ("http://a@b@[::1]/", "loopback"),
    ("http:127.0.0.1/", "loopback"),
    ("http:/127.0.0.1/", "loopback"),
    ("http:///127.0.0.1/", "loopback"),
    ("http:\\\\127.0.0.1\\x", "loopback"),
    ("HTTP://127.0.0.1/", "loopback"),
    ("  http://127.0.0.1/ ", "loopback"),
    ("ht\ttp://127.0.\n0.1/", "loopback"),
    ("http://127.0.0.1?x", "loopback"),
    ("http://127.0.0.1#x", "loopback"),
    # URLs Chromium would refuse to fetch at all
    ("http:///", "URL has no host"),
    ("http://user@/", "URL has no host"),
    ("http://:80/", "URL has no host"),
    ("http://1.2.3.4.5/", "invalid IPv4 host"),
    ("http://256.0.0.1/", "invalid IPv4 host"),
    ("http://1.2.3.256/", "invalid IPv4 host"),
    ("http://4294967296/", "invalid IPv4 host"),
    ("http://09.0.0.1/", "invalid IPv4 host"),
    ("http://foo.1/", "invalid IPv4 host"),
    ("http://[::1/", "invalid host"),
    ("http://[::1]x/", "invalid host"),
    ("http://[fe80::1%25eth0]/", "invalid IPv6 host"),
    ("http://[127.0.0.1]/", "invalid IPv6 host"),
    ("http://::1/", "URL has no host"),
    ("http://127.0.0.1:99999/", "invalid port"),
    ("http://127.0.0.1:8o/", "invalid port"),
    ("http://exa mple.com/", "invalid host"),
    ("http://ex%zzample.com/", "invalid host"),
    ("http://...", "invalid host"),
    ("http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/", "non-ASCII host"),
    ("http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/", "non-ASCII host"),
    ("http://stra%C3%9Fe.example/", "non-ASCII host"),
    ("/relative/path.png", "not an absolute URL"),
    ("", "not an absolute URL"),
    # schemes
    ("file:///etc/passwd", "the file: scheme is not allowed"),
    ("FILE:///etc/passwd", "the file: scheme is not allowed"),
    ("file://localhost/etc/passwd", "file: scheme"),
    ("ftp://example.com/a.png", "the ftp: scheme is not allowed"),
    ("javascript:alert(1)", "the javascript: scheme is not allowed"),
    (" java\tscript:alert(1)", "the javascript: scheme is not allowed"),
    ("chrome://settings", "the chrome: scheme is not allowed"),
    ("chrome-extension://abc/x.js", "chrome-extension: scheme"),
    ("view-source:http://example.com/", "view-source: scheme"),
    ("ws://example.com/socket", "the ws: scheme is not allowed"),
    ("gopher://127.0.0.1:6379/_INFO", "gopher: scheme"),
    ("jar:http://example.com/a.jar!/", "jar: scheme"),
]

ALLOWED_STATICALLY = [
    "data:text/plain,hello",
    "DATA:image/png;base64,iVBORw0KGgo=",
    "da\nta:text/plain,x",
    "blob:https://example.com/7c2e1c0e-4b1f-4c53-8a53-1b2f0c6e9d21",
    "about:blank",
    "about:srcdoc",
    "http://8.8.8.8/",
    "https://1.1.1.1:443/dns-query",
    "http://134744072/",  # 8.8.8.8 spelled as one number
    "http://[2606:4700:4700::1111]/",
    "http://[::ffff:8.8.8.8]/",
    "http://[2002:808:808::1]/",
    "http://[64:ff9b::8.8.8.8]/",
    "http://100.63.255.255/",
    "http://100.128.0.1/",
    "http://172.32.0.1/",
]

NEEDS_DNS = [
    "http://example.com/",
    "https://cdn.example.org:8443/font.woff2",
    "https://EXAMPLE.com./",
    "http://127.0.0.1.nip.io/",
    "http://1.2.3.x/",
    "http://localhost.example.com/",
    "http://metadata/",
    "http://xn--strae-oqa.example/",
]


@pytest.mark.parametrize(("url", "reason"), BLOCKED)
async def test_blocked_without_dns(url: str, reason: str) -> None:
    policy = NetworkPolicy()
    static = policy.check_url_static(url)
    assert static is not None and not static.allowed
    assert static.reason.startswith("blocked: ")
    assert reason in static.reason
    assert await policy.check_url(url, resolve=never_called) == static


@pytest.mark.parametrize("url", ALLOWED_STATICALLY)
async def test_allowed_without_dns(url: str) -> None:
    policy = NetworkPolicy()
    assert policy.check_url_static(url) == Verdict(True, "")
    assert await policy.check_url(url, resolve=never_called) == Verdict(True, "")


@pytest.mark.parametrize("url", NEEDS_DNS)
def test_names_need_dns(url: str) -> None:
    assert NetworkPolicy().check_url_static(url) is None


async def test_public_name_is_allowed() -> None:
    asked: list[str] = []
    dns = resolver(
        {"example.com": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]}, asked
    )
    verdict = await NetworkPolicy().check_url("https://Example.COM/logo.png", resolve=dns)
    assert verdict == Verdict(True, "")
    assert asked == ["example.com"]


@pytest.mark.parametrize(
    ("addresses", "reason"),
    [
        (["93.184.215.14", "10.0.0.7"], "internal.example resolves to 10.0.0.7, a private address"),
        (["10.0.0.7", "93.184.215.14"], "resolves to 10.0.0.7, a private address"),
        (["2606:4700::1", "::1"], "resolves to ::1, a loopback address"),
        (["169.254.169.254"], "resolves to 169.254.169.254, a cloud metadata address"),
        (["fe80::1%eth0"], "resolves to fe80::1, a link-local address"),
        (["::ffff:192.168.0.1"], "a private address (IPv4-mapped 192.168.0.1)"),
        (["not-an-address"], "'not-an-address' is not an IP address"),
    ],
)
async def test_name_is_blocked_if_any_address_is(addresses: list[str], reason: str) -> None:
    dns = resolver({"internal.example": addresses})
    verdict = await NetworkPolicy().check_url("http://internal.example/a.css", resolve=dns)
    assert not verdict.allowed
    assert reason in verdict.reason


async def test_dns_failure_is_unresolved_not_blocked() -> None:
    verdict = await NetworkPolicy().check_url("http://nowhere.invalid/", resolve=resolver({}))
    assert verdict == Verdict(False, "could not resolve nowhere.invalid", unresolved=True)
    # The real resolver: a name under .invalid never resolves (RFC 2606).
    verdict, addresses = await NetworkPolicy().resolve("nowhere.invalid")
    assert verdict == Verdict(False, "could not resolve nowhere.invalid", unresolved=True)
    assert addresses == []


async def test_empty_answer_is_unresolved() -> None:
    dns = resolver({"empty.example": []})
    verdict = await NetworkPolicy().check_url("http://empty.example/", resolve=dns)
    assert verdict == Verdict(False, "could not resolve empty.example", unresolved=True)


async def test_slow_dns_is_unresolved() -> None:
    async def hangs(host: str) -> list[str]:
        await asyncio.Event().wait()
        return []

    policy = NetworkPolicy(resolve_timeout_s=0.01)
    verdict = await policy.check_url("http://slow.example/", resolve=hangs)
    assert verdict == Verdict(False, "could not resolve slow.example", unresolved=True)


async def test_default_resolver_returns_plain_address_strings() -> None:
    # A numeric host is answered by getaddrinfo itself, without asking any DNS server.
    assert await _getaddrinfo("127.0.0.1") == ["127.0.0.1"]


async def test_the_host_resolved_is_the_host_chromium_fetches() -> None:
    asked: list[str] = []
    dns = resolver({"evil.example": ["93.184.215.14"], "intranet.": ["93.184.215.15"]}, asked)
    policy = NetworkPolicy()
    # A backslash ends the authority, so the "@127.0.0.1" part is path, not host.
    assert (await policy.check_url("http://evil.example\\@127.0.0.1/", resolve=dns)).allowed
    # A trailing dot stays: "intranet." must not pick up resolv.conf search domains.
    assert (await policy.check_url("http://intranet./", resolve=dns)).allowed
    assert asked == ["evil.example", "intranet."]


@pytest.mark.parametrize(
    ("ip", "category"),
    [
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "carrier-grade-nat"),
        ("224.0.0.251", "multicast"),
        ("ff05::1:3", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:8.8.8.8", None),
        ("2002:c0a8:101::", "private"),
        ("64:ff9b::7f00:1", "loopback"),
    ],
)
def test_classify(ip: str, category: str | None) -> None:
    assert classify(ip_address(ip)) == category


def test_check_address_reasons() -> None:
    policy = NetworkPolicy()
    assert policy.check_address(IPv4Address("10.0.0.1")) == Verdict(
        False,
        "blocked: 10.0.0.1 is a private address; allow it with PRESSROOM_ALLOW_HOSTS=10.0.0.1",
    )
    assert policy.check_address("10.0.0.1", host="DB.internal.") == Verdict(
        False,
        "blocked: db.internal resolves to 10.0.0.1, a private address;"
        " allow it with PRESSROOM_ALLOW_HOSTS=db.internal",
    )
    assert policy.check_address(IPv6Address("2606:4700::1"), host="cdn.example") == Verdict(
        True, ""
    )
    assert policy.check_address("[::1]").reason == (
        "blocked: ::1 is a loopback address; allow it with PRESSROOM_ALLOW_HOSTS=::1"
    )


@pytest.mark.parametrize(
    ("url", "entry"),
    [
        ("http://10.0.0.1/", "10.0.0.1"),
        ("http://127.1:8080/", "127.0.0.1"),
        ("http://[::1]/", "::1"),
        ("http://[::ffff:192.168.0.9]/", "192.168.0.9"),
        ("http://[fe80::1]/", "fe80::1"),
        ("http://198.18.0.7/", "198.18.0.7"),
        ("http://localhost:3000/", "localhost"),
        ("http://app.localhost/", "app.localhost"),
        ("http://intranet.corp/", "intranet.corp"),
    ],
)
async def test_a_refused_address_names_the_entry_that_allows_it(url: str, entry: str) -> None:
    dns = resolver({"intranet.corp": ["10.20.0.4"]})
    refused = await NetworkPolicy().check_url(url, resolve=dns)
    assert refused.reason.endswith(f"; allow it with PRESSROOM_ALLOW_HOSTS={entry}"), refused
    assert (await NetworkPolicy([entry]).check_url(url, resolve=dns)).allowed


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/", "http://metadata.google.internal/", "file:///x"]
)
def test_metadata_and_other_schemes_are_refused_without_an_allow_hint(url: str) -> None:
    # The metadata endpoint hands out the machine's credentials: nothing suggests opening it.
    reason = decided(NetworkPolicy(), url).reason
    assert reason.startswith("blocked: ") and "PRESSROOM_ALLOW_HOSTS" not in reason


async def test_allow_by_name() -> None:
    policy = NetworkPolicy(["host.internal"])
    for url in ("http://host.internal:8080/", "http://HOST.INTERNAL./x"):
        assert policy.check_url_static(url) == Verdict(True, "")
        # An allow-listed name is trusted whatever it resolves to.
        assert await policy.check_url(url, resolve=never_called) == Verdict(True, "")
    assert policy.check_address("10.0.0.5", host="host.internal").allowed
    assert policy.check_url_static("http://sub.host.internal/") is None
    assert policy.validate_webhook_url("http://host.internal:9000/hook") is None


@pytest.mark.parametrize("entry", ["*.example.com", ".example.com", "*.EXAMPLE.com."])
async def test_allow_by_wildcard(entry: str) -> None:
    policy = NetworkPolicy([entry])
    assert policy.check_url_static("http://a.example.com/") == Verdict(True, "")
    assert policy.check_url_static("http://a.b.Example.com./") == Verdict(True, "")
    # The wildcard covers subdomains only, and only on a label boundary.
    dns = resolver({"example.com": ["10.0.0.1"], "badexample.com": ["10.0.0.2"]})
    assert not (await policy.check_url("http://example.com/", resolve=dns)).allowed
    assert not (await policy.check_url("http://badexample.com/", resolve=dns)).allowed


async def test_allow_by_ip() -> None:
    policy = NetworkPolicy(["127.0.0.1"])
    for url in ("http://127.0.0.1:5000/", "http://2130706433/", "http://[::ffff:127.0.0.1]/"):
        assert policy.check_url_static(url) == Verdict(True, "")
    assert policy.check_url_static("http://127.0.0.2/") == Verdict(
        False,
        "blocked: 127.0.0.2 is a loopback address; allow it with PRESSROOM_ALLOW_HOSTS=127.0.0.2",
    )
    # Only the IPv4-mapped form is the same socket; other embeddings need their own entry.
    assert not decided(policy, "http://[::127.0.0.1]/").allowed
    assert not decided(policy, "http://[2002:7f00:1::]/").allowed
    assert not decided(policy, "http://[64:ff9b::127.0.0.1]/").allowed
    dns = resolver({"dev.example": ["127.0.0.1"]})
    assert await policy.check_url("http://dev.example/", resolve=dns) == Verdict(True, "")


@pytest.mark.parametrize("entry", ["::1", "[::1]", "::1/128"])
def test_allow_by_ipv6(entry: str) -> None:
    policy = NetworkPolicy([entry])
    assert policy.check_url_static("http://[::1]:8080/") == Verdict(True, "")
    assert not decided(policy, "http://127.0.0.1/").allowed


async def test_allow_by_cidr() -> None:
    policy = NetworkPolicy(["10.0.0.0/8", "fd00::/8"])
    assert policy.check_url_static("http://10.9.8.7/") == Verdict(True, "")
    assert policy.check_url_static("http://[fd12::1]/") == Verdict(True, "")
    assert not decided(policy, "http://192.168.1.1/").allowed
    dns = resolver({"build.corp": ["10.1.1.1"], "mixed.corp": ["10.1.1.1", "192.168.1.1"]})
    assert await policy.check_url("http://build.corp/", resolve=dns) == Verdict(True, "")
    mixed = await policy.check_url("http://mixed.corp/", resolve=dns)
    assert mixed.reason.startswith(
        "blocked: mixed.corp resolves to 192.168.1.1, a private address; allow it with"
    )


def test_localhost_needs_both_loopbacks_or_the_name() -> None:
    url = "http://localhost:3000/"
    assert NetworkPolicy(["localhost"]).check_url_static(url) == Verdict(True, "")
    assert NetworkPolicy(["127.0.0.0/8", "::1"]).check_url_static(url) == Verdict(True, "")
    # Chromium may pick ::1 for localhost, which allowing 127.0.0.1 alone does not cover.
    assert not decided(NetworkPolicy(["127.0.0.1"]), url).allowed


def test_allow_list_ignores_blank_entries() -> None:
    policy = NetworkPolicy(["", "  ", " Host.Internal "])
    assert policy.check_url_static("http://host.internal/") == Verdict(True, "")
    assert not decided(policy, "http://10.0.0.1/").allowed


@pytest.mark.parametrize(
    "entry", ["host.internal:8080", "exa mple.com", "*", "*.", "300.1.1.1", "10.0.0.0/33", "a/b"]
)
def test_bad_allow_list_entries_fail_fast(entry: str) -> None:
    with pytest.raises(ValueError, match="allow-list entry"):
        NetworkPolicy([entry])


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://hooks.example.com/pressroom", None),
        ("http://hooks.example.com:8080/x?y=1", None),
        ("https://8.8.8.8/hook", None),
        ("ftp://example.com/", "webhook URL must use http or https"),
        ("javascript:alert(1)", "webhook URL must use http or https"),
        ("data:text/plain,x", "webhook URL must use http or https"),
        ("hooks.example.com/x", "webhook URL is not an absolute URL"),
        ("https://", "webhook URL has no host"),
        ("https://?x", "webhook URL has no host"),
        ("http:///hook", "webhook URL has no host"),
        ("https:///x", "webhook URL has no host"),
        ("https:////hooks.example.com/x", "webhook URL has no host"),
        ("http:/hooks.example.com/x", "webhook URL has no host"),
        ("http:hooks.example.com", "webhook URL has no host"),
        ("http://", "webhook URL has no host"),
        ("http://:80/", "webhook URL has no host"),
        ("http://user@/x", "webhook URL has no host"),
        ("https://#frag", "webhook URL has no host"),
        ("HTTPS://hooks.example.com/x", None),
        ("https://user:pass@example.com/", "webhook URL must not contain credentials"),
        ("https://token@example.com/", "webhook URL must not contain credentials"),
        ("https://example.com:70000/", "webhook URL has an invalid port"),
        ("https://example.com/" + "a" * 2029, "webhook URL must be at most 2048 characters"),
        ("https://example.com\\@10.0.0.1/", "webhook URL must be ASCII without spaces"),
        ("https://exa mple.com/", "webhook URL must be ASCII without spaces"),
        ("https://exämple.com/", "webhook URL must be ASCII without spaces"),
        ("https://example.com/\n", "webhook URL must be ASCII without spaces"),
        ("https://10.0.0.1/", "webhook URL is not allowed: 10.0.0.1 is a private address"),
        ("http://localhost:8000/", "webhook URL is not allowed: localhost is a loopback host name"),
        ("http://0x7f.1/", "webhook URL is not allowed: 127.0.0.1 is a loopback address"),
        ("http://[::ffff:169.254.169.254]/", "webhook URL is not allowed: ::ffff:a9fe:a9fe is"),
        ("http://1.2.3.4.5/", "webhook URL has an invalid IPv4 host '1.2.3.4.5'"),
    ],
)
def test_validate_webhook_url(url: str, error: str | None) -> None:
    message = NetworkPolicy().validate_webhook_url(url)
    if error is None:
        assert message is None
    else:
        assert message is not None and message.startswith(error)


def test_validate_webhook_url_length_limit_is_inclusive() -> None:
    url = "https://example.com/" + "a" * (2048 - len("https://example.com/"))
    assert len(url) == 2048
    assert NetworkPolicy().validate_webhook_url(url) is None


def test_validate_webhook_url_honours_the_allow_list() -> None:
    policy = NetworkPolicy(["localhost", "10.0.0.0/8"])
    assert policy.validate_webhook_url("http://localhost:8000/hook") is None
    assert policy.validate_webhook_url("http://10.1.2.3/hook") is None
    assert policy.validate_webhook_url("http://192.168.0.1/hook") is not None


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://pages.example/invoice?id=7", None),
        ("http://pages.example:8080/", None),
        ("file:///etc/passwd", "page_url must use http or https"),
        ("javascript:alert(1)", "page_url must use http or https"),
        ("ftp://pages.example/", "page_url must use http or https"),
        ("http://127.0.0.1/", "page_url is not allowed: 127.0.0.1 is a loopback address"),
        ("http://0x7f.1/", "page_url is not allowed: 127.0.0.1 is a loopback address"),
        ("http://[::ffff:10.0.0.1]/", "page_url is not allowed: ::ffff:a00:1 is a private"),
        ("http://172.16.4.4/", "page_url is not allowed: 172.16.4.4 is a private address"),
        ("http://169.254.169.254/", "page_url is not allowed: 169.254.169.254 is a cloud"),
        ("http://[fd00:ec2::254]/", "page_url is not allowed: fd00:ec2::254 is a cloud"),
        ("https://a:b@pages.example/", "page_url must not contain credentials"),
        ("http:///x", "page_url has no host"),
        ("https://pages.example/" + "x" * 8192, "page_url must be at most 8192 characters"),
    ],
)
def test_validate_page_url(url: str, error: str | None) -> None:
    why = NetworkPolicy().validate_page_url(url)
    assert why == error if error is None else why is not None and why.startswith(error), why


def test_validate_page_url_honours_the_allow_list() -> None:
    assert NetworkPolicy(["127.0.0.1"]).validate_page_url("http://127.0.0.1:8080/x") is None


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Pages.Example:80/a?b#c", "http://pages.example"),
        ("https://pages.example:443", "https://pages.example"),
        ("https://pages.example:8443/x", "https://pages.example:8443"),
        ("http://2130706433:8080/", "http://127.0.0.1:8080"),
        ("http://[0:0::1]:81/", "http://[::1]:81"),
        ("data:text/html,x", None),
        ("http://", None),
    ],
)
def test_origin_is_written_as_chromium_writes_request_urls(url: str, origin: str | None) -> None:
    assert netpolicy_origin(url) == origin
