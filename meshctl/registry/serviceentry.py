"""ServiceEntry, WorkloadEntry and WorkloadGroup files to the registry model, as istiod does it.

`build_file_model` is a pure function of the configs (the file registry, `registry/files.py`,
builds again on a change, reusing what its memo converted; `update_file_model` applies a change
of WorkloadEntries alone to the last build, with the same result, which a test checks against
a build from scratch). It follows `pilot/pkg/serviceregistry/serviceentry` (conversion.go,
controller.go, workloadentry.go): a WorkloadEntry becomes a workload as
`registry/workloads.py` says, a ServiceEntry its services and endpoints as
`registry/serviceentry_convert.py` says; this module decides what is converted and who owns a
hostname:

- A hostname defined by two ServiceEntries belongs to the first in (namespace, name) order; the
  other is ignored and a note names both (Istio keeps one per namespace; meshctl's model has one
  service per hostname).
- A ServiceEntry whose resolution meshctl cannot serve is ignored with a note, as is a
  WorkloadEntry naming a WorkloadGroup that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

from meshctl.api.networking.v1alpha3 import service_entry_pb2, workload_entry_pb2, workload_group_pb2
from meshctl.config.labels import GROUP_ANNOTATION, labels_match
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.model import Endpoint, Service, ServiceModel, make_model, patch_model, sorted_endpoints
from meshctl.registry.serviceentry_convert import convert_services, service_endpoints
from meshctl.registry.workloads import (
    LabelPool,
    Workload,
    WorkloadIndex,
    template_of,
    workload_from_message,
)

#: The kinds this registry reads; a change to any other kind leaves its model alone.
KINDS: Final = frozenset({"ServiceEntry", "WorkloadEntry", "WorkloadGroup"})

_SE = service_entry_pb2.ServiceEntry
_WE = workload_entry_pb2.WorkloadEntry
_WG = workload_group_pb2.WorkloadGroup


class BuildMemo:
    """What an earlier build converted, for the next build to reuse; a registry keeps one.

    Configs are immutable, so the same WorkloadEntry config object with the same group template
    converts to the same workload, and the same ServiceEntry config object selecting the very
    same workloads has the same services and endpoints. A change to one file of ten thousand
    then converts one entry instead of all of them.
    """

    __slots__ = ("entries", "index", "model", "owners", "workloads")

    def __init__(self) -> None:
        #: WorkloadEntry key -> (config, its group's template, the workload)
        self.workloads: dict[ConfigKey, tuple[Config, Workload | None, Workload]] = {}
        #: ServiceEntry key -> (config, the workloads it selected, its services, their endpoints)
        self.entries: dict[
            ConfigKey, tuple[Config, Sequence[Workload], list[Service], dict[str, tuple[Endpoint, ...]]]
        ] = {}
        #: the model the last build made, whose digests the next carries over
        self.model: ServiceModel | None = None
        #: the last build's workloads by namespace and label, and each hostname's ServiceEntry
        self.index: WorkloadIndex | None = None
        self.owners: dict[str, ConfigKey] = {}


def _config_order(pair: tuple[Config, Any]) -> tuple[str, str, str]:
    key = pair[0].key
    return (key.kind, key.namespace, key.name)  # ConfigKey's order, compared as a plain tuple


def build_file_model(configs: Iterable[Config], memo: BuildMemo | None = None) -> ServiceModel:
    """The services and endpoints that ServiceEntry, WorkloadEntry and WorkloadGroup configs
    define; other kinds are ignored. Deterministic: the same configs give the same model.

    With `memo`, entries unchanged since the build that filled it are not converted again; the
    memo is updated to hold exactly this build's."""
    entries: list[tuple[Config, _SE]] = []
    workload_entries: list[Config] = []
    groups: dict[tuple[str, str], _WG] = {}
    for config in configs:
        if config.kind == "WorkloadEntry":
            # Its spec is read below, one at a time and only when the memo lacks it: the loader
            # keeps WorkloadEntry specs packed (see `Config`), so each read parses.
            workload_entries.append(config)
            continue
        spec = config.spec
        if config.kind == "ServiceEntry" and isinstance(spec, _SE):
            entries.append((config, spec))
        elif config.kind == "WorkloadGroup" and isinstance(spec, _WG):
            groups[(config.namespace, config.name)] = spec

    notes: list[str] = []
    templates: dict[tuple[str, str], Workload] = {}
    shared_labels: LabelPool = {}
    fresh: dict[ConfigKey, tuple[Config, Workload | None, Workload]] = {}
    for config in sorted(workload_entries, key=lambda c: tuple(c.key)):
        template = template_of(config, groups, templates, notes)
        known = memo.workloads.get(config.key) if memo is not None else None
        if known is not None and known[0] is config and known[1] == template:
            workload = known[2]
        else:
            entry = config.spec
            if not isinstance(entry, _WE):
                continue
            workload = workload_from_message(
                entry, config.name, config.namespace, config.labels, template, shared_labels=shared_labels
            )
        fresh[config.key] = (config, template, workload)
    index = WorkloadIndex(w for _, _, w in fresh.values())

    services: dict[str, Service] = {}
    owners: dict[str, ConfigKey] = {}
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    converted_entries: dict[
        ConfigKey, tuple[Config, Sequence[Workload], list[Service], dict[str, tuple[Endpoint, ...]]]
    ] = {}
    for config, spec in sorted(entries, key=_config_order):
        # Every host of the entry has the same selector, so the workloads are looked up once.
        selected: Sequence[Workload] = ()
        if spec.HasField("workload_selector"):
            selected = index.select(config.namespace, dict(spec.workload_selector.labels))
        seen = memo.entries.get(config.key) if memo is not None else None
        if seen is not None and seen[0] is config and _same_workloads(seen[1], selected):
            converted, entry_endpoints = seen[2], seen[3]
        else:
            converted = convert_services(config)
            entry_endpoints = {s.hostname: sorted_endpoints(service_endpoints(spec, s, selected)) for s in converted}
        converted_entries[config.key] = (config, selected, converted, entry_endpoints)
        if not converted and spec.hosts:
            resolution = _SE.Resolution.Name(spec.resolution)
            notes.append(f"{config.key} is ignored: resolution {resolution} is not supported")
        for service in converted:
            owner = owners.get(service.hostname)
            if owner is not None:
                if owner != config.key:
                    notes.append(f"host {service.hostname} is defined by {owner} and {config.key}; using {owner}")
                continue
            owners[service.hostname] = config.key
            services[service.hostname] = service
            endpoints[service.hostname] = entry_endpoints[service.hostname]
    model = make_model(services.values(), endpoints, notes, previous=[memo.model] if memo and memo.model else ())
    if memo is not None:
        memo.workloads, memo.entries, memo.model = fresh, converted_entries, model
        memo.index, memo.owners = index, owners
    return model


