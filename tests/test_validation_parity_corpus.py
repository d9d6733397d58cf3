"""Istio's own validation table tests, translated (tests/parity/*.yaml), run through meshctl's
loader: each resource must get Istio's verdict, valid or invalid.

A case whose `meshctl:` entry gives another verdict is a deliberate difference (docs/validation.md
says why); the test holds meshctl to that verdict instead, so a change on either side shows. The
agreement figure in docs/validation.md is checked against the corpus, so it cannot go stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from ruamel.yaml import YAML

from meshctl.config.loader import load_text
from meshctl.config.model import served_group

CORPUS = Path(__file__).parent / "parity"

#: What each `wrap` puts around a case's `part`: (kind, spec builder).
_WRAPS: dict[str, tuple[str, Any]] = {
    "gw-server": ("Gateway", lambda part, case: {"servers": [part]}),
    "gw-port": (
        "Gateway",
        lambda part, case: {
            "servers": [{"hosts": ["foo.bar.com"], "port": part, **({"bind": case["bind"]} if "bind" in case else {})}]
        },
    ),
    "gw-tls": (
        "Gateway",
        lambda part, case: {
            "servers": [
                {"hosts": ["foo.bar.com"], "port": {"number": 443, "name": "tls", "protocol": "TLS"}, "tls": part}
            ]
        },
    ),
    "vs-http": ("VirtualService", lambda part, case: {"hosts": ["foo.bar"], "http": [part]}),
    "vs-route": (
        "VirtualService",
        lambda part, case: {"hosts": ["foo.bar"], "http": [{"route": [{"destination": {"host": "foo.bar"}}], **part}]},
    ),
    "vs-delegate": ("VirtualService", lambda part, case: {"http": [part]}),
    "vs-tcp": ("VirtualService", lambda part, case: {"hosts": ["foo.bar"], "tcp": [{"route": part}]}),
    "dr-tp": ("DestinationRule", lambda part, case: {"host": "reviews", "trafficPolicy": part}),
    "se-dns-endpoint": (
        "ServiceEntry",
        lambda part, case: {
            "hosts": ["foo.bar.com"],
            "resolution": "DNS",
            "ports": [{"number": 80, "protocol": "http", "name": "http"}],
            "endpoints": [{"address": part}],
        },
    ),
    "se-static-endpoint": (
        "ServiceEntry",
        lambda part, case: {
            "hosts": ["foo.bar.com"],
            "resolution": "STATIC",
            "ports": [{"number": 80, "protocol": "http", "name": "http"}],
            "endpoints": [{"address": part}],
        },
    ),
    "se-address": (
        "ServiceEntry",
        lambda part, case: {
            "hosts": ["foo.bar.com"],
            "resolution": "NONE",
            "addresses": [part],
            "ports": [{"number": 80, "protocol": "http", "name": "http"}],
        },
    ),
    "se-port": (
        "ServiceEntry",
        lambda part, case: {"hosts": ["foo.bar.com"], "resolution": "DNS", "ports": [part]},
    ),
}


def _cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(CORPUS.glob("*.yaml")):
        for case in YAML(typ="safe").load(path.read_text()):
            out.append({**case, "file": path.name})
    return out


CASES = _cases()


def document(case: dict[str, Any]) -> str:
    """The case as one document (JSON, which is YAML too), as a user would write it."""
    if "resource" in case:
        return json.dumps(case["resource"], indent=2) + "\n"
    if "wrap" in case:
        kind, build = _WRAPS[case["wrap"]]
        spec = build(case["part"], case)
    else:
        kind, spec = case["kind"], case["spec"]
    metadata: dict[str, Any] = {"name": case.get("name", "foo"), "namespace": case.get("namespace", "bar")}
    if "annotations" in case:
        metadata["annotations"] = case["annotations"]
    resource = {"apiVersion": f"{served_group(kind)}/v1", "kind": kind, "metadata": metadata, "spec": spec}
    return json.dumps(resource, indent=2) + "\n"


def meshctl_valid(case: dict[str, Any]) -> bool:
    return load_text(document(case), "parity.yaml").ok


def expected(case: dict[str, Any]) -> bool:
    """The verdict meshctl must give: Istio's, unless a deliberate difference is recorded."""
    return bool(case["meshctl"]["valid"] if "meshctl" in case else case["valid"])


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_meshctl_gives_istios_verdict(case: dict[str, Any]) -> None:
    result = load_text(document(case), "parity.yaml")
    detail = "\n".join(map(str, result.findings)) or "(no finding)"
    assert result.ok == expected(case), f"{document(case)}\n{detail}"


def test_every_difference_says_why() -> None:
    for case in CASES:
        if "meshctl" in case:
            assert case["meshctl"]["valid"] != case["valid"], case["case"]
            assert case["meshctl"].get("why"), case["case"]


def test_docs_state_the_measured_agreement() -> None:
    agree = sum(1 for case in CASES if "meshctl" not in case)
    text = (ROOT / "docs" / "validation.md").read_text()
    match = re.search(r"agrees with Istio on (\d+) of the (\d+) cases", text)
    assert match, "docs/validation.md states the corpus agreement"
    assert (int(match[1]), int(match[2])) == (agree, len(CASES))
