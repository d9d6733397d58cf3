"""`meshctl validate --envoy`: each proxy's generated config loaded by the real Envoy, as CI runs it.

What the static checks cannot know is what the fleet's own Envoy refuses: a runtime layer that
lowers the RE2 program size limit, a certificate file that is there but holds no certificate.
Each such refusal must be an error on the Istio resource, field and line it came from, in every
output format; a file that is only on the VMs must not fail the check (it is stubbed, and said
so); and without an Envoy the command must say so and exit 2, never pass.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, ROOT, cli_bootstrap, examples_copy, needs_envoy, runner
from ruamel.yaml import YAML

from meshctl.cli.app import app

pytestmark = [pytest.mark.e2e, needs_envoy]

#: A route regex with an RE2 program of 43: far under meshctl's (and Istio's) limit of 32,768,
#: far over the 10 of a hardened fleet's runtime layer.
REGEX = "/ratings/[0-9]+/(stars|votes)/[a-z]{2,8}"
REGEX_VS = f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: details-paths
  namespace: bookinfo
spec:
  hosts:
  - details.bookinfo.mesh
  http:
  - match:
    - uri:
        regex: "{REGEX}"
    route:
    - destination:
        host: details.bookinfo.mesh
"""
REGEX_LINE = 12  # the `regex:` line above

CLIENTS = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: sleep-vm-1
  namespace: bookinfo
spec:
  address: 10.10.0.90
  labels:
    app: sleep
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: sleep-vm-2
  namespace: bookinfo
spec:
  address: 10.10.0.91
  labels:
    app: sleep
"""


DOC = ROOT / "docs" / "validation.md"


def _versionless(line: str) -> str:
    return re.sub(r"Envoy [0-9][^ ]* ", "Envoy VERSION ", line)


def hardened_bootstrap(tmp_path: Path, error_level: int = 10) -> Path:
    """The bootstrap `meshctl bootstrap` writes for a VM, with the fleet's runtime layer
    lowering the RE2 program size limit, as an older or hardened fleet would run."""
    data: dict[str, Any] = cli_bootstrap()
    data["layered_runtime"]["layers"].insert(
        1, {"name": "hardened", "static_layer": {"re2.max_program_size.error_level": error_level}}
    )
    path = tmp_path / "envoy.yaml"
    YAML(typ="safe").dump(data, path)
    return path


def test_examples_pass_envoy() -> None:
    """What CI runs on the example mesh: every proxy's config loads in the real Envoy."""
    result = runner.invoke(app, ["validate", "--strict", "--envoy", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert "checked 7 proxy config(s)" in result.stderr


def test_runtime_layer_refusal_names_the_virtual_service(tmp_path: Path) -> None:
    mesh = examples_copy(tmp_path)
    (mesh / "bookinfo" / "paths.yaml").write_text(REGEX_VS)
    fleet = hardened_bootstrap(tmp_path)
    assert runner.invoke(app, ["validate", "--strict", str(mesh)]).exit_code == 0  # the static checks pass it
    # meshctl bootstrap's own runtime (Istio's limit) takes the regex too.
    assert runner.invoke(app, ["validate", "--strict", "--envoy", str(mesh)]).exit_code == 0

    result = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(fleet), "-o", "json", str(mesh)])
    assert result.exit_code == 1, result.output
    (finding,) = json.loads(result.stdout)
    assert finding["severity"] == "error"
    assert finding["code"] == "MC0101"
    assert (finding["kind"], finding["namespace"], finding["name"]) == ("VirtualService", "bookinfo", "details-paths")
    assert finding["file"] == str(mesh / "bookinfo" / "paths.yaml")
    assert finding["line"] == REGEX_LINE
    assert finding["field"] == "spec.http[0].match[0].uri.regex"
    assert "refuses route configuration 9080" in finding["message"]
    assert f"regex '{REGEX}' RE2 program size of 43 > max program size of 10" in finding["message"]
    assert "productpage-v1-vm.bookinfo" in finding["message"]

    text = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(fleet), str(mesh)])
    assert text.exit_code == 1
    # docs/validation.md shows this very line, but for the tree's path and Envoy's version.
    [shown] = re.findall(r"^error \S+ VirtualService bookinfo/details-paths .*\[MC0101\]$", DOC.read_text(), re.M)
    [printed] = text.stdout.splitlines()
    assert _versionless(printed.split(" ", 2)[2]) == _versionless(shown.split(" ", 2)[2])
    assert (
        f"error {mesh / 'bookinfo' / 'paths.yaml'}:{REGEX_LINE}:9 VirtualService bookinfo/details-paths " in text.stdout
    )
    one = ["--proxy", "details-v1-vm.bookinfo"]
    github = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(fleet), *one, "-o", "github", str(mesh)])
    assert github.exit_code == 1
    assert github.stdout.startswith(
        f"::error file={mesh / 'bookinfo' / 'paths.yaml'},line={REGEX_LINE},col=9,title=MC0101::"
    )


