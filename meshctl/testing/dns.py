"""A DNS server for tests: answers A queries for names under given domains, on a UDP port of
127.0.0.1, and NXDOMAIN for everything else; a context manager.

Tests of what Envoy resolves by itself (the dynamic forward proxy) point the Envoy's resolver at
it (`resolver_config`), so names like `a.localtest.example` resolve to a local backend with no
network and no change to the host's /etc/hosts. It counts the queries it answers, so a test can
tell a name was looked up.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from typing import Any

import dns.exception
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class DnsServer:
    """`zones` maps a domain (`localtest.example`) to the IPv4 address every name under it, and
    the domain itself, resolves to."""

    def __init__(self, zones: Mapping[str, str], *, ttl: int = 30) -> None:
        self._zones = {domain.strip(".").lower(): address for domain, address in zones.items()}
        self._ttl = ttl
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._lock = threading.Lock()
        self._queries: list[str] = []

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._sock.close()
        self._thread.join(timeout=5)

    @property
    def queries(self) -> list[str]:
        """The names asked for (A and AAAA), in order, without the trailing dot."""
        with self._lock:
            return list(self._queries)

    def resolver_config(self) -> dict[str, Any]:
        """Envoy's c-ares resolver using this server only: a bootstrap's (or a cluster's)
        `typed_dns_resolver_config`."""
        return {
            "name": "envoy.network.dns_resolver.cares",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": self.port}}],
                "dns_resolver_options": {"no_default_search_domain": True},
            },
        }

    def _address(self, name: str) -> str | None:
        name = name.rstrip(".").lower()
        for domain, address in self._zones.items():
            if name == domain or name.endswith("." + domain):
                return address
        return None

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self._sock.recvfrom(4096)
            except OSError:
                return  # closed by stop()
            try:
                query = dns.message.from_wire(data)
            except dns.exception.DNSException:
                continue  # a malformed datagram is dropped, as a server would
            answer = dns.message.make_response(query)
            for question in query.question:
                name = question.name.to_text()
                with self._lock:
                    self._queries.append(name.rstrip("."))
                address = self._address(name)
                if address is None:
                    answer.set_rcode(dns.rcode.NXDOMAIN)
                elif question.rdtype == dns.rdatatype.A:
                    answer.answer.append(dns.rrset.from_text(question.name, self._ttl, "IN", "A", address))
            try:
                self._sock.sendto(answer.to_wire(), peer)
            except OSError:
                return
