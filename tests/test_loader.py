"""The loader: Istio YAML as users write it for Kubernetes, and every way a file can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshctl.config.findings import Severity
from meshctl.config.loader import LoadOptions, load_file, load_paths, load_text, merge_files
from meshctl.config.model import ConfigKey

VS = """apiVersion: networking.istio.io/{version}
kind: VirtualService
metadata:
  name: {name}
  namespace: shop
  labels:
    team: payments
spec:
  hosts:
  - reviews.shop.mesh
  http:
  - timeout: 5s
    route:
    - destination:
        host: reviews.shop.mesh
"""


def errors(result_findings: tuple[object, ...] | list[object]) -> list[str]:
    return [str(f) for f in result_findings if getattr(f, "severity", None) is Severity.ERROR]


@pytest.mark.parametrize("version", ["v1alpha3", "v1beta1", "v1"])
def test_every_accepted_api_version_gives_the_same_typed_spec(version: str) -> None:
    result = load_text(VS.format(version=version, name="reviews"), "vs.yaml")
    assert result.ok, result.findings
    (config,) = result.configs
    assert config.key == ConfigKey("VirtualService", "shop", "reviews")
    assert config.labels == {"team": "payments"}
    spec = config.spec
    assert list(spec.hosts) == ["reviews.shop.mesh"]  # type: ignore[attr-defined]
    assert spec.http[0].timeout.seconds == 5  # type: ignore[attr-defined]
    assert (config.source.file, config.source.line) == ("vs.yaml", 1)


def test_multi_document_file_remembers_each_documents_line_and_defaults_the_namespace() -> None:
    text = (
        VS.format(version="v1", name="a")
        + "---\n"
        + "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: b\nspec:\n  host: x.mesh\n"
    )
    result = load_text(text, "f.yaml", LoadOptions(default_namespace="team-a"))
    assert result.ok, result.findings
    a, b = result.configs
    assert a.source.line == 1 and b.source.line == text.count("\n", 0, text.index("kind: Dest"))
    assert b.key == ConfigKey("DestinationRule", "team-a", "b")


def test_non_istio_kinds_are_skipped_with_a_warning() -> None:
    text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: reviews\n---\n" + VS.format(
        version="v1", name="r"
    )
    result = load_text(text, "mixed.yaml")
    assert result.ok
    assert [c.name for c in result.configs] == ["r"]
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING
    assert "skipped v1 Service" in warning.message and warning.line == 2


def test_security_kinds_are_skipped_with_a_warning() -> None:
    text = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: x\n"
    result = load_text(text, "a.yaml")
    assert result.ok and not result.configs
    assert "not supported yet" in result.findings[0].message


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("- a\n- b\n", "must be a mapping", 1),
        ("apiVersion: networking.istio.io/v1\nmetadata: {name: x}\n", "missing kind", 1),
        ("kind: Gateway\nmetadata: {name: x}\n", "no apiVersion", 1),
        ("apiVersion: networking.istio.io/v2\nkind: Gateway\nmetadata: {name: x}\n", "unknown apiVersion", 1),
        ("apiVersion: networking.istio.io/v1\nkind: Gateway\nspec: {}\n", "no metadata.name", 1),
        (
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: Bad_Name\n"
            "spec:\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n",
            "invalid name",
            4,
        ),
        (
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: g\n  labels:\n    v: 1\n"
            "spec:\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n",
            "values must be strings",
            6,
        ),
    ],
)
def test_envelope_errors_say_what_and_where(text: str, message: str, line: int) -> None:
    result = load_text(text, "bad.yaml")
    assert not result.ok and not result.configs
    (finding,) = [f for f in result.findings if f.severity is Severity.ERROR]
    assert message in finding.message
    assert (finding.file, finding.line) == ("bad.yaml", line)


def test_schema_errors_point_at_the_field() -> None:
    text = VS.format(version="v1", name="r").replace("timeout: 5s", "timeout: 5 seconds\n    bogus: 1")
    result = load_text(text, "vs.yaml")
    assert not result.ok and not result.configs
    by_field = {f.field: f for f in result.findings}
    assert by_field["spec.http[0].timeout"].line == 12
    assert "invalid duration" in by_field["spec.http[0].timeout"].message
    assert by_field["spec.http[0].bogus"].line == 13
    assert "unknown field" in by_field["spec.http[0].bogus"].message
    assert all(f.resource == ConfigKey("VirtualService", "shop", "r") for f in result.findings)


def test_one_bad_document_rejects_the_whole_file() -> None:
    text = (
        VS.format(version="v1", name="a")
        + "---\n"
        + VS.format(version="v1", name="b").replace("hosts:\n  - reviews.shop.mesh", "hosts: 5")
    )
    result = load_text(text, "two.yaml")
    assert not result.ok
    assert result.configs == ()
    assert any(f.field == "spec.hosts" for f in result.findings)


def test_same_resource_twice_names_both_places(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(VS.format(version="v1", name="r"))
    (tmp_path / "b.yaml").write_text("# moved\n" + VS.format(version="v1", name="r"))
    result = load_paths([tmp_path])
    configs, findings = merge_files(result.files.values())
    assert configs[ConfigKey("VirtualService", "shop", "r")].source.file.endswith("a.yaml")
    (dup,) = findings
    assert dup.file is not None and dup.file.endswith("b.yaml") and dup.line == 2
    assert "a.yaml:1:1" in dup.message

    same_file = load_text(
        VS.format(version="v1", name="r") + "---\n" + VS.format(version="v1", name="r"), "x.yaml"
    )
    assert not same_file.ok
    assert "defined twice" in errors(same_file.findings)[0]


def test_discovery_is_recursive_sorted_and_skips_hidden(tmp_path: Path) -> None:
    (tmp_path / "z").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "z" / "b.yml").write_text(VS.format(version="v1", name="b"))
    (tmp_path / "a.yaml").write_text(VS.format(version="v1", name="a"))
    (tmp_path / ".git" / "c.yaml").write_text("not: [yaml")
    (tmp_path / "notes.txt").write_text("ignored")
    result = load_paths([tmp_path])
    assert [Path(p).relative_to(tmp_path).as_posix() for p in result.files] == ["a.yaml", "z/b.yml"]


def test_size_limit_and_non_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 2000 + "\n")
    result = load_file(big, LoadOptions(max_file_bytes=1000))
    assert not result.ok and "over the 1000-byte limit" in result.findings[0].message
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"a: \xff\xfe\n")
    assert "not UTF-8" in load_file(binary).findings[0].message


def test_missing_path_is_reported(tmp_path: Path) -> None:
    result = load_paths([tmp_path / "nope"])
    assert "no such file" in result.findings[0].message
