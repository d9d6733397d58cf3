"""Reading config files and walking config trees without trusting what is on disk.

A config directory is input like any other, and what a name ending in `.yaml` leads to is not
always a file: a FIFO (reading it waits for a writer, forever), a link to /dev/zero (endless, with
a size of 0), a file in /proc (a size of 0, and content anyway), or links that lead back into the
tree (`a -> .` and `b -> .` make a walk that follows links visit 2^depth copies of it). The rules,
shared by `meshctl validate` (the loader) and `meshctl serve` (the watcher), so neither can be made
to block, loop or fill memory by what a directory holds:

- only regular files are read: a path that does not lead to one is refused before it is opened
  (opening a device can do things: a tape rewinds), and the opened file is checked again, since
  something else may have been renamed into place meanwhile; it is opened non-blocking, so even
  a FIFO swapped in at that moment cannot hold the reader up;
- the size limit holds on the bytes actually read: at most the limit plus one byte is read,
  whatever the file's size says;
- a walk enters each directory (device, inode) once, so a tree is walked in time linear in its
  size; a directory reached a second time (by a symlink, or a bind mount) is skipped with a
  warning naming it;
- a link to a directory is followed only when it leads inside the tree being walked (`team ->
  teams/a`, a ConfigMap's `..data`): one that leads out of it (`usr -> /usr`, a home directory)
  is not walked, with a warning naming where it leads, since every reload would walk it again
  and what it holds is not this tree's to serve; give such a directory as a config directory of
  its own. A link to a file is followed wherever it leads: it is one file, read under the same
  rules as any other. This is the line `kubectl apply -R` and Istio's file source draw more
  strictly (they follow no link to a directory at all).

A file that cannot be used raises `ConfigError` with the message for its finding; an I/O error
stays an `OSError`, since it may pass (a permission fixed, a file put back).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from meshctl.config import yamlsource
from meshctl.config.findings import Finding, Severity
from meshctl.config.ignore import IGNORE_FILE, IGNORE_LIMIT, Rule, ignored_by, parse_rules
from meshctl.errors import ConfigError

YAML_SUFFIXES: Final = (".yaml", ".yml")

#: What a file's stat says about its content: (inode, device, size, mtime, ctime), times in ns.
Signature = tuple[int, int, int, int, int]

#: Non-blocking, so that opening a FIFO returns at once; no controlling terminal from a tty.
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: Reads after the first (which asks for the whole file as its size says) take this much at a time.
_CHUNK: Final = 256 * 1024

_NOT_REGULAR: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def signature(st: os.stat_result) -> Signature:
    """The parts of a stat that change when a file's content does; ctime is among them because
    it catches a rewrite that restored the mtime (`cp -p`, tar)."""
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class FileBytes:
    """A file's bytes, with its stat just before and just after they were read."""

    data: bytes
    before: Signature
    after: Signature

    @property
    def changing(self) -> bool:
        """True when a writer was at work while the bytes were read: they may be half of a save."""
        return self.before != self.after


def read_config_file(path: str | os.PathLike[str], limit: int) -> FileBytes:
    """The bytes of the regular file `path` leads to (links are followed), at most `limit`.

    Raises ConfigError when it is not a regular file or is over the limit, OSError when it
    cannot be read; never blocks on what the file is."""
    _check_regular(os.stat(path))  # before opening, which has effects on some devices
    fd = os.open(path, _OPEN_FLAGS)
    try:
        opened = os.fstat(fd)
        _check_regular(opened)  # what was opened may not be what was stat'ed
        yamlsource.check_size(opened.st_size, limit)  # says how big, when the size is known to be true
        data = read_bounded(lambda n: os.read(fd, n), limit, opened.st_size)
        return FileBytes(data, signature(opened), signature(os.fstat(fd)))
    finally:
        os.close(fd)


