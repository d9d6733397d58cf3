"""Label selectors as Istio applies them: every key of the selector present with the same value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
