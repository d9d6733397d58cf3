"""`meshctl simulate --cases`: routing tests in a YAML file, on the example mesh (whose own cases
file must pass, so CI runs it) and on a small inline mesh with redirects, direct responses and
added headers; a wrong expectation fails with a diff that names the route and its file:line, and a
file that is not a cases file is refused with the line of the case."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, runner
from typer.testing import Result

from meshctl.cli.app import app
from meshctl.simulate import cases as cases_module
from meshctl.simulate.cases import ProxyResources, load_cases, run_cases
from meshctl.testing.builders import snapshot_from_yaml

BOOKINFO_CASES = ROOT / "examples" / "routing-tests" / "bookinfo.yaml"
CANARY = "cluster: outbound|9080|v2|reviews.bookinfo.mesh"


def run(cases: Path, *args: str, config_dir: Path = EXAMPLES) -> Result:
    return runner.invoke(app, ["simulate", "--cases", str(cases), "--config-dir", str(config_dir), *args])


def test_the_example_cases_pass() -> None:
    result = run(BOOKINFO_CASES)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    count = len(load_cases(BOOKINFO_CASES))
    assert count >= 8
    assert f"{count} case(s): {count} passed, 0 failed" in result.stderr


def _with_wrong_canary(tmp_path: Path) -> tuple[Path, int]:
    """A copy of the example cases whose canary expects v3; and the line of that case."""
    text = BOOKINFO_CASES.read_text()
    assert text.count(CANARY) == 1
    copy = tmp_path / "bookinfo.yaml"
    copy.write_text(text.replace(CANARY, CANARY.replace("|v2|", "|v3|")))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if CANARY in line)
    case_line = max(i for i in range(at) if lines[i].startswith("- name:")) + 1
    return copy, case_line


def _virtual_service_line(path: Path, name: str) -> int:
    """The line of the document holding VirtualService `name` (where the loader says it starts)."""
    lines = path.read_text().splitlines()
    at = lines.index(f"  name: {name}", next(i for i, line in enumerate(lines) if line == "kind: VirtualService"))
    return max(i for i in range(at) if lines[i].startswith("apiVersion:")) + 1


def test_a_wrong_expectation_fails_with_a_diff_naming_the_route_and_its_source(tmp_path: Path) -> None:
    cases, case_line = _with_wrong_canary(tmp_path)
    result = run(cases)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    line = lines[0]
    assert line.startswith(f"{cases}:{case_line}: FAIL jason gets the reviews canary: ")
    assert (
        "cluster: expected outbound|9080|v3|reviews.bookinfo.mesh, got outbound|9080|v2|reviews.bookinfo.mesh" in line
    )
    vs_line = _virtual_service_line(EXAMPLES / "bookinfo" / "traffic.yaml", "reviews")
    assert "route canary-jason" in line
    assert f"VirtualService bookinfo/reviews at {EXAMPLES / 'bookinfo' / 'traffic.yaml'}:{vs_line}" in line
    assert re.search(r"\d+ case\(s\): \d+ passed, 1 failed", result.stderr)


def test_github_annotations_point_at_the_failing_case(tmp_path: Path) -> None:
    cases, case_line = _with_wrong_canary(tmp_path)
    result = run(cases, "-o", "github")
    assert result.exit_code == 1
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"::error file={cases},line={case_line},title=routing test::jason gets the reviews canary: ")
    assert "got outbound|9080|v2|reviews.bookinfo.mesh" in line


def test_json_is_a_list_of_results_with_their_walks(tmp_path: Path) -> None:
    cases, case_line = _with_wrong_canary(tmp_path)
    result = run(cases, "-o", "json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert len(out) == len(load_cases(cases))
    failed = [r for r in out if not r["passed"]]
    assert [(r["name"], r["line"]) for r in failed] == [("jason gets the reviews canary", case_line)]
    assert failed[0]["mismatches"] == [
        {
            "field": "cluster",
            "expected": "outbound|9080|v3|reviews.bookinfo.mesh",
            "got": "outbound|9080|v2|reviews.bookinfo.mesh",
        }
    ]
    assert failed[0]["simulation"]["route"]["name"] == "canary-jason"


# -- a small inline mesh: redirects, direct responses, added headers ---------------------------

SHOP = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web, namespace: shop}
spec: {address: 10.20.0.5, labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client, namespace: shop}
spec: {address: 10.20.0.9, labels: {app: client}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.mesh]
  http:
  - name: moved
    match: [{uri: {prefix: /old}}]
    redirect: {uri: /new, redirectCode: 302}
  - name: teapot
    match: [{uri: {exact: /tea}}]
    directResponse: {status: 418}
  - name: tagged
    headers: {request: {set: {x-team: shop}}}
    route: [{destination: {host: web.shop.mesh}}]
"""

SHOP_CASES = """- name: old pages move
  proxy: client.shop
  request: {url: "http://web.shop.mesh:8000/old/a?q=1"}
  expect: {route: moved, status: 302, redirect: "http://web.shop.mesh:8000/new?q=1"}
- name: tea
  proxy: client.shop
  request: {url: "http://web.shop.mesh:8000/tea", method: PUT}
  expect: {status: 418, source: VirtualService/shop/web}
- name: tagged
  proxy: sidecar~10.20.0.9~client.shop~shop.svc.cluster.local
  request: {url: "http://web.shop.mesh:8000/", headers: {X-Trace: 1}}
  expect:
    cluster: {outbound|8000||web.shop.mesh: 100}
    header: {name: X-Team, value: shop}
"""


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    (tmp_path / "mesh").mkdir()
    (tmp_path / "mesh" / "shop.yaml").write_text(SHOP)
    (tmp_path / "cases.yaml").write_text(SHOP_CASES)
    return tmp_path