def read_bounded(read: Callable[[int], bytes], limit: int, size_hint: int = 0) -> bytes:
    """Everything `read` gives until it returns nothing, refused once more than `limit` bytes
    came: a size that says 0 (a device, /proc, a pipe) does not make it read without end."""
    budget = limit + 1
    chunks: list[bytes] = []
    total = 0
    # The size plus one: a file that is as big as it says is read in one call, and the next says EOF.
    want = size_hint + 1 if size_hint > 0 else _CHUNK
    while total < budget:
        chunk = read(min(want, budget - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        want = _CHUNK
    raise ConfigError(f"file is over the {limit}-byte limit for a config file")


def decode_text(raw: bytes) -> str:
    """A file's bytes as text (UTF-8, with or without a byte-order mark), or ConfigError."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"file is not UTF-8 text: {exc.reason}") from None


def _check_regular(st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    what = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), "not a file")
    raise ConfigError(f"not a regular file ({what}); only regular files are read")


@dataclass(slots=True)
class Walk:
    """What a walk found: YAML files in walk order, warnings about the tree, and the directories
    it did not enter because it had already been in them. Paths are kept as text (the watcher
    walks the tree on every change; a `Path` per file of ten thousand cost a tenth of a second).
    `directories` are those listed (each by the path it was walked under) and `links` the files
    that are symlinks: the watcher reads a file event's path alone only in a directory the walk
    listed, and looks at linked files again on every event, since what they lead to may change
    with no event about their own name."""

    paths: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [Path(p) for p in self.paths]


def walk_yaml(paths: Iterable[Path | str]) -> Walk:
    """YAML files under `paths` in a stable order: in each directory its files by name, then its
    subdirectories by name, each walked whole before the next. Hidden files and folders (.git,
    ..data) are skipped; links are followed, into each directory once. A path given as a file is
    taken whatever its suffix."""
    walk = Walk()
    for given in paths:
        path = str(Path(given))  # as `Path` spells it (`./mesh/` -> `mesh`), once per root
        if os.path.isdir(path):
            _walk_tree(path, walk)
        else:
            walk.paths.append(path)
    return walk


def _walk_tree(root: str, walk: Walk) -> None:
    try:
        st = os.stat(root)
    except OSError:
        return
    seen: dict[tuple[int, int], str] = {(st.st_dev, st.st_ino): root}
    inside = os.path.realpath(root)  # a root that is itself a link is walked where it leads
    stack: list[tuple[str, list[Rule]]] = [(root, [])]
    while stack:  # a stack, not recursion: depth is whatever the tree's is
        directory, inherited = stack.pop()
        rules = inherited + _ignore_rules(directory, walk)
        links = len(walk.links)
        listed = _list(directory, walk.links)
        if listed is None:
            continue  # as os.walk does: it adds nothing (the watcher then reads the files it knew there directly)
        files, subdirs = listed
        if rules:
            files, subdirs = _not_ignored(files, subdirs, rules, walk)
            kept = set(files)
            walk.links[links:] = [p for p in walk.links[links:] if p in kept]
        else:
            # Only where no ignore rule holds may a file event's path be read alone: elsewhere
            # whether it is read at all is the rules' to say, which only a walk applies.
            walk.directories.append(directory)
        walk.paths.extend(files)
        entered = _enter(directory, _within(subdirs, inside, walk), seen, walk)
        stack.extend((d, rules) for d in reversed(entered))


def _ignore_rules(directory: str, walk: Walk) -> list[Rule]:
    """The rules of `directory`'s `.meshctlignore` (`config/ignore.py`), read as any config file
    is; one that cannot be read ignores nothing, with a warning."""
    path = os.path.join(directory, IGNORE_FILE)
    if not os.path.lexists(path):
        return []
    try:
        text = decode_text(read_config_file(path, IGNORE_LIMIT).data)
    except (ConfigError, OSError) as e:
        walk.findings.append(Finding(Severity.WARNING, f"not used, nothing is ignored by it: {e}", path))
        return []
    rules, findings = parse_rules(directory, text)
    walk.findings.extend(findings)
    return rules


def _not_ignored(
    files: list[str], subdirs: list[os.DirEntry[str]], rules: list[Rule], walk: Walk
) -> tuple[list[str], list[os.DirEntry[str]]]:
    """`files` and `subdirs` without what `rules` ignore. Ignored paths are `skipped`, so the
    watcher neither reads a file it served before the rule came nor drops it as unreadable."""
    kept_files = [p for p in files if ignored_by(rules, p, is_dir=False) is None]
    kept_dirs = [e for e in subdirs if ignored_by(rules, e.path, is_dir=True) is None]
    kept = set(kept_files) | {e.path for e in kept_dirs}
    walk.skipped.extend(p for p in [*files, *(e.path for e in subdirs)] if p not in kept)
    return kept_files, kept_dirs


def _within(subdirs: list[os.DirEntry[str]], inside: str, walk: Walk) -> list[os.DirEntry[str]]:
    """`subdirs` without the links that lead out of the tree (`inside`, its real path); each
    of those is skipped with a warning."""
    kept: list[os.DirEntry[str]] = []
    for entry in subdirs:
        if _is_link(entry):
            target = os.path.realpath(entry.path)
            if target != inside and not target.startswith(inside.rstrip(os.sep) + os.sep):
                walk.skipped.append(entry.path)
                message = (
                    f"not read: a link to {target}, a directory outside {inside}; give it as a config"
                    " directory of its own, or link the files it should serve"
                )
                walk.findings.append(Finding(Severity.WARNING, message, entry.path))
                continue
        kept.append(entry)
    return kept


def _list(directory: str, links: list[str]) -> tuple[list[str], list[os.DirEntry[str]]] | None:
    """A directory's YAML files and its subdirectories (links to directories too), by name; the
    files that are links are added to `links` too. None when it cannot be listed."""
    try:
        with os.scandir(directory) as entries:
            visible = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError:
        return None
    files: list[str] = []
    subdirs: list[os.DirEntry[str]] = []
    for entry in visible:
        if _is_dir(entry):
            subdirs.append(entry)
        elif entry.name.endswith(YAML_SUFFIXES):
            files.append(entry.path)
            if _is_link(entry):
                links.append(entry.path)
    return files, subdirs


def _enter(directory: str, subdirs: list[os.DirEntry[str]], seen: dict[tuple[int, int], str], walk: Walk) -> list[str]:
    """The subdirectories to walk, by name: those not walked (or queued) already. A directory is
    claimed by its real entry before links to it in the same directory, so `alias -> team` next
    to `team` reads `team`; otherwise the first reached (the shallowest) wins."""
    entered: set[str] = set()
    for entry in sorted(subdirs, key=_is_link):  # real directories first; sorted() keeps name order
        try:
            st = entry.stat()
        except OSError:
            continue  # gone, or a link that broke meanwhile
        path = entry.path
        first = seen.setdefault((st.st_dev, st.st_ino), path)
        if first is path:
            entered.add(entry.name)
            continue
        walk.skipped.append(path)
        message = f"not read again: it leads to {first}, already read"
        walk.findings.append(Finding(Severity.WARNING, message, path))
    return [e.path for e in subdirs if e.name in entered]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows links, as os.walk(followlinks=True) did
    except OSError:
        return False


def _is_link(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink()
    except OSError:
        return True
