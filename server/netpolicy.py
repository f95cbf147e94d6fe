"""Whether the renderer (through its egress gate, server/render/egress.py) or the webhook sender may
reach a URL or an address.

URLs are read the way Chromium's WHATWG parser reads them (numeric IPv4 forms, backslashes,
percent-encoded hosts), so the host judged here is the host that would be fetched. Names are
resolved on every check and nothing is cached here: a cache would only widen the window in
which a DNS change goes unnoticed, and the OS resolver already caches what it safely can.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)
from urllib.parse import unquote_to_bytes

Resolver = Callable[[str], Awaitable[list[str]]]

MAX_WEBHOOK_URL_CHARS = 2048
MAX_PAGE_URL_CHARS = 8192
DEFAULT_RESOLVE_TIMEOUT_S = 5.0

_NETWORK_SCHEMES = frozenset({"http", "https"})
# These never touch the network: data is inline, blob is in-memory, about is blank/srcdoc.
_LOCAL_SCHEMES = frozenset({"data", "blob", "about"})

_METADATA_NAMES = frozenset({"metadata.google.internal"})
_V6_LOOPBACK = IPv6Address("::1")
_LOCALHOST_ADDRESSES = (IPv4Address("127.0.0.1"), _V6_LOOPBACK)

_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*):")
_AUTHORITY_END = re.compile(r"[/\\?#]")
# "scheme://" and the first character of a host, as a webhook URL must be written.
_WRITTEN_AUTHORITY = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://[^/?#]")
# Stricter than WHATWG on purpose: anything odd in a host is refused rather than interpreted.
_HOST_NAME = re.compile(r"[a-z0-9._\-]+")
_C0_AND_SPACE = "".join(chr(code) for code in range(0x21))
_DROP_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")
_RADIX_DIGITS = {
    8: frozenset("01234567"),
    10: frozenset("0123456789"),
    16: frozenset("0123456789abcdefABCDEF"),
}

_V4_TABLE: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(cidr), category)
    for cidr, category in (
        # Metadata endpoints first: they sit inside the link-local and CGNAT ranges.
        ("169.254.169.254/32", "metadata"),
        ("100.100.100.200/32", "metadata"),
        ("0.0.0.0/8", "unspecified"),
        ("127.0.0.0/8", "loopback"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("169.254.0.0/16", "link-local"),
        ("100.64.0.0/10", "carrier-grade-nat"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "reserved"),
        ("192.88.99.0/24", "reserved"),
        ("198.18.0.0/15", "reserved"),
        ("198.51.100.0/24", "reserved"),
        ("203.0.113.0/24", "reserved"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    )
)

_V6_TABLE: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(cidr), category)
    for cidr, category in (
        ("fd00:ec2::254/128", "metadata"),
        ("fc00::/7", "private"),
        ("fe80::/10", "link-local"),
        # Deprecated site-local scope: as internal as unique-local.
        ("fec0::/10", "private"),
        ("ff00::/8", "multicast"),
        # RFC 8215 local-use NAT64 translates into the operator's own network.
        ("64:ff9b:1::/48", "private"),
        ("100::/64", "reserved"),
        ("2001::/23", "reserved"),
        ("2001:db8::/32", "reserved"),
        ("3fff::/20", "reserved"),
        ("5f00::/16", "reserved"),
    )
)
_V6_GLOBAL_UNICAST = IPv6Network("2000::/3")
_V6_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
_V6_NAT64 = IPv6Network("64:ff9b::/96")
_V6_COMPATIBLE = IPv6Network("::/96")

_ADDRESS_KIND = {
    "unspecified": "an unspecified",
    "loopback": "a loopback",
    "private": "a private",
    "link-local": "a link-local",
    "metadata": "a cloud metadata",
    "carrier-grade-nat": "a carrier-grade NAT",
    "multicast": "a multicast",
    "broadcast": "a broadcast",
    "reserved": "a reserved",
}


#: The setting whose entries the block gives way to: refusals of an address name it.
ALLOW_SETTING = "PRESSROOM_ALLOW_HOSTS"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one URL or address; `reason` is empty when allowed. `unresolved`: the
    host name did not resolve, a network failure worth another try rather than a refusal."""

    allowed: bool
    reason: str
    unresolved: bool = False


ALLOWED = Verdict(True, "")


def _blocked(detail: str) -> Verdict:
    return Verdict(False, f"blocked: {detail}")


