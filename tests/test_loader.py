"""The loader: Istio YAML as users write it for Kubernetes, and every way a file can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshctl.api.networking.v1alpha3.workload_entry_pb2 import WorkloadEntry
from meshctl.config.findings import Severity
from meshctl.config.loader import LoadOptions, load_file, load_text, merge_files
from meshctl.config.model import ConfigKey, make_config
from meshctl.config.tree import load_paths

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
    text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: reviews\n---\n" + VS.format(version="v1", name="r")
    result = load_text(text, "mixed.yaml")
    assert result.ok
    assert [c.name for c in result.configs] == ["r"]
    (warning,) = result.findings
    assert warning.severity is Severity.WARNING
    assert "skipped v1 Service" in warning.message and warning.line == 2


def test_every_security_kind_loads_as_a_served_kind() -> None:
    """meshctl enforces every security.istio.io kind, so none is skipped: a policy that loaded
    and did nothing would let through what it denies."""
    text = "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata:\n  name: x\nspec: {}\n"
    result = load_text(text, "a.yaml")
    assert result.ok and [c.kind for c in result.configs] == ["RequestAuthentication"]
    assert not result.findings


@pytest.mark.parametrize(
    ("api_version", "kind", "message"),
    [
        ("networking.istio.io/v1", "VirtualSevice", "unknown kind VirtualSevice in networking.istio.io; did you mean"),
        ("networking.istio.io/v1beta1", "Destinationrule", "did you mean DestinationRule?"),
        ("security.istio.io/v1", "AuthPolicy", "did you mean AuthorizationPolicy?"),
        ("telemetry.istio.io/v1", "Nonsense", "unknown kind Nonsense in telemetry.istio.io (its kinds: Telemetry)"),
    ],
)
def test_an_unknown_kind_in_an_istio_group_is_an_error_with_the_kind_meant(
    api_version: str, kind: str, message: str
) -> None:
    (finding,) = load_text(f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: x}}\n", "t.yaml").findings
    assert finding.severity is Severity.ERROR and message in finding.message
    assert (finding.line, finding.field) == (2, "kind")


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("networking.istio.io/v1alpha3", "ProxyConfig"),
        ("v1", "Service"),
    ],
)
def test_kinds_meshctl_does_not_serve_outside_security_are_warnings(api_version: str, kind: str) -> None:
    result = load_text(f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: x}}\n", "t.yaml")
    assert result.ok and result.findings[0].severity is Severity.WARNING


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

    same_file = load_text(VS.format(version="v1", name="r") + "---\n" + VS.format(version="v1", name="r"), "x.yaml")
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


WE = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: shop
spec:
  address: 10.0.0.{n}
  labels: {{app: reviews, version: v1}}
  serviceAccount: reviews
"""


def test_workload_entries_are_kept_packed_and_read_as_typed_specs() -> None:
    result = load_text(WE.format(name="vm-1", n=1) + "---\n" + VS.format(version="v1", name="r"), "f.yaml")
    assert result.ok, result.findings
    entry, route = result.configs
    assert entry.packed and not route.packed
    spec = entry.spec
    assert isinstance(spec, WorkloadEntry)
    assert (spec.address, spec.service_account) == ("10.0.0.1", "reviews")
    assert dict(spec.labels) == {"app": "reviews", "version": "v1"}
    assert entry.spec == spec and entry.spec is not spec  # parsed again on every read
    assert entry.spec_wire() == spec.SerializeToString(deterministic=True)


def test_packed_and_unpacked_configs_of_the_same_content_are_the_same() -> None:
    (entry,) = load_text(WE.format(name="vm-1", n=1), "f.yaml").configs
    unpacked = make_config("WorkloadEntry", "vm-1", "shop", entry.spec)
    assert unpacked.content_digest() == entry.content_digest()
    assert unpacked.same_content(entry) and entry.same_content(unpacked)
    (moved,) = load_text("# moved\n" + WE.format(name="vm-1", n=1), "g.yaml").configs
    assert moved.same_content(entry) and moved.source.line == 2
    (changed,) = load_text(WE.format(name="vm-1", n=2), "f.yaml").configs
    assert not changed.same_content(entry) and changed.content_digest() != entry.content_digest()


def test_strings_every_document_repeats_are_shared() -> None:
    text = VS.format(version="v1", name="a") + "---\n" + VS.format(version="v1", name="b")
    a, b = load_text(text, "f.yaml").configs
    assert a.key.kind is b.key.kind and a.key.namespace is b.key.namespace and a.api_version is b.api_version
    ((key_a, value_a),), ((key_b, value_b),) = a.labels.items(), b.labels.items()
    assert key_a is key_b and value_a is value_b
    assert a.annotations is b.annotations  # no annotations: one shared empty mapping


def test_worker_processes_give_the_same_configs(tmp_path: Path) -> None:
    for i in range(70):
        text = WE.format(name=f"vm-{i}", n=i) + "---\n" + VS.format(version="v1", name=f"r{i}")
        (tmp_path / f"vm-{i:02}.yaml").write_text(text)
    alone = load_paths([tmp_path], LoadOptions(workers=1))
    forked = load_paths([tmp_path], LoadOptions(workers=2))
    pairs = [
        (a, b)
        for x, y in zip(alone.files.values(), forked.files.values(), strict=True)
        for a, b in zip(x.configs, y.configs, strict=True)
    ]
    assert len(pairs) == 140
    for a, b in pairs:
        assert a.key == b.key and a.packed == b.packed and a.source == b.source
        assert a.same_content(b) and a.content_digest() == b.content_digest()


def test_findings_alike_in_one_file_are_reported_once_with_a_count() -> None:
    """A file of thousands of broken documents is one finding, not thousands of lines."""
    result = load_text("{}\n---\n" * 5000 + VS.format(version="v1", name="r"), "junk.yaml")
    assert not result.ok and result.configs == ()
    assert [(f.severity, f.message, f.line) for f in result.findings] == [
        (Severity.ERROR, "missing kind (and 4,999 more like it in this file)", 1)
    ]


def test_findings_per_file_are_bounded_and_the_rest_counted() -> None:
    skipped = "\n---\n".join(f"apiVersion: v1\nkind: Kind{i}\nmetadata: {{name: x}}" for i in range(250))
    result = load_text(skipped, "k8s.yaml", LoadOptions(max_findings_per_file=100))
    assert result.ok  # warnings only
    assert len(result.findings) == 101
    assert result.findings[99].message == "skipped v1 Kind99: not Istio networking config"
    assert (result.findings[-1].severity, result.findings[-1].message) == (
        Severity.WARNING,
        "150 more findings in this file not shown",
    )


def test_an_error_among_the_findings_not_shown_still_rejects_the_file() -> None:
    skipped = "".join(f"apiVersion: v1\nkind: Kind{i}\nmetadata: {{name: x}}\n---\n" for i in range(5))
    result = load_text(skipped + "- not a mapping\n", "k8s.yaml", LoadOptions(max_findings_per_file=5))
    assert not result.ok and result.configs == ()
    assert (result.findings[-1].severity, result.findings[-1].message) == (
        Severity.ERROR,
        "1 more finding in this file not shown",
    )
