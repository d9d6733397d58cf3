"""Generated resources as Envoy's admin `/config_dump?include_eds`: what the proxy would report.

People debugging a mesh already read `config_dump` output, and tools (`istioctl proxy-config
cluster --file`, jq scripts) already parse it, so `meshctl dump` speaks that format rather than a
new one. Each resource is shown as Envoy holds it after an xDS update: `dynamic_active_clusters`,
`dynamic_listeners[].active_state`, `dynamic_route_configs`, `dynamic_endpoint_configs`,
`dynamic_active_secrets` (keys redacted as Envoy redacts them), in Envoy's order (clusters,
endpoints, listeners, routes, secrets).

Versions are the server's own: a resource's `version_info` is the content version the server
gives it (`to_resource`), and a section's `version_info` is the version of the whole set
(`set_version`), so a dump can be compared with what a live proxy reports. They are taken from
the server's functions rather than recomputed here, so the two can never drift apart.

A dump holds what Envoy holds, which is what it asks for: every cluster and listener (CDS and LDS
are wildcard), the endpoints of its EDS clusters, and only the route configs its listeners name
over RDS. A route config that no listener names is never requested, so never sent; `subscribed`
leaves it out and says which, since it usually means a listener the generators chose not to bind.

What only a running Envoy knows is left out: `last_updated` (the time an update arrived), warming
and draining states, and DNS answers. Endpoints of clusters that carry them inline (DNS and
STATIC clusters) are listed as Envoy lists them, beside the EDS ones, without a version: they
arrive with their cluster, not on EDS. A DNS cluster's endpoints are its hostnames here, where a
live Envoy would show the addresses it resolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from google.protobuf import any_pb2, descriptor_pool, json_format
from google.protobuf.message import Message

from meshctl.xds import types
from meshctl.xds.mesh_tls import secret_names
from meshctl.xds.names import resource_name
from meshctl.xds.resources import set_version, to_resource

#: Envoy's own names for the sections (its config tracker keys), used by `--type` and in diffs.
SECTION_NAMES: Final = {
    types.CLUSTER: "clusters",
    types.ENDPOINT: "endpoints",
    types.LISTENER: "listeners",
    types.ROUTE: "routes",
    types.SECRET: "secrets",
}
TYPE_BY_SECTION: Final = {name: type_url for type_url, name in SECTION_NAMES.items()}

#: The order Envoy dumps sections in (its ConfigDump documentation).
DUMP_ORDER: Final = (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE, types.SECRET)

Resources = Mapping[str, Sequence[Message]]

HCM_TYPE: Final = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


@dataclass(frozen=True, slots=True)
class Versioned:
    """A resource and the version the server gives it ("" for what is not an xDS resource)."""

    message: Message
    version: str


def versioned(resources: Resources, type_url: str) -> list[Versioned]:
    """The resources of one type with their server versions, in the order given."""
    return [Versioned(m, to_resource(m, type_url).version) for m in resources.get(type_url, ())]


def type_version(resources: Resources, type_url: str) -> str:
    """The version of the whole set of one type, as the server sends it in `version_info`."""
    return set_version(to_resource(m, type_url) for m in resources.get(type_url, ()))


def endpoint_assignments(resources: Resources) -> list[Versioned]:
    """Every cluster's endpoints, as `?include_eds` lists them: the EDS assignments (with their
    EDS versions) and the inline `load_assignment` of other clusters (no version), by cluster."""
    out = versioned(resources, types.ENDPOINT)
    eds = {resource_name(v.message) for v in out}
    for cluster in resources.get(types.CLUSTER, ()):
        name = resource_name(cluster)
        if name in eds or not cluster.HasField("load_assignment"):
            continue
        assignment = endpoint_pb2.ClusterLoadAssignment()
        assignment.CopyFrom(cluster.load_assignment)  # type: ignore[attr-defined]
        if not assignment.cluster_name:
            assignment.cluster_name = name
        out.append(Versioned(assignment, ""))
    return sorted(out, key=lambda v: resource_name(v.message))


def rds_names(listener: Message) -> list[str]:
    """The route configs a listener asks for over RDS: the `rds` of each HTTP connection manager."""
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2

    data: Any = listener
    chains = [*data.filter_chains, *([data.default_filter_chain] if data.HasField("default_filter_chain") else [])]
    out = []
    for chain in chains:
        for f in chain.filters:
            if f.typed_config.type_url.endswith("/" + HCM_TYPE):
                hcm = http_connection_manager_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                if hcm.HasField("rds"):
                    out.append(hcm.rds.route_config_name)
    return out


def subscribed(resources: Resources) -> tuple[Resources, tuple[str, ...]]:
    """`resources` as the proxy would receive them: route configs that no listener names over RDS
    left out (Envoy never requests them). Also returns the names left out."""
    wanted = {name for listener in resources.get(types.LISTENER, ()) for name in rds_names(listener)}
    routes = resources.get(types.ROUTE, ())
    kept = tuple(r for r in routes if resource_name(r) in wanted)
    dropped = tuple(resource_name(r) for r in routes if resource_name(r) not in wanted)
    return {**resources, types.ROUTE: kept}, dropped


def build_config_dump(resources: Resources, type_urls: Iterable[str] = DUMP_ORDER) -> config_dump_pb2.ConfigDump:
    """A ConfigDump with one section per type in `type_urls`, in Envoy's order."""
    wanted = set(type_urls)
    dump = config_dump_pb2.ConfigDump()
    for type_url in DUMP_ORDER:
        if type_url in wanted:
            dump.configs.add().Pack(_SECTIONS[type_url](resources))
    return dump