def _blocked_host(detail: str, category: str, entry: str) -> Verdict:
    """A refusal of an internal address or name, saying which allow-list entry would let it
    through; none for a cloud metadata endpoint, which hands out the machine's credentials."""
    if category == "metadata":
        return _blocked(detail)
    return _blocked(f"{detail}; allow it with {ALLOW_SETTING}={entry}")


#: How an `unresolved` verdict's reason begins; the name follows.
UNRESOLVED = "could not resolve"


def _unresolved(name: str) -> Verdict:
    return Verdict(False, f"{UNRESOLVED} {name}", unresolved=True)


def classify(ip: IPv4Address | IPv6Address) -> str | None:
    """The kind of non-public address `ip` is ("loopback", "private", "metadata", ...), or None."""
    found = _classify(ip)
    return None if found is None else found[0]


def _classify(ip: IPv4Address | IPv6Address) -> tuple[str, str] | None:
    """(category, note about an embedded IPv4 address) for a non-public address, else None."""
    if isinstance(ip, IPv4Address):
        category = _classify_v4(ip)
        return None if category is None else (category, "")
    if ip == _V6_LOOPBACK:
        return ("loopback", "")
    if int(ip) == 0:
        return ("unspecified", "")
    embedded = _embedded_v4(ip)
    if embedded is not None:
        v4, form, routes_to_v4 = embedded
        inner = _classify_v4(v4)
        if inner is not None:
            return (inner, f"{form} {v4}")
        # Only forms that really deliver to the embedded address are as public as it is.
        return None if routes_to_v4 else ("reserved", f"{form} {v4}")
    if ip.teredo is not None:
        # Reached only through a relay; no reason for a PDF or a webhook to go there.
        for v4 in ip.teredo:
            inner = _classify_v4(v4)
            if inner is not None:
                return (inner, f"Teredo {v4}")
        return ("reserved", "Teredo")
    for network, category in _V6_TABLE:
        if ip in network:
            return (category, "")
    if ip not in _V6_GLOBAL_UNICAST:
        return ("reserved", "")
    return None


def _classify_v4(ip: IPv4Address) -> str | None:
    for network, category in _V4_TABLE:
        if ip in network:
            return category
    return None


def _embedded_v4(ip: IPv6Address) -> tuple[IPv4Address, str, bool] | None:
    """The IPv4 address an IPv6 form carries, its name, and whether traffic reaches it."""
    low32 = IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped, "IPv4-mapped", True)
    if ip in _V6_TRANSLATED:
        return (low32, "IPv4-translated", False)
    if ip in _V6_NAT64:
        return (low32, "NAT64", True)
    if ip in _V6_COMPATIBLE:
        return (low32, "IPv4-compatible", False)
    if ip.sixtofour is not None:
        return (ip.sixtofour, "6to4", True)
    return None


class _BadUrl(ValueError):
    """The URL cannot be fetched as written; the message completes the sentence "URL ..."."""


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    # Decoded and lower-cased, trailing dot kept: "intranet." must not pick up search domains.
    host: str = ""
    ip: IPv4Address | IPv6Address | None = None
    has_userinfo: bool = False
    port: int | None = None

    @property
    def name(self) -> str:
        return self.host.rstrip(".")


def _parse_url(url: str) -> _Target:
    """Split `url` as the WHATWG URL parser would, far enough to know what it would connect to."""
    url = url.strip(_C0_AND_SPACE)
    match = _SCHEME.match(url)
    if match is None or match.group(1).lower() in _NETWORK_SCHEMES:
        # Tabs and newlines vanish anywhere in a URL; only pay for a copy when the host
        # matters, as data: URLs can be megabytes long.
        url = url.translate(_DROP_TAB_NEWLINE)
        match = _SCHEME.match(url)
    if match is None:
        raise _BadUrl("is not an absolute URL")
    scheme = match.group(1).lower()
    if scheme not in _NETWORK_SCHEMES:
        return _Target(scheme)
    # Special schemes: any run of slashes or backslashes opens the authority, and a
    # backslash ends it, so "http:\\evil\@10.0.0.1" has host "evil" for Chromium.
    rest = url[match.end() :].lstrip("/\\")
    end = _AUTHORITY_END.search(rest)
    authority = rest if end is None else rest[: end.start()]
    _userinfo, at, hostport = authority.rpartition("@")
    if not hostport:
        raise _BadUrl("has no host")
    ip: IPv4Address | IPv6Address | None
    if hostport.startswith("["):
        host, ip, port = _parse_bracketed(hostport)
    else:
        raw_host, _, port = hostport.partition(":")
        host, ip = _parse_host(raw_host)
        _check_port(port)
    return _Target(scheme, host, ip, bool(at), int(port) if port else None)


