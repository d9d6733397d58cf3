"""PeerAuthentication as `istioctl validate` checks it (Istio's `ValidatePeerAuthentication` and
the PeerAuthentication CRD schema), seen the way a user sees it: Istio's documented examples
load clean under both apiVersions, and each broken rule is an error at its field and line.

The cases use the validation rules' format (`cases` in tests/conftest.py): a line marked `# <-` is
where the finding must point (unmarked: the `spec:` line). They are loaded as security.istio.io
documents here, since conftest's `document` writes networking.istio.io ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cases, marked_line, runner
from conftest import document as conftest_document

from meshctl.api.security.v1beta1.peer_authentication_pb2 import PeerAuthentication
from meshctl.cli.app import app
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import load_text
from meshctl.config.model import make_config

PA = "PeerAuthentication"


def document(spec: str, *, api_version: str = "security.istio.io/v1", namespace: str = "shop") -> str:
    return conftest_document(PA, spec, namespace=namespace, api_version=api_version)


def load(spec: str) -> tuple[str, list[Finding], bool]:
    text = document(spec)
    result = load_text(text, "peer.yaml")
    return text, list(result.findings), result.ok


ERRORS = cases(
    PA,
    """
[pa-port-level-without-selector] spec.portLevelMtls
portLevelMtls requires a selector with matchLabels
    mtls: {mode: STRICT}
    portLevelMtls:  # <-
      8080: {mode: DISABLE}

[pa-port-level-with-empty-selector] spec.portLevelMtls
a mesh- or namespace-wide PeerAuthentication cannot have port-level mTLS
    selector: {matchLabels: {}}
    portLevelMtls:  # <-
      8080: {mode: DISABLE}

[pa-port-zero] spec.portLevelMtls.0
port number 0 must be in the range 1..65535
    selector: {matchLabels: {app: finance}}
    portLevelMtls:
      0: {mode: STRICT}  # <-

[pa-port-too-high] spec.portLevelMtls.42949672
port number 42949672 must be in the range 1..65535
    selector: {matchLabels: {app: finance}}
    portLevelMtls:
      "42949672": {mode: STRICT}  # <-

[pa-port-not-a-number] spec.portLevelMtls.acd
expected an integer
    selector: {matchLabels: {app: finance}}
    portLevelMtls:
      acd: {mode: STRICT}  # <-

[pa-mode-unknown] spec.mtls.mode
invalid value "STRICTT": must be one of UNSET, DISABLE, PERMISSIVE, STRICT
    mtls:
      mode: STRICTT  # <-

[pa-port-mode-unknown] spec.portLevelMtls.8080.mode
invalid value "OFF"
    selector: {matchLabels: {app: finance}}
    portLevelMtls:
      8080:
        mode: "OFF"  # <-

[pa-unknown-field] spec.mtls.mod
unknown field "mod" in MutualTLS
    mtls:
      mod: STRICT  # <-

[pa-unknown-top-level-field] spec.portLevelTls
unknown field "portLevelTls" in PeerAuthentication
    selector: {matchLabels: {app: finance}}
    portLevelTls:  # <-
      8443: {mode: SIMPLE}

[pa-selector-wildcard] spec.selector.matchLabels.app
wildcards are not supported in selectors
    selector:
      matchLabels:
        app: "fin*"  # <-
    mtls: {mode: STRICT}

[pa-selector-empty-key] spec.selector.matchLabels.
empty key is not allowed in a selector
    selector:
      matchLabels:
        "": finance  # <-
    mtls: {mode: STRICT}
""",
)


@pytest.mark.parametrize(("kind", "spec", "field", "message"), ERRORS)
def test_broken_rule_is_an_error_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text, findings, ok = load(spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.ERROR
    assert found[0].resource is not None and found[0].resource.kind == kind
    assert found[0].line == marked_line(text), str(found[0])
    assert not ok


def test_a_selector_without_labels_is_a_warning_as_in_istio() -> None:
    """Istio's `validateWorkloadSelector`: "workload selector specified without labels"; its CRD
    tests call `selector: {}` weird but valid."""
    text, findings, ok = load("selector: {}  # <-\n")
    (warning,) = findings
    assert warning.severity is Severity.WARNING and warning.field == "spec.selector.matchLabels"
    assert "workload selector has no labels" in warning.message
    assert warning.line == marked_line(text)
    assert ok


# Istio's documented examples (istio/api security/v1beta1/peer_authentication.proto), whole.
ISTIO_EXAMPLES = {
    "mesh-wide-strict": """
