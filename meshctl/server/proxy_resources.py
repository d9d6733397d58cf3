"""What the resource cache hands the servicer: everything one proxy may be sent at one snapshot
(`ProxyResources`), and a node resolved to its workload with it (`Resolved`).

Apart from the cache (`meshctl.server.cache`) because the protocol state, the servicer, the
credentials and the rollout read these values and nothing else of it: they need not import
generation to hold a proxy's view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from meshctl.xds import types
from meshctl.xds.resources import Resource

if TYPE_CHECKING:
    from meshctl.snapshot.model import Snapshot
    from meshctl.snapshot.proxy import Proxy


@dataclass(frozen=True, slots=True, eq=False)
class Resolved:
    """A node bound to its workload in one snapshot, and everything it may be sent there."""

    proxy: Proxy
    resources: ProxyResources


@dataclass(frozen=True, slots=True, eq=False)
class ProxyResources:
    """Everything one proxy may be sent at one snapshot, by type URL then name."""

    snapshot_version: str
    config_version: str
    by_type: Mapping[str, Mapping[str, Resource]]

    def of(self, type_url: str) -> Mapping[str, Resource]:
        return self.by_type.get(type_url, _NOTHING)


def with_endpoints(
    snapshot: Snapshot, config: Mapping[str, Mapping[str, Resource]], eds: Mapping[str, Resource]
) -> ProxyResources:
    """A view at `snapshot`: `config`'s resources (clusters, listeners, routes, secrets) and the
    assignments `eds`, which an endpoint-only change replaces alone."""
    by_type = dict(config)
    by_type[types.ENDPOINT] = eds
    return ProxyResources(snapshot.version, snapshot.config_version, MappingProxyType(by_type))


#: What `ProxyResources.of` gives for a type it has none of (asked at every push of every stream).
_NOTHING: Mapping[str, Resource] = MappingProxyType({})
