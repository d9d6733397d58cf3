"""The parse of each config file kept across restarts, in the state directory, keyed on its text.

Start-up at 10,000 files spends about half its CPU building documents from libyaml's events.
Most files are the same as at the last start, so `meshctl serve --state-dir` keeps what each
file's parse gave (its documents: index, line, column and data, exactly what `parse_documents`
returns) in `STATE_FILE`, keyed on a digest of the file's text, and a file whose text has an
entry is not parsed again. Field positions are not kept: they come from the text, which is read
anyway, and only when there is a finding (`positions.Positions`).

The file is plain data, never code: one JSON header line, then one line per text, `KEY JSON`.
JSON gives back exactly the values a parse gives (str, int, float with inf and nan, bool,
None, lists, mappings in their order) except mappings with keys other than strings
(`80: http`): a file whose documents hold one is not kept, and is parsed at every start.

What is read is not trusted further than that. Whoever can write the state directory can
already replace the CA's key, so an entry that lies about a text is not what the checks are
for; a cache that cannot be used must cost a parse, never a wrong or a stuck server:

- the file is read only if it is a regular file (not a link, FIFO or device), opened
  non-blocking, and no bigger than `MAX_BYTES`;
- a header of another format, meshctl version, parser version or parse bounds (`identity`)
  makes the whole file stale;
- an entry is decoded when its text is met, and must have the shape and bounds of a parse
  (documents in order, positions, nesting up to `MAX_DEPTH`, values up to the document limit);
  one that does not makes the rest of the file ignored too;
and each of these is said once, as a warning, and the files are parsed.

The file is rewritten (a temporary file renamed over it, on a thread of its own, so no reload
waits for it) after a full pass over the tree that parsed something or left an entry unused:
it then holds the entries of the files in the tree, and nothing else, up to `MAX_BYTES`.
`meshctl validate` and the other one-shot commands do not use it: they have no state
directory, and a run in CI starts from a fresh checkout anyway.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from meshctl import __version__
from meshctl.config import flowquotes, yamlsource
from meshctl.config.files import read_bounded
from meshctl.config.yamlsource import MAX_DEPTH, Document

logger = logging.getLogger("meshctl.config.parse_cache")

#: The file's name in the state directory.
STATE_FILE: Final = "parse-cache.jsonl"
#: The file's size limit, read or written: some 7 times a tree of 10,000 services' 10 MB.
MAX_BYTES: Final = 64 * 1024 * 1024
_FORMAT: Final = "meshctl-parse-cache/1"
_KEY_CHARS: Final = 32  # hex digits of a 16-byte digest
_OPEN: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
#: Not through a link, and not waiting for a reader should a FIFO be put where the file goes.
_WRITE: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
#: How long stopping waits for a rewrite in progress (the rename makes one cut short harmless).
JOIN_TIMEOUT: Final = 10.0


class _Unusable(Exception):
    """Why the cache file, or an entry of it, is not used."""


def identity(max_values: int, max_alias_values: int) -> str:
    """What the entries depend on besides a file's text: meshctl's version, the code that
    parses (its source, so that a build with another parser never reads old entries), libyaml's
    and ruamel's versions, and the bounds a parse was held to."""
    digest = hashlib.blake2b(digest_size=8)
    for module in (yamlsource, flowquotes):
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:  # no source at hand (a frozen build): its version stands for it
            digest.update(module.__name__.encode())
    clib = sys.modules[yamlsource._CParser.__module__]
    from ruamel.yaml import __version__ as ruamel_version

    parts = (__version__, digest.hexdigest(), clib.get_version_string(), ruamel_version)
    bounds = (max_values, max_alias_values, MAX_DEPTH, yamlsource.DEFAULT_MAX_DOCUMENTS)
    return " ".join(map(str, (*parts, *bounds)))