def _parse_bracketed(hostport: str) -> tuple[str, IPv6Address, str]:
    close = hostport.find("]")
    tail = hostport[close + 1 :]
    if close == -1 or (tail and not tail.startswith(":")):
        raise _BadUrl(f"has an invalid host {_shown(hostport)}")
    _check_port(tail[1:])
    literal = hostport[1:close]
    # URLs have no zone ids, and Python would otherwise accept "fe80::1%eth0".
    if "%" in literal:
        raise _BadUrl(f"has an invalid IPv6 host {_shown(literal)}")
    try:
        ip = IPv6Address(literal)
    except ValueError:
        raise _BadUrl(f"has an invalid IPv6 host {_shown(literal)}") from None
    return str(ip), ip, tail[1:]


def _shown(text: str) -> str:
    """`text` quoted for a reason, cut short: reasons end up in logs and job errors."""
    return repr(text if len(text) <= 64 else f"{text[:61]}...")


def _check_port(port: str) -> None:
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise _BadUrl("has an invalid port")


def _parse_host(raw: str) -> tuple[str, IPv4Address | None]:
    if not raw:
        raise _BadUrl("has no host")
    try:
        host = unquote_to_bytes(raw).decode("ascii").lower()
    except UnicodeDecodeError:
        # IDNA mappings differ between Python and Chromium (e.g. "ß"); a mismatch would let
        # us check one name while Chromium fetches another, so only the xn-- form is taken.
        raise _BadUrl("has a non-ASCII host; write it in its xn-- form") from None
    if not _HOST_NAME.fullmatch(host) or not host.strip("."):
        raise _BadUrl(f"has an invalid host {_shown(raw)}")
    if _ends_in_number(host):
        ip = _parse_ipv4(host)
        return str(ip), ip
    return host, None


def _ipv4_number(part: str) -> int | None:
    """One dotted part in WHATWG rules: 0x → hex, a leading 0 → octal, else decimal."""
    if not part:
        return None
    radix, digits = 10, part
    if part[:2] in ("0x", "0X"):
        radix, digits = 16, part[2:]
    elif len(part) > 1 and part[0] == "0":
        radix, digits = 8, part[1:]
    if not digits:
        return 0
    if not all(char in _RADIX_DIGITS[radix] for char in digits):
        return None
    # Leading zeros are legal in any number; past 16 significant digits it is out of range
    # anyway, and int() refuses very long decimal strings.
    if len(digits.lstrip("0")) > 16:
        return 1 << 64
    return int(digits, radix)


def _ends_in_number(host: str) -> bool:
    """WHATWG: a host whose last label is numeric must be a valid IPv4 address, or nothing."""
    parts = host.split(".")
    if parts[-1] == "":
        if len(parts) == 1:
            return False
        parts.pop()
    last = parts[-1]
    if last and all(char in _RADIX_DIGITS[10] for char in last):
        return True
    return _ipv4_number(last) is not None


