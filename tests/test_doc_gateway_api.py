"""docs/gateway-api.md held to what meshctl does: its YAML is the example file, its routing tests
pass on the bookinfo mesh with that file beside gateway.yaml (and its edge cases on the
Istio form too, but the one the Gateway API says differently), and the outputs it shows are
what `dump` and `validate` print."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import EXAMPLES, ROOT
from ruamel.yaml import YAML
from typer.testing import CliRunner

from meshctl.cli.app import app

PAGE = ROOT / "docs" / "gateway-api.md"
EXAMPLE = ROOT / "examples" / "gateway-api" / "bookinfo-gateway.yaml"
CASES = ROOT / "examples" / "routing-tests" / "gateway-api.yaml"
runner = CliRunner()

SHOP = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: reviews
  namespace: shop
spec:
  parentRefs:
  - name: bookinfo-gateway
    namespace: bookinfo
  rules:
  - backendRefs:
    - name: reviews
      namespace: bookinfo
      port: 9080
"""


def blocks(language: str) -> list[str]:
    lines = PAGE.read_text().splitlines()
    out, index = [], 0
    while index < len(lines):
        if lines[index].strip() == f"```{language}":
            end = lines.index("```", index + 1)
            out.append("\n".join(lines[index + 1 : end]) + "\n")
            index = end
        index += 1
    return out


def mesh(parent: Path) -> Path:
    """The tree the page's commands make: the bookinfo mesh with the Gateway API edge beside it."""
    target = parent / "mesh"
    target.mkdir()
    shutil.copytree(EXAMPLES / "bookinfo", target / "bookinfo")
    shutil.copytree(EXAMPLE.parent, target / "gateway-api")
    return target


def test_the_page_shows_the_example_files() -> None:
    shown = [b for b in blocks("yaml") if "gateway.networking.k8s.io" in b]
    assert shown == [EXAMPLE.read_text().split("\n", 2)[2]]
    istio = next(b for b in blocks("yaml") if "kind: VirtualService" in b)
    assert istio in (EXAMPLES / "bookinfo" / "gateway.yaml").read_text()


def test_the_routing_tests_pass_on_the_gateway_api_form(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--cases", str(CASES), "--config-dir", str(mesh(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "7 passed, 0 failed" in result.output


def test_the_edge_cases_pass_on_the_istio_form_but_the_path_segment_one(tmp_path: Path) -> None:
    cases = YAML(typ="safe").load(CASES.read_text())
    for case in cases:
        case["proxy"] = "ingressgateway-vm.bookinfo"  # the Istio form's gateway
    (tmp_path / "cases.yaml").write_text("\n".join(_dump(c) for c in cases[:6]))
    result = runner.invoke(app, ["simulate", "--cases", str(tmp_path / "cases.yaml"), "--config-dir", str(EXAMPLES)])
    assert result.exit_code == 1
    assert "5 passed, 1 failed" in result.output
    assert "a path prefix matches whole segments" in result.output


def _dump(case: dict[str, object]) -> str:
    import io

    out = io.StringIO()
    YAML(typ="safe").dump([case], out)
    return out.getvalue()


def test_dump_says_what_attached_where(tmp_path: Path) -> None:
    [note] = [b.strip() for b in blocks("text") if b.startswith("note: Gateway API")]
    args = ["dump", "--config-dir", str(mesh(tmp_path)), "--proxy", "bookinfo-gateway-vm.bookinfo", "-t", "listeners"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert note in result.output.splitlines()


def test_validate_reports_a_refused_backend_as_the_page_shows(tmp_path: Path, monkeypatch: object) -> None:
    [shown] = [b.strip() for b in blocks("text") if "RefNotPermitted" in b]
    directory = mesh(tmp_path)
    (directory / "shop.yaml").write_text(SHOP)
    result = runner.invoke(app, ["validate", str(directory)])
    assert result.exit_code == 0, result.output
    lines = [line.replace(str(tmp_path) + "/", "") for line in result.output.splitlines()]
    assert not any(line.startswith("error") for line in lines), lines
    assert shown in lines, lines