def text_key(text: str) -> str:
    """The key of a file's text: a digest of its UTF-8 (as decoded, so a byte-order mark or not
    gives one entry)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class ParseCache:
    """Documents of texts parsed before, read from `path` once, and what this process parsed
    since, written back after a full pass (see the module doc). Used by the watcher's reload
    thread; only the writing runs on a thread of its own."""

    def __init__(self, path: Path, *, max_values: int, max_alias_values: int, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self._identity = identity(max_values, max_alias_values)
        self._max_values = max_values
        self._max_bytes = max_bytes
        #: Entries read from the file (their JSON), until the first pass is over.
        self._stored: dict[str, str] | None = None
        #: Entries of texts parsed by this process, not written yet.
        self._fresh: dict[str, str] = {}
        #: The key of each file's text, as last loaded.
        self._keys: dict[str, str] = {}
        self._written: frozenset[str] = frozenset()  # the keys the file holds
        self._warned = False
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()  # guards the file's writing
        #: Texts given back from the file, and texts parsed, since the start (for tests and logs).
        self.hits = self.parses = 0

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    def text_key(text: str) -> str:
        """`text_key`, for the loader, which knows this module only by its objects."""
        return text_key(text)

    def documents(self, file: str, text: str, parse: Callable[[], list[Document]]) -> list[Document]:
        """What `parse()` gives for `file`'s `text`: from the cache when it holds the text,
        else parsed (and kept for the next start). A parse error propagates, and is not kept."""
        key = text_key(text)
        found = self.lookup(file, key)
        if found is not None:
            return found
        docs = parse()
        self.record(key, docs)
        return docs

    def lookup(self, file: str, key: str) -> list[Document] | None:
        """The documents of the text of `key` (the text of `file` now), if the cache holds them."""
        self._keys[file] = key
        stored = self._read() if self._stored is None else self._stored
        body = stored.get(key)
        if body is None:
            return None
        try:
            docs = _decode(body, self._max_values)
        except _Unusable as exc:
            self._give_up(f"an entry is unusable ({exc})")
            return None
        self.hits += 1
        return docs

    def record(self, key: str, docs: list[Document]) -> None:
        """Keep the documents a parse gave for the text of `key`, if JSON gives them back."""
        self.parses += 1
        body = _encode(docs)
        if body is not None and key not in self._written:
            self._fresh[key] = body

    def _read(self) -> dict[str, str]:
        self._stored = {}
        try:
            self._stored = _read_entries(self.path, self._max_bytes, self._identity)
        except FileNotFoundError:
            pass
        except _Unusable as exc:
            self._give_up(str(exc))
        except OSError as exc:
            self._give_up(f"cannot read it: {exc.strerror or exc}")
        self._written = frozenset(self._stored)
        return self._stored

    def _give_up(self, why: str) -> None:
        """Use nothing more from the file; say why once."""
        self._stored = {}
        self._written = frozenset()
        if not self._warned:
            logger.warning("ignoring the parse cache %s: %s; the config files are parsed", self.path, why)
        self._warned = True

    # -- writing -----------------------------------------------------------------------------

    def settle(self, files: Iterable[str]) -> None:
        """A full pass over the tree is over and `files` are its files: rewrite the cache with
        their entries (on a thread of its own) when it parsed something new or the file holds
        entries of other texts; drop what was read of the file."""
        self._stored = {}
        self._keys = {f: self._keys[f] for f in files if f in self._keys}
        keys = set(self._keys.values())
        fresh = {k: b for k, b in self._fresh.items() if k in keys}
        self._fresh = {}
        wanted = frozenset(keys & (self._written | fresh.keys()))
        if wanted == self._written:
            return
        self._written = wanted
        self.join()
        self._writer = threading.Thread(target=self._write, args=(wanted, fresh), name="meshctl-parse-cache")
        self._writer.daemon = True  # the rename makes a write cut short harmless
        self._writer.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for a rewrite in progress (stopping the watcher does)."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)

    def _write(self, keys: frozenset[str], fresh: dict[str, str]) -> None:
        """Write the entries of `keys`, from `fresh` or else from the file as it is, to a
        temporary file beside it, renamed over it: a reader finds the old file or the new one,
        never half of one."""
        try:
            old = _read_entries(self.path, self._max_bytes, self._identity)
        except (OSError, _Unusable):
            old = {}
        lines: list[str] = []
        size = 200  # the header's, at most
        for key in sorted(keys):
            body = fresh.get(key) or old.get(key)
            if body is None:
                continue
            size += _KEY_CHARS + len(body) + 2
            if size > self._max_bytes:
                break
            lines.append(f"{key} {body}")
        fields = {"format": _FORMAT, "identity": self._identity, "entries": len(lines)}
        header = json.dumps(fields, separators=(",", ":"))
        data = ("\n".join([header, *lines]) + "\n").encode("ascii")
        temp = self.path.with_name(f".{self.path.name}.tmp")
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(temp, _WRITE, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, self.path)
            except OSError as exc:  # said once, like a cache that cannot be read
                if not self._warned:
                    logger.warning("cannot write the parse cache %s: %s", self.path, exc.strerror or exc)
                self._warned = True


def _read_entries(path: Path, limit: int, identity_: str) -> dict[str, str]:
    """The entries of the cache file (their JSON, by key), or _Unusable saying why none can be used."""
    raw = _read_file(path, limit)
    try:
        lines = raw.decode("utf-8").split("\n")
        header = json.loads(lines[0])
    except (ValueError, RecursionError):
        raise _Unusable("it does not start with this format's header") from None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise _Unusable("it does not start with this format's header")
    if header.get("identity") != identity_:
        raise _Unusable("it was written by another version of meshctl or of its YAML parser")
    if lines[-1] or header.get("entries") != len(lines) - 2:
        raise _Unusable("it is cut short, or has lines added")
    entries: dict[str, str] = {}
    for line in lines[1:-1]:
        key, body = line[:_KEY_CHARS], line[_KEY_CHARS + 1 :]
        if line[_KEY_CHARS : _KEY_CHARS + 1] != " " or not _is_key(key):
            raise _Unusable("a line of it is not an entry")
        entries[key] = body
    return entries


def _is_key(key: str) -> bool:
    return len(key) == _KEY_CHARS and all(c in "0123456789abcdef" for c in key)


def _read_file(path: Path, limit: int) -> bytes:
    """The cache file's bytes: only a regular file, not through a link, never more than `limit`."""
    try:
        fd = os.open(path, _OPEN)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name is a symbolic link
            raise _Unusable("it is a symbolic link") from None
        raise
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _Unusable("it is not a regular file")
        if opened.st_size > limit:
            raise _Unusable(f"it is over {limit} bytes")
        try:
            return read_bounded(lambda n: os.read(fd, n), limit, opened.st_size)
        except ValueError as exc:  # ConfigError is a ValueError: over the limit after all
            raise _Unusable(f"it is over {limit} bytes") from exc
    finally:
        os.close(fd)


