"""EnvoyFilter `applyTo: BOOTSTRAP` patches, applied where a meshctl proxy's bootstrap is made.

In Istio the bootstrap is made when the agent starts Envoy, and BOOTSTRAP patches are merged into
it then. meshctl serves no bootstrap: `meshctl bootstrap --config PATH` writes it once, so that
is where the patches are applied, and they take effect when the bootstrap is written again and
Envoy restarted (`serve` applies none; validation says so in a warning).

The EnvoyFilters are those of the `--config` paths, selected for the node as the server selects
them (`select_envoy_filters`: root namespace, the node's namespace, `workloadSelector` on the
labels the bootstrap knows, `targetRefs`, priority), their BOOTSTRAP patches merged in order
into the bootstrap as Istio merges them (protobuf merge; an `Any` of the same type unpacked and
merged). Only MERGE changes a bootstrap, as in Istio. A `proxyVersion` match is tested against
no version (Envoy has not told it yet), as the offline commands do; `metadata` against the node
metadata the bootstrap carries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.api.networking.v1alpha3 import envoy_filter_pb2
from meshctl.config.envoy_types import parse_value
from meshctl.config.findings import Finding
from meshctl.config.model import Config
from meshctl.snapshot.envoy_filters import select_envoy_filters
from meshctl.snapshot.model import spec
from meshctl.snapshot.node import ProxyNode, ProxyType
from meshctl.xds.proto_merge import merge

EF = envoy_filter_pb2.EnvoyFilter


def bootstrap_patches(
    paths: Sequence[Path], node: ProxyNode, labels: Mapping[str, str], metadata: Mapping[str, Any]
) -> tuple[list[tuple[Config, Message]], list[Finding]]:
    """The BOOTSTRAP patch values that apply to `node` (with `labels` and `metadata`), in
    order, each with its EnvoyFilter; and the errors of the files that failed to load (whose
    EnvoyFilters are left out)."""
    from meshctl.ingest import load_files
    from meshctl.registry.serviceentry import build_file_model
    from meshctl.snapshot.model import build_snapshot

    loaded = load_files(paths)
    every = list(loaded.configs.values())
    filters = [c for c in every if c.kind == "EnvoyFilter" and _has_bootstrap_patch(c)]
    if not filters:
        return [], loaded.errors
    configs = [c for c in every if c.kind in ("EnvoyFilter", "Gateway", "ServiceEntry", "WorkloadEntry")]
    snapshot = build_snapshot(configs, build_file_model(configs))
    router = node.type is ProxyType.ROUTER
    selected = select_envoy_filters(snapshot, node.namespace, labels, router=router)
    out: list[tuple[Config, Message]] = []
    for config in selected:
        for cp in spec(config).config_patches:
            if cp.apply_to != EF.BOOTSTRAP or cp.patch.operation != EF.Patch.MERGE or not _for(cp.match, metadata):
                continue
            out.append((config, parse_value("BOOTSTRAP", cp.patch.value)))
    return out, loaded.errors


def _has_bootstrap_patch(config: Config) -> bool:
    return any(cp.apply_to == EF.BOOTSTRAP for cp in spec(config).config_patches)


def _for(match: Any, metadata: Mapping[str, Any]) -> bool:
    """Whether a patch's proxy match admits this node before its Envoy version is known."""
    proxy = match.proxy
    if proxy.proxy_version and not re.search(proxy.proxy_version, ""):
        return False
    return all(k in metadata and str(metadata[k]) == v for k, v in proxy.metadata.items())


def apply_bootstrap_patches(bootstrap: dict[str, Any], patches: Sequence[Message]) -> dict[str, Any]:
    """`bootstrap` (as `build_bootstrap` makes it) with `patches` merged in, in order."""
    if not patches:
        return bootstrap
    message: Any = parse_value("BOOTSTRAP", bootstrap)
    for patch in patches:
        merge(message, patch)
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out
