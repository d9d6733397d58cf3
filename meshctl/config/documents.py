"""A changed file loaded again document by document: what did not change costs next to nothing.

One file often holds hundreds or thousands of resources (a catalog of ServiceEntries), and an edit
changes one of them. Parsing and validating the whole file again cost 0.85 s for 10,000 entries,
and gave every resource a new object, so everything downstream treated them as new. Here the file
is cut at its document markers (`---` at the start of a line, which ends any scalar or collection
YAML can be in; inside a quoted scalar it is an error), and only new or changed documents are
parsed and validated; the others keep their resources (the very same objects when they did not
move) and their findings.

The last load's text is kept with its pieces, so the new text is compared with it first: the
pieces that lie in the text both share at the start are kept as they are, those in the text both
share at the end are kept and, where lines came or went before them, moved; only the text between
is cut and hashed, and each of its pieces is looked up among the pieces the old text had there (a
document moved within that stretch is not parsed again). An edit then costs the edited stretch,
not a pass over every document of the file.

The result is the one `loader.load_text` gives for the whole text. Where the cut would not be
exact, the whole text is loaded instead, as it always was: a directive (`%` at a line start), a
line break that is not "\\n" or "\\r\\n" (libyaml also breaks lines at a lone "\\r", NEL, LS and PS,
which would move every line after it), a piece that libyaml does not read as exactly one
document (text before the first marker may hold none), and a piece that does not parse (the
whole load says where, as it always did). Anchors do not cross documents; the file's budget of
values added by aliases does, so each piece remembers what its aliases added.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

from meshctl.config import positions, yamlsource
from meshctl.config.findings import FieldPath, Finding
from meshctl.config.model import Config, Source
from meshctl.config.yamlsource import Document
from meshctl.errors import YamlError

_MARKER: Final = b"---"
#: What may follow `---` on its line for it to start a document: the line's end ("\n", or the
#: "\r" of "\r\n"), the file's end, or a space or tab before more.
_LINE_GOES_ON: Final = (b"", b"\n", b"\r", b" ", b"\t")
#: Line breaks libyaml knows besides "\n" and "\r\n", in UTF-8: NEL, LS, PS.
_OTHER_BREAKS: Final = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")


@dataclass(frozen=True, slots=True)
class Piece:
    """One document's text as a previous load saw it, and what it gave there."""

    digest: bytes
    #: The 1-based line its text starts on, and the index of the YAML document it is.
    line: int
    index: int
    configs: tuple[Config, ...]
    findings: tuple[Finding, ...]
    #: Documents libyaml read in it: 1, or 0 for text before the first marker that holds none.
    documents: int = 1
    #: Values its aliases added, charged to the file's budget when it is kept (None: not known,
    #: for a document an earlier run parsed with aliases in it; such a piece is not kept).
    aliases: int | None = 0


@dataclass(frozen=True, slots=True)
class Pieces:
    """A file's text (encoded) as a load cut it, where each piece starts in it, and the pieces."""

    data: bytes
    starts: tuple[int, ...]
    pieces: tuple[Piece, ...]


class Cut:
    """One new or changed document of a file: where it starts (offset, line), the digest of its
    text, and the text itself, decoded only when asked for; `head` for the text before the first
    marker."""

    __slots__ = ("_data", "digest", "end", "head", "line", "start")

    def __init__(self, data: bytes, start: int, end: int, line: int, *, head: bool = False) -> None:
        self._data, self.start, self.end, self.line, self.head = data, start, end, line, head
        self.digest = hashlib.blake2b(data[start:end], digest_size=16).digest()

    @property
    def text(self) -> str:
        return self._data[self.start : self.end].decode("utf-8", "surrogatepass")

    def may_alias(self) -> bool:
        """Whether its text could hold an alias (`*name`)."""
        return self._data.find(b"*", self.start, self.end) >= 0


@dataclass(frozen=True, slots=True)
class Recut:
    """A new text against the pieces of the last: the pieces kept at the front (same place), the
    new stretch cut (`middle`, with the old pieces it replaces to look its pieces up in), and the
    pieces kept at the end (`tail`), moved to start at `tail_line` and by `byte_shift` bytes."""

    data: bytes
    front: Sequence[Piece]
    front_starts: Sequence[int]
    middle: list[Cut]
    replaced: Sequence[Piece]
    tail: Sequence[Piece]
    tail_starts: Sequence[int]
    #: Where the middle ends: the line it reaches, and the document index the tail had before.
    tail_line: int
    tail_index: int
    byte_shift: int

    @property
    def count(self) -> int:
        """Pieces of the new text."""
        return len(self.front) + len(self.middle) + len(self.tail)


def exact(data: bytes, *, at_start: bool = True) -> bool:
    """Whether cutting `data` at its markers gives the documents and lines libyaml reads (see
    the module); `at_start`: `data` starts the text (else a line starts in it only after a
    line break). Passes over the text in C only."""
    if (at_start and data.startswith(b"%")) or b"\n%" in data:
        return False  # a directive
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return False  # a lone "\r": a line break to libyaml
    return not any(b in data for b in _OTHER_BREAKS)


