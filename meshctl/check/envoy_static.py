"""One proxy's generated config as a bootstrap Envoy can check in validate mode, and nothing else changed.

`envoy --mode validate` loads a bootstrap and runs every check Envoy applies to config it is sent,
but it takes no xDS: a proxy's resources have to be written in as static ones, and the secrets
they name have to be there (Envoy's validate mode reads every certificate it is given, and cannot
fetch one). Each change made here is the smallest that makes the config loadable, and none
removes something Envoy would check on a VM:

- EDS clusters become STATIC with their ClusterLoadAssignment inlined (the endpoints Envoy would
  be sent for them); the rest of the cluster is as generated.
- An HTTP connection manager's `rds` becomes the `route_config` it names, with
  `validate_clusters: false` unless the route config says otherwise: that is Envoy's default for a
  route config over RDS, where inline route configs default to true. A route to a cluster the
  proxy does not have is a 503 on the VM, not a refusal, and must stay one here.
- A secret named over SDS (the mesh's `default` and `ROOTCA`, which `meshctl serve` issues per
  proxy) keeps its name and loses its `sds_config`, and a static secret of that name, from a
  throwaway CA made for the run, takes its place, with the kind the reference asks for (a
  certificate and key, or a trust bundle). The TLS context that names it is left as it is.
- A certificate, key or CA file a TLS context reads from disk is used as it is when it exists
  here, so a broken file is refused. One that is missing on this machine (it lives on the VMs)
  is replaced by throwaway PEM of its kind (a certificate and its key together, so they match),
  a CRL that is missing is left out, and each replacement is reported (`StubbedFile`): Envoy
  cannot vouch for a file it did not read.

The fleet's own bootstrap (`fleet_settings`) brings what changes how Envoy judges config: its
runtime layers above all (`re2.max_program_size.error_level`), its regex engine, stats and
overload settings; a layer this machine cannot have (RTDS, a disk layer of the VMs' own
directory) is left out with a note. Without one, the runtime is the one `meshctl bootstrap` writes.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.config.model import ConfigKey
from meshctl.xds import types
from meshctl.xds.names import resource_name

#: What `meshctl validate --envoy` calls each type it reports on.
TYPE_WORDS: Final = {
    types.CLUSTER: "cluster",
    types.ENDPOINT: "endpoints of cluster",
    types.LISTENER: "listener",
    types.ROUTE: "route configuration",
}

#: Fields of a fleet's bootstrap that decide how Envoy judges config, and so are carried into
#: the bootstrap validated. The rest (node, admin, its own static and dynamic resources, the xDS
#: cluster and its certificates) is about where that Envoy runs and is left out.
FLEET_FIELDS: Final = (
    "layered_runtime",
    "default_regex_engine",
    "overload_manager",
    "stats_config",
    "header_prefix",
    "deferred_stat_options",
)

_ISTIO_PATH_PARTS: Final = 8


@dataclass(frozen=True, slots=True)
class GeneratedResource:
    """A generated resource as plain data, by xDS type and name."""

    type_url: str
    name: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StubbedFile:
    """A file a TLS context reads that is not on this machine, replaced for the check."""

    path: str
    what: str
    type_url: str
    resource: str
    source: ConfigKey | None


@dataclass(slots=True)
class StaticConfig:
    """A proxy's resources made loadable, and what was stubbed to get there."""

    resources: list[GeneratedResource]
    static_resources: dict[str, Any]
    stubbed: list[StubbedFile] = field(default_factory=list)

    def digest(self, fleet: Mapping[str, Any]) -> str:
        """Equal for proxies whose bootstraps differ in node identity only: one run checks them all."""
        text = json.dumps({"static": self.static_resources, "fleet": fleet}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def plain(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


def generated_resources(resources: Mapping[str, Sequence[Message]]) -> list[GeneratedResource]:
    """Every cluster, endpoint assignment, listener and route config, in that order."""
    return [
        GeneratedResource(type_url, resource_name(message), plain(message))
        for type_url in (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE)
        for message in resources.get(type_url, ())
    ]


def static_config(resources: Sequence[GeneratedResource]) -> StaticConfig:
    """The bootstrap's `static_resources` for one proxy's generated resources (see the module)."""
    endpoints = {r.name: r.data for r in resources if r.type_url == types.ENDPOINT}
    routes = {r.name: r.data for r in resources if r.type_url == types.ROUTE}
    stubbed: list[StubbedFile] = []
    clusters = []
    for r in resources:
        if r.type_url != types.CLUSTER:
            continue
        data = copy.deepcopy(r.data)
        if data.get("type") == "EDS" or "eds_cluster_config" in data:
            data.pop("eds_cluster_config", None)
            data["type"] = "STATIC"
            data["load_assignment"] = copy.deepcopy(endpoints.get(r.name, {"cluster_name": r.name}))
        stubbed.extend(_stub_files(data, r, None))
        clusters.append(data)
    listeners = []
    for r in resources:
        if r.type_url == types.LISTENER:
            data = _inline_routes(copy.deepcopy(r.data), routes)
            stubbed.extend(_stub_files(data, r, None))
            listeners.append(data)
    static: dict[str, Any] = {"clusters": clusters, "listeners": listeners}
    roles: dict[str, str] = {}
    _static_secret_refs(static, roles)
    if roles:
        static["secrets"] = [_throwaway_secret(name, role) for name, role in sorted(roles.items())]
    return StaticConfig(list(resources), static, stubbed)


def _inline_routes(node: Any, routes: Mapping[str, Mapping[str, Any]]) -> Any:
    if isinstance(node, dict):
        if isinstance(node.get("rds"), dict):
            name = node["rds"].get("route_config_name", "")
            node = {k: v for k, v in node.items() if k != "rds"}
            route_config = copy.deepcopy(dict(routes.get(name, {"name": name})))
            route_config.setdefault("validate_clusters", False)
            node["route_config"] = route_config
        return {k: _inline_routes(v, routes) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_routes(v, routes) for v in node]
    return node


def _static_secret_refs(node: Any, roles: dict[str, str], role: str = "") -> None:
    """Drop `sds_config` from every SDS reference, recording each name with the kind of secret
    the field that holds it takes."""
    if isinstance(node, dict):
        if "sds_config" in node and "name" in node:
            del node["sds_config"]
            roles.setdefault(node["name"], role or "tls_certificate")
        for key, value in node.items():
            inner = role
            if key == "tls_certificate_sds_secret_configs":
                inner = "tls_certificate"
            elif key == "validation_context_sds_secret_config":
                inner = "validation_context"
            _static_secret_refs(value, roles, inner)
    elif isinstance(node, list):
        for value in node:
            _static_secret_refs(value, roles, role)


def _throwaway_secret(name: str, role: str) -> dict[str, Any]:
    cert, key = _throwaway_pem()
    if role == "validation_context":
        return {"name": name, "validation_context": {"trusted_ca": {"inline_string": cert}}}
    return {
        "name": name,
        "tls_certificate": {"certificate_chain": {"inline_string": cert}, "private_key": {"inline_string": key}},
    }


def _stub_files(node: Any, resource: GeneratedResource, source: ConfigKey | None) -> Iterator[StubbedFile]:
    """Replace the TLS files missing here under `node` (see the module), yielding each; `source`
    is the Istio resource whose metadata is nearest above."""
    if isinstance(node, dict):
        source = istio_source(node) or source
        certificates = node.get("tls_certificates")
        for certificate in certificates if isinstance(certificates, list) else ():
            yield from _stub_certificate(certificate, resource, source)
        if _missing(node.get("trusted_ca")):
            path = node["trusted_ca"]["filename"]
            node["trusted_ca"] = {"inline_string": _throwaway_pem()[0]}
            yield StubbedFile(path, "CA certificate", resource.type_url, resource.name, source)
        if _missing(node.get("crl")):
            path = node.pop("crl")["filename"]
            yield StubbedFile(path, "CRL", resource.type_url, resource.name, source)
        for value in list(node.values()):
            yield from _stub_files(value, resource, source)
    elif isinstance(node, list):
        for value in node:
            yield from _stub_files(value, resource, source)


def _stub_certificate(certificate: Any, resource: GeneratedResource, source: ConfigKey | None) -> Iterator[StubbedFile]:
    if not isinstance(certificate, dict):
        return
    parts = {"certificate_chain": "certificate", "private_key": "private key"}
    missing = [(k, what) for k, what in parts.items() if _missing(certificate.get(k))]
    if not missing:
        return
    cert, key = _throwaway_pem()
    for k, what in missing:
        yield StubbedFile(certificate[k]["filename"], what, resource.type_url, resource.name, source)
    certificate["certificate_chain"] = {"inline_string": cert}  # the pair must match: both go
    certificate["private_key"] = {"inline_string": key}


def _missing(data_source: Any) -> bool:
    return isinstance(data_source, dict) and "filename" in data_source and not os.path.exists(data_source["filename"])


def istio_source(node: Mapping[str, Any]) -> ConfigKey | None:
    """The Istio resource a generated object names in its `filter_metadata.istio.config`
    (`/apis/networking.istio.io/v1/namespaces/NS/virtual-service/NAME`), if it names one."""
    metadata = node.get("metadata")
    if not isinstance(metadata, dict):
        return None
    istio = metadata.get("filter_metadata", {}).get("istio", {})
    path = istio.get("config") if isinstance(istio, dict) else None
    if not isinstance(path, str):
        return None
    parts = path.split("/")
    if len(parts) != _ISTIO_PATH_PARTS or parts[1] != "apis" or parts[4] != "namespaces":
        return None
    kind = "".join(word.capitalize() for word in parts[6].split("-"))
    return ConfigKey(kind, parts[5], parts[7])


def default_runtime() -> dict[str, Any]:
    """The runtime `meshctl bootstrap` gives every proxy, for a check run without `--bootstrap`."""
    from meshctl.bootstrap import RUNTIME

    return {"layered_runtime": {"layers": [{"name": "global config", "static_layer": dict(RUNTIME)}]}}


def fleet_settings(bootstrap: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of a fleet's bootstrap that are carried into the check (`FLEET_FIELDS`), and
    notes on what of them could not be: runtime layers served over RTDS (no xDS here)."""
    out = {k: copy.deepcopy(bootstrap[k]) for k in FLEET_FIELDS if k in bootstrap}
    notes = []
    runtime = out.get("layered_runtime")
    if isinstance(runtime, dict) and isinstance(runtime.get("layers"), list):
        kept = []
        for layer in runtime["layers"]:
            name = layer.get("name", "?") if isinstance(layer, dict) else "?"
            if isinstance(layer, dict) and "rtds_layer" in layer:
                notes.append(f"runtime layer {name!r} comes over RTDS: left out of the check")
            elif isinstance(layer, dict) and _missing_disk_layer(layer):
                root = layer["disk_layer"]["symlink_root"]
                notes.append(
                    f"runtime layer {name!r} reads {root}, which is not on this machine: left out of the check"
                )
            else:
                kept.append(layer)
        runtime["layers"] = kept
    if "layered_runtime" not in out:
        out.update(default_runtime())
    return out, notes


def _missing_disk_layer(layer: Mapping[str, Any]) -> bool:
    """A disk layer whose directory is only on the VMs: Envoy refuses to start without it."""
    disk = layer.get("disk_layer")
    return (
        isinstance(disk, dict)
        and isinstance(disk.get("symlink_root"), str)
        and not os.path.exists(disk["symlink_root"])
    )


def bootstrap(static: StaticConfig, node_id: str, fleet: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "node": {"id": node_id, "cluster": "meshctl-validate"},
        **fleet,
        "static_resources": static.static_resources,
    }


@functools.cache
def _throwaway_pem() -> tuple[str, str]:
    """A self-signed CA certificate and its key, made once per process, for nothing but the check."""
    from meshctl.security.selfsigned import throwaway_certificate

    return throwaway_certificate("meshctl validate --envoy", ca=True)


def read_bootstrap(path: Path) -> dict[str, Any]:
    """A fleet's bootstrap file (YAML or JSON); ValueError with the reason when it is not one."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe", pure=True).load(path.read_text())
    except (OSError, UnicodeDecodeError, YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an Envoy bootstrap (a mapping)")
    return data