_CONTAINERS: Final = (dict, list)


def _encode(docs: list[Document]) -> str | None:
    """The documents as one line of JSON, or None when JSON would not give them back exactly
    (a mapping key that is not a string)."""
    for doc in docs:
        if _walk(doc.data, sys.maxsize, keys_are_text=True) is None:
            return None
    rows = [[d.index, d.line, d.column, d.data] for d in docs]
    return json.dumps(rows, separators=(",", ":"), check_circular=False)


def _decode(body: str, max_values: int) -> list[Document]:
    """An entry's documents, checked to be what a parse could have given."""
    try:
        rows = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _Unusable("not JSON, or nested too deeply") from exc
    if type(rows) is not list or len(rows) > yamlsource.DEFAULT_MAX_DOCUMENTS:
        raise _Unusable("not a list of documents")
    docs: list[Document] = []
    last = -1
    for row in rows:
        if type(row) is not list or len(row) != 4:
            raise _Unusable("a document is not [index, line, column, data]")
        index, line, column, data = row
        if not all(type(n) is int for n in (index, line, column)) or not (index > last and line > 0 and column > 0):
            raise _Unusable("a document's index or position is out of order")
        if data is None or _walk(data, max_values, keys_are_text=False) is None:
            raise _Unusable("a document is nested or sized beyond what a parse allows")
        last = index
        docs.append(Document(index=index, line=line, column=column, data=data))
    return docs


def _walk(data: Any, max_values: int, *, keys_are_text: bool) -> int | None:
    """How many values `data` holds, or None when it nests deeper than a parse allows, holds
    more than `max_values` values, or (with `keys_are_text`) a mapping key that is no string."""
    count = 1
    stack: list[tuple[Any, int]] = [(data, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        kind = type(value)
        if kind is dict:
            if keys_are_text and not all(type(k) is str for k in value):
                return None
            items = value.values()
        elif kind is list:
            items = value
        else:
            continue
        if depth > MAX_DEPTH:
            return None
        count += len(items)
        if count > max_values:
            return None
        for item in items:
            if type(item) in _CONTAINERS:
                push((item, depth + 1))
    return count
