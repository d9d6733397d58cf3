"""`meshctl validate` as CI runs it: formats, exit codes, all findings in one run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, runner
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config.yamlsource import DEFAULT_MAX_FILE_BYTES

GOOD_SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: reviews
  namespace: shop
spec:
  hosts: [reviews.shop.mesh]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: DNS
"""

BAD_VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
  namespace: shop
spec:
  hosts: [reviews.shop.mesh]
  http:
  - route:
    - destination:
        host: reviewz.shop.mesh
"""


def test_examples_validate_cleanly() -> None:
    result = runner.invoke(app, ["validate", "--strict", str(EXAMPLES)])
    assert result.exit_code == 0, result.output


def test_findings_from_every_file_in_one_run(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("a: [1\n")
    (tmp_path / "b.yaml").write_text(GOOD_SE + "---\n" + BAD_VS)
    result = runner.invoke(app, ["validate", "-o", "json", str(tmp_path)])
    assert result.exit_code == 1
    findings = json.loads(result.stdout)
    assert {Path(f["file"]).name for f in findings} == {"a.yaml", "b.yaml"}
    ist = next(f for f in findings if f["code"] == "IST0101")
    assert ist == {
        "severity": "error",
        "file": str(tmp_path / "b.yaml"),
        "line": 21,
        "column": 9,
        "kind": "VirtualService",
        "namespace": "shop",
        "name": "reviews",
        "field": "spec.http[0].route[0].destination.host",
        "message": 'Referenced host not found: "reviewz.shop.mesh"',
        "code": "IST0101",
    }


def test_text_format_is_one_line_per_finding(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(GOOD_SE + "---\n" + BAD_VS)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    (line,) = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert line == (
        f"error {tmp_path / 'b.yaml'}:21:9 VirtualService shop/reviews "
        'spec.http[0].route[0].destination.host: Referenced host not found: "reviewz.shop.mesh" [IST0101]'
    )


def test_github_annotations(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(GOOD_SE + "---\n" + BAD_VS)
    result = runner.invoke(app, ["validate", "-o", "github", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stdout.startswith(f"::error file={tmp_path / 'b.yaml'},line=21,col=9,title=IST0101::")
    assert "VirtualService shop/reviews spec.http[0].route[0].destination.host:" in result.stdout


def test_warnings_pass_unless_strict(tmp_path: Path) -> None:
    (tmp_path / "k8s.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n")
    assert runner.invoke(app, ["validate", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["validate", "--strict", str(tmp_path)]).exit_code == 1


def test_known_hosts_satisfy_references(tmp_path: Path) -> None:
    (tmp_path / "vs.yaml").write_text(BAD_VS)
    assert runner.invoke(app, ["validate", str(tmp_path)]).exit_code == 1
    assert runner.invoke(app, ["validate", "--known-host", "*.shop.mesh", str(tmp_path)]).exit_code == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["validate", str(tmp_path / "missing")]).exit_code == 2
    assert runner.invoke(app, ["validate"]).exit_code == 2
    assert runner.invoke(app, ["validate", "-o", "xml", str(tmp_path)]).exit_code == 2


def test_stdin_through_the_installed_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meshctl", "validate", "-o", "json", "-"],
        input=BAD_VS.replace("hosts: [reviews.shop.mesh]", "hosts: [bad_host]"),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)
    assert findings[0]["file"] == "<stdin>"
    assert any(f["field"].startswith("spec.hosts") for f in findings)


@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_valid_input_prints_no_findings(fmt: str) -> None:
    result = runner.invoke(app, ["validate", "-o", fmt, str(EXAMPLES)])
    assert result.exit_code == 0
    assert result.stdout.strip() in ("", "[]")


def test_endless_stdin_is_read_only_up_to_the_size_limit() -> None:
    """`yes | meshctl validate -` once read until memory ran out; now it stops past the limit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshctl", "validate", "-o", "json", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert proc.stdin is not None
    written, chunk = 0, b"#" * 65536
    try:
        while written < 8 * DEFAULT_MAX_FILE_BYTES:  # a regression reads it all, and fails below
            proc.stdin.write(chunk)
            written += len(chunk)
    except BrokenPipeError:  # meshctl stopped reading and exited, as it should
        pass
    stdout, stderr = proc.communicate(timeout=60)  # closes stdin: EOF for a meshctl still reading
    assert proc.returncode == 1, stderr
    assert [(f["file"], f["message"]) for f in json.loads(stdout)] == [
        ("<stdin>", f"file is over the {DEFAULT_MAX_FILE_BYTES}-byte limit for a config file")
    ]
    assert written < 2 * DEFAULT_MAX_FILE_BYTES


def test_stdin_over_the_limit_does_not_stop_the_files_being_checked(tmp_path: Path) -> None:
    (tmp_path / "vs.yaml").write_text(BAD_VS)
    too_big = b"#" * (DEFAULT_MAX_FILE_BYTES + 1)
    result = runner.invoke(app, ["validate", "-o", "json", str(tmp_path), "-"], input=too_big)
    assert result.exit_code == 1
    assert {(f["file"], f["code"]) for f in json.loads(result.stdout)} == {
        ("<stdin>", None),
        (str(tmp_path / "vs.yaml"), "IST0101"),
    }


def test_stdin_that_is_not_utf8_is_a_finding_not_an_internal_error() -> None:
    result = runner.invoke(app, ["validate", "-"], input=b"kind: \xff\xfe\n")
    assert result.exit_code == 1
    assert "error <stdin>: file is not UTF-8 text" in result.stdout


def test_a_directory_without_yaml_fails_instead_of_checking_nothing(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not config\n")
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert f"no YAML files (*.yaml, *.yml) in {tmp_path}: nothing to check" in result.output


ROOT_POLICY = """apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: mesh-root}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: shop}
spec:
  hosts: [a.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: a}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: a}}
"""


def test_analysis_takes_the_root_namespace_of_the_mesh_config(tmp_path: Path) -> None:
    """A policy in MeshConfig's rootNamespace is mesh-wide only when validate is told that root."""
    (tmp_path / "mesh.yaml").write_text(ROOT_POLICY)
    (tmp_path / "meshconfig.yaml").write_text("rootNamespace: mesh-root\n")
    plain = runner.invoke(app, ["validate", str(tmp_path / "mesh.yaml"), "-o", "json"])
    told = runner.invoke(
        app, ["validate", "--mesh-config", str(tmp_path / "meshconfig.yaml"), str(tmp_path / "mesh.yaml"), "-o", "json"]
    )
    assert "MC0002" not in plain.stdout
    assert "MC0002" in told.stdout and told.exit_code == 0
