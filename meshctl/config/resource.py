"""One YAML document to a `Config` and its findings.

A document is checked as Kubernetes and Istio check it: a mapping with a kind, an apiVersion of
a group and version meshctl serves, metadata with a valid name, namespace, labels and
annotations, and a spec that parses (`schema`) and validates (`validation`). Kinds of other API
groups are skipped with a warning, an unknown kind in Istio's own groups is a typo and an error,
and a kind meshctl does not serve is refused with the reason (`_not_served`). Findings carry the
position of the field they are about, found again only for them (`Locator`).
"""

from __future__ import annotations

import difflib
import re
from datetime import datetime
from functools import cache
from sys import intern
from typing import TYPE_CHECKING, Any, Final, Protocol

from meshctl.config import yamlsource
from meshctl.config.findings import FieldPath, Finding, Severity, format_path
from meshctl.config.model import (
    GATEWAY_API_GROUP,
    GATEWAY_API_KINDS,
    GROUP_VERSIONS,
    ISTIO_KINDS,
    NOT_SERVED_YET,
    REFUSED,
    WASM_DOWNLOAD_REFUSED,
    Config,
    ConfigKey,
    Source,
    served_group,
    spec_class,
)
from meshctl.config.schema import parse_spec
from meshctl.config.validation import validate_spec
from meshctl.config.validation.metadata import validate_metadata

if TYPE_CHECKING:
    from google.protobuf.message import Message


# Kubernetes object names: RFC 1123 subdomain; namespaces: RFC 1123 label.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class DocumentOptions(Protocol):
    """What loading one document reads of the loader's options (`loader.LoadOptions`)."""

    @property
    def default_namespace(self) -> str: ...

    @property
    def validate(self) -> bool: ...

    @property
    def refuse_unserved(self) -> bool: ...


class Locator(Protocol):
    """Where a field of a document of the file is (line, column), for findings."""

    def position(self, document: int, path: FieldPath) -> tuple[int, int]: ...


def load_document(
    doc: yamlsource.Document, display: str, options: DocumentOptions, locator: Locator
) -> tuple[Config | None, list[Finding]]:
    """One document to a Config. The kind, apiVersion and namespace are interned: each is
    written in thousands of documents and each document's copy would be a string of its own."""
    source = Source(display, doc.line, doc.column, doc.index)
    data = doc.data

    def finding(
        message: str, path: FieldPath = (), severity: Severity = Severity.ERROR, key: ConfigKey | None = None
    ) -> Finding:
        line, column = locator.position(doc.index, path) if path else (doc.line, doc.column)
        return Finding(severity, message, display, line, column, key, format_path(path))

    if not isinstance(data, dict):
        if _routing_tests(data):
            return None, [finding(ROUTING_TESTS_SKIPPED, severity=Severity.INFO)]
        return None, [finding(f"a document must be a mapping (an object), not a {_kind_of(data)}")]
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if not isinstance(kind, str) or not kind:
        return None, [finding("missing kind", ("kind",) if "kind" in data else ())]
    if not isinstance(api_version, str) or not api_version:
        return None, [finding(f"{kind} has no apiVersion", ("apiVersion",) if "apiVersion" in data else ())]

    group, _, version = api_version.partition("/")
    if group == GATEWAY_API_GROUP:
        kind = GATEWAY_API_KINDS.get(kind, kind)
    if group != served_group(kind):
        message, severity = _not_served(group, api_version, kind, options)
        return None, [finding(message, ("kind",), severity)]
    url = _wasm_download(kind, data.get("spec"))
    if url is not None:
        severity = Severity.ERROR if options.refuse_unserved else Severity.WARNING
        message = f"refused {api_version} {kind}: url {url!r}: {WASM_DOWNLOAD_REFUSED}"
        return None, [finding(message, ("spec", "url"), severity)]
    if version not in GROUP_VERSIONS[group]:
        accepted = ", ".join(f"{group}/{v}" for v in GROUP_VERSIONS[group])
        return None, [finding(f"unknown apiVersion {api_version}: use one of {accepted}", ("apiVersion",))]

    kind, api_version = intern(kind), intern(api_version)
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        path: FieldPath = ("metadata",) if "metadata" in data else ()
        return None, [finding(f"{kind} has no metadata.name", path)]
    problems: list[Finding] = []
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None, [finding(f"{kind} has no metadata.name", ("metadata",))]
    namespace = metadata.get("namespace", options.default_namespace)
    if namespace is None:
        namespace = options.default_namespace
    if not isinstance(namespace, str) or not _LABEL.fullmatch(namespace) or len(namespace) > 63:
        problems.append(
            finding(f"invalid namespace {namespace!r}: must be a DNS label (RFC 1123)", ("metadata", "namespace"))
        )
        namespace = options.default_namespace
    key = ConfigKey(kind, intern(namespace), name)
    if not _SUBDOMAIN.fullmatch(name) or len(name) > 253:
        problems.append(
            finding(
                f"invalid name {name!r}: must be lowercase letters, digits, '-' and '.' (RFC 1123)",
                ("metadata", "name"),
                key=key,
            )
        )
    labels = _string_map(metadata, "labels", key, problems, finding)
    annotations = _string_map(metadata, "annotations", key, problems, finding)
    created = _creation_time(metadata.get("creationTimestamp"))
    if created is _INVALID:
        message = "metadata.creationTimestamp must be an RFC 3339 time (2024-05-01T12:00:00Z)"
        problems.append(finding(message, ("metadata", "creationTimestamp"), key=key))

    spec, issues = parse_spec(data.get("spec"), spec_class_of(kind))
    problems.extend(finding(i.message, i.path, key=key) for i in issues)
    if issues:
        # A spec that did not parse whole is no resource: analysing what parsed would report
        # findings about fields the document does have.
        return None, problems
    if options.validate and not issues:
        problems.extend(finding(i.message, i.path, i.severity, key) for i in validate_spec(kind, spec))
        for i in validate_metadata(key, labels, annotations, spec):
            problems.append(finding(i.message, i.path, i.severity, key))

    kept = spec.SerializeToString(deterministic=True) if kind in PACKED_KINDS else _compact(spec)
    config = Config(
        key,
        api_version,
        kept,
        labels=labels,
        annotations=annotations,
        source=source,
        created=created if isinstance(created, float) else None,
    )
    return config, problems


