"""What every kind's findings have in common: where a finding points and what it names, all of a
resource's problems in one run, and an empty mapping counted as set.
"""

from __future__ import annotations

import pytest
from conftest import DR, SC, SE, VS, document, load

from meshctl.config.loader import load_text
from meshctl.config.validation.common import header_name_problem, header_value_problem


def test_finding_names_file_line_resource_and_field() -> None:
    text = document(VS, "hosts: [r.shop.mesh]\nhttp:\n- route:\n  - destination: {host: r.shop.mesh}\n    weight: -5\n")
    (finding,) = load_text(text, "shop/reviews.yaml").findings
    assert str(finding) == (
        "error shop/reviews.yaml:11:7 VirtualService shop/example spec.http[0].route[0].weight: "
        "weight -5 must not be negative"
    )


def test_every_problem_in_a_resource_is_reported_at_once() -> None:
    _, findings = load(
        SE, "hosts: ['*']\nports: [{number: 0, name: Bad_Name, protocol: SPDY}]\nresolution: DNS_ROUND_ROBIN"
    )
    assert {f.field for f in findings} >= {
        "spec.hosts[0]",
        "spec.ports[0].number",
        "spec.ports[0].name",
        "spec.ports[0].protocol",
    }


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        (DR, "host: r.mesh\ntrafficPolicy: {}", "trafficPolicy must set at least one field"),
        (SC, "workloadSelector: {labels: {}}\negress: [{hosts: [./*]}]", "workload selector has no labels"),
    ],
)
def test_an_empty_mapping_counts_as_set(kind: str, spec: str, message: str) -> None:
    _, findings = load(kind, spec)
    assert [message in f.message for f in findings] == [True]


def test_header_names_and_values_envoy_adds_are_at_most_16_kib() -> None:
    """Envoy's `HeaderValue` takes at most 16384 bytes of name and of value: a longer one in a
    VirtualService's header operations makes every proxy refuse the route configuration."""
    assert header_value_problem("v" * 16384) is None
    assert "16385 bytes long: Envoy takes at most 16384" in (header_value_problem("v" * 16385) or "")
    assert "Envoy takes at most 16384" in (header_value_problem("é" * 8193) or "")  # bytes, not characters
    assert "Envoy takes at most 16384" in (header_name_problem("x" * 16385) or "")
