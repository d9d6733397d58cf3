"""A sidecar's DNS listener: the mesh's names answered by the proxy itself, with no /etc/hosts.

An app on a VM calls `inventory.shop.mesh:9080` and needs an address for it. Istio's agent
answers such lookups with a DNS proxy; meshctl has no agent on the VM, and Envoy has the UDP
DNS filter (`envoy.filters.udp.dns_filter`), which answers from an inline table and forwards what
it does not know. So every sidecar whose node asks for it (`DNS_PORT`, Istio's `DNS_CAPTURE`:
`snapshot/interception.py`) gets a UDP listener on `127.0.0.1:PORT` (15053 by default) whose table
holds what that proxy can reach:

- the hosts its outbound listeners serve, and nothing else: the table is read off the same
  builder (`listeners_outbound`), so Sidecar egress and exportTo scope it exactly as they scope
  the listeners and clusters;
- each host's answer is where this proxy takes the app's connections for it: without iptables the
  host's own loopback address for a TCP-level service (`snapshot/loopback.py`), 127.0.0.1 for an
  HTTP one, a Sidecar egress `bind` where one moves it; under iptables (`REDIRECT`, `TPROXY`) the
  service's address, which iptables sends to the proxy; a host with no address there is left
  to the VM's resolvers, as Istio does without address allocation;
- short names as Istio's DNS proxy answers them: `NAME.NS.svc.SUFFIX` also as `NAME.NS.svc`,
  `NAME.NS` and, from a proxy of namespace NS, `NAME`; other hosts by their full name only.
  A wildcard host is in the table as written (`*.example.com`): the filter answers it for every
  name under the suffix (not for the suffix itself).

Names the table lacks go to the resolvers of the VM's /etc/resolv.conf (Envoy's default
resolver), or, with `DNS_FORWARD: false`, are answered NXDOMAIN. Behind a systemd-resolved that
sends only the mesh's domains here (`mesh_domains`: `svc.SUFFIX`, the parent domain of every
internal host, every external host itself; systemd/), forwarding is not needed and is best off:
resolved already answers every other name, and a missing mesh name forwarded back to it would
circle until the resolver's timeout.

The listener is outbound config, keyed by the `OutboundProxy` (which carries the DNS settings)
like the other outbound listeners, so proxies of one view share it and it follows the mesh with
every push: a new ServiceEntry's name resolves without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.data.dns.v3 import dns_table_pb2
from envoy.extensions.filters.udp.dns_filter.v3 import dns_filter_pb2
from google.protobuf import duration_pb2

from meshctl.registry.model import Location, Protocol
from meshctl.snapshot.loopback import is_tcp_level
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds import listener_filters as lf
from meshctl.xds.listeners_outbound import outbound_answers
from meshctl.xds.names import LOCALHOST

DNS_FILTER: Final = "envoy.filters.udp.dns_filter"
#: How long a client may keep an answer: short, so a changed address is taken up soon.
ANSWER_TTL_SECONDS: Final = 30


def dns_listener_name(port: int) -> str:
    return f"dns_{port}"


def istio_names(host: str, namespace: str, domain: str) -> list[str]:
    """`host` and the short names Istio's DNS proxy answers for it, for a proxy of `namespace`
    whose node domain is `domain` (`NS.svc.cluster.local`)."""
    _, sep, suffix = domain.partition(".svc.")
    if not sep:
        return [host]
    parts = host.split(".")
    if len(parts) < 4 or ".".join(parts[2:]) != f"svc.{suffix}":
        return [host]
    name, ns = parts[0], parts[1]
    names = [host, f"{name}.{ns}.svc", f"{name}.{ns}"]
    if ns == namespace:
        names.append(name)
    return names


def name_table(scope: ProxyScope, answers: Mapping[str, Sequence[str]] | None = None) -> Mapping[str, str]:
    """name -> the address this proxy answers for it, in name order. A name two hosts claim
    (short names of two namespaces' hosts cannot; two hosts can) keeps the first host's in
    hostname order."""
    if answers is None:
        answers = outbound_answers(scope)
    out: dict[str, str] = {}
    for host in sorted(answers):
        address = _answer(answers[host])
        if not address:
            continue
        for name in istio_names(host, scope.proxy.namespace, scope.proxy.domain):
            out.setdefault(name, address)
    return MappingProxyType(dict(sorted(out.items())))


@dataclass(frozen=True, slots=True)
class TableConflict:
    """Hosts a proxy's table cannot answer apart: `name`, claimed by `hosts[0]` and `hosts[1]`
    with different addresses (the first keeps it: its `address` is the answer), or, where
    `name` is "", plain TCP `hosts` answered with one `address` on one `port`, where a
    connection reaches the first alone. Both `meshctl hosts` and `meshctl validate` (MC0006)
    read these, so the two never disagree on what clashes."""

    hosts: tuple[str, ...]
    address: str
    name: str = ""
    port: int = 0

    def __str__(self) -> str:
        first = self.hosts[0]
        if self.name:
            second = self.hosts[1]
            return f"name {self.name} is claimed by {first} and {second}: it resolves to {first}'s {self.address}"
        return (
            f"{', '.join(self.hosts)} resolve to {self.address} and share port {self.port}: nothing in a TCP "
            f"connection tells them apart, so it reaches {first} (give the range room: MeshConfig loopbackRange)"
        )


def table_conflicts(scope: ProxyScope, answers: Mapping[str, Sequence[str]] | None = None) -> list[TableConflict]:
    """What the table cannot answer apart: a name two hosts claim with different addresses (the
    first host in name order keeps it), and plain TCP hosts (TLS ones are told apart by SNI)
    answered with one address on one port (the loopback range full or turned off, or one
    service address under iptables), where a connection reaches the first alone."""
    if answers is None:
        answers = outbound_answers(scope)
    services = {s.hostname: s for s in scope.services}
    claimed: dict[str, tuple[str, str]] = {}
    sharing: dict[tuple[str, int], list[str]] = {}
    out: list[TableConflict] = []
    for host in sorted(answers):
        address = _answer(answers[host])
        if not address:
            continue
        for name in istio_names(host, scope.proxy.namespace, scope.proxy.domain):
            first = claimed.setdefault(name, (host, address))
            if first[1] != address:
                out.append(TableConflict((first[0], host), first[1], name=name))
        service = services.get(host)
        for port in service.ports if service is not None else ():
            if is_tcp_level(port.protocol) and port.protocol not in (Protocol.TLS, Protocol.HTTPS):  # SNI tells
                sharing.setdefault((address, port.number), []).append(host)
    for (address, number), hosts in sorted(sharing.items()):
        if len(hosts) > 1:
            out.append(TableConflict(tuple(hosts), address, port=number))
    return out


def _answer(addresses: Sequence[str]) -> str:
    """One address per name: a host's own one over the shared 127.0.0.1 (its HTTP ports listen
    on both), else the first."""
    return next((a for a in addresses if a != LOCALHOST), addresses[0] if addresses else "")


def mesh_domains(scope: ProxyScope, names: Mapping[str, str] | None = None) -> list[str]:
    """The domains this proxy's DNS listener answers for alone (see the module docstring),
    without one another's subdomains, sorted."""
    if names is None:
        names = name_table(scope)
    _, sep, suffix = scope.proxy.domain.partition(".svc.")
    found = {f"svc.{suffix}"} if sep else set()
    services = {s.hostname: s for s in scope.services}
    for host in names:
        service = services.get(host)
        if service is None:
            continue  # a short name: within its host's domain
        if host.startswith("*."):
            found.add(host[2:])
        elif service.location is Location.MESH_EXTERNAL or host.count(".") < 2:
            found.add(host)
        else:
            found.add(host.partition(".")[2])
    return sorted(d for d in found if not any(d.endswith("." + other) for other in found))