metadata:
  name: default
  namespace: istio-system
spec:
  mtls:
    mode: STRICT
""",
    "namespace-wide-permissive": """
metadata:
  name: default
  namespace: foo
spec:
  mtls:
    mode: PERMISSIVE
""",
    "workload-strict": """
metadata:
  name: finance
  namespace: foo
spec:
  selector:
    matchLabels:
      app: finance
  mtls:
    mode: STRICT
""",
    "workload-port-8080-plaintext": """
metadata:
  name: default
  namespace: foo
spec:
  selector:
    matchLabels:
      app: finance
  mtls:
    mode: STRICT
  portLevelMtls:
    8080:
      mode: DISABLE
""",
    "workload-inherit-port-8080-plaintext": """
metadata:
  name: default
  namespace: foo
spec:
  selector:
    matchLabels:
      app: finance
  mtls:
    mode: UNSET
  portLevelMtls:
    8080:
      mode: DISABLE
""",
    "mtls-empty-is-unset": """
metadata:
  name: default
  namespace: foo
spec:
  mtls: {}
""",
    "root-namespace-with-selector": """
metadata:
  name: finance-everywhere
  namespace: istio-system
spec:
  selector:
    matchLabels:
      app: finance
  mtls:
    mode: STRICT
  portLevelMtls:
    "8080":
      mode: PERMISSIVE
""",
    "no-spec": """
metadata:
  name: default
  namespace: foo
""",
}


@pytest.mark.parametrize("api_version", ["security.istio.io/v1beta1", "security.istio.io/v1"])
@pytest.mark.parametrize("example", list(ISTIO_EXAMPLES))
def test_istio_examples_load_without_findings(api_version: str, example: str) -> None:
    text = f"apiVersion: {api_version}\nkind: {PA}\n{ISTIO_EXAMPLES[example].lstrip()}"
    result = load_text(text, "peer.yaml")
    assert result.findings == (), "\n".join(map(str, result.findings))
    (config,) = result.configs
    assert (config.kind, config.api_version) == (PA, api_version)


def test_modes_land_in_the_spec() -> None:
    result = load_text(
        f"apiVersion: security.istio.io/v1\nkind: {PA}\n" + ISTIO_EXAMPLES["workload-port-8080-plaintext"], "p.yaml"
    )
    (config,) = result.configs
    spec = config.spec
    assert isinstance(spec, PeerAuthentication)
    assert spec.selector.match_labels == {"app": "finance"}
    assert spec.mtls.mode == PeerAuthentication.MutualTLS.STRICT
    assert spec.port_level_mtls[8080].mode == PeerAuthentication.MutualTLS.DISABLE


@pytest.mark.parametrize(
    ("api_version", "message"),
    [
        ("security.istio.io/v1alpha1", "use one of security.istio.io/v1beta1, security.istio.io/v1"),
        ("networking.istio.io/v1", "unknown kind PeerAuthentication in networking.istio.io"),
    ],
)
def test_a_peer_authentication_outside_its_group_versions_is_an_error(api_version: str, message: str) -> None:
    result = load_text(document("mtls: {mode: STRICT}", api_version=api_version), "peer.yaml")
    (finding,) = result.findings
    assert finding.severity is Severity.ERROR and message in finding.message
    assert not result.ok and not result.configs


def test_a_config_built_in_code_gets_the_security_api_version() -> None:
    config = make_config(PA, "default", "istio-system", PeerAuthentication())
    assert config.api_version == "security.istio.io/v1"


STRICT_POLICY = document("mtls: {mode: STRICT}", namespace="istio-system")
REQUEST_AUTHENTICATION = """apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata:
  name: jwt
  namespace: foo
spec:
  jwtRules:
  - issuer: https://issuer.example
    jwksUri: https://issuer.example/jwks.json
"""


def test_validate_accepts_a_peer_authentication_without_the_unenforced_security_flag(tmp_path: Path) -> None:
    path = tmp_path / "peer.yaml"
    path.write_text(STRICT_POLICY)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_validate_accepts_every_security_kind_and_the_old_flag_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "jwt.yaml"
    path.write_text(STRICT_POLICY + "---\n" + REQUEST_AUTHENTICATION)
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    accepted = runner.invoke(app, ["validate", "--allow-unenforced-security", str(path)])
    assert accepted.exit_code == 0, accepted.output
