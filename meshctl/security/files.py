"""Writing key and certificate files so that no reader ever sees half of one.

A file is written whole under a temporary name in its own directory, with its final mode from the
moment it exists (a key is never readable by others, not even while being written), flushed to
disk, and only then given its name: `os.replace` when an existing file may be replaced, `os.link`
when it may not (the link fails if the name exists, so of two writers the first wins and nothing
it wrote is overwritten). A crash leaves at most a stray temporary file, never a truncated key.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

#: A private key: read and written by its owner only.
PRIVATE_MODE = 0o600
#: A certificate: public by nature.
PUBLIC_MODE = 0o644


def write_atomically(path: Path, data: bytes, *, mode: int, replace: bool = True) -> None:
    """Give `path` the contents `data` in one step (see the module's docstring). With
    `replace=False` an existing `path` raises FileExistsError and is left as it was."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make the new name durable too: a rename is only on disk once its directory is."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
