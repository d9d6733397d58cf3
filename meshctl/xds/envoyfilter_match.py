"""EnvoyFilter patches, compiled once, and the tests that say what each one touches.

A patch is compiled from its EnvoyFilter once per content (`compile_patches`): its value parsed
into its Envoy type, its proxy version regex compiled. The match tests follow pilot's envoyfilter
package: a field left out matches everything; listener ports are the listener's own, except on
`virtualInbound`/`virtualOutbound`, whose filter chains carry the port; route configurations are
matched by the port in their name (a gateway's `https.443.NAME.GW.NS` also by server port name
and gateway); clusters by the service, subset and port of their `outbound|PORT|SUBSET|HOST`
name, or by the exact name alone when one is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from google.protobuf.message import Message

from meshctl.api.networking.v1alpha3 import envoy_filter_pb2
from meshctl.config.envoy_types import parse_value
from meshctl.config.model import Config
from meshctl.snapshot.model import spec

EF = envoy_filter_pb2.EnvoyFilter
HCM = "envoy.filters.network.http_connection_manager"
#: Filter names Envoy still knows under their old spelling, as Istio matches them.
_ALIASES = {
    "envoy.http_connection_manager": HCM,
    "envoy.tcp_proxy": "envoy.filters.network.tcp_proxy",
    "envoy.router": "envoy.filters.http.router",
    "envoy.lua": "envoy.filters.http.lua",
    "envoy.cors": "envoy.filters.http.cors",
    "envoy.fault": "envoy.filters.http.fault",
    "envoy.filters.http.jwt_authn": "envoy.filters.http.jwt_authn",
    "envoy.listener.tls_inspector": "envoy.filters.listener.tls_inspector",
    "envoy.listener.http_inspector": "envoy.filters.listener.http_inspector",
    "envoy.listener.original_dst": "envoy.filters.listener.original_dst",
}
VIRTUAL_LISTENERS = frozenset({"virtualInbound", "virtualOutbound"})


def canonical(name: str) -> str:
    return _ALIASES.get(name, name)


@dataclass(frozen=True, slots=True, eq=False)
class Patch:
    """One `configPatches` entry, ready to apply."""

    apply_to: int
    operation: int
    context: int
    match: Any  # EnvoyConfigObjectMatch (only its object part is read here)
    value: Message | None
    filter_class: int
    version_regex: re.Pattern[str] | None
    metadata: Mapping[str, str]
    origin: str  # "EnvoyFilter ns/name", for logs

    def new_value(self) -> Any:
        """A fresh copy of the value, for a list to own."""
        assert self.value is not None
        copy = type(self.value)()
        copy.CopyFrom(self.value)
        return copy


@lru_cache(maxsize=4096)
def _compiled(key: object, digest: str, config: Config) -> tuple[Patch, ...]:
    del key, digest  # the cache key: the same content compiles alike
    out: list[Patch] = []
    for cp in spec(config).config_patches:
        if cp.apply_to not in _APPLIED or cp.patch.operation == EF.Patch.INVALID:
            continue
        value = None
        if cp.patch.HasField("value"):
            try:
                value = parse_value(EF.ApplyTo.Name(cp.apply_to), cp.patch.value)
            except ValueError:
                continue  # validation refused the file: never reaches a snapshot
        elif cp.patch.operation != EF.Patch.REMOVE:
            continue
        proxy = cp.match.proxy
        regex = re.compile(proxy.proxy_version) if proxy.proxy_version else None
        out.append(
            Patch(
                cp.apply_to,
                cp.patch.operation,
                cp.match.context,
                cp.match,
                value,
                cp.patch.filter_class,
                regex,
                dict(proxy.metadata),
                f"EnvoyFilter {config.namespace}/{config.name}",
            )
        )
    return tuple(out)


_APPLIED = frozenset(
    {
        EF.LISTENER,
        EF.FILTER_CHAIN,
        EF.NETWORK_FILTER,
        EF.HTTP_FILTER,
        EF.LISTENER_FILTER,
        EF.ROUTE_CONFIGURATION,
        EF.VIRTUAL_HOST,
        EF.HTTP_ROUTE,
        EF.CLUSTER,
    }
)


def compile_patches(
    filters: tuple[Config, ...], proxy_version: str, metadata: Mapping[str, Any]
) -> dict[int, list[Patch]]:
    """The patches of `filters` that apply to this proxy (its version and metadata), by applyTo,
    in order."""
    by_apply: dict[int, list[Patch]] = {}
    for config in filters:
        for patch in compiled(config):
            if applies(patch, proxy_version, metadata):
                by_apply.setdefault(patch.apply_to, []).append(patch)
    return by_apply


def compiled(config: Config) -> tuple[Patch, ...]:
    """An EnvoyFilter's patches, compiled once per content."""
    return _compiled(config.key, config.content_digest(), config)


def applies(patch: Patch, proxy_version: str, metadata: Mapping[str, Any]) -> bool:
    """Whether a patch's proxy match (version, metadata) takes a proxy in."""
    if patch.version_regex is not None and not patch.version_regex.search(proxy_version):
        return False
    return not any(str(metadata.get(k, "")) != v or k not in metadata for k, v in patch.metadata.items())