def test_only_the_named_proxy_is_checked(tmp_path: Path) -> None:
    mesh = examples_copy(tmp_path)
    (mesh / "bookinfo" / "paths.yaml").write_text(REGEX_VS)
    fleet = hardened_bootstrap(tmp_path)
    # The gateway routes bookinfo.example.com only: the refused route is not in its config.
    gateway = ["validate", "--envoy", "--bootstrap", str(fleet), "--proxy", "ingressgateway-vm.bookinfo", str(mesh)]
    result = runner.invoke(app, gateway)
    assert result.exit_code == 0, result.output
    assert "checked 1 proxy config(s)" in result.stderr
    result = runner.invoke(app, [*gateway[:-1], "--proxy", "reviews-v2-vm.bookinfo", str(mesh)])
    assert result.exit_code == 1
    assert "for proxy reviews-v2-vm.bookinfo:" in result.stdout


GATEWAY_TLS = """
  - port:
      number: 8443
      name: https
      protocol: HTTPS
    hosts:
    - bookinfo.example.com
    tls:
      mode: SIMPLE
      serverCertificate: {cert}
      privateKey: {key}
"""


def test_tls_files_are_read_when_present_and_stubbed_when_not(tmp_path: Path) -> None:
    """A file only the VMs hold does not fail CI, and is said to be unchecked; the same file
    present here but holding no certificate is Envoy's refusal, on the Gateway's field."""
    mesh = examples_copy(tmp_path)
    gateway = mesh / "bookinfo" / "gateway.yaml"
    cert, key = tmp_path / "gw" / "cert.pem", tmp_path / "gw" / "key.pem"
    text = gateway.read_text()
    anchor = "    - bookinfo.example.com\n"
    gateway.write_text(text.replace(anchor, anchor + GATEWAY_TLS.format(cert=cert, key=key).lstrip("\n"), 1))
    assert runner.invoke(app, ["validate", "--strict", str(mesh)]).exit_code == 0

    result = runner.invoke(app, ["validate", "--envoy", "-o", "json", str(mesh)])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)
    assert {(n["severity"], n["code"], n["name"], n["field"]) for n in notes} == {
        ("info", "MC0103", "bookinfo-gateway", "spec.servers[1].tls.serverCertificate"),
        ("info", "MC0103", "bookinfo-gateway", "spec.servers[1].tls.privateKey"),
    }
    assert all("is not on this machine" in n["message"] for n in notes)

    cert.parent.mkdir()
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    gateway_only = ["--proxy", "ingressgateway-vm.bookinfo"]
    result = runner.invoke(app, ["validate", "--envoy", *gateway_only, "-o", "json", str(mesh)])
    assert result.exit_code == 1, result.output
    (finding,) = json.loads(result.stdout)
    assert (finding["severity"], finding["code"], finding["kind"]) == ("error", "MC0101", "Gateway")
    assert finding["field"] == "spec.servers[1].tls.serverCertificate"
    assert finding["file"] == str(gateway)
    assert (
        "refuses listener 0.0.0.0_8443 for proxy ingressgateway-vm.bookinfo: "
        f"Failed to load certificate chain from {cert}" in finding["message"]
    )


def test_identical_configs_share_one_run(tmp_path: Path) -> None:
    mesh = examples_copy(tmp_path)
    with (mesh / "bookinfo" / "workloads.yaml").open("a") as f:
        f.write(CLIENTS)
    result = runner.invoke(app, ["validate", "--envoy", str(mesh)])
    assert result.exit_code == 0, result.output
    assert "checked 9 proxy config(s), 8 distinct, in 9 validate run(s)" in result.stderr


