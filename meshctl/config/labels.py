"""Label selectors as Istio applies them: every key of the selector present with the same value."""

from __future__ import annotations

from collections.abc import Mapping


def labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True when `labels` has every key of `selector` with the same value (an empty selector
    matches everything)."""
    return all(labels.get(k) == v for k, v in selector.items())
