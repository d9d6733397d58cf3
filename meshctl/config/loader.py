"""Files of Istio YAML to `Config` objects and findings.

A file is the unit of loading: it is accepted whole or rejected whole (any error in any of its
documents rejects it), so a half-edited multi-document file never reaches the store. Kinds of
other API groups (a Kubernetes Service next to a VirtualService, say) are skipped with a warning,
the way a Kubernetes manifest directory is usually organised; in Istio's own groups an unknown
kind is a typo and an error, and a kind meshctl does not serve is refused with the reason
(`_not_served`). Every security.istio.io kind is loaded and enforced.

Parsing is fast (see `yamlsource`); field positions are computed only for findings.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from pathlib import Path
from sys import intern
from typing import TYPE_CHECKING, Any, Final, Protocol

from meshctl.config import documents, positions, yamlsource
from meshctl.config.files import decode_text, read_config_file, walk_yaml
from meshctl.config.findings import FieldPath, Finding, Severity, format_path, has_errors
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
from meshctl.errors import ConfigError, YamlError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from meshctl.config.parse_cache import ParseCache


# Kubernetes object names: RFC 1123 subdomain; namespaces: RFC 1123 label.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to read files; passed down from the CLI or the server config, never global."""

    default_namespace: str = "default"
    max_file_bytes: int = yamlsource.DEFAULT_MAX_FILE_BYTES
    max_values: int = yamlsource.DEFAULT_MAX_VALUES  # written in one document
    max_alias_values: int = yamlsource.DEFAULT_MAX_ALIAS_VALUES  # added by aliases in one file
    validate: bool = True
    #: Distinct findings reported for one file; the rest are counted in one last finding.
    max_findings_per_file: int = 100
    #: Processes that load files side by side when there are many (see `tree.load_paths`); 1 loads
    #: everything in this process, as a server must (it runs threads, and workers are forked);
    #: 0 chooses by the tree's size and the idle CPUs (`parallel.auto_workers`).
    workers: int = 1
    #: An Istio kind meshctl does not serve (`model.REFUSED`) is an error, as `validate` has it,
    #: rather than a warning beside the rest of its file, as a server has it.
    refuse_unserved: bool = False


