"""What `meshctl validate` reports when a file is partly broken: every mistake in one run, and
nothing false elsewhere because one document (or one file) was rejected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from meshctl.cli.app import app

PAYMENTS_SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.shop.mesh]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
"""

FRONT_VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: front, namespace: shop}
spec:
  hosts: [front.shop.mesh]
  http:
  - route:
    - destination: {host: payments.shop.mesh}
"""


def findings(*args: str) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(app, ["validate", "-o", "json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_a_broken_document_does_not_make_the_hosts_of_its_file_missing_elsewhere(tmp_path: Path) -> None:
    typo = "apiVersion: networking.istio.io/v1\nkind: VirtualServise\nmetadata: {name: x, namespace: shop}\nspec: {}\n"
    (tmp_path / "a.yaml").write_text(typo + "---\n" + PAYMENTS_SE)
    (tmp_path / "b.yaml").write_text(FRONT_VS)
    code, found = findings(str(tmp_path))
    assert code == 1
    assert [(Path(f["file"]).name, f["line"]) for f in found] == [("a.yaml", 2)]
    assert "unknown kind VirtualServise" in found[0]["message"]


def test_a_file_with_three_mistakes_in_three_resources_reports_all_three(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(
        PAYMENTS_SE
        + """---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: regex, namespace: shop}
spec:
  hosts: [regex.shop.mesh]
  http:
  - match: [{uri: {regex: "a(b"}}]
    route:
    - destination: {host: payments.shop.mesh}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: lost, namespace: shop}
spec:
  hosts: [lost.shop.mesh]
  http:
  - route:
    - destination: {host: nowhere.shop.mesh}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: subset, namespace: shop}
spec:
  hosts: [subset.shop.mesh]
  http:
  - route:
    - destination: {host: payments.shop.mesh, subset: v9}
"""
    )
    code, found = findings(str(tmp_path))
    assert code == 1
    by_resource = {(f["name"], f["field"]): f["message"] for f in found}
    assert "invalid regex" in by_resource[("regex", "spec.http[0].match[0].uri.regex")]
    assert "nowhere.shop.mesh" in by_resource[("lost", "spec.http[0].route[0].destination.host")]
    assert "v9" in by_resource[("subset", "spec.http[0].route[0].destination.subset")]
    assert len(found) == 3, found


def test_alike_findings_of_two_resources_are_both_listed(tmp_path: Path) -> None:
    def vs(name: str, typos: int) -> str:
        route = "  - timeout: soon\n    route: [{destination: {host: payments.shop.mesh}}]\n"
        head = "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
        head += f"metadata: {{name: {name}, namespace: shop}}\n"
        routes = route * typos
        return head + f"spec:\n  hosts: [{name}.shop.mesh]\n  http:\n" + routes

    (tmp_path / "vs.yaml").write_text(PAYMENTS_SE + "---\n" + vs("one", 3) + "---\n" + vs("two", 1))
    code, found = findings(str(tmp_path))
    assert code == 1
    assert sorted((f["name"], f["field"]) for f in found) == [
        ("one", "spec.http[0].timeout"),
        ("one", "spec.http[1].timeout"),
        ("one", "spec.http[2].timeout"),
        ("two", "spec.http[0].timeout"),
    ]
    assert not any("more like it" in f["message"] for f in found)


def test_findings_alike_in_one_resource_are_still_counted_as_one(tmp_path: Path) -> None:
    (tmp_path / "empties.yaml").write_text("kind: \n---\n" * 5)
    code, found = findings(str(tmp_path))
    assert code == 1
    assert [f["message"] for f in found] == ["missing kind (and 4 more like it in this file)"]


def test_routing_tests_among_the_config_are_skipped_with_a_note() -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    code, found = findings(str(examples))
    assert code == 0, found
    notes = [f for f in found if f["file"].endswith("routing-tests/bookinfo.yaml")]
    assert [(n["severity"], n["line"]) for n in notes] == [("info", 9)]
    assert "simulate --cases" in notes[0]["message"]


def test_a_list_that_is_not_routing_tests_is_still_an_error(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- name: a\n  request: {}\n- just a string\n")
    code, found = findings(str(tmp_path))
    assert code == 1
    assert "a document must be a mapping (an object), not a list" in found[0]["message"]


def test_a_rejected_file_still_gives_the_server_nothing() -> None:
    from meshctl.config.loader import load_text

    typo = "apiVersion: networking.istio.io/v1\nkind: VirtualServise\nmetadata: {name: x, namespace: shop}\nspec: {}\n"
    result = load_text(typo + "---\n" + PAYMENTS_SE, "a.yaml")
    assert not result.ok
    assert result.configs == ()  # the store keeps the file's last good contents
    assert [c.key.name for c in result.analysed] == ["payments"]  # what validate analyses
