"""A complete Envoy bootstrap for a VM proxy: node identity, ADS to meshctl, and an admin port.

With it a VM needs only `meshctl bootstrap ... > envoy.yaml && envoy -c envoy.yaml`: everything
else (listeners, clusters, routes, endpoints) arrives over ADS.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.snapshot.proxy import ProxyNode

XDS_CLUSTER = "xds-grpc"


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    xds_host: str
    xds_port: int
    delta: bool = False
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    labels: Mapping[str, str] = field(default_factory=dict)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
        "static_resources": {
            "clusters": [
                {
                    "name": XDS_CLUSTER,
                    "type": "STATIC" if _is_ip(options.xds_host) else "STRICT_DNS",
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
                                                "socket_address": {
                                                    "address": options.xds_host,
                                                    "port_value": options.xds_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ]
        },
    }