def update_file_model(
    configs: Mapping[ConfigKey, Config | None], changed: Iterable[ConfigKey], memo: BuildMemo
) -> ServiceModel | None:
    """The model `build_file_model(configs.values(), memo)` would make, when only the
    WorkloadEntries and ServiceEntries `changed` (created, updated or deleted) differ from the
    build that filled `memo`: those workloads are converted, only the ServiceEntries that
    selected them before or select them now are matched again, and the ServiceEntries changed
    are converted and matched. None when that does not hold (another kind changed, a
    WorkloadEntry of a WorkloadGroup, no build before) or when the result would need the
    whole build's rules (a model with notes, a hostname defined twice, an entry ignored): build
    the whole model then.

    An endpoint joining or leaving then costs its namespace's ServiceEntries, and an edit of
    one ServiceEntry costs that entry, not the mesh."""
    model, index = memo.model, memo.index
    if model is None or index is None:
        return None
    changed = list(changed)
    if any(key.kind not in _INCREMENTAL_KINDS for key in changed):
        return None
    entries = _changed_entries(configs, [k for k in changed if k.kind == "ServiceEntry"], memo)
    if entries is None:
        return None
    workloads = _changed_workloads(configs, [k for k in changed if k.kind == "WorkloadEntry"], memo)
    if workloads is None:
        return None
    if not workloads and not entries:
        return model
    endpoints = _apply_workloads(workloads, memo) if workloads else {}
    services: dict[str, Service | None] = {}
    for key, config, converted in entries:
        old = memo.entries.pop(key, None)
        if old is not None:
            for service in old[2]:
                if memo.owners.get(service.hostname) == key:
                    del memo.owners[service.hostname]
                    services[service.hostname] = None
                    endpoints[service.hostname] = ()
        if config is None:
            continue
        spec = config.spec
        assert isinstance(spec, _SE)  # _changed_entries converted it
        selected: Sequence[Workload] = ()
        if spec.HasField("workload_selector"):
            selected = index.select(config.namespace, dict(spec.workload_selector.labels))
        entry_endpoints = {s.hostname: sorted_endpoints(service_endpoints(spec, s, selected)) for s in converted}
        memo.entries[key] = (config, selected, converted, entry_endpoints)
        for service in converted:
            memo.owners[service.hostname] = key
            services[service.hostname] = service
            endpoints[service.hostname] = entry_endpoints[service.hostname]
    updated = patch_model(model, services, endpoints)
    memo.model = updated
    return updated


