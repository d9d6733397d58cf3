"""Which WasmPlugins apply to a proxy, in the order their filters run, as Istio orders them.

Hierarchy: the WasmPlugins of the root namespace (MeshConfig `rootNamespace`) apply to every
proxy of the mesh, those of a namespace to its proxies; a `selector` narrows either to the
workloads with its labels, and `targetRefs` replace it (`target_refs.py`: a plugin with target
references applies only to the proxies they resolve to). The filters are then grouped by
`phase` (placed in the HTTP filter chain by `xds/wasm.py`) and, within a phase, run in
descending `priority` (default 0); equal priorities keep the root namespace's first, then the
proxy namespace's, each oldest first (`metadata.creationTimestamp`; those without one by name),
so every replica orders alike.

The selection is resolved when a proxy is bound, into `Proxy.wasm_plugins`, which is part of its
patch key: a WasmPlugin change regenerates only the proxies it selects (before or after).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from meshctl.config.labels import labels_match
from meshctl.config.model import Config
from meshctl.registry.model import Service
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.target_refs import references, targets_proxy

KIND: Final = "WasmPlugin"


def priority(config: Config) -> int:
    plugin: Any = spec(config)
    return int(plugin.priority.value) if plugin.HasField("priority") else 0


def _of_namespace(snapshot: Snapshot, namespace: str) -> tuple[Config, ...]:
    return snapshot.index.scoped(
        "wasm_plugins",
        (namespace, snapshot.kind_digests.get(KIND, b"")),
        lambda: tuple(sorted((c for c in snapshot.of_kind(KIND) if c.namespace == namespace), key=Config.istio_order)),
    )


def select_wasm_plugins(
    snapshot: Snapshot,
    namespace: str,
    labels: Mapping[str, str],
    *,
    router: bool = False,
    services: Iterable[Service] = (),
) -> tuple[Config, ...]:
    """The WasmPlugins that apply to a proxy of `namespace` with `labels` (a gateway when
    `router`, an endpoint of `services`), highest priority first (see the module docstring)."""
    if not snapshot.of_kind(KIND):
        return ()
    served = tuple(services)
    root = snapshot.mesh.root_namespace
    found: list[Config] = []
    for ns in (root,) if namespace == root else (root, namespace):
        for config in _of_namespace(snapshot, ns):
            plugin: Any = spec(config)
            refs = references(plugin)
            if refs:
                # A target reference names an object of the plugin's own namespace.
                if not targets_proxy(snapshot, ns, refs, router=router, labels=labels, services=served):
                    continue
            elif not labels_match(dict(plugin.selector.match_labels), labels):
                continue
            found.append(config)
    found.sort(key=lambda c: -priority(c))  # stable: root first, then oldest first
    return tuple(found)


def plugins_key(plugins: tuple[Config, ...]) -> tuple[tuple[object, str], ...]:
    """What generation reads of the selected WasmPlugins: each one's identity and content."""
    return tuple((c.key, c.content_digest()) for c in plugins)
