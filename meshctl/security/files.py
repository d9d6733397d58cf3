"""Reading credential files as untrusted input, and writing them so that no reader ever sees half of one.

Reading: a key, certificate or token file is read with the config directory's rules
(`meshctl.config.files`): only a regular file (a FIFO would hang start-up, a link to /dev/zero
would be read without end), opened non-blocking, and at most `CREDENTIAL_LIMIT` bytes of it.

Writing: a file is written whole under a temporary name in its own directory, with its final mode from the
moment it exists (a key is never readable by others, not even while being written), flushed to
disk, and only then given its name: `os.replace` when an existing file may be replaced, `os.link`
when it may not (the link fails if the name exists, so of two writers the first wins and nothing
it wrote is overwritten). A crash leaves at most a stray temporary file, never a truncated key.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from meshctl.config.files import read_bounded
from meshctl.errors import ConfigError, CredentialError

#: A private key: read and written by its owner only.
PRIVATE_MODE = 0o600
#: A certificate: public by nature.
PUBLIC_MODE = 0o644
#: The most read of a credential file: a bundle of a hundred certificates is some 200 KB.
CREDENTIAL_LIMIT: Final = 1024 * 1024
#: Non-blocking, so that opening a FIFO returns at once; no controlling terminal from a tty.
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def read_credential(path: Path, limit: int = CREDENTIAL_LIMIT) -> bytes:
    """The bytes of the regular file `path` leads to, at most `limit`. Raises CredentialError,
    naming the file, for anything else (a FIFO, a device, a directory, too big); OSError when it
    cannot be read (missing, no permission), for the caller's own words."""
    _check_regular(path, os.stat(path))  # before opening, which has effects on some devices
    fd = os.open(path, _OPEN_FLAGS)
    try:
        opened = os.fstat(fd)
        _check_regular(path, opened)  # what was opened may not be what was stat'ed
        try:
            return read_bounded(lambda n: os.read(fd, n), limit, opened.st_size)
        except ConfigError:
            raise CredentialError(f"{path}: over {limit} bytes, more than any key or certificate file") from None
    finally:
        os.close(fd)


def group_or_world_readable(path: Path) -> int | None:
    """The permission bits of `path` when its group or others may read it, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return stat.S_IMODE(mode) if mode & 0o044 else None


def _check_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        mode = st.st_mode
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
        raise CredentialError(f"{path}: not a regular file ({what}); only regular files are read")


def write_atomically(path: Path, data: bytes, *, mode: int, replace: bool = True, group: int | None = None) -> None:
    """Give `path` the contents `data` in one step (see the module's docstring). With
    `replace=False` an existing `path` raises FileExistsError and is left as it was. `group`
    (a gid) owns the file from before it has its name, for a reader in that group."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        if group is not None:
            os.fchown(fd, -1, group)
            os.fchmod(fd, mode)  # the umask may have taken group bits away
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
