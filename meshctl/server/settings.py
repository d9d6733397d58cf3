"""What `meshctl serve` is told (`ServeSettings`, plain data the CLI builds from flags and the
environment, passed down, never global), and the checks of its listening addresses that the CLI
makes before the server starts. Apart from `app.py` so the commands that only parse an address
(`bootstrap`, `ca`) do not import the server.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from meshctl.kv.source import KvLocation
from meshctl.registry.consul_http import ConsulOptions
from meshctl.registry.health_share import DEFAULT_SESSION_TTL
from meshctl.server.auth import XdsTls
from meshctl.server.discovery import DebounceSettings
from meshctl.server.history import DEFAULT_KEEP
from meshctl.server.limits import StreamLimits
from meshctl.server.notify import NotifySettings
from meshctl.server.rollout_plan import RolloutSettings
from meshctl.server.write_budget import DEFAULT_BYTES
from meshctl.snapshot.model import MeshSettings

#: Where the self-signed root lives unless --state-dir says otherwise (systemd's StateDirectory=).
DEFAULT_STATE_DIR: Final = Path("/var/lib/meshctl")


def split_address(address: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` -> (host, port); raises ValueError with the reason."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return (host.strip("[]") or default_host), int(port)


def check_bindable(host: str, port: int) -> None:
    """Raise OSError saying why `host:port` cannot be listened on (a name that does not resolve,
    an address not of this host, a port in use), by binding it once as a listener would.

    gRPC only says "Failed to bind" (and logs its own line on stderr); this says why, before gRPC
    tries. Port 0 checks the address alone.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen()
        except OSError as exc:
            raise OSError(f"{host}:{port}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything `meshctl serve` is told; built by the CLI, passed down, never global."""

    config_dirs: tuple[Path, ...]
    xds_address: str = "127.0.0.1:15010"
    admin_address: str = "127.0.0.1:15014"
    consul: ConsulOptions | None = None
    #: Read the config from this Consul KV prefix instead of `config_dirs` (`--config-consul-kv`).
    config_kv: KvLocation | None = None
    default_namespace: str = "default"
    debounce: DebounceSettings = field(default_factory=DebounceSettings)
    #: Seconds between full passes over `config_dirs` (0: never), which catch what no file event told.
    resync_period: float = 300.0
    mesh: MeshSettings = field(default_factory=MeshSettings)
    #: How long a stopping server lets streams finish before closing them.
    drain_seconds: float = 5.0
    #: TLS on the xDS port; with a client CA, proxies must prove the workload their node id names.
    tls: XdsTls | None = None
    #: A file holding the bearer token the /debug admin pages require.
    admin_token_file: Path | None = None
    #: systemd's notify socket and watchdog (read from the environment by the CLI); off by default.
    notify: NotifySettings = field(default_factory=NotifySettings)
    #: Called once the server is up, with the (xds, admin) ports chosen.
    on_ready: Callable[[int, int], None] | None = None
    #: Istio's MeshConfig YAML (`--mesh-config`), followed for changes; settings override `mesh`.
    mesh_config: Path | None = None
    #: Kubernetes-style TLS secrets (`DIR/NAMESPACE/NAME/tls.crt`...) that gateways name by
    #: `credentialName`, followed for changes and served over SDS (`meshctl.server.credentials`).
    credentials_dir: Path | None = None
    #: How long new proxies wait for every registry's first sync before the server gives them
    #: what it has (see `Server.admission`): long enough for a Consul restart.
    registry_sync_timeout: float = 30.0
    #: Freeze what start-up loaded out of the cyclic garbage collector (`gc.freeze`): it lives as
    #: long as the server, and full collections walking it cost up to a tenth of a second per
    #: change at a thousand services. `meshctl serve` owns its process and sets it; a server
    #: embedded in another process (tests) leaves that process's collector alone.
    freeze_startup: bool = False
    #: The CA that signs workload certificates: Istio's cacerts files (`ca_dir`), else a root kept
    #: in `state_dir`; with neither (or a default state dir that cannot be written), no proxy
    #: gets a certificate and config uses no mutual TLS.
    ca_dir: Path | None = None
    #: After `ca_dir` changes its signing certificate, the certificates the old one signed are
    #: reissued at random times within this long (at most a third of their lifetime).
    ca_reissue_window: datetime.timedelta = datetime.timedelta(minutes=10)
    state_dir: Path | None = None
    #: False when `state_dir` is the default: a directory that cannot be written then turns
    #: workload mutual TLS off with a warning instead of stopping the server.
    state_dir_given: bool = True
    workload_cert_lifetime: datetime.timedelta = datetime.timedelta(hours=24)
    #: Where join tokens are exchanged for first certificates (`meshctl.server.ca_service`); None: nowhere.
    join_address: str | None = None
    #: Send keys to proxies whose identity the xDS connection did not prove (loopback demos).
    insecure_send_keys: bool = False
    #: Seconds after which gRPC sends a connection GOAWAY (gRPC core adds ±10 % jitter), so the
    #: streams of a fleet spread back over replicas that return; None for never. As istiod's
    #: `PILOT_KEEPALIVE_MAX_SERVER_CONNECTION_AGE` (30m), with its 10 s grace (`grpc_options`).
    max_connection_age: float | None = 1800.0
    #: Serve a mesh with no config and no services (`--allow-empty-mesh`); without it (or the
    #: `EMPTY_MESH_MARKER` file in the config source) such a mesh is not ready (`Server.admission`).
    allow_empty_mesh: bool = False
    #: New ADS streams a second this server admits (a token bucket, `meshctl.server.pacing`);
    #: more are refused with UNAVAILABLE, which Envoy retries. 0: no limit.
    max_new_streams_per_second: float = 0.0
    #: Response bytes handed to gRPC at once (`meshctl.server.write_budget`); 0: no bound.
    max_write_bytes: int = DEFAULT_BYTES
    #: What the clients of the xDS port may make the server hold (`meshctl.server.limits`).
    limits: StreamLimits = field(default_factory=StreamLimits)
    #: Seconds a health-checked workload's Envoy may be without a health stream before the
    #: workload counts as unhealthy (Istio's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).
    health_grace: float = 10.0
    #: The TTL of the Consul session under which replicas share health and registrations: a
    #: replica that dies has its share removed after one to two TTLs (Consul's rule).
    health_session_ttl: float = DEFAULT_SESSION_TTL
    #: Snapshot versions the push history keeps (in `state_dir`; `meshctl.server.history`).
    history_size: int = DEFAULT_KEEP
    #: Canaries and their soak (`meshctl.server.rollout`); none by default.
    rollout: RolloutSettings = field(default_factory=RolloutSettings)


#: How long a stream past its connection's max age may still run (istiod's
#: `MaxServerConnectionAgeGrace`, 10 s): a push under way finishes, then Envoy reconnects.
MAX_CONNECTION_AGE_GRACE: Final = 10.0


def grpc_age_options(max_age: float | None) -> list[tuple[str, int]]:
    """gRPC server options for `ServeSettings.max_connection_age`: none without one. gRPC core
    jitters the age by ±10 % itself (`kMaxConnectionAgeJitter`), so the fleet's reconnects spread."""
    if max_age is None or max_age <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", max(1, int(max_age * 1000))),
        ("grpc.max_connection_age_grace_ms", int(MAX_CONNECTION_AGE_GRACE * 1000)),
    ]
