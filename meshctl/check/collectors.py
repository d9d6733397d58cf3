"""The collectors MeshConfig's tracers and access log services name, checked against the tree's
services, for `meshctl validate --mesh-config`.

A provider whose `service` the registry does not have (or whose `port` is not one of its ports)
is left out of every proxy's config: Istio logs it and serves the rest; `serve` warns, and here
it is an error on the provider's `service` field, since tracing or logs a Telemetry asks for
would silently go nowhere. A collector registered elsewhere (Consul) is named with
`--known-host`. It builds a snapshot of the tree, so it sits above `snapshot/` and is handed to
`config/check.py` as a callable with the rest of the proxy analysis (`cli/validate.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from meshctl.config.findings import Finding, Severity
from meshctl.config.mesh import MeshSettings, place_mesh_findings
from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.collectors import collector_problems
from meshctl.snapshot.model import build_snapshot


def collector_findings(
    configs: Sequence[Config], mesh: MeshSettings, mesh_file: Path, known_hosts: Collection[str] = ()
) -> list[Finding]:
    """An error for each collector provider of `mesh` the tree's services do not serve."""
    if not mesh.providers.collectors:
        return []
    snapshot = build_snapshot(configs, build_file_model(configs), mesh)
    found = [
        Finding(Severity.ERROR, why, str(mesh_file), field=f"{provider.field}.service")
        for provider, why in collector_problems(snapshot)
        if not any(fnmatchcase(provider.service.rpartition("/")[2], known) for known in known_hosts)
    ]
    return place_mesh_findings(mesh_file, found)
