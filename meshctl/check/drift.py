"""Drift: how the config a live Envoy holds differs from what meshctl would send it now.

Both sides are read from the same format, Envoy's admin `/config_dump?include_eds`: the live
side as Envoy prints it, the meshctl side as `meshctl dump` builds it (`build_config_dump`), so
one reader serves both and neither side gets a treatment the other does not. Only xDS state is
compared: the bootstrap and its static resources (`static_clusters`, `static_endpoint_configs`,
the xds-grpc cluster) never came from a control plane and are skipped.

Resources are compared per section (clusters, endpoints, listeners, routes, secrets) and name:

- missing: meshctl would send it and Envoy lacks it;
- extra: Envoy holds it and meshctl would not send it;
- changed: both have it and the content differs. Content is compared as protobuf messages, each
  side parsed into its type (`@type`) and serialized deterministically, never as JSON text:
  Envoy prints fields in its own way (defaults, durations), and text would differ where the
  config does not.
- secrets are compared by name only: their keys are redacted in every dump and issued per proxy.

Envoy fills in some fields itself when it holds a resource; each is cleared on both sides before
comparing, and only where Envoy's value is its default, so a value meshctl sets on purpose still
counts:

- ClusterLoadAssignment `policy.overprovisioning_factor` 140 (Envoy's default), and the then
  empty `policy`;
- an empty `locality` on a locality's endpoints, and a locality `load_balancing_weight` of 0;
- an empty `endpoint.health_check_config`, a `health_status` of HEALTHY (what Envoy reports for an
  endpoint sent as UNKNOWN) and a `load_balancing_weight` of 1 on each endpoint;
- endpoints are a set: localities, and endpoints within a locality, are sorted before comparing
  (Envoy may reorder them, and order carries no meaning for load balancing by weight);
- endpoints are compared for EDS clusters only. Envoy lists an assignment for every cluster, with
  nothing in it for BlackHoleCluster and PassthroughCluster and none of the hosts of a DNS cluster
  (it resolves them instead); those endpoints arrive inside their cluster, and are compared there.

Versions: Envoy reports, per resource, the version it was delivered with. Over state-of-the-world
xDS that is the version of the whole response (meshctl's set version of the type,
`set_version`), over delta xDS the resource's own (`to_resource(...).version`); either counts as
current. Envoy keeps no version for EDS assignments in its dump, so endpoints have none to check.
A version that is neither is reported, but versions alone are not drift: content is.

NACKs: Envoy keeps the last update it rejected as `error_state` on the resource (with the
rejected version and Envoy's reason). Each is reported prominently, and counts as drift: Envoy
is running on older config than it was sent.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.xds import types
from meshctl.xds.config_dump import SECTION_NAMES, build_config_dump, config_dump_dict, type_version

#: What Envoy's dump calls each section's type (the `@type` of each entry of `configs`).
_DUMP_TYPES: Final = {
    "envoy.admin.v3.ClustersConfigDump": "clusters",
    "envoy.admin.v3.EndpointsConfigDump": "endpoints",
    "envoy.admin.v3.ListenersConfigDump": "listeners",
    "envoy.admin.v3.RoutesConfigDump": "routes",
    "envoy.admin.v3.SecretsConfigDump": "secrets",
}
SECTIONS: Final = tuple(SECTION_NAMES[t] for t in (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE))
ALL_SECTIONS: Final = (*SECTIONS, "secrets")

#: Envoy's default overprovisioning factor, which it prints in every assignment's `policy`.
_OVERPROVISIONING_DEFAULT: Final = 140
_HEALTHY: Final = 1  # envoy.config.core.v3.HealthStatus.HEALTHY


class DumpError(ValueError):
    """A document that is not an Envoy config dump (no `configs`, or entries that do not parse)."""


class Kind(enum.StrEnum):
    missing = "missing"
    extra = "extra"
    changed = "changed"


@dataclass(frozen=True, slots=True)
class Held:
    """One resource a side holds; `message` is None for secrets, compared by name only."""

    message: Message | None
    version: str


@dataclass(frozen=True, slots=True)
class Nack:
    """The last update Envoy rejected for one resource: `error_state` in its dump."""

    section: str
    name: str
    version: str
    details: str
    when: str

    def as_dict(self) -> dict[str, str]:
        return {"type": self.section, "name": self.name, "version": self.version, "details": self.details}


@dataclass(frozen=True, slots=True)
class Holding:
    """What one side holds, by section and name, and the NACKs it keeps."""

    resources: Mapping[str, Mapping[str, Held]]
    nacks: tuple[Nack, ...] = ()


@dataclass(frozen=True, slots=True)
class Difference:
    section: str
    name: str
    kind: Kind
    meshctl: Held | None
    envoy: Held | None

    def as_dict(self) -> dict[str, str]:
        """The `-o json` shape, stable for tools."""
        return {
            "type": self.section,
            "name": self.name,
            "drift": self.kind.value,
            "meshctl_version": self.meshctl.version if self.meshctl else "",
            "envoy_version": self.envoy.version if self.envoy else "",
        }


@dataclass(frozen=True, slots=True)
class TypeVersion:
    """One section's versions: meshctl's set version, those Envoy holds, and how many resources
    Envoy holds at a version that is neither the set's nor the resource's own."""

    section: str
    meshctl: str
    envoy: tuple[str, ...]
    stale: int

    @property
    def current(self) -> bool:
        return self.stale == 0

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.section, "meshctl": self.meshctl, "envoy": list(self.envoy), "stale": self.stale}


@dataclass(frozen=True, slots=True)
class DriftReport:
    differences: tuple[Difference, ...]
    versions: tuple[TypeVersion, ...]
    nacks: tuple[Nack, ...] = field(default=())

    @property
    def drifted(self) -> bool:
        """Drift is content that differs or an update Envoy rejected; versions alone are not."""
        return bool(self.differences or self.nacks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "drift": self.drifted,
            "differences": [d.as_dict() for d in self.differences],
            "nacks": [n.as_dict() for n in self.nacks],
            "versions": [v.as_dict() for v in self.versions],
        }


# -- reading a dump -----------------------------------------------------------------------------


def read_dump(data: Any) -> Holding:
    """The xDS resources of a `/config_dump?include_eds` document, parsed into their types and
    normalised (see the module's docstring); DumpError when it is not one."""
    if not isinstance(data, Mapping) or not isinstance(data.get("configs"), list):
        raise DumpError("not an Envoy config dump: no 'configs' list")
    resources: dict[str, dict[str, Held]] = {s: {} for s in ALL_SECTIONS}
    nacks: list[Nack] = []
    for config in data["configs"]:
        if not isinstance(config, Mapping):
            raise DumpError("not an Envoy config dump: an entry of 'configs' is not an object")
        section = _DUMP_TYPES.get(str(config.get("@type", "")).rpartition("/")[2])
        if section is None:
            continue  # the bootstrap, scoped routes: not compared
        for name, held, error in _entries(section, config):
            if held is not None:
                resources[section][name] = held
            if error is not None:
                nacks.append(_nack(section, name, error))
    return Holding(resources, tuple(nacks))


def _entries(section: str, config: Mapping[str, Any]) -> Iterable[tuple[str, Held | None, Mapping[str, Any] | None]]:
    """(name, what is held, error_state) for each dynamic resource of one section."""
    if section == "listeners":
        for entry in config.get("dynamic_listeners", []):
            state = entry.get("active_state") or entry.get("warming_state")
            held = _held(state["listener"], state.get("version_info", "")) if state else None
            yield entry.get("name", ""), held, entry.get("error_state")
        return
    if section == "secrets":
        for key in ("dynamic_active_secrets", "dynamic_warming_secrets"):
            for entry in config.get(key, []):
                yield entry.get("name", ""), Held(None, entry.get("version_info", "")), None
        return
    keys = {
        "clusters": (("dynamic_active_clusters", "dynamic_warming_clusters"), "cluster"),
        "endpoints": (("dynamic_endpoint_configs",), "endpoint_config"),
        "routes": (("dynamic_route_configs",), "route_config"),
    }
    lists, inner = keys[section]
    for key in lists:
        for entry in config.get(key, []):
            error = entry.get("error_state")
            if inner not in entry:  # a resource Envoy rejected and never held
                yield _failed_name(error), None, error
                continue
            held = _held(entry[inner], entry.get("version_info", ""))
            yield _name(held.message), held, error


def _held(packed: Mapping[str, Any], version: str) -> Held:
    """A resource of the dump (an Any as JSON, `@type` and its fields), parsed and normalised."""
    from google.protobuf import any_pb2

    any_message = any_pb2.Any()
    try:
        json_format.ParseDict(dict(packed), any_message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, KeyError) as exc:
        raise DumpError(f"a resource of the dump does not parse ({packed.get('@type', '?')}): {exc}") from None
    message = _unpack(any_message)
    normalise(message)
    return Held(message, version)


def _unpack(packed: Any) -> Message:
    from google.protobuf import descriptor_pool, message_factory

    full_name = packed.type_url.rpartition("/")[2]
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError:
        raise DumpError(f"a resource of the dump has a type meshctl does not know: {full_name}") from None
    message: Message = message_factory.GetMessageClass(descriptor)()
    packed.Unpack(message)
    return message


def _name(message: Message | None) -> str:
    from meshctl.xds.names import resource_name

    return resource_name(message) if message is not None else ""


def _failed_name(error: Mapping[str, Any] | None) -> str:
    """The name of a rejected resource that Envoy never held: the one in its failed config."""
    failed = (error or {}).get("failed_configuration") or {}
    return str(failed.get("name") or failed.get("cluster_name") or "")


def _nack(section: str, name: str, error: Mapping[str, Any]) -> Nack:
    return Nack(
        section,
        name,
        str(error.get("version_info", "")),
        str(error.get("details", "")),
        str(error.get("last_update_attempt", "")),
    )


# -- normalising --------------------------------------------------------------------------------


def normalise(message: Message) -> None:
    """Clear what Envoy fills in by itself, in place (each field is listed in the module's
    docstring); a message of another type is left as it is."""
    if message.DESCRIPTOR.full_name == "envoy.config.endpoint.v3.ClusterLoadAssignment":
        _normalise_assignment(message)


def _normalise_assignment(assignment: Any) -> None:
    if assignment.HasField("policy"):
        factor = assignment.policy.overprovisioning_factor
        if assignment.policy.HasField("overprovisioning_factor") and factor.value == _OVERPROVISIONING_DEFAULT:
            assignment.policy.ClearField("overprovisioning_factor")
        if not assignment.policy.ListFields():
            assignment.ClearField("policy")
    for group in assignment.endpoints:
        if group.HasField("locality") and not group.locality.ListFields():
            group.ClearField("locality")
        if group.HasField("load_balancing_weight") and group.load_balancing_weight.value == 0:
            group.ClearField("load_balancing_weight")
        for lb in group.lb_endpoints:
            if lb.endpoint.HasField("health_check_config") and not lb.endpoint.health_check_config.ListFields():
                lb.endpoint.ClearField("health_check_config")
            if lb.health_status == _HEALTHY:
                lb.ClearField("health_status")
            if lb.HasField("load_balancing_weight") and lb.load_balancing_weight.value == 1:
                lb.ClearField("load_balancing_weight")
        _sort(group.lb_endpoints)
    _sort(assignment.endpoints)


def _sort(repeated: Any) -> None:
    """Sort a repeated message field by content, so that order does not count."""
    ordered = sorted(repeated, key=lambda m: m.SerializeToString(deterministic=True))
    copies = [type(m)() for m in ordered]
    for copy, original in zip(copies, ordered, strict=True):
        copy.CopyFrom(original)
    del repeated[:]
    repeated.extend(copies)


# -- comparing ----------------------------------------------------------------------------------


def expected_holding(resources: Mapping[str, Sequence[Message]]) -> Holding:
    """What Envoy would hold after meshctl sent it `resources` (as `meshctl dump` prints it)."""
    return read_dump(config_dump_dict(build_config_dump(resources)))


def compare(resources: Mapping[str, Sequence[Message]], live: Any) -> DriftReport:
    """How `live` (Envoy's `/config_dump?include_eds`, as parsed JSON) differs from `resources`
    (what meshctl would send the proxy, `subscribed(generate(...))`)."""
    want = expected_holding(resources)
    have = read_dump(live)
    eds = eds_clusters(want) | eds_clusters(have)
    want, have = _eds_only(want, eds), _eds_only(have, eds)
    differences: list[Difference] = []
    versions: list[TypeVersion] = []
    for section in ALL_SECTIONS:
        mine, theirs = want.resources.get(section, {}), have.resources.get(section, {})
        for name in sorted(mine.keys() | theirs.keys()):
            kind = _kind(mine.get(name), theirs.get(name))
            if kind is not None:
                differences.append(Difference(section, name, kind, mine.get(name), theirs.get(name)))
        if section in SECTIONS:
            versions.append(_versions(section, type_version(resources, _TYPE_URLS[section]), mine, theirs))
    return DriftReport(tuple(differences), tuple(versions), have.nacks)


def eds_clusters(holding: Holding) -> set[str]:
    """The clusters a side holds whose endpoints come over EDS."""
    out = set()
    for name, held in holding.resources.get("clusters", {}).items():
        cluster: Any = held.message
        if cluster is not None and cluster.type == _EDS:
            out.add(name)
    return out


def _eds_only(holding: Holding, eds: set[str]) -> Holding:
    endpoints = {n: h for n, h in holding.resources.get("endpoints", {}).items() if n in eds}
    return Holding({**holding.resources, "endpoints": endpoints}, holding.nacks)


def holds_mesh_secrets(live: Any) -> bool:
    """Whether Envoy holds (or waits for) any secret: the server sends a proxy config that names
    the mesh's certificates only when it may send that proxy keys, which depends on how its
    connection proved its identity, so a dump without secrets means config without mutual TLS."""
    return bool(read_dump(live).resources.get("secrets"))


def node_metadata(live: Any) -> Mapping[str, Any]:
    """The node metadata of the live Envoy's bootstrap (what it told the server about itself),
    or an empty mapping when the dump has no bootstrap."""
    for config in live.get("configs", ()) if isinstance(live, Mapping) else ():
        if isinstance(config, Mapping) and str(config.get("@type", "")).endswith("BootstrapConfigDump"):
            metadata = config.get("bootstrap", {}).get("node", {}).get("metadata", {})
            return metadata if isinstance(metadata, Mapping) else {}
    return {}


_EDS: Final = 3  # envoy.config.cluster.v3.Cluster.DiscoveryType.EDS
_TYPE_URLS: Final = {name: type_url for type_url, name in SECTION_NAMES.items()}


def _kind(mine: Held | None, theirs: Held | None) -> Kind | None:
    if theirs is None:
        return Kind.missing
    if mine is None:
        return Kind.extra
    if mine.message is None or theirs.message is None:
        return None  # secrets: by name only
    if mine.message.SerializeToString(deterministic=True) != theirs.message.SerializeToString(deterministic=True):
        return Kind.changed
    return None


def _versions(section: str, set_version: str, mine: Mapping[str, Held], theirs: Mapping[str, Held]) -> TypeVersion:
    """Envoy's versions of a section against meshctl's: current when each is the set version
    (state of the world) or the resource's own (delta); unversioned entries are not checked."""
    held = {name: h.version for name, h in theirs.items() if h.version}
    stale = sum(1 for name, v in held.items() if v != set_version and (name not in mine or mine[name].version != v))
    return TypeVersion(section, set_version, tuple(sorted(set(held.values()))), stale)