def build_dns_listener(scope: ProxyScope, answers: Mapping[str, Sequence[str]]) -> listener_pb2.Listener:
    """The UDP listener on 127.0.0.1:`dns_port` answering from this proxy's name table."""
    names = name_table(scope, answers)
    ttl = duration_pb2.Duration(seconds=ANSWER_TTL_SECONDS)
    table = dns_table_pb2.DnsTable(
        virtual_domains=[
            dns_table_pb2.DnsTable.DnsVirtualDomain(
                name=name,
                endpoint=dns_table_pb2.DnsTable.DnsEndpoint(
                    address_list=dns_table_pb2.DnsTable.AddressList(address=[address])
                ),
                answer_ttl=ttl,
            )
            for name, address in names.items()
        ],
    )
    config = dns_filter_pb2.DnsFilterConfig(
        stat_prefix="dns",
        server_config=dns_filter_pb2.DnsFilterConfig.ServerContextConfig(inline_dns_table=table),
    )
    if scope.proxy.dns_forward:
        # No resolvers named: Envoy's default resolver, which reads the VM's /etc/resolv.conf.
        config.client_config.resolver_timeout.seconds = 5
        config.client_config.max_pending_lookups = 256
    port = scope.proxy.dns_port
    return listener_pb2.Listener(
        name=dns_listener_name(port),
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(
                address=LOCALHOST, port_value=port, protocol=address_pb2.SocketAddress.UDP
            )
        ),
        traffic_direction=base_pb2.TrafficDirection.OUTBOUND,
        listener_filters=[listener_components_pb2.ListenerFilter(name=DNS_FILTER, typed_config=lf.typed(config))],
    )
