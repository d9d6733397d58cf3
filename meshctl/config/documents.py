"""A changed file loaded again document by document: unchanged documents keep what they gave.

One file often holds hundreds or thousands of resources (a catalog of ServiceEntries), and an edit
changes one of them. Parsing and validating the whole file again cost 0.85 s for 10,000 entries,
and gave every resource a new object, so everything downstream treated them as new. Here the file
is cut at its document markers (`---` at the start of a line, which YAML never allows inside a
document), each document's text is compared with what the previous load of the file saw, and
only new or changed documents are parsed and validated; the others keep their resources (the
very same objects when they did not move) and their findings.

The result is the one `loader.load_text` gives for the whole text; where the cut would not be
exact (directives, `...` document ends, a document that does not parse on its own) the whole
text is loaded instead, as it always was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

from meshctl.config import positions, yamlsource
from meshctl.config.findings import FieldPath, Finding
from meshctl.config.model import Config, Source
from meshctl.config.yamlsource import Document
from meshctl.errors import YamlError

#: What may follow `---` (a document's start) or `...` (a document's end) on their line: the
#: line's end, the file's end, or a space or tab before more.
_LINE_GOES_ON: Final = (b"", b"\n", b" ", b"\t")


@dataclass(frozen=True, slots=True)
class Piece:
    """One document's text as a previous load saw it, and what it gave there."""

    digest: bytes
    #: The 1-based line its text starts on, and the index of the YAML document it is.
    line: int
    index: int
    configs: tuple[Config, ...]
    findings: tuple[Finding, ...]


class _Cut:
    """One document of a file: where it starts (line, index), the digest of its text, and the
    text itself, decoded only when asked for (a document seen before is never parsed again)."""

    __slots__ = ("_data", "_end", "_start", "digest", "index", "line")

    def __init__(self, data: bytes, start: int, end: int, line: int, index: int) -> None:
        self._data, self._start, self._end = data, start, end
        self.line, self.index = line, index
        self.digest = hashlib.blake2b(data[start:end], digest_size=16).digest()

    @property
    def text(self) -> str:
        return self._data[self._start : self._end].decode("utf-8", "surrogatepass")


def cut(text: str) -> list[_Cut] | None:
    """The documents of `text` with the line and index each starts at; None when cutting at the
    markers would not give the documents YAML reads.

    The text is encoded once and cut, hashed and counted as bytes (the markers are ASCII at the
    start of a line, so they cut the encoded text where they cut the text): a file of 1,000
    documents with one added costs its pieces' hashes, not a copy and an encoding of each."""
    data = text.encode("utf-8", "surrogatepass")
    if any(_line_starts(data, b"%")) or any(data[i + 3 : i + 4] in _LINE_GOES_ON for i in _line_starts(data, b"...")):
        return None  # a directive or a document end
    starts = [i for i in _line_starts(data, b"---") if data[i + 3 : i + 4] in _LINE_GOES_ON]
    head_end = starts[0] if starts else len(data)
    out: list[_Cut] = []
    index = 0
    if _has_content(data[:head_end].decode("utf-8", "surrogatepass")):
        out.append(_Cut(data, 0, head_end, 1, 0))
        index = 1
    line = 1 + data.count(b"\n", 0, head_end)
    for start, end in zip(starts, [*starts[1:], len(data)] if starts else [], strict=True):
        out.append(_Cut(data, start, end, line, index))
        line += data.count(b"\n", start, end)
        index += 1
    return out


def _line_starts(data: bytes, prefix: bytes) -> Iterator[int]:
    """The offsets of the lines of `data` that start with `prefix` (found by `bytes.find`: a
    regular expression anchored at line starts tries every character of the file)."""
    if data.startswith(prefix):
        yield 0
    needle = b"\n" + prefix
    at = data.find(needle)
    while at >= 0:
        yield at + 1
        at = data.find(needle, at + 1)


def _has_content(head: str) -> bool:
    """Whether text before the first marker makes a document (anything but blanks and comments)."""
    return any(s and not s.startswith("#") for s in (line.strip() for line in head.splitlines()))


class _OffsetLocator:
    """Field positions in one document's own text, as positions in the whole file."""

    def __init__(self, text: str, line: int, index: int) -> None:
        self._positions = positions.Positions(text)
        self._line, self._index = line, index

    def position(self, document: int, path: FieldPath) -> tuple[int, int]:
        line, column = self._positions.locate(document - self._index, path)
        return line + self._line - 1, column


def moved(piece: Piece, line: int, index: int) -> tuple[tuple[Config, ...], tuple[Finding, ...]]:
    """What `piece` gave, placed where its text now starts."""
    if (piece.line, piece.index) == (line, index):
        return piece.configs, piece.findings
    shift = line - piece.line
    configs = tuple(_placed(c, shift, index) for c in piece.configs)
    findings = tuple(replace(f, line=f.line + shift) if f.line else f for f in piece.findings)
    return configs, findings


def _placed(config: Config, shift: int, index: int) -> Config:
    source = config.source
    return config.with_source(Source(source.file, source.line + shift, source.column, index))


def parse_piece(
    cut_: _Cut, max_values: int, aliases: yamlsource.AliasBudget
) -> tuple[list[Document], _OffsetLocator]:
    """The document of one cut, positioned in the whole file; raises YamlError (the caller then
    loads the whole text, so the error is reported as the whole file's)."""
    documents = yamlsource.parse_documents(cut_.text, max_values=max_values, aliases=aliases)
    if len(documents) > 1:
        raise YamlError("more than one document in a piece")
    placed = [
        Document(index=cut_.index, line=d.line + cut_.line - 1, column=d.column, data=d.data) for d in documents
    ]
    return placed, _OffsetLocator(cut_.text, cut_.line, cut_.index)


def by_digest(pieces: Sequence[Piece]) -> dict[bytes, Piece]:
    """The previous pieces by their text's digest (the first, for text repeated in a file)."""
    out: dict[bytes, Piece] = {}
    for piece in pieces:
        out.setdefault(piece.digest, piece)
    return out
