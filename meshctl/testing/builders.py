"""Build snapshots and proxies from Istio YAML text, the way the server does, for tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshctl.config.loader import load_text
from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import MeshSettings, Snapshot, build_snapshot
from meshctl.snapshot.proxy import Proxy, bind_proxy, parse_node_id


class InvalidFixture(Exception):
    """The YAML given to a builder does not load cleanly."""


def configs_from_yaml(text: str, *, namespace: str = "default") -> list[Config]:
    from meshctl.config.loader import LoadOptions

    result = load_text(text, "<fixture>", LoadOptions(default_namespace=namespace))
    if not result.ok:
        raise InvalidFixture("\n".join(str(f) for f in result.findings))
    return list(result.configs)


def snapshot_from_yaml(text: str, *, mesh: MeshSettings | None = None, namespace: str = "default") -> Snapshot:
    """A snapshot of the configs in `text`, with services from its ServiceEntries/WorkloadEntries."""
    configs = configs_from_yaml(text, namespace=namespace)
    return build_snapshot(configs, build_file_model(configs), mesh)


def proxy_for(
    snapshot: Snapshot,
    node_id: str = "sidecar~10.0.0.99~client.default~default.svc.cluster.local",
    metadata: Mapping[str, Any] | None = None,
) -> Proxy:
    return bind_proxy(parse_node_id(node_id, metadata), snapshot)
