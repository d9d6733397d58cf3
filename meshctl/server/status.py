"""The running server's state as the admin pages and `meshctl proxy-status` read it.

Everything is derived on request from the streams, the store, the registries and the current
snapshot; nothing here is kept in step separately, so a page can never disagree with what is
being served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from meshctl.config.findings import format_path
from meshctl.xds import types

if TYPE_CHECKING:
    from meshctl.config.store import ConfigStore
    from meshctl.registry.aggregate import AggregateRegistry
    from meshctl.registry.health_share import ConsulShare
    from meshctl.security.ca import CertificateAuthority
    from meshctl.server.ads import AdsServicer
    from meshctl.server.credentials import CredentialSecrets
    from meshctl.server.delivery import Delivery
    from meshctl.server.discovery import Discovery
    from meshctl.server.health import HealthDiscovery
    from meshctl.server.metrics import Metrics
    from meshctl.server.secrets import WorkloadSecrets
    from meshctl.snapshot.model import Snapshot


class RunningServer(Protocol):
    """The parts of the running server the pages read (`meshctl.server.app.Server` has them);
    a protocol, so this module needs nothing of `app` and the imports run one way."""

    store: ConfigStore
    registry: AggregateRegistry
    discovery: Discovery
    ads: AdsServicer
    metrics: Metrics
    secrets: WorkloadSecrets
    credential_secrets: CredentialSecrets
    hds: HealthDiscovery
    delivery: Delivery
    share: ConsulShare | None

    @property
    def ca(self) -> CertificateAuthority | None: ...

    def ready(self) -> bool: ...


class ServerStatus:
    """Implements the admin server's `AdminState` over the running server."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server

    def ready(self) -> bool:
        return self._server.ready()

    def ready_note(self) -> str:
        """What `/ready` says beside its status: a pinned or held fleet, and replicas' shared
        health that Consul no longer takes (served from the last known state meanwhile)."""
        notes = [self._server.delivery.ready_note()]
        share = self._server.share
        if share is not None:
            notes.append(share.status()[1])
        return "\n".join(note for note in notes if note)

    def history(self, version: str = "") -> Any:
        return self._server.delivery.history_page(version)

    def rollout(self) -> dict[str, Any]:
        return self._server.delivery.rollout.status()

    def rollout_act(self, action: str, version: str = "") -> str:
        """Raises RolloutError with the reason when the action cannot be done."""
        return self._server.delivery.act(action, version)

    def version(self) -> dict[str, Any]:
        """The build serving, and the snapshot it serves (replicas fed the same input agree)."""
        from meshctl import __version__

        snapshot = self._server.discovery.snapshot
        ca = self._server.ca
        return {
            "version": __version__,
            "snapshot": snapshot.version if snapshot else "",
            # What `proxy-status` compares across replicas: one mesh, one trust.
            "root_fingerprints": list(ca.root_fingerprints) if ca is not None else [],
        }

    def metrics_text(self) -> str:
        return self._server.metrics.render()

    def syncz(self) -> list[dict[str, Any]]:
        """One entry per connected proxy: per type, what was sent, what was ACKed, any NACK."""
        out = []
        snapshot = self._server.discovery.snapshot
        for stream in sorted(self._server.ads.streams.values(), key=lambda s: s.connection.node_id):
            conn = stream.connection
            entry: dict[str, Any] = {
                "proxy": conn.node_id,
                "workload": stream.proxy.workload if stream.proxy else "",
                # Which generator family serves it: an Envoy, or a proxyless gRPC library.
                "generator": "grpc" if stream.proxy is not None and stream.proxy.node.proxyless else "envoy",
                "delta": conn.delta,
                "connected_at": conn.connected_at,
                "snapshot": conn.resources.snapshot_version if conn.resources else "",
                "latest_snapshot": snapshot.version if snapshot else "",
                "rollout": self._server.delivery.rollout.role_of(stream),
                "retained_clusters": sorted(conn.retained_clusters),
                "health": self._server.hds.state_of(conn.node_id),
                "client_cert_expires": stream.certificate_not_after or None,
                "types": {},
            }
            for status in conn.status():
                entry["types"][types.SHORT_NAMES[status.type_url]] = {
                    "sent": status.sent_version,
                    "acked": status.acked_version,
                    "nonce": status.nonce,
                    "nack": status.nack,
                }
            out.append(entry)
        return out

    def config_dump(self, proxy_id: str) -> dict[str, Any] | None:
        """The connected proxy's config as `meshctl dump -o json` prints it: Envoy's
        `/config_dump?include_eds` of everything generated for it from the current snapshot (a
        gRPC node's as `dump --grpc`), and the secrets it holds, private keys redacted."""
        from meshctl.xds.config_dump import build_config_dump, config_dump_dict
        from meshctl.xds.generate import generate

        snapshot = self._server.discovery.snapshot
        streams = [s for s in self._server.ads.streams.values() if s.proxy is not None]
        # The full node id, or NAME.NAMESPACE (its third part) as every CLI command takes a proxy.
        found = [s for s in streams if s.connection.node_id == proxy_id] or [
            s for s in streams if s.connection.node_id.split("~")[2:3] == [proxy_id]
        ]
        if len({s.connection.node_id for s in found}) != 1 or snapshot is None or found[0].proxy is None:
            return None
        node_id = found[0].connection.node_id
        held = (*self._server.secrets.held(node_id), *self._server.credential_secrets.held(found[0].proxy))
        if found[0].proxy.node.proxyless:
            from meshctl.xds.grpc_gen import generate_grpc

            resources = {**generate_grpc(snapshot, found[0].proxy), types.SECRET: held}
        else:
            resources = {**generate(snapshot, found[0].proxy), types.SECRET: held}
        return config_dump_dict(build_config_dump(resources))

    def registryz(self) -> dict[str, Any]:
        registry = self._server.registry
        model = registry.model()
        return {
            "status": [
                {
                    "name": s.name,
                    "healthy": s.healthy,
                    "message": s.message,
                    "services": s.services,
                    "endpoints": s.endpoints,
                }
                for s in registry.member_statuses()
            ],
            "notes": list(model.notes),
            "services": [
                {
                    "hostname": svc.hostname,
                    "namespace": svc.namespace,
                    "registry": svc.registry,
                    "resolution": svc.resolution.value,
                    "ports": [{"name": p.name, "number": p.number, "protocol": p.protocol.value} for p in svc.ports],
                    "endpoints": [
                        {
                            "address": ep.address,
                            "ports": {str(k): v for k, v in ep.ports.items()},
                            "labels": dict(ep.labels),
                            "health": ep.health.value,
                            "healthReason": ep.health_reason,
                            "locality": ep.locality,
                            "workload": f"{ep.namespace}/{ep.name}" if ep.name else "",
                        }
                        for ep in model.endpoints_of(host)
                    ],
                }
                for host, svc in sorted(model.services.items())
            ],
        }

    def configz(self) -> dict[str, Any]:
        store = self._server.store
        return {
            "revision": store.revision,
            "resources": [
                {
                    "kind": c.kind,
                    "namespace": c.namespace,
                    "name": c.name,
                    "source": str(c.source),
                }
                for _, c in sorted(store.configs.items())
            ],
            "errors": [
                {"file": f.file, "line": f.line, "column": f.column, "message": f.message, "text": str(f)}
                for f in store.errors()
            ],
            "gatewayApi": gateway_api_status(self._server.discovery.snapshot),
        }


def gateway_api_status(snapshot: Snapshot | None) -> dict[str, Any]:
    """The Gateway API's status as Istio would write it: the conditions that are False, and
    which route attached to which listener (the mesh's sidecars for a GAMMA route)."""
    if snapshot is None:
        return {"conditions": [], "attachments": []}
    translation = snapshot.gateway_api
    return {
        "conditions": [
            {
                "kind": c.key.kind,
                "namespace": c.key.namespace,
                "name": c.key.name,
                "field": format_path(c.path),
                "type": c.type,
                "status": "False",
                "reason": c.reason,
                "message": c.message,
                "source": str(snapshot.configs[c.key].source) if c.key in snapshot.configs else "",
            }
            for c in translation.conditions
        ],
        "attachments": [
            {
                "route": f"{a.route.kind} {a.route.namespace}/{a.route.name}",
                "parent": f"Gateway {a.gateway.namespace}/{a.gateway.name}" if a.gateway is not None else "mesh",
                "listener": a.listener or "",
                "hosts": list(a.hosts),
            }
            for a in translation.attachments
        ],
    }