def config_dump_dict(dump: config_dump_pb2.ConfigDump) -> dict[str, Any]:
    """The dump as Envoy's admin endpoint prints it: proto field names, `@type` on every Any."""
    return message_dict(dump)


def message_dict(message: Message) -> dict[str, Any]:
    """A message as protobuf JSON with proto field names, in an order that depends only on its
    content: fields in field-number order (as Envoy prints them) and map keys sorted.

    protobuf's own conversion walks maps (a Struct's `fields`, `filter_metadata`) in the order of
    its hash tables, which changes from one process to the next; two dumps of the same config
    would then differ as text, and a diff of them would show changes that are not there.
    """
    data = json_format.MessageToDict(message, preserving_proto_field_name=True)
    out: dict[str, Any] = _ordered(message.DESCRIPTOR, data)
    return out


_JSON_VALUES: Final = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})


def _ordered(descriptor: Any, data: Any) -> Any:
    if descriptor.full_name in _JSON_VALUES:
        return _sorted_json(data)
    if not isinstance(data, Mapping):
        return data
    if descriptor.full_name == "google.protobuf.Any":
        return _ordered_any(data)
    out = {}
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key)
        inner = field.message_type if field is not None else None
        if inner is None:
            out[key] = value
        elif inner.GetOptions().map_entry:
            value_type = inner.fields_by_name["value"].message_type
            out[key] = {k: _ordered(value_type, v) if value_type else v for k, v in sorted(value.items())}
        elif field.is_repeated:
            out[key] = [_ordered(inner, v) for v in value]
        else:
            out[key] = _ordered(inner, value)
    return out


def _ordered_any(data: Mapping[str, Any]) -> Any:
    type_url = str(data.get("@type", ""))
    try:
        inner = descriptor_pool.Default().FindMessageTypeByName(type_url.rpartition("/")[2])
    except KeyError:
        return dict(data)
    if "value" in data and len(data) == 2:  # a well-known type, held as {"@type", "value"}
        return {"@type": type_url, "value": _ordered(inner, data["value"])}
    rest = _ordered(inner, {k: v for k, v in data.items() if k != "@type"})
    return {"@type": type_url, **rest}


def _sorted_json(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _sorted_json(data[k]) for k in sorted(data)}
    if isinstance(data, list):
        return [_sorted_json(v) for v in data]
    return data


def _any(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _clusters(resources: Resources) -> Message:
    section = config_dump_shared_pb2.ClustersConfigDump(version_info=type_version(resources, types.CLUSTER))
    for v in versioned(resources, types.CLUSTER):
        section.dynamic_active_clusters.add(version_info=v.version, cluster=_any(v.message))
    out: Message = section
    return out


def _endpoints(resources: Resources) -> Message:
    section = config_dump_shared_pb2.EndpointsConfigDump()
    for v in endpoint_assignments(resources):
        section.dynamic_endpoint_configs.add(version_info=v.version, endpoint_config=_any(v.message))
    out: Message = section
    return out


def _listeners(resources: Resources) -> Message:
    section = config_dump_shared_pb2.ListenersConfigDump(version_info=type_version(resources, types.LISTENER))
    for v in versioned(resources, types.LISTENER):
        entry = section.dynamic_listeners.add(name=getattr(v.message, "name", ""))
        entry.active_state.version_info = v.version
        entry.active_state.listener.Pack(v.message)
    out: Message = section
    return out


def _routes(resources: Resources) -> Message:
    section = config_dump_shared_pb2.RoutesConfigDump()
    for v in versioned(resources, types.ROUTE):
        section.dynamic_route_configs.add(version_info=v.version, route_config=_any(v.message))
    out: Message = section
    return out


def _secrets(resources: Resources) -> Message:
    """Secrets as Envoy dumps them: those held with their private keys redacted (Envoy's
    `[redacted]`); without them (an offline dump: the server issues them to the live proxy),
    the names the config asks for, as Envoy lists secrets it waits for."""
    section = config_dump_pb2.SecretsConfigDump()
    held = {resource_name(m): m for m in resources.get(types.SECRET, ())}
    asked = secret_names(resources.get(types.CLUSTER, ()), resources.get(types.LISTENER, ()))
    for name in sorted(held.keys() | asked):
        message = held.get(name)
        if message is None:
            section.dynamic_warming_secrets.add(name=name)
            continue
        shown = secret_pb2.Secret()
        shown.CopyFrom(message)
        if shown.HasField("tls_certificate"):
            shown.tls_certificate.private_key.Clear()
            shown.tls_certificate.private_key.inline_string = "[redacted]"
        entry = section.dynamic_active_secrets.add(name=name, version_info=to_resource(message, types.SECRET).version)
        entry.secret.Pack(shown)
    out: Message = section
    return out


_SECTIONS: Final = {
    types.CLUSTER: _clusters,
    types.ENDPOINT: _endpoints,
    types.LISTENER: _listeners,
    types.ROUTE: _routes,
    types.SECRET: _secrets,
}
