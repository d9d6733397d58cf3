"""A complete Envoy bootstrap for a VM proxy: node identity, ADS to meshctl, and an admin port.

With it a VM needs only `meshctl bootstrap ... > envoy.yaml && envoy -c envoy.yaml`: everything
else (listeners, clusters, routes, endpoints) arrives over ADS.

With `XdsClientTls` the ADS connection is TLS: Envoy checks the server's certificate against a CA
and a SAN (the `sni` name, else the xDS host: a DNS SAN for a name, an IP SAN for an address, as
any TLS client checks the host it dialled; a chain check alone would accept any certificate the
CA ever signed), and presents its own certificate when one is given, which `meshctl serve
--client-ca` requires to name this node's workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshctl.config.hosts import is_ip
from meshctl.snapshot.proxy import ProxyNode

XDS_CLUSTER = "xds-grpc"
_UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


@dataclass(frozen=True, slots=True)
class XdsClientTls:
    """Envoy's side of xDS over TLS: the CA to check meshctl with, and this proxy's certificate."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    #: The server name to send and to find in the server's certificate (default: the xDS host).
    sni: str | None = None


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    xds_host: str
    xds_port: int
    delta: bool = False
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    labels: Mapping[str, str] = field(default_factory=dict)
    tls: XdsClientTls | None = None


def _filename(path: Path) -> dict[str, str]:
    # Absolute, as Envoy resolves relative names against its own working directory; not resolved,
    # so a symlink a rotation agent swaps keeps pointing at the current file.
    return {"filename": str(path.absolute())}


def xds_transport_socket(tls: XdsClientTls, xds_host: str) -> dict[str, Any]:
    """The `xds-grpc` cluster's UpstreamTlsContext."""
    server_name = tls.sni or xds_host
    san_type = "IP_ADDRESS" if is_ip(server_name) else "DNS"
    common: dict[str, Any] = {
        # gRPC servers refuse TLS connections that do not negotiate HTTP/2 by ALPN.
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": _filename(tls.ca_file),
            "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": server_name}}],
        },
    }
    if tls.cert_file is not None and tls.key_file is not None:
        common["tls_certificates"] = [
            {"certificate_chain": _filename(tls.cert_file), "private_key": _filename(tls.key_file)}
        ]
    context: dict[str, Any] = {"@type": _UPSTREAM_TLS, "common_tls_context": common}
    if not is_ip(server_name):
        context["sni"] = server_name
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def build_bootstrap(node: ProxyNode, options: BootstrapOptions) -> dict[str, Any]:
    """The bootstrap as plain data (YAML or JSON for Envoy's `-c`)."""
    metadata: dict[str, Any] = {
        "NAMESPACE": node.namespace,
        "INTERCEPTION_MODE": node.interception.value,
    }
    labels = {**node.labels, **options.labels}
    if labels:
        metadata["LABELS"] = dict(labels)
    ads = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {
            "id": node.id,
            "cluster": f"{node.name}.{node.namespace}",
            "metadata": metadata,
        },
        "admin": {
            "address": {"socket_address": {"address": options.admin_address, "port_value": options.admin_port}},
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if options.delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "static_resources": {"clusters": [xds_cluster(options)]},
    }


def xds_cluster(options: BootstrapOptions) -> dict[str, Any]:
    """The `xds-grpc` cluster: HTTP/2 with keepalives to meshctl serve, over TLS when asked."""
    cluster: dict[str, Any] = {
        "name": XDS_CLUSTER,
        "type": "STATIC" if is_ip(options.xds_host) else "STRICT_DNS",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "connection_keepalive": {"interval": "30s", "timeout": "10s"},
                    }
                },
            }
        },
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": options.xds_host, "port_value": options.xds_port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if options.tls is not None:
        cluster["transport_socket"] = xds_transport_socket(options.tls, options.xds_host)
    return cluster