def test_redirects_direct_responses_and_headers_are_checked(shop: Path) -> None:
    result = run(shop / "cases.yaml", config_dir=shop / "mesh")
    assert result.exit_code == 0, result.output
    assert "3 case(s): 3 passed, 0 failed" in result.stderr


def test_each_expectation_reports_what_it_got(shop: Path) -> None:
    wrong = (
        SHOP_CASES.replace("status: 302", "status: 301")
        .replace("/new?q=1", "/newer")
        .replace("status: 418", "status: 200")
        .replace("value: shop", "value: other")
        .replace("VirtualService/shop/web", "VirtualService/shop/api")
    )
    (shop / "cases.yaml").write_text(wrong)
    result = run(shop / "cases.yaml", config_dir=shop / "mesh")
    assert result.exit_code == 1
    moved, tea, tagged = result.stdout.splitlines()
    assert "status: expected 301, got 302; redirect: expected http://web.shop.mesh:8000/newer," in moved
    assert "got http://web.shop.mesh:8000/new?q=1" in moved and "route moved" in moved
    assert "status: expected 200, got 418; source: expected VirtualService/shop/api, got VirtualService/shop/web" in tea
    assert "header: expected x-team: other, got x-team: shop" in tagged


def test_each_proxy_is_generated_once(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meshctl.cli import offline
    from meshctl.xds import generate as generate_module

    calls: list[str] = []
    real = generate_module.generate

    def counting(snapshot: object, proxy: object) -> object:
        calls.append(getattr(proxy, "id", ""))
        return real(snapshot, proxy)  # type: ignore[arg-type]

    monkeypatch.setattr(generate_module, "generate", counting)
    snapshot = snapshot_from_yaml(SHOP, namespace="shop")
    cases = load_cases(shop / "cases.yaml") * 50
    proxies = ProxyResources(snapshot, lambda ref, grpc: offline.find_proxy(snapshot, ref, "shop", grpc=grpc), False)
    results = run_cases(cases, proxies)
    assert len(results) == 150 and all(r.passed for r in results)
    # Two references (NAME.NAMESPACE and the node id) to one proxy: one generation.
    assert len(calls) == 1


# -- files that are not cases files ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "- name: a\n  proxy: client.shop\n  request: {url: 'http://web.shop.mesh/'}\n  expcet: {status: 200}\n",
            4,
            "case 1 (a): unknown field expcet",
        ),
        (SHOP_CASES + "- name: b\n  proxy: client.shop\n  expect: {status: 200}\n", 15, "case 4 (b): missing request"),
        (
            SHOP_CASES + "- name: c\n  proxy: client.shop\n  request: {method: GET}\n  expect: {status: 200}\n",
            17,
            "case 4 (c): request: missing url",
        ),
        (
            "- name: d\n  proxy: client.shop\n  request: {url: 'ftp://x/'}\n  expect: {status: 200}\n",
            3,
            "case 1 (d): request:",
        ),
        (
            "- name: e\n  proxy: client.shop\n  request: {url: 'http://x/'}\n  expect: {status: fine}\n",
            4,
            "case 1 (e): expect.status: an HTTP status",
        ),
        ("- name: f\n  proxy: client.shop\n  request: {url: 'http://x/'}\n  expect: {}\n", 4, "case 1 (f): expect:"),
        (
            "- name: g\n  proxy: nobody.shop\n  request: {url: 'http://x/'}\n  expect: {status: 404}\n",
            1,
            "g: proxy 'nobody.shop' names no WorkloadEntry",
        ),
        ("name: h\n", 1, "a cases file is one YAML list of cases"),
        ("- [unclosed\n", 2, ""),
    ],
)
def test_a_bad_cases_file_exits_2_with_the_line_of_the_case(shop: Path, text: str, line: int, message: str) -> None:
    (shop / "cases.yaml").write_text(text)
    result = run(shop / "cases.yaml", config_dir=shop / "mesh")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    error = " ".join(result.stderr.split())
    assert f"{shop / 'cases.yaml'}:{line}: {message}" in error


def test_cases_and_a_single_request_do_not_mix(shop: Path) -> None:
    mesh = str(shop / "mesh")
    given = runner.invoke(
        app, ["simulate", "http://web.shop.mesh:8000/", "--cases", str(shop / "cases.yaml"), "--config-dir", mesh]
    )
    assert given.exit_code == 2 and "--cases" in given.stderr
    neither = runner.invoke(app, ["simulate", "--config-dir", mesh])
    assert neither.exit_code == 2 and "--cases" in neither.stderr
    github = runner.invoke(
        app, ["simulate", "http://web.shop.mesh:8000/", "--proxy", "client.shop", "--config-dir", mesh, "-o", "github"]
    )
    assert github.exit_code == 2
    missing = run(shop / "none.yaml", config_dir=shop / "mesh")
    assert missing.exit_code == 2 and "none.yaml" in missing.stderr


def test_the_cases_module_is_what_the_docs_describe() -> None:
    docs = (ROOT / "docs" / "routing-tests.md").read_text()
    for field in (*cases_module.CASE_FIELDS, *cases_module.REQUEST_FIELDS, *cases_module.EXPECT_FIELDS):
        assert f"`{field}`" in docs, field
    assert "examples/routing-tests/bookinfo.yaml" in docs
