"""Paths as the directory watcher sees them: which events matter, where a file sorts in a walk,
and what a root, a directory or a file is right now. Plain functions of paths and stats, apart
from the watcher so that its module is about when and what to reload."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Final

from meshctl.config.files import YAML_SUFFIXES, Signature, signature

#: The symlink kubelet renames into place to update a ConfigMap or Secret volume.
_KUBERNETES_DATA_LINK: Final = "..data"


def is_relevant(path: str, roots: Sequence[str], *, is_directory: bool) -> bool:
    """Whether an event on `path` can change what a reload of `roots` reads."""
    for root in roots:
        if path == root:
            return True
        if not is_under(path, root):
            continue
        parts = path[len(root) :].strip(os.sep).split(os.sep)
        if parts[-1] == _KUBERNETES_DATA_LINK and not any(p.startswith(".") for p in parts[:-1]):
            return True
        if any(p.startswith(".") for p in parts):
            return False
        return is_directory or parts[-1].endswith(YAML_SUFFIXES)
    return False


def is_doubt(path: str, roots: Sequence[str], *, is_directory: bool) -> bool:
    """Whether an event on `path` (a relevant one) leaves which files the tree holds in doubt,
    so that only a walk of the whole tree can tell: a directory created, deleted, renamed or
    changed in its permissions, a root itself, or a ConfigMap's `..data` link swapped (which
    changes every file linked through it, with no event about them)."""
    return is_directory or path in roots or os.path.basename(path) == _KUBERNETES_DATA_LINK


def is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk_key(root: str, path: str) -> tuple[tuple[int, str], ...]:
    """The position `discover` gives a path: a directory's files (by name) before its
    subdirectories (by name), so kept files sort where a successful walk would put them."""
    parts = path[len(root) :].strip(os.sep).split(os.sep) if path != root else []
    return (*((1, d) for d in parts[:-1]), *((0, f) for f in parts[-1:]))


def root_problem(root: str) -> str | None:
    """Why a root cannot be read now, or None; a directory root must also be listable, since a
    walk that silently lists nothing would delete everything."""
    try:
        if stat.S_ISDIR(os.stat(root).st_mode):
            with os.scandir(root):
                pass
    except FileNotFoundError:
        return f"{root} does not exist"
    except OSError as exc:
        return f"cannot read {root}: {exc.strerror or exc}"
    return None


def dir_identity(path: str) -> tuple[int, int, str] | None:
    """(device, inode, real path) of a directory: a change means it was replaced or re-pointed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, os.path.realpath(path)) if stat.S_ISDIR(st.st_mode) else None


def stat_signature(path: str) -> Signature | None:
    try:
        return signature(os.stat(path))
    except OSError:
        return None


def exists(path: str) -> bool:
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # there but unreadable: loading it fails, which keeps its last good contents
    return True