#: The kinds `update_file_model` applies as a change; any other needs the whole build.
_INCREMENTAL_KINDS: Final = frozenset({"WorkloadEntry", "ServiceEntry"})


def _changed_entries(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], memo: BuildMemo
) -> list[tuple[ConfigKey, Config | None, list[Service]]] | None:
    """The ServiceEntries changed, each with its new services (none: deleted); None when the
    change needs the whole build. Reads the memo, changes nothing.

    Without notes in the model before, every hostname had one ServiceEntry and none was
    ignored; if that still holds after the change, each hostname still belongs to the one entry
    that defines it, so the entries changed can be replaced on their own."""
    assert memo.model is not None
    out: list[tuple[ConfigKey, Config | None, list[Service]]] = []
    if not keys:
        return out
    if memo.model.notes:
        return None
    claimed: set[str] = set()
    leaving = set(keys)
    for key, config, _ in _changed_since(configs, keys, memo.entries):
        converted: list[Service] = []
        if config is not None:
            spec = config.spec
            if not isinstance(spec, _SE):
                return None
            converted = convert_services(config)
            if not converted and spec.hosts:
                return None  # ignored, with a note
            for service in converted:
                owner = memo.owners.get(service.hostname)
                if service.hostname in claimed or (owner is not None and owner not in leaving):
                    return None  # defined twice: the first by name wins, with a note
                claimed.add(service.hostname)
        out.append((key, config, converted))
    return out


#: A memo's entry for a config: the config it was made from first.
_Entry = TypeVar("_Entry", bound=tuple[Any, ...])


def _changed_since(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], known: Mapping[ConfigKey, _Entry]
) -> Iterator[tuple[ConfigKey, Config | None, _Entry | None]]:
    """Each of `keys` whose config is not the very object the memo `known` holds for it (added,
    replaced or gone), with the config now (None: gone) and the memo's entry (None: new)."""
    for key in keys:
        config = configs.get(key)
        entry = known.get(key)
        if config is None and entry is None:
            continue
        if config is not None and entry is not None and config is entry[0]:
            continue
        yield key, config, entry


def _changed_workloads(
    configs: Mapping[ConfigKey, Config | None], keys: list[ConfigKey], memo: BuildMemo
) -> list[tuple[ConfigKey, Config | None, Workload | None, Workload | None]] | None:
    """The WorkloadEntries changed, each as (key, config, old workload, new workload); None when
    one belongs (or belonged) to a WorkloadGroup. Reads the memo, changes nothing."""
    replaced: list[tuple[ConfigKey, Config | None, Workload | None, Workload | None]] = []
    for key, config, known in _changed_since(configs, keys, memo.workloads):
        if any(c is not None and c.annotations.get(GROUP_ANNOTATION) for c in (config, known and known[0])):
            return None  # group templates and their notes: the whole build handles them
        new: Workload | None = None
        if config is not None:
            entry = config.spec
            if isinstance(entry, _WE):
                new = workload_from_message(entry, config.name, config.namespace, config.labels, None)
        replaced.append((key, config, known[2] if known is not None else None, new))
    return replaced


def _apply_workloads(
    replaced: list[tuple[ConfigKey, Config | None, Workload | None, Workload | None]], memo: BuildMemo
) -> dict[str, tuple[Endpoint, ...]]:
    """Put the workloads changed into the memo's index and match again the ServiceEntries
    that selected them or select them now; returns those entries' hosts' new endpoints."""
    index = memo.index
    assert index is not None
    touched: dict[str, list[Mapping[str, str]]] = {}
    for key, config, old, new in replaced:
        if old is not None:
            index.remove(old)
            touched.setdefault(old.namespace, []).append(old.labels)
        if new is not None and config is not None:
            index.add(new)
            touched.setdefault(new.namespace, []).append(new.labels)
            memo.workloads[key] = (config, None, new)
        else:
            memo.workloads.pop(key, None)
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    for key, (config, _selected, converted, _endpoints_of) in list(memo.entries.items()):
        labels = touched.get(config.namespace)
        if labels is None:
            continue
        spec = config.spec
        if not isinstance(spec, _SE) or not spec.HasField("workload_selector"):
            continue
        selector = dict(spec.workload_selector.labels)
        if not any(labels_match(selector, found) for found in labels):
            continue
        selected = index.select(config.namespace, selector)
        entry_endpoints = {s.hostname: sorted_endpoints(service_endpoints(spec, s, selected)) for s in converted}
        memo.entries[key] = (config, selected, converted, entry_endpoints)
        for host, eps in entry_endpoints.items():
            if memo.owners.get(host) == key:
                endpoints[host] = eps
    return endpoints


def _same_workloads(a: Sequence[Workload], b: Sequence[Workload]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
