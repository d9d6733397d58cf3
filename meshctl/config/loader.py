"""Files of Istio YAML to `Config` objects and findings.

A file is the unit of loading: it is accepted whole or rejected whole (any error in any of its
documents rejects it), so a half-edited multi-document file never reaches the store. Each
document becomes a resource as `resource` says (kinds of other API groups skipped with a
warning, the way a Kubernetes manifest directory is usually organised); a file loaded before is
loaded again by the stretch that changed (`documents`).

Parsing is fast (see `yamlsource`); field positions are computed only for findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl.config import documents, positions, resource, yamlsource
from meshctl.config.files import decode_text, read_config_file, walk_yaml
from meshctl.config.findings import FieldPath, Finding, Severity, has_errors
from meshctl.config.model import (
    Config,
    ConfigKey,
    Source,
)
from meshctl.errors import ConfigError, YamlError

if TYPE_CHECKING:
    from meshctl.config.parse_cache import ParseCache


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
    #: (the watcher's), so that one reuses the documents whose text did not change: of this
    #: text, or, when this one did not load, of the last text loaded by pieces.
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
    if previous is None:
        return load_text(text, display, options, parse_cache=parse_cache)
    found = _load_pieces(text, display, options, previous.pieces, parse_cache)
    if found is not None:
        return found
    result = load_text(text, display, options, parse_cache=parse_cache)
    if not result.ok and previous.pieces is not None:
        # A save with a typo: the fix that follows is compared with the text before it.
        result = replace(result, pieces=previous.pieces)
    return result


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
    data = text.encode("utf-8", "surrogatepass")
    if (previous is None or not previous.pieces) and data.count(b"\n---") + 1 < _PIECES_FROM:
        return None  # too few documents for pieces to pay: not worth a cut
    recut = documents.recut(previous, data)
    if recut is None or not _PIECES_FROM <= recut.count <= yamlsource.DEFAULT_MAX_DOCUMENTS:
        return None
    aliases = yamlsource.AliasBudget(options.max_alias_values)  # the file's, across its pieces
    if not _charge(aliases, recut.front):
        return None
    key = parse_cache.text_key(text) if parse_cache is not None else ""
    cached = parse_cache.lookup(display, key) if parse_cache is not None else None
    by_index = {doc.index: doc for doc in cached} if cached is not None else None
    whole = _Locator(text) if cached is not None else None
    fresh = parse_cache is not None and cached is None and not recut.front and not recut.tail
    parsed: list[yamlsource.Document] | None = [] if fresh else None
    known = documents.by_digest(recut.replaced)
    pieces, starts = list(recut.front), list(recut.front_starts)
    index = pieces[-1].index + pieces[-1].documents if pieces else 0
    for cut in recut.middle:
        piece = known.get(cut.digest)
        if piece is not None:
            if not _charge(aliases, (piece,)):
                return None
            piece = documents.moved(piece, cut.line, index)
            parsed = None
        else:
            locator: resource.Locator
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
            loaded = [resource.load_document(doc, display, options, locator) for doc in docs]
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
        config, doc_findings = resource.load_document(doc, display, options, locator)
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
