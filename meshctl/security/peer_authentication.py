"""Which mutual TLS mode applies to a workload's port: Istio's PeerAuthentication precedence.

Three levels of policy, each refining the one above it (`pilot/pkg/security/authn`):

- mesh-wide: a policy without a selector in the root namespace (MeshConfig's, `istio-system`);
- namespace-wide: a policy without a selector in the workload's namespace;
- workload: a policy in the workload's namespace whose selector matches the workload's labels,
  with its `portLevelMtls` for single ports (keyed by the port the workload listens on).

A level that says UNSET (or has no policy) inherits the level above; with no policy anywhere the
mode is PERMISSIVE, Istio's default, so that plaintext clients keep working while mesh clients
move to mutual TLS. Where several policies compete at one level, the oldest wins (creation time,
then name), as in Istio; a workload-level policy without a selector is a namespace one.

Clients decide whether to use mutual TLS towards a service (auto mTLS) from the namespace-wide
mode of the service's namespace (`namespace_mode`), as Istio's BestEffortInferServiceMTLSMode does:
workload-level policies are not visible to a client choosing per cluster.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from meshctl.config.model import Config
from meshctl.snapshot.model import Snapshot, spec

KIND: Final = "PeerAuthentication"


class MtlsMode(enum.Enum):
    """How a workload port accepts connections."""

    #: plaintext only
    DISABLE = "DISABLE"
    #: mutual TLS from mesh clients and plaintext from anyone else
    PERMISSIVE = "PERMISSIVE"
    #: mutual TLS only
    STRICT = "STRICT"

    @property
    def accepts_mtls(self) -> bool:
        return self is not MtlsMode.DISABLE

    @property
    def accepts_plaintext(self) -> bool:
        return self is not MtlsMode.STRICT


#: The protobuf enum's numbers (istio.security.v1beta1.PeerAuthentication.MutualTLS.Mode);
#: UNSET (0) is absent: it inherits.
_BY_NUMBER: Final[Mapping[int, MtlsMode]] = {1: MtlsMode.DISABLE, 2: MtlsMode.PERMISSIVE, 3: MtlsMode.STRICT}
DEFAULT_MODE: Final = MtlsMode.PERMISSIVE


@dataclass(frozen=True, slots=True)
class WorkloadMtls:
    """The modes in force for one workload: `mode` for every port but those in `ports`."""

    mode: MtlsMode = DEFAULT_MODE
    ports: tuple[tuple[int, MtlsMode], ...] = ()
    #: The policies it was decided from, `namespace/name`, for dumps and logs.
    sources: tuple[str, ...] = ()

    def for_port(self, port: int) -> MtlsMode:
        for number, mode in self.ports:
            if number == port:
                return mode
        return self.mode


def workload_mtls(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> WorkloadMtls:
    """The modes that apply to a workload of `namespace` with `labels`."""
    policies = snapshot.of_kind(KIND)
    if not policies:
        return WorkloadMtls()
    root = snapshot.mesh.root_namespace
    mesh = _oldest(c for c in policies if c.namespace == root and not _selector(c))
    own = _oldest(c for c in policies if c.namespace == namespace and not _selector(c))
    selected = _oldest(
        c for c in policies if c.namespace == namespace and _selector(c) and _matches(_selector(c), labels)
    )
    mode = DEFAULT_MODE
    sources: list[str] = []
    for policy in (mesh, own, selected):
        if policy is None or f"{policy.namespace}/{policy.name}" in sources:
            continue
        sources.append(f"{policy.namespace}/{policy.name}")
        mode = _mode(spec(policy).mtls.mode) or mode
    ports: list[tuple[int, MtlsMode]] = []
    if selected is not None:
        for number, setting in sorted(spec(selected).port_level_mtls.items()):
            ports.append((int(number), _mode(setting.mode) or mode))
    return WorkloadMtls(mode, tuple(ports), tuple(sources))


def namespace_mode(snapshot: Snapshot, namespace: str) -> MtlsMode:
    """The namespace-wide mode of `namespace` (its own policy, else the mesh's, else PERMISSIVE):
    what a client assumes of a service there when choosing auto mTLS."""
    policies = snapshot.of_kind(KIND)
    if not policies:
        return DEFAULT_MODE
    root = snapshot.mesh.root_namespace
    own = _oldest(c for c in policies if c.namespace == namespace and not _selector(c))
    mesh = _oldest(c for c in policies if c.namespace == root and not _selector(c))
    for policy in (own, mesh):
        if policy is not None and (found := _mode(spec(policy).mtls.mode)) is not None:
            return found
    return DEFAULT_MODE


def _mode(number: int) -> MtlsMode | None:
    return _BY_NUMBER.get(int(number))


def _selector(config: Config) -> Mapping[str, str]:
    body = spec(config)
    if not body.HasField("selector"):
        return {}
    labels: Mapping[str, str] = body.selector.match_labels
    return labels


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _oldest(configs: Iterable[Config]) -> Config | None:
    """Istio's tie-break between policies at one level: the oldest, then by name."""
    found = sorted(configs, key=lambda c: (c.created if c.created is not None else float("inf"), c.name))
    return found[0] if found else None