@dataclass(frozen=True, slots=True)
class FileResult:
    """What one file gave: its resources when it loaded, and every finding about it."""

    path: str
    configs: tuple[Config, ...] = ()
    findings: tuple[Finding, ...] = ()
    #: What each document gave, kept by a load that may be followed by another of the same file
    #: (the watcher's), so that one reuses the documents whose text did not change.
    pieces: documents.Pieces | None = field(default=None, compare=False, repr=False)
    #: The resources of a rejected file's documents that loaded complete: never served (the
    #: file keeps its last good contents), but analysed by `validate`, so one broken document
    #: neither hides the file's other findings nor makes its hosts look missing elsewhere.
    rejected: tuple[Config, ...] = field(default=(), compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """False when the file must not replace what the store last had from it."""
        return not has_errors(self.findings)

    @property
    def analysed(self) -> tuple[Config, ...]:
        """What cross-resource analysis reads of this file: its resources, or those it would
        have had, had it loaded."""
        return self.configs or self.rejected


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Every file under the given paths, in path order, plus findings about the tree itself."""

    files: Mapping[str, FileResult] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()

    def all_findings(self) -> list[Finding]:
        out = list(self.findings)
        for result in self.files.values():
            out.extend(result.findings)
        return out


class Locator(Protocol):
    """Where a field of a document of the file is (line, column), for findings."""

    def position(self, document: int, path: FieldPath) -> tuple[int, int]: ...


class _Locator:
    """Finds field positions in one file's text, composing it at most once."""

    def __init__(self, text: str) -> None:
        self._positions = positions.Positions(text)

    def position(self, document: int, path: FieldPath) -> tuple[int, int]:
        return self._positions.locate(document, path)


def discover(paths: Iterable[Path]) -> list[Path]:
    """YAML files under `paths` in a stable order (see `files.walk_yaml`, which also says what it
    skipped); hidden files and folders (.git, ..data) are skipped, and each directory is read once
    however many links lead to it. A path given as a file is taken whatever its suffix."""
    return walk_yaml(paths).files


def load_file(path: Path, options: LoadOptions | None = None) -> FileResult:
    """Read and load one file; I/O errors become findings, never exceptions. Only a regular
    file is read, never more than the size limit, and nothing it can be makes this block."""
    options = options or LoadOptions()
    try:
        raw = read_config_file(path, options.max_file_bytes).data
    except (ConfigError, OSError) as exc:
        return unreadable(str(path), exc)
    return load_bytes(raw, str(path), options)


def unreadable(display: str, exc: ConfigError | OSError) -> FileResult:
    """The result of a file that could not be read, with a finding that says why."""
    message = f"cannot read file: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
    return FileResult(display, findings=(_file_error(display, message),))


def load_bytes(
    raw: bytes,
    display: str,
    options: LoadOptions | None = None,
    *,
    previous: FileResult | None = None,
    parse_cache: ParseCache | None = None,
) -> FileResult:
    """Load a file's bytes, read by the caller (the watcher keeps a digest of exactly what it
    loaded). With `previous` (the last load of the same file), documents whose text it saw are
    not loaded again (`meshctl.config.documents`), and the result keeps its pieces for the next.
    With `parse_cache`, a text parsed by an earlier run is not parsed again (`parse_cache`)."""
    options = options or LoadOptions()
    try:
        yamlsource.check_size(len(raw), options.max_file_bytes)
        text = decode_text(raw)
    except ConfigError as exc:
        return FileResult(display, findings=(_file_error(display, str(exc)),))
    if previous is not None:
        found = _load_pieces(text, display, options, previous.pieces, parse_cache)
        if found is not None:
            return found
    return load_text(text, display, options, parse_cache=parse_cache)


#: Files of fewer documents are loaded whole: parsing each document on its own costs more than
#: parsing the file in one go, which pays only where a file holds many documents.
_PIECES_FROM = 64


def _load_pieces(
    text: str,
    display: str,
    options: LoadOptions,
    previous: documents.Pieces | None,
    parse_cache: ParseCache | None,
) -> FileResult | None:
    """`load_text`'s result, document by document, keeping what `previous` pieces gave for the
    documents whose text is the same; None when the text cannot be cut exactly (see the module).
    A text `parse_cache` holds is not parsed; one parsed here piece by piece is kept in it when
    every piece was parsed (the documents of the pieces kept are not at hand)."""
    recut = documents.recut(previous, text.encode("utf-8", "surrogatepass"))
    if recut is None or not _PIECES_FROM <= recut.count <= yamlsource.DEFAULT_MAX_DOCUMENTS:
        return None
    aliases = yamlsource.AliasBudget(options.max_alias_values)  # the file's, across its pieces
    if not _charge(aliases, recut.head):
        return None
    key = parse_cache.text_key(text) if parse_cache is not None else ""
    cached = parse_cache.lookup(display, key) if parse_cache is not None else None
    by_index = {doc.index: doc for doc in cached} if cached is not None else None
    whole = _Locator(text) if cached is not None else None
    fresh = parse_cache is not None and cached is None and not recut.head and not recut.tail
    parsed: list[yamlsource.Document] | None = [] if fresh else None
    known = documents.by_digest(recut.replaced)
    pieces, starts = list(recut.head), list(recut.head_starts)
    index = pieces[-1].index + pieces[-1].documents if pieces else 0
    for cut in recut.middle:
        piece = known.get(cut.digest)
        if piece is not None:
            if not _charge(aliases, (piece,)):
                return None
            piece = documents.moved(piece, cut.line, index)
            parsed = None
        else:
            locator: Locator
            count = 1
            used: int | None = 0
            if by_index is not None and whole is not None and not cut.head:
                docs, locator = ([by_index[index]] if index in by_index else []), whole
                used = None if cut.may_alias() else 0  # what its aliases added is not known
            else:
                try:
                    docs, count, used, locator = documents.parse_piece(cut, index, options.max_values, aliases)
                except YamlError:
                    return None  # the whole text, loaded whole, says where
                if parsed is not None:
                    parsed.extend(docs)
            loaded = [_load_document(doc, display, options, locator) for doc in docs]
            piece_configs = tuple(c for c, _ in loaded if c is not None)
            piece_findings = tuple(f for _, fs in loaded for f in fs)
            piece = documents.Piece(cut.digest, cut.line, index, piece_configs, piece_findings, count, used)
        pieces.append(piece)
        starts.append(cut.start)
        index += piece.documents
    if recut.tail:
        if not _charge(aliases, recut.tail):
            return None
        lines, indexes = recut.tail_line - recut.tail[0].line, index - recut.tail_index
        if lines or indexes:
            pieces += (documents.moved(p, p.line + lines, p.index + indexes) for p in recut.tail)
        else:
            pieces += recut.tail
        starts += (s + recut.byte_shift for s in recut.tail_starts) if recut.byte_shift else recut.tail_starts
    if parse_cache is not None and parsed is not None:
        parse_cache.record(key, parsed)
    configs, findings = _assemble(pieces, display, options)
    kept = documents.Pieces(recut.data, tuple(starts), tuple(pieces))
    if findings.has_errors:
        return FileResult(display, (), findings.result(), kept, tuple(configs))
    return FileResult(display, tuple(configs), findings.result(), kept)


def _charge(aliases: yamlsource.AliasBudget, pieces: Sequence[documents.Piece]) -> bool:
    """Charge what the aliases of `pieces` added to the file's budget, as a whole parse would;
    False when that is not known or over the budget (the whole text is then loaded whole)."""
    costs = [p.aliases for p in pieces]
    if None in costs:
        return False
    aliases.left -= sum(c for c in costs if c)
    return aliases.left >= 0


def _assemble(
    pieces: Sequence[documents.Piece], display: str, options: LoadOptions
) -> tuple[list[Config], _FileFindings]:
    """The file's resources and findings from its pieces, as `load_text` gives them: a resource
    defined twice is an error at its second place, which keeps the first."""
    configs = [c for p in pieces for c in p.configs]
    findings = _FileFindings(display, options.max_findings_per_file)
    if len({c.key for c in configs}) == len(configs):
        for piece in pieces:
            if piece.findings:
                findings.extend(piece.findings)
        return configs, findings
    configs = []
    seen: dict[ConfigKey, Source] = {}
    for piece in pieces:
        findings.extend(piece.findings)
        for config in piece.configs:
            first = seen.get(config.key)
            if first is not None:
                findings.extend([_duplicate(config, first)])
                continue
            seen[config.key] = config.source
            configs.append(config)
    return configs, findings


def load_text(
    text: str, display: str, options: LoadOptions | None = None, *, parse_cache: ParseCache | None = None
) -> FileResult:
    """Load every document of one file's text (also used for stdin); with `parse_cache`, a
    text an earlier run parsed is not parsed again."""
    options = options or LoadOptions()
    try:
        yamlsource.check_size(len(text.encode("utf-8", "surrogatepass")), options.max_file_bytes)
        aliases = yamlsource.AliasBudget(options.max_alias_values)

        def parse() -> list[yamlsource.Document]:
            return yamlsource.parse_documents(text, max_values=options.max_values, aliases=aliases)

        parsed = parse_cache.documents(display, text, parse) if parse_cache is not None else parse()
    except YamlError as exc:
        return FileResult(display, findings=(_file_error(display, exc.message, exc.line, exc.column),))

    locator = _Locator(text)
    configs: list[Config] = []
    findings = _FileFindings(display, options.max_findings_per_file)
    seen: dict[ConfigKey, Source] = {}
    for doc in parsed:
        config, doc_findings = _load_document(doc, display, options, locator)
        findings.extend(doc_findings)
        if config is None:
            continue
        first = seen.get(config.key)
        if first is not None:
            findings.extend([_duplicate(config, first)])
            continue
        seen[config.key] = config.source
        configs.append(config)
    if findings.has_errors:
        return FileResult(display, (), findings.result(), rejected=tuple(configs))
    return FileResult(display, tuple(configs), findings.result())


class _FileFindings:
    """One file's findings, bounded: a file of a million broken documents must not become a
    million log lines and a gigabyte of findings, in the server or in CI.

    Findings alike (same severity, message and field, of the same resource) are kept as the
    first of them, which says how many more there were: a finding of another resource is never
    folded into one it only resembles, or fixing the first would reveal it a run later. After
    `limit` distinct ones, the rest are only counted, and one last finding says how many were
    left out, as an error if any of them was one, so a file with errors is still rejected whole."""

    def __init__(self, display: str, limit: int) -> None:
        self._display, self._limit = display, limit
        self._first: dict[tuple[Severity, str, str, ConfigKey | None], Finding] = {}
        self._count: dict[tuple[Severity, str, str, ConfigKey | None], int] = {}
        self._dropped: dict[Severity, int] = {}
        self.has_errors = False

    def extend(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            self.has_errors = self.has_errors or finding.severity is Severity.ERROR
            key = (finding.severity, finding.message, finding.field, finding.resource)
            if key in self._first:
                self._count[key] += 1
            elif len(self._first) < self._limit:
                self._first[key], self._count[key] = finding, 1
            else:
                self._dropped[finding.severity] = self._dropped.get(finding.severity, 0) + 1

    def result(self) -> tuple[Finding, ...]:
        out = [_with_more(finding, self._count[key] - 1) for key, finding in self._first.items()]
        if self._dropped:
            worst = next(s for s in Severity if s in self._dropped)  # ERROR, WARNING, INFO: worst first
            dropped = sum(self._dropped.values())
            message = f"{dropped:,} more finding{'s' if dropped > 1 else ''} in this file not shown"
            out.append(Finding(worst, message, self._display))
        return tuple(out)


def _with_more(finding: Finding, more: int) -> Finding:
    return replace(finding, message=f"{finding.message} (and {more:,} more like it in this file)") if more else finding


def _load_document(
    doc: yamlsource.Document, display: str, options: LoadOptions, locator: Locator
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

    spec, issues = parse_spec(data.get("spec"), _spec_class(kind))
    problems.extend(finding(i.message, i.path, key=key) for i in issues)
    if issues:
        # A spec that did not parse whole is no resource: analysing what parsed would report
        # findings about fields the document does have.
        return None, problems
    if options.validate and not issues:
        problems.extend(finding(i.message, i.path, i.severity, key) for i in validate_spec(kind, spec))
        for i in validate_metadata(key, labels, annotations, spec):
            problems.append(finding(i.message, i.path, i.severity, key))

    kept = spec.SerializeToString(deterministic=True) if kind in _PACKED_KINDS else _compact(spec)
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


def _not_served(group: str, api_version: str, kind: str, options: LoadOptions) -> tuple[str, Severity]:
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
_spec_class = cache(spec_class)


def _compact(spec: Message) -> Message:
    """A copy of `spec` made from its wire form, to keep instead of it. With protobuf's upb
    backend a message only grows: building it field by field leaves slack, and reading a map
    field that is not set (validation does, for every rule that looks at one) adds an empty map
    to it for good, some 370 bytes each. The copy holds only what the spec says."""
    return type(spec).FromString(spec.SerializeToString())


#: Kinds whose specs are kept as their wire form (see `Config`): a mesh has WorkloadEntries by
#: the ten thousand, and once the registry has made them endpoints they are read one at a time
#: (binding a proxy to its workload), where parsing fifty bytes again costs nothing.
_PACKED_KINDS: Final = frozenset({"WorkloadEntry"})


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


def _file_error(display: str, message: str, line: int = 0, column: int = 0) -> Finding:
    return Finding(Severity.ERROR, message, display, line, column)


def _duplicate(config: Config, first: Source) -> Finding:
    src = config.source
    return Finding(
        Severity.ERROR,
        f"{config.key} is defined twice: here and at {first}",
        src.file,
        src.line,
        src.column,
        config.key,
    )


def merge_files(files: Iterable[FileResult]) -> tuple[dict[ConfigKey, Config], list[Finding]]:
    """The resources of many files as one set. When two files define the same resource, the first
    in path order wins (deterministic, so replicas agree) and the other place gets an error."""
    out: dict[ConfigKey, Config] = {}
    findings: list[Finding] = []
    keep = out.setdefault  # one dict operation per resource: a tree of 100,000 is merged per reload
    for result in files:
        for config in result.configs:
            first = keep(config.key, config)
            if first is not config:
                findings.append(_duplicate(config, first.source))
    return out, findings


def iter_configs(result: LoadResult) -> Iterator[Config]:
    for file_result in result.files.values():
        yield from file_result.configs