def context_matches(patch: Patch, context: int) -> bool:
    return patch.context in (EF.ANY, context)


# --- listeners ----------------------------------------------------------------------------


def listener_matches(listener: Any, patch: Patch) -> bool:
    m = patch.match.listener if patch.match.HasField("listener") else None
    if m is None:
        return True
    if m.name and m.name != listener.name:
        return False
    wanted = canonical(m.listener_filter)
    if wanted and not any(canonical(f.name) == wanted for f in listener.listener_filters):
        return False
    if patch.apply_to != EF.LISTENER and listener.name in VIRTUAL_LISTENERS:
        return True  # the port is matched on the filter chain
    return not m.port_number or listener.address.socket_address.port_value == m.port_number


def filter_chain_matches(listener: Any, chain: Any, patch: Patch) -> bool:
    if not patch.match.HasField("listener"):
        return True
    lm = patch.match.listener
    fcm = chain.filter_chain_match
    if listener.name in VIRTUAL_LISTENERS and lm.port_number and fcm.destination_port.value != lm.port_number:
        return False
    if not lm.HasField("filter_chain"):
        return True
    m = lm.filter_chain
    if m.name and m.name != chain.name:
        return False
    if m.sni and m.sni not in fcm.server_names:
        return False
    if m.transport_protocol and fcm.transport_protocol != m.transport_protocol:
        return False
    if m.application_protocols and not all(p in fcm.application_protocols for p in m.application_protocols.split(",")):
        return False
    return not m.destination_port or fcm.destination_port.value == m.destination_port


def filter_match_name(patch: Patch) -> str:
    """The network filter a patch names, "" when none."""
    lm = patch.match.listener
    return lm.filter_chain.filter.name if patch.match.HasField("listener") else ""


def sub_filter_name(patch: Patch) -> str:
    lm = patch.match.listener
    return lm.filter_chain.filter.sub_filter.name if patch.match.HasField("listener") else ""


def listener_filter_name(patch: Patch) -> str:
    return patch.match.listener.listener_filter if patch.match.HasField("listener") else ""


def name_matches(wanted: str, name: str) -> bool:
    return canonical(wanted) == canonical(name)


# --- routes -------------------------------------------------------------------------------


def _route_port(name: str) -> int:
    if name.startswith("inbound|"):
        parts = name.split("|")
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return int(name) if name.isdigit() else 0


def route_configuration_matches(name: str, patch: Patch, context: int) -> bool:
    """Whether a patch matches the route configuration `name` (its name is all it reads)."""
    if not patch.match.HasField("route_configuration"):
        return True
    m = patch.match.route_configuration
    if m.name and m.name != name:
        return False
    if context != EF.GATEWAY:
        return not m.port_number or _route_port(name) == m.port_number
    parts = name.split(".")  # http.8080 / https.443.PORTNAME.GW.NS
    port = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    port_name = parts[2] if parts[0] == "https" and len(parts) == 5 else ""
    gateway = f"{parts[4]}/{parts[3]}" if parts[0] == "https" and len(parts) == 5 else ""
    if m.port_number and m.port_number != port:
        return False
    if m.port_name and m.port_name != port_name:
        return False
    return not m.gateway or m.gateway == gateway


def virtual_host_matches(vhost: Any, patch: Patch) -> bool:
    rm = patch.match.route_configuration if patch.match.HasField("route_configuration") else None
    if rm is None or not rm.HasField("vhost"):
        return True
    m = rm.vhost
    if m.name and m.name != vhost.name:
        return False
    return not m.domain_name or m.domain_name in vhost.domains


def has_route_match(patch: Patch) -> bool:
    rm = patch.match.route_configuration
    return bool(patch.match.HasField("route_configuration") and rm.HasField("vhost") and rm.vhost.HasField("route"))


def route_matches(route: Any, patch: Patch) -> bool:
    if not has_route_match(patch):
        return True
    m = patch.match.route_configuration.vhost.route
    if m.name and m.name != route.name:
        return False
    action = route.WhichOneof("action")
    wanted = {
        EF.RouteConfigurationMatch.RouteMatch.ROUTE: "route",
        EF.RouteConfigurationMatch.RouteMatch.REDIRECT: "redirect",
        EF.RouteConfigurationMatch.RouteMatch.DIRECT_RESPONSE: "direct_response",
    }.get(m.action)
    return bool(wanted is None or action == wanted)


# --- clusters -----------------------------------------------------------------------------


def cluster_matches(name: str, patch: Patch, hosts: frozenset[str] = frozenset()) -> bool:
    """Whether a patch matches the cluster `name` (its name is all it reads); `hosts`: the
    services an inbound cluster serves (its name has none)."""
    if not patch.match.HasField("cluster"):
        return True
    m = patch.match.cluster
    if m.name:
        return bool(m.name == name)
    parts = name.split("|")
    if len(parts) != 4:
        return not (m.service or m.subset or m.port_number)
    _, port, subset, host = parts
    if m.subset and m.subset != subset:
        return False
    if m.service and m.service != host and m.service not in hosts:
        return False
    return not m.port_number or port == str(m.port_number)
