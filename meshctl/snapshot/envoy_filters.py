"""Which EnvoyFilters apply to a proxy, in the order their patches are applied.

As in Istio: the EnvoyFilters of the root namespace (MeshConfig `rootNamespace`) apply to every
proxy of the mesh, those of a namespace to its proxies; a `workloadSelector` narrows either to
the workloads with its labels, and `targetRefs` replace it (a Gateway's proxies, a Service's or
ServiceEntry's endpoints: `target_refs.py`). Patches are applied in ascending `priority` (default 0); among
equal priorities the root namespace's come first, then the proxy's namespace's, and within a
namespace the oldest first. Files carry no creation time unless `metadata.creationTimestamp` is
written: an EnvoyFilter with one comes before those without, which are in name order, so every
replica orders alike.

The selection is part of a proxy's generation key (`Proxy.envoy_filters`): a change to an
EnvoyFilter regenerates only the proxies it selects (before or after the change).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from meshctl.config.labels import labels_match, selector_labels
from meshctl.config.model import Config
from meshctl.registry.model import Service
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.target_refs import references, targets_proxy

KIND = "EnvoyFilter"


def _order(config: Config) -> tuple[int, float, str]:
    created = config.created if config.created is not None else math.inf
    return (spec(config).priority, created, config.name)


def _of_namespace(snapshot: Snapshot, namespace: str) -> tuple[Config, ...]:
    """A namespace's EnvoyFilters in their order, found once per snapshot."""
    return snapshot.index.scoped(
        "envoy_filters",
        (namespace, snapshot.kind_digests.get(KIND, b"")),
        lambda: tuple(sorted((c for c in snapshot.of_kind(KIND) if c.namespace == namespace), key=_order)),
    )


def select_envoy_filters(
    snapshot: Snapshot,
    namespace: str,
    labels: Mapping[str, str],
    *,
    router: bool = False,
    services: Iterable[Service] = (),
) -> tuple[Config, ...]:
    """The EnvoyFilters that apply to a proxy of `namespace` with `labels` (a gateway when
    `router`, an endpoint of `services`), in patch order. An EnvoyFilter with `targetRefs`
    applies only to the proxies they name (`target_refs.py`), never namespace-wide."""
    if not snapshot.of_kind(KIND):
        return ()
    served = tuple(services)
    root = snapshot.mesh.root_namespace
    found: list[tuple[int, int, Config]] = []  # (priority, root first, config): sorted stably
    for rank, ns in enumerate((root,) if namespace == root else (root, namespace)):
        for config in _of_namespace(snapshot, ns):
            refs = references(spec(config))
            if refs:
                if not targets_proxy(snapshot, ns, refs, router=router, labels=labels, services=served):
                    continue
                found.append((spec(config).priority, rank, config))
                continue
            selector = selector_labels(spec(config))
            if selector and not labels_match(selector, labels):
                continue
            found.append((spec(config).priority, rank, config))
    found.sort(key=lambda entry: (entry[0], entry[1]))
    return tuple(config for _, _, config in found)


def filters_key(filters: tuple[Config, ...]) -> tuple[tuple[object, str], ...]:
    """What of the selected EnvoyFilters generation reads, for the generation key: each one's
    identity and content."""
    return tuple((c.key, c.content_digest()) for c in filters)