def test_no_envoy_is_an_error_not_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without Envoy: nothing beside the interpreter, nothing on PATH."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = runner.invoke(app, ["validate", "--envoy", str(EXAMPLES)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: --envoy needs an envoy binary: none on PATH or beside meshctl; give --envoy-binary PATH"
    ]
    missing = runner.invoke(app, ["validate", "--envoy", "--envoy-binary", str(tmp_path / "envoy"), str(EXAMPLES)])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"error: --envoy-binary {tmp_path / 'envoy'}: no such executable"


def test_envoy_options_usage(tmp_path: Path) -> None:
    assert runner.invoke(app, ["validate", "--bootstrap", "x.yaml", str(EXAMPLES)]).exit_code == 2
    assert runner.invoke(app, ["validate", "--envoy", str(EXAMPLES), str(EXAMPLES)]).exit_code == 2
    bad = tmp_path / "envoy.yaml"
    bad.write_text("- not\n- a bootstrap\n")
    result = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(bad), str(EXAMPLES)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --bootstrap {bad}: not an Envoy bootstrap (a mapping)"


MUTUAL_TLS = """apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata:
  name: default
  namespace: bookinfo
spec:
  mtls:
    mode: STRICT
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: details-mtls
  namespace: bookinfo
spec:
  host: details.bookinfo.mesh
  trafficPolicy:
    tls:
      mode: ISTIO_MUTUAL
"""


def test_mesh_certificates_need_no_secrets(tmp_path: Path) -> None:
    """Mutual TLS names the mesh's SDS secrets, which no CI machine holds (and which validate
    mode cannot fetch: it crashes on the attempt); the config still loads, secrets stubbed."""
    mesh = examples_copy(tmp_path)
    (mesh / "bookinfo" / "mtls.yaml").write_text(MUTUAL_TLS)
    result = runner.invoke(app, ["validate", "--envoy", "-o", "json", str(mesh)])
    assert result.exit_code == 0, result.output
    assert not [f for f in json.loads(result.stdout) if f["code"] in ("MC0101", "MC0102", "MC0103")]


def test_broken_trees_and_unknown_proxies(tmp_path: Path) -> None:
    """Config is never built from a tree with errors: those are the answer (exit 1), and
    Envoy is not asked. A --proxy the tree does not describe is a usage error."""
    mesh = examples_copy(tmp_path)
    traffic = mesh / "bookinfo" / "traffic.yaml"
    traffic.write_text(traffic.read_text().replace("        subset: v2\n", "        subset: v9\n", 1))
    result = runner.invoke(app, ["validate", "--envoy", str(mesh)])
    assert result.exit_code == 1
    assert "IST0101" in result.stdout
    assert "--envoy skipped: the tree has errors" in result.stderr
    unknown = runner.invoke(app, ["validate", "--envoy", "--proxy", "nobody.bookinfo", str(EXAMPLES)])
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("error: --proxy 'nobody.bookinfo' names no WorkloadEntry")


def test_fleet_settings_that_only_the_vms_have(tmp_path: Path) -> None:
    """A runtime layer read from a directory of the VMs, or served over RTDS, cannot be had
    here: each is left out, with a note. Settings Envoy refuses on their own are the
    bootstrap's fault, not the mesh's: exit 2, one line."""
    data: dict[str, Any] = cli_bootstrap()
    data["layered_runtime"]["layers"] += [
        {"name": "vm-disk", "disk_layer": {"symlink_root": str(tmp_path / "runtime" / "current")}},
        {"name": "rtds", "rtds_layer": {"name": "runtime", "rtds_config": {"ads": {}}}},
    ]
    fleet = tmp_path / "envoy.yaml"
    YAML(typ="safe").dump(data, fleet)
    result = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(fleet), str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert f"runtime layer 'vm-disk' reads {tmp_path / 'runtime' / 'current'}, which is not on this machine" in (
        result.stderr
    )
    assert "runtime layer 'rtds' comes over RTDS: left out of the check" in result.stderr

    data["overload_manager"]["resource_monitors"].append(
        {"name": "envoy.resource_monitors.none", "typed_config": {"@type": "type.googleapis.com/google.protobuf.Empty"}}
    )
    YAML(typ="safe").dump(data, fleet)
    result = runner.invoke(app, ["validate", "--envoy", "--bootstrap", str(fleet), str(EXAMPLES)])
    assert result.exit_code == 2
    assert result.stdout == ""
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith(f"error: --bootstrap {fleet}: Envoy ")
    assert "refuses it with no mesh config at all: " in line
    assert "envoy.resource_monitors.none" in line
