"""Label selectors as Istio applies them: every key of the selector present with the same value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: Istio's label of an endpoint's TLS mode (`istio`: it takes mutual TLS; `disabled`: it does not).
TLS_MODE_LABEL: Final = "security.istio.io/tlsMode"
#: Istio's label of the network a workload is on.
NETWORK_LABEL: Final = "topology.istio.io/network"
#: Istio's label of a workload's locality (region/zone/subzone).
LOCALITY_LABEL: Final = "istio-locality"
#: Istio's annotation on a WorkloadEntry registered into a WorkloadGroup, naming the group.
GROUP_ANNOTATION: Final = "istio.io/autoRegistrationGroup"


def labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True when `labels` has every key of `selector` with the same value (an empty selector
    matches everything)."""
    return all(labels.get(k) == v for k, v in selector.items())


def selector_labels(spec: Any, field: str = "workload_selector") -> dict[str, str]:
    """The labels of a spec's workload selector, or {} when none is set. Istio spells them
    `labels` in networking's WorkloadSelector (Sidecar, ServiceEntry) and `matchLabels` in the
    shared `istio.type.v1beta1` one (DestinationRule)."""
    if not spec.HasField(field):
        return {}
    selector = getattr(spec, field)
    labels = selector.match_labels if hasattr(selector, "match_labels") else selector.labels
    return dict(labels)