def _parse_ipv4(host: str) -> IPv4Address:
    """The WHATWG IPv4 parser: "127.1", "0x7f.1", "2130706433" all mean 127.0.0.1."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    numbers = [_ipv4_number(part) for part in parts]
    if len(parts) > 4 or None in numbers:
        raise _BadUrl(f"has an invalid IPv4 host {_shown(host)}")
    values = [number for number in numbers if number is not None]
    if any(value > 255 for value in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        raise _BadUrl(f"has an invalid IPv4 host {_shown(host)}")
    total = values[-1] + sum(value << (8 * (3 - index)) for index, value in enumerate(values[:-1]))
    return IPv4Address(total)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str | None:
    """The origin of an http(s) URL as Chromium writes it in request URLs (scheme://host, with
    the port unless it is the scheme's own), or None when the URL has none."""
    try:
        target = _parse_url(url)
    except _BadUrl:
        return None
    if target.scheme not in _NETWORK_SCHEMES:
        return None
    host = f"[{target.host}]" if isinstance(target.ip, IPv6Address) else target.host
    port = target.port
    shown_port = "" if port is None or port == _DEFAULT_PORTS[target.scheme] else f":{port}"
    return f"{target.scheme}://{host}{shown_port}"


async def _getaddrinfo(host: str) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    families = (socket.AF_INET, socket.AF_INET6)
    return list(dict.fromkeys(str(info[4][0]) for info in infos if info[0] in families))


class NetworkPolicy:
    """The renderer's and the webhook sender's rule for which hosts they may reach."""

    __slots__ = ("_names", "_networks", "_resolve_timeout_s", "_suffixes")

    def __init__(
        self,
        allow_hosts: Iterable[str] = (),
        *,
        resolve_timeout_s: float = DEFAULT_RESOLVE_TIMEOUT_S,
    ) -> None:
        names: set[str] = set()
        suffixes: set[str] = set()
        networks: list[IPv4Network | IPv6Network] = []
        for raw in allow_hosts:
            entry = raw.strip().lower()
            if not entry:
                continue
            network = _allow_network(entry)
            if network is not None:
                networks.append(network)
                continue
            wildcard = entry.startswith(("*.", "."))
            name = entry.removeprefix("*").removeprefix(".").rstrip(".")
            if not name or not _HOST_NAME.fullmatch(name) or name.startswith("."):
                raise ValueError(
                    f"allow-list entry {raw!r} is not a host name, *.domain, IP address or CIDR"
                )
            if wildcard:
                suffixes.add(f".{name}")
            else:
                names.add(name)
        self._names = frozenset(names)
        self._suffixes = tuple(sorted(suffixes))
        self._networks = tuple(networks)
        self._resolve_timeout_s = resolve_timeout_s

    def check_address(
        self, ip: str | IPv4Address | IPv6Address, host: str | None = None
    ) -> Verdict:
        """Whether connecting to `ip` is allowed; `host` (the name it came from) names it in the
        reason and is honoured if allow-listed by name. No I/O."""
        if isinstance(ip, str):
            # getaddrinfo reports IPv6 scope ids ("fe80::1%eth0"); the scope does not matter here.
            try:
                address = ip_address(ip.strip("[]").partition("%")[0])
            except ValueError:
                return _blocked(f"{_shown(ip)} is not an IP address")
        else:
            address = ip
        name = host.lower().rstrip(".") if host else ""
        if name and self._name_allowed(name):
            return ALLOWED
        if self._ip_allowed(address):
            return ALLOWED
        found = _classify(address)
        if found is None:
            return ALLOWED
        category, note = found
        kind = f"{_ADDRESS_KIND[category]} address" + (f" ({note})" if note else "")
        if name and name != str(address):
            return _blocked_host(f"{name} resolves to {address}, {kind}", category, name)
        # An IPv4-mapped address is allowed by its IPv4 entry (see _ip_allowed).
        mapped = address.ipv4_mapped if isinstance(address, IPv6Address) else None
        return _blocked_host(f"{address} is {kind}", category, str(mapped or address))

    def check_url_static(self, url: str) -> Verdict | None:
        """The verdict when it needs no DNS (scheme, IP literal, localhost, allow-list); None if
        the host name must be resolved first. Cheap: Chromium asks for every subresource."""
        try:
            target = _parse_url(url)
        except _BadUrl as error:
            return _blocked(f"URL {error}")
        return self._check_static(target)

    async def check_url(self, url: str, *, resolve: Resolver | None = None) -> Verdict:
        """The full verdict, resolving the host name when needed: blocked if ANY address is,
        `unresolved` if the name does not resolve.

        `resolve` maps a host name to IP strings (default: the loop's getaddrinfo)."""
        try:
            target = _parse_url(url)
        except _BadUrl as error:
            return _blocked(f"URL {error}")
        verdict = self._check_static(target)
        if verdict is not None:
            return verdict
        verdict, _addresses = await self.resolve(target.host, resolve=resolve)
        return verdict

    async def resolve(
        self, host: str, *, resolve: Resolver | None = None
    ) -> tuple[Verdict, list[str]]:
        """The verdict for connecting to `host` (a name or an IP literal, as a proxy is asked
        for it) and, when allowed, the addresses it was judged by: connect to those and no
        other, so a name that resolves differently a moment later gains nothing. A name that
        does not resolve (or not in time) is `unresolved`, not refused: DNS may answer later."""
        literal = f"[{host}]" if ":" in host and not host.startswith("[") else host
        try:
            target = _parse_url(f"http://{literal}/")
        except _BadUrl as error:
            return _blocked(f"host {error.args[0].removeprefix('has ')}"), []
        if target.ip is not None:
            return self.check_address(target.ip), [str(target.ip)]
        verdict = self._check_static(target)
        if verdict is not None and not verdict.allowed:
            return verdict, []
        addresses = await self._lookup(target.host, resolve)
        if not addresses:
            return _unresolved(target.name), []
        if verdict is None:  # not allowed by name: every address must be
            for address in addresses:
                checked = self.check_address(address, target.name)
                if not checked.allowed:
                    return checked, []
        return ALLOWED, addresses

    async def _lookup(self, host: str, resolve: Resolver | None) -> list[str]:
        resolver = _getaddrinfo if resolve is None else resolve
        try:
            async with asyncio.timeout(self._resolve_timeout_s):
                return await resolver(host)
        except (OSError, UnicodeError, ValueError, TimeoutError):
            return []

    def validate_webhook_url(self, url: str) -> str | None:
        """An error message for a webhook URL that can never be delivered to, else None.

        Host names are checked again with `check_url` at delivery time, since DNS can change."""
        return self._validate_http_url(url, "webhook URL", MAX_WEBHOOK_URL_CHARS)

    def validate_page_url(self, url: str) -> str | None:
        """An error message for a page_url the renderer will never open, else None. Host
        names are judged again, resolved, by the gate Chromium's requests go through."""
        return self._validate_http_url(url, "page_url", MAX_PAGE_URL_CHARS)

    def _validate_http_url(self, url: str, what: str, max_chars: int) -> str | None:
        if len(url) > max_chars:
            return f"{what} must be at most {max_chars} characters"
        # HTTP clients split odd URLs differently from WHATWG ("a\@b"); refuse rather than guess.
        if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
            return f"{what} must be ASCII without spaces, control characters or backslashes"
        try:
            target = _parse_url(url)
        except _BadUrl as error:
            return f"{what} {error}"
        if target.scheme not in _NETWORK_SCHEMES:
            return f"{what} must use http or https"
        if not _WRITTEN_AUTHORITY.match(url):
            # WHATWG reads "http:///hook" and "http:hook" as http://hook/, HTTP clients as
            # URLs without a host: neither reading is the sender's to pick.
            return f"{what} has no host (write it as https://host/path)"
        if target.has_userinfo:
            return f"{what} must not contain credentials (user:password@)"
        verdict = self._check_static(target)
        if verdict is not None and not verdict.allowed:
            return f"{what} is not allowed: {verdict.reason.removeprefix('blocked: ')}"
        return None

    def _check_static(self, target: _Target) -> Verdict | None:
        if target.scheme in _LOCAL_SCHEMES:
            return ALLOWED
        if target.scheme not in _NETWORK_SCHEMES:
            return _blocked(f"the {target.scheme}: scheme is not allowed")
        if target.ip is not None:
            return self.check_address(target.ip)
        name = target.name
        if self._name_allowed(name):
            return ALLOWED
        if name == "localhost" or name.endswith(".localhost"):
            # Chromium answers these itself without DNS, with both loopback addresses.
            if all(self._ip_allowed(ip) for ip in _LOCALHOST_ADDRESSES):
                return ALLOWED
            return _blocked_host(f"{name} is a loopback host name", "loopback", name)
        if name in _METADATA_NAMES:
            return _blocked(f"{name} is a cloud metadata host name")
        return None

    def _name_allowed(self, name: str) -> bool:
        return name in self._names or name.endswith(self._suffixes)

    def _ip_allowed(self, ip: IPv4Address | IPv6Address) -> bool:
        if any(ip in network for network in self._networks):
            return True
        # ::ffff:127.0.0.1 is the very same socket as 127.0.0.1; other embeddings (6to4,
        # NAT64) go through some gateway, so they need an entry of their own.
        mapped = ip.ipv4_mapped if isinstance(ip, IPv6Address) else None
        return mapped is not None and any(mapped in network for network in self._networks)


def _allow_network(entry: str) -> IPv4Network | IPv6Network | None:
    """An allow-list entry read as an IP, CIDR or numeric IPv4 form, or None for a name."""
    bare = entry.removeprefix("[").removesuffix("]")
    try:
        return ip_network(bare, strict=False)
    except ValueError:
        pass
    name = entry.rstrip(".")
    if _HOST_NAME.fullmatch(name) and _ends_in_number(name):
        try:
            return IPv4Network(_parse_ipv4(name))
        except _BadUrl:
            raise ValueError(f"allow-list entry {entry!r} is not a valid IPv4 address") from None
    return None