def _not_served(group: str, api_version: str, kind: str, options: DocumentOptions) -> tuple[str, Severity]:
    """Why a document of a kind meshctl does not serve is skipped, and how bad that is:

    - a kind no Istio group has, in an Istio group, is a typo: an error, with the kind meant;
    - an Istio kind meshctl does not serve (`model.REFUSED`) is refused with the reason: an
      error for `validate` (config that would silently do nothing fails CI), a warning for a
      server, which keeps serving the rest of the file (`LoadOptions.refuse_unserved`);
    - every other group's kind (Kubernetes, Gateway API) is skipped with a warning.
    """
    known = ISTIO_KINDS.get(group)
    if known is not None and kind not in known:
        close = difflib.get_close_matches(kind, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (its kinds: {', '.join(sorted(known))})"
        return f"unknown kind {kind} in {group}{hint}", Severity.ERROR
    if known is not None:
        reason = REFUSED[kind][1] if kind in REFUSED else "not served"
        severity = Severity.ERROR if options.refuse_unserved else Severity.WARNING
        return f"refused {api_version} {kind}: {reason}", severity
    if group in NOT_SERVED_YET:
        return f"skipped {api_version} {kind}: {NOT_SERVED_YET[group]}", Severity.WARNING
    return f"skipped {api_version} {kind}: not Istio networking config", Severity.WARNING


def _wasm_download(kind: str, spec: Any) -> str | None:
    """The `spec.url` of a WasmPlugin that names a module to fetch (oci://, http(s)://, or no
    scheme, which Istio reads as oci://), None for a local file:// module or any other kind.
    Such a document is skipped like a refused kind: a server warns and serves the rest."""
    if kind != "WasmPlugin" or not isinstance(spec, dict):
        return None
    url = spec.get("url")
    if not isinstance(url, str) or not url or url.startswith("file://"):
        return None
    return url


#: `spec_class` imports on every call; the loader asks once per document.
spec_class_of = cache(spec_class)


def _compact(spec: Message) -> Message:
    """A copy of `spec` made from its wire form, to keep instead of it. With protobuf's upb
    backend a message only grows: building it field by field leaves slack, and reading a map
    field that is not set (validation does, for every rule that looks at one) adds an empty map
    to it for good, some 370 bytes each. The copy holds only what the spec says."""
    return type(spec).FromString(spec.SerializeToString())


#: Kinds whose specs are kept as their wire form (see `Config`): a mesh has WorkloadEntries by
#: the ten thousand, and once the registry has made them endpoints they are read one at a time
#: (binding a proxy to its workload), where parsing fifty bytes again costs nothing.
PACKED_KINDS: Final = frozenset({"WorkloadEntry"})


def _string_map(
    metadata: dict[str, Any], name: str, key: ConfigKey, problems: list[Finding], finding: Any
) -> dict[str, str]:
    value = metadata.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(finding(f"metadata.{name} must be a mapping", ("metadata", name), key=key))
        return {}
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            problems.append(
                finding(
                    f"metadata.{name} values must be strings (quote {v!r})",
                    ("metadata", name, str(k)),
                    key=key,
                )
            )
            continue
        out[k] = v
    return out


#: What `_creation_time` says of a value that is no time.
_INVALID: Final = object()


def _creation_time(value: Any) -> float | object | None:
    """`metadata.creationTimestamp` as seconds since the epoch; None when absent (or null, as
    `kubectl get -o yaml` of an unsaved object writes it); `_INVALID` when it is no RFC 3339 time."""
    if value is None:
        return None
    if not isinstance(value, str):
        return _INVALID
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return _INVALID
    if when.tzinfo is None:
        return _INVALID
    seconds: float = when.timestamp()
    return seconds


#: The note on a file of routing tests met among the config (`examples/` holds both).
ROUTING_TESTS_SKIPPED = "skipped: a file of routing tests for `meshctl simulate --cases` (docs/routing-tests.md)"


def _routing_tests(data: Any) -> bool:
    """True for what `meshctl simulate --cases` reads: a list of cases, each a mapping with a
    request and what to expect of it (the cases are checked by `simulate`, not here)."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(case, dict) and "request" in case and "expect" in case for case in data)
    )


def _kind_of(data: Any) -> str:
    if isinstance(data, list):
        return "list"
    if isinstance(data, str):
        return "string"
    return type(data).__name__
