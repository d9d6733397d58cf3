"""The xDS bootstrap a proxyless gRPC application starts from (gRFC A27, A29, A36).

gRPC's xDS client reads it from the file named by `GRPC_XDS_BOOTSTRAP` (or the JSON itself in
`GRPC_XDS_BOOTSTRAP_CONFIG`) when the first `xds:///` channel or xDS server is made. It names:

- the xDS servers (meshctl serve's replicas, tried in order), spoken to over SotW ADS v3
  (`server_features: ["xds_v3"]`), with `insecure` channel credentials or `tls` ones trusting
  meshctl's CA (and presenting the workload's certificate when one is given);
- the node: Istio's node id, and metadata with `GENERATOR: grpc`, which makes meshctl serve
  gRPC's resources rather than Envoy's;
- the certificate providers: `default`, a `file_watcher` over the workload's certificate, key
  and root in a `meshctl ca issue` / `ca renew` directory, which mesh TLS config names;
- the template an xDS server's listener name is made from (Istio's
  `xds.istio.io/grpc/lds/inbound/%s`, `%s` being `IP:PORT`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshctl.snapshot.node import GRPC_GENERATOR, ProxyNode

#: Istio's listener name template for gRPC xDS servers (`grpcxds.ServerListenerNameTemplate`).
SERVER_LISTENER_TEMPLATE = "xds.istio.io/grpc/lds/inbound/%s"
#: The certificate provider instance mesh TLS config names (Istio's `default`).
CERTIFICATE_PROVIDER = "default"
#: How often gRPC re-reads the certificate files: renewals are picked up within this.
REFRESH_INTERVAL = "300s"
#: The names `meshctl ca issue` and `ca renew` write in a certificate directory.
CERT_FILE, KEY_FILE, ROOT_FILE = "cert-chain.pem", "key.pem", "root-cert.pem"


@dataclass(frozen=True, slots=True)
class GrpcBootstrapOptions:
    #: meshctl serve's addresses, `HOST:PORT`, the first tried first
    servers: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    #: TLS to meshctl: its CA, and this workload's certificate and key (both or neither)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    #: the workload's certificate directory, for the `default` certificate provider
    cert_dir: Path | None = None


def build_grpc_bootstrap(node: ProxyNode, options: GrpcBootstrapOptions) -> dict[str, Any]:
    """The bootstrap as a JSON-ready dict."""
    creds: dict[str, Any]
    if options.ca_file is None:
        creds = {"type": "insecure"}
    else:
        config = {"ca_certificate_file": str(options.ca_file)}
        if options.cert_file is not None and options.key_file is not None:
            config |= {"certificate_file": str(options.cert_file), "private_key_file": str(options.key_file)}
        creds = {"type": "tls", "config": config}
    metadata: dict[str, Any] = {
        "GENERATOR": GRPC_GENERATOR,
        "NAMESPACE": node.namespace,
        "INTERCEPTION_MODE": node.interception.value,
    }
    if options.labels:
        metadata["LABELS"] = dict(options.labels)
    out: dict[str, Any] = {
        "xds_servers": [
            {"server_uri": server, "channel_creds": [creds], "server_features": ["xds_v3"]}
            for server in options.servers
        ],
        "node": {"id": node.id, "metadata": metadata, "locality": {}},
        "server_listener_resource_name_template": SERVER_LISTENER_TEMPLATE,
    }
    if options.cert_dir is not None:
        out["certificate_providers"] = {
            CERTIFICATE_PROVIDER: {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": str(options.cert_dir / CERT_FILE),
                    "private_key_file": str(options.cert_dir / KEY_FILE),
                    "ca_certificate_file": str(options.cert_dir / ROOT_FILE),
                    "refresh_interval": REFRESH_INTERVAL,
                },
            }
        }
    return out
