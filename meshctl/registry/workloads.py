"""WorkloadEntries and WorkloadGroup templates as the workloads a ServiceEntry's selector sees.

Apart from the ServiceEntry build (`registry/serviceentry.py`) because a workload is decided by
its own WorkloadEntry and group alone, whatever selects it, and because selection has its own
index; the build converts each entry once and matches services against the index. The rules, as
Istio's `ConvertWorkloadEntry` and auto-registration apply them:

- A workload's labels are the spec's labels merged with the metadata labels, metadata winning.
  A WorkloadEntry whose address is not an IP (a hostname or a `unix://` socket) is only
  selected by DNS-resolved services, which Envoy can resolve.
- Locality falls back to the `istio-locality` label (`region.zone` written with dots, since
  Kubernetes labels cannot hold `/`), network to the `topology.istio.io/network` label. The
  service account is kept as the name written in the WorkloadEntry (not a SPIFFE URI): the
  identity's trust domain is a server setting, applied where certificates are checked.
- A WorkloadEntry annotated `istio.io/autoRegistrationGroup: NAME` (the annotation Istio's
  auto-registration writes on entries it creates from a group) belongs to the WorkloadGroup NAME
  of its namespace. Istio copies the group's template into such entries; here the template fills
  whatever the entry leaves unset: labels (entry > group `metadata.labels` > template labels),
  ports (per name), service account, network, locality and weight.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Final

from meshctl.api.networking.v1alpha3 import workload_entry_pb2, workload_group_pb2
from meshctl.config.hosts import is_ip
from meshctl.config.labels import GROUP_ANNOTATION, LOCALITY_LABEL, NETWORK_LABEL, labels_match
from meshctl.config.model import Config
from meshctl.registry.model import frozen

UNIX_PREFIX: Final = "unix://"

_WE = workload_entry_pb2.WorkloadEntry
_WG = workload_group_pb2.WorkloadGroup


@dataclass(frozen=True, slots=True)
class Workload:
    """A WorkloadEntry with its metadata labels and group defaults applied: what selectors see."""

    name: str
    namespace: str
    address: str
    ports: Mapping[str, int] = field(default_factory=lambda: frozen(None))
    labels: Mapping[str, str] = field(default_factory=lambda: frozen(None))
    service_account: str = ""
    network: str = ""
    locality: str = ""
    weight: int = 0

    @property
    def is_socket(self) -> bool:
        return self.address.startswith(UNIX_PREFIX)

    @property
    def dns_only(self) -> bool:
        """Not an IP: only Envoy's DNS clusters can use it (Istio's `DNSServiceEntryOnly`)."""
        return not is_ip(self.address)


#: Label sets already made read-only in one build, by their sorted items.
LabelPool = dict[tuple[tuple[str, str], ...], Mapping[str, str]]
#: What a WorkloadEntry starts from when it belongs to no WorkloadGroup.
_NO_TEMPLATE: Final = Workload(name="", namespace="", address="")


class WorkloadIndex:
    """The workloads of each namespace, in the order they were given, and the same workloads by
    (namespace, label key, label value).

    A selector then costs the workloads that carry its rarest label rather than every workload of
    its namespace, so a mesh of thousands of ServiceEntries, each selecting its own handful of
    WorkloadEntries, is built in time linear in its size rather than in their product. Selection
    keeps the given order, as a scan of the whole namespace would.
    """

    __slots__ = ("_by_label", "_by_namespace")

    def __init__(self, workloads: Iterable[Workload]) -> None:
        self._by_namespace: dict[str, list[Workload]] = {}
        self._by_label: dict[tuple[str, str, str], list[Workload]] = {}
        for workload in workloads:
            self._by_namespace.setdefault(workload.namespace, []).append(workload)
            for key, value in workload.labels.items():
                self._by_label.setdefault((workload.namespace, key, value), []).append(workload)

    def add(self, workload: Workload) -> None:
        """Add one workload where a build in key order would have put it (by name)."""
        _insort(self._by_namespace.setdefault(workload.namespace, []), workload)
        for key, value in workload.labels.items():
            _insort(self._by_label.setdefault((workload.namespace, key, value), []), workload)

    def remove(self, workload: Workload) -> None:
        for bucket in (
            self._by_namespace.get(workload.namespace),
            *(self._by_label.get((workload.namespace, k, v)) for k, v in workload.labels.items()),
        ):
            if bucket is not None:
                for i, w in enumerate(bucket):
                    if w is workload:
                        del bucket[i]
                        break

    def select(self, namespace: str, selector: Mapping[str, str]) -> list[Workload]:
        """The workloads of `namespace` whose labels match `selector` (Istio's rule: a
        ServiceEntry selects only in its own namespace, and a selector without labels selects
        every workload there)."""
        if not selector:
            return list(self._by_namespace.get(namespace, ()))
        buckets: list[list[Workload]] = []
        for key, value in selector.items():
            bucket = self._by_label.get((namespace, key, value))
            if bucket is None:
                return []  # no workload has this label, so none can match the whole selector
            buckets.append(bucket)
        return [w for w in min(buckets, key=len) if labels_match(selector, w.labels)]


def _insort(bucket: list[Workload], workload: Workload) -> None:
    """Insert keeping the bucket in name order (a namespace's workloads in key order)."""
    bisect.insort(bucket, workload, key=lambda w: w.name)


def workload_from_message(
    entry: _WE,
    name: str,
    namespace: str,
    extra_labels: Mapping[str, str] | None = None,
    template: Workload | None = None,
    *,
    shared_labels: LabelPool | None = None,
) -> Workload:
    """A WorkloadEntry spec (a file's or one inline in a ServiceEntry) as a workload; labels are
    layered template < spec < `extra_labels` (the metadata labels), as Istio merges them.

    The spec is read through `ListFields`: with upb, merely reading a map field that is not set
    (`entry.ports` of nearly every WorkloadEntry) gives the message an empty map for good, about
    370 bytes each. Label keys and values, service accounts, networks and localities are
    interned: ten thousand endpoints carry a few hundred distinct ones, and each string read
    from a message is a new object. Equal label sets are one mapping through `shared_labels`
    (every endpoint of a service version has the same labels), which the endpoints share too."""
    base = template or _NO_TEMPLATE
    fields = {f.name: value for f, value in entry.ListFields()}
    merged = {**base.labels, **fields.get("labels", {}), **(extra_labels or {})}
    items = tuple((intern(k), intern(v)) for k, v in sorted(merged.items()))
    labels = shared_labels.get(items) if shared_labels is not None else None
    if labels is None:
        labels = frozen(dict(items))
        if shared_labels is not None:
            shared_labels[items] = labels
    own_ports = {intern(k): v for k, v in fields.get("ports", {}).items() if v > 0}
    ports = frozen({**base.ports, **own_ports}) if own_ports else base.ports
    locality = fields.get("locality") or base.locality
    if not locality and labels.get(LOCALITY_LABEL):
        locality = labels[LOCALITY_LABEL].replace(".", "/")
    return Workload(
        name=name,
        namespace=namespace,
        address=fields.get("address", ""),
        ports=ports,
        labels=labels,
        service_account=intern(fields.get("service_account") or base.service_account),
        network=intern(fields.get("network") or base.network or labels.get(NETWORK_LABEL, "")),
        locality=intern(locality),
        weight=fields.get("weight") or base.weight,
    )


def template_of(
    config: Config,
    groups: Mapping[tuple[str, str], _WG],
    templates: dict[tuple[str, str], Workload],
    notes: list[str],
) -> Workload | None:
    """The template of the WorkloadGroup a WorkloadEntry names, if any. `templates` keeps each
    group's template once converted: a group may have thousands of members, and they all start
    from the same one."""
    group_name = config.annotations.get(GROUP_ANNOTATION, "")
    if not group_name:
        return None
    group_key = (config.namespace, group_name)
    group = groups.get(group_key)
    if group is None:
        notes.append(
            f"{config.key} names WorkloadGroup {config.namespace}/{group_name} "
            f"({GROUP_ANNOTATION}), which does not exist"
        )
        return None
    template = templates.get(group_key)
    if template is None:
        template = workload_from_message(group.template, "", "", dict(group.metadata.labels))
        templates[group_key] = template
    return template