def recut(previous: Pieces | None, data: bytes) -> Recut | None:
    """The new text `data` against `previous` (None: all of it is new); None when cutting it at
    its markers would not be exact. Only the stretch that changed is looked at: the rest is
    the previous text, which was exact."""
    if previous is None or not previous.pieces:
        if not exact(data):
            return None
        return Recut(data, (), (), _cuts(data, 0, len(data), 1), (), (), (), 0, 0, 0)
    old, starts, pieces = previous.data, previous.starts, previous.pieces
    same_start = _common_prefix(old, data)
    same_end = _common_suffix(old, data, min(len(old), len(data)) - same_start)
    # Kept at the start: the pieces whose text and the marker after it lie in the shared start.
    k = max(bisect_right(starts, same_start - len(_MARKER) - 1) - 1, 0)
    # Kept at the end: the pieces whose marker and the line break before it lie in the shared end.
    j = max(bisect_left(starts, len(old) - same_end + 1), k)
    shift = len(data) - len(old)
    begin = starts[k]
    end = starts[j] + shift if j < len(starts) else len(data)
    # What a directive or a line break could be made of, where it could have come (the stretch
    # covers every byte that changed, and a few around it, for what ends or starts there).
    if not exact(data[max(begin - 3, 0) : end + 3], at_start=begin < 3):
        return None
    line = pieces[k].line
    middle = _cuts(data, begin, end, line)
    tail_line = line + data.count(b"\n", begin, end)
    tail_index = pieces[j].index if j < len(pieces) else 0
    return Recut(
        data, pieces[:k], starts[:k], middle, pieces[k:j], pieces[j:], starts[j:], tail_line, tail_index, shift
    )


def _cuts(data: bytes, begin: int, end: int, line: int) -> list[Cut]:
    """The pieces of `data[begin:end]`, which starts at a marker or at the text's start (then
    the text before the first marker is a piece of its own, if there is any) and ends at a
    marker or at the text's end. Counted and hashed as bytes: the markers are ASCII at a line's
    start, so they cut the encoded text where they cut the text."""
    if begin >= end:
        return []
    starts = [begin]
    found = list(_markers(data, begin, end))
    head = begin == 0 and not (found and found[0] == 0)
    starts += (i for i in found if i > begin)
    out: list[Cut] = []
    for start, stop in zip(starts, [*starts[1:], end], strict=True):
        out.append(Cut(data, start, stop, line, head=head and start == 0))
        line += data.count(b"\n", start, stop)
    return out


def _markers(data: bytes, begin: int, end: int) -> Iterator[int]:
    """The offsets in `data[begin:end]` of the lines that start a document (found by
    `bytes.find`: a regular expression anchored at line starts tries every character)."""
    if begin == 0 and data.startswith(_MARKER) and data[3:4] in _LINE_GOES_ON:
        yield 0
    needle = b"\n" + _MARKER
    at = data.find(needle, begin, end)
    while at >= 0:
        if data[at + 4 : at + 5] in _LINE_GOES_ON:
            yield at + 1
        at = data.find(needle, at + 1, end)


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the start `a` and `b` share: a binary search of memory comparisons (no
    copies), so a file appended to costs one comparison."""
    whole = memoryview(a)
    n = min(len(a), len(b))
    if b.startswith(whole[:n]):
        return n
    low, high = 0, n  # a's first `low` bytes start b; its first `high` do not
    while high - low > 1:
        mid = (low + high) // 2
        if b.startswith(whole[:mid]):
            low = mid
        else:
            high = mid
    return low


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """The length of the end `a` and `b` share, at most `limit` (what their shared start leaves)."""
    whole = memoryview(a)
    if limit <= 0:
        return 0
    if b.endswith(whole[len(a) - limit :]):
        return limit
    low, high = 0, limit
    while high - low > 1:
        mid = (low + high) // 2
        if b.endswith(whole[len(a) - mid :]):
            low = mid
        else:
            high = mid
    return low


class _OffsetLocator:
    """Field positions in one document's own text, as positions in the whole file."""

    def __init__(self, text: str, line: int, index: int) -> None:
        self._positions = positions.Positions(text)
        self._line, self._index = line, index

    def position(self, document: int, path: FieldPath) -> tuple[int, int]:
        line, column = self._positions.locate(document - self._index, path)
        return line + self._line - 1, column


def moved(piece: Piece, line: int, index: int) -> Piece:
    """`piece`, placed where its text now starts (itself, when it did not move)."""
    if (piece.line, piece.index) == (line, index):
        return piece
    shift = line - piece.line
    configs = tuple(_placed(c, shift, index) for c in piece.configs)
    findings = tuple(replace(f, line=f.line + shift) if f.line else f for f in piece.findings)
    return replace(piece, line=line, index=index, configs=configs, findings=findings)


def _placed(config: Config, shift: int, index: int) -> Config:
    source = config.source
    return config.with_source(Source(source.file, source.line + shift, source.column, index))


def parse_piece(
    cut: Cut, index: int, max_values: int, aliases: yamlsource.AliasBudget
) -> tuple[list[Document], int, int, _OffsetLocator]:
    """The document of one piece positioned in the whole file, how many documents libyaml read
    in it, and the values its aliases added. Raises YamlError when it does not parse, or holds
    other than one document (none is allowed for the text before the first marker): the caller
    then loads the whole text, so the file is judged as a whole load judges it."""
    left = aliases.left
    docs, count = yamlsource.parse_stream(cut.text, max_values=max_values, aliases=aliases)
    if count > 1 or (count == 0 and not cut.head):
        raise YamlError(f"{count} documents in a piece")
    placed = [Document(index=index, line=d.line + cut.line - 1, column=d.column, data=d.data) for d in docs]
    return placed, count, left - aliases.left, _OffsetLocator(cut.text, cut.line, index)


def by_digest(pieces: Sequence[Piece]) -> dict[bytes, Piece]:
    """The previous pieces by their text's digest (the first, for text repeated in a file)."""
    out: dict[bytes, Piece] = {}
    for piece in pieces:
        out.setdefault(piece.digest, piece)
    return out
