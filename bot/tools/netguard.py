"""Which network addresses a tool may reach: public ones only (the SSRF guard behind ``web_fetch``).

A URL's host is resolved first and every address it resolves to is checked, so a name that points at
loopback, a private network, link-local (cloud metadata at 169.254.169.254), multicast or reserved space is
refused like the literal address would be. IPv6 forms that embed an IPv4 address (IPv4-mapped, 6to4,
NAT64, Teredo) are judged by the embedded address. A public address of this machine itself is refused
too: a service bound to every interface (the ops port opened to ``0.0.0.0``, a local model server)
answers there as it does on loopback. The caller then connects to the checked address itself, so a
second DNS answer (rebinding) cannot change where the request goes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection

from bot.tools.base import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IANA's special-purpose ranges that are not globally reachable, named here rather than left to the
# ``ipaddress`` tables of the running Python: 3.11's count only 192.0.0.0/29 of 192.0.0.0/24 as private
# (192.0.0.192 is a cloud metadata address), and not 3fff::/20. Nor the deprecated site-local fec0::/10
# (RFC 3879), which no table calls private or reserved, though networks still number hosts in it (and
# Windows its DNS servers, fec0:0:0:ffff::1): outside 2000::/3, nothing there is a public address.
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "::/127", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip


def refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be contacted, or ``None`` when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = refusal(embedded)
            if inner is not None:
                return inner
    if ip in _METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_private:
        return "a private network address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global or any(ip in net for net in _NOT_GLOBAL if net.version == ip.version):
        return "not a public address"
    return None


def of_this_machine(ip: IPAddress) -> bool:
    """True when ``ip`` is one of this machine's own addresses: the kernel lets a socket bind only to
    those (with ``net.ipv4.ip_nonlocal_bind`` set it lets any, and every fetch is refused: closed, not
    open). A family the machine has no sockets for cannot be reached either."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (the event loop's resolver, off the loop thread)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"could not resolve {host!r} ({exc})") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    return addresses


class AddressGuard:
    """Resolve a host and return one address that is safe to connect to, or raise :class:`ToolError`.

    ``allow`` lists ``(ip, port)`` endpoints that are let through although non-public. Production never
    sets it; tests use it to reach their own server on 127.0.0.1 while every other local address stays
    refused. ``resolver`` replaces DNS the same way (tests only).
    """

    def __init__(self, *, allow: Collection[tuple[str, int]] = (), resolver: Resolver = resolve) -> None:
        self._allow = {(str(ipaddress.ip_address(ip)), port) for ip, port in allow}
        self._resolve = resolver

    async def check(self, host: str, port: int) -> IPAddress:
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            addresses = await self._resolve(host, port)
        if not addresses:
            raise ToolError(f"{host!r} did not resolve to any address")
        for ip in addresses:  # all of them: a mixed answer is a classic rebinding set-up
            reason = refusal(ip) or ("an address of this machine" if of_this_machine(ip) else None)
            if reason is not None and (str(ip), port) not in self._allow:
                shown = host if host == str(ip) else f"{host} ({ip})"
                raise ToolError(f"refused: {shown} is {reason}; only public addresses can be fetched")
        return addresses[0]
