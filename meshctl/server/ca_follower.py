"""Following a plug-in CA directory while serving: the CA is replaced without a restart.

A CA is rotated the way Istio's plug-in CA is (docs/vm-setup.md, "Rotating the CA"): the operator
changes the files of `--ca-dir` (Istio's `cacerts` layout) in steps, and the server follows each
step as it lands:

- `root-cert.pem` may hold several roots: every one is sent to the proxies in `ROOTCA`, so a
  fleet trusts the old root and the new one while it moves from one to the other;
- a new `ca-cert.pem`/`ca-key.pem` (an intermediate of the same root, or of the new one) signs
  every certificate issued from then on, and the workload certificates the old one signed are
  reissued at random times over a window (`WorkloadSecrets.follow_ca`), so a fleet moves without
  a burst of signatures and pushes;
- the old root leaves `root-cert.pem` last, once nothing it signed is in use.

`CaHolder` is the one place the CA in force lives: the workload secrets, the certificate service
and the status pages read it at each use, so a swap is one assignment, seen whole by each reader.

The directory is looked at once a second (four `stat`s), as the MeshConfig file is: a change is
loaded with every check `--ca-dir` passes at start (`meshctl.security.cacerts`). Files are
written one at a time, so a load can see a step half-done (a new certificate beside the old key):
it fails, the CA in force stays, and the next change, the step completed, is loaded. A directory
that stays unusable is an error in the log, once per state of its files.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from meshctl.errors import CredentialError
from meshctl.security.ca import CertificateAuthority
from meshctl.security.cacerts import CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT

logger = logging.getLogger("meshctl.server")

_FILES = (CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN)
_Stamp = tuple[tuple[int, int, int] | None, ...]


class CaHolder:
    """The CA in force. `current` is replaced whole by `swap`; readers take it at each use."""

    __slots__ = ("current", "swaps")

    def __init__(self, ca: CertificateAuthority) -> None:
        self.current = ca
        #: How many times the CA was replaced since start (for /metrics and tests).
        self.swaps = 0

    def swap(self, ca: CertificateAuthority) -> CertificateAuthority:
        """Put `ca` in force; returns the CA it replaces."""
        before, self.current = self.current, ca
        self.swaps += 1
        return before


def _stamp(directory: Path) -> _Stamp:
    """What changes when any file of the directory is replaced or rewritten (symlinks followed:
    systemd credentials and Kubernetes-style `..data` links swap targets)."""
    stamps: list[tuple[int, int, int] | None] = []
    for name in _FILES:
        try:
            s = os.stat(directory / name)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((s.st_ino, s.st_mtime_ns, s.st_size))
    return tuple(stamps)


class CaDirFollower:
    """Loads `directory` again when its files change, and puts the CA in `holder` when it differs
    from the one in force; `on_swap(before, after)` is called after each swap."""

    def __init__(
        self,
        directory: Path,
        holder: CaHolder,
        on_swap: Callable[[CertificateAuthority, CertificateAuthority], None],
    ) -> None:
        self._directory = directory
        self._holder = holder
        self._on_swap = on_swap
        self._stamp = _stamp(directory)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Look once a second from now on (in the running event loop), until `stop`."""
        self._timer = asyncio.get_running_loop().call_later(1.0, self._run)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        try:
            self.check()
        except Exception:  # a follower that stops looking would leave the CA as it is, silently
            logger.exception("following --ca-dir failed; looking again in a second")
        self._timer = asyncio.get_running_loop().call_later(1.0, self._run)

    def check(self, now: datetime | None = None) -> bool:
        """Look at the files once; True when a new CA was put in force."""
        stamp = _stamp(self._directory)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            ca = CertificateAuthority.from_ca_dir(self._directory, now=now or datetime.now(UTC))
        except CredentialError as exc:
            logger.error("--ca-dir changed but cannot be used, the CA in force stays: %s", exc)
            return False
        before = self._holder.current
        if ca.certificate == before.certificate and ca.root_pem == before.root_pem:
            return False
        self._say(before, ca)
        self._holder.swap(ca)
        self._on_swap(before, ca)
        return True

    @staticmethod
    def _say(before: CertificateAuthority, after: CertificateAuthority) -> None:
        """Log what the change does, and warn of a step taken too early."""
        old_roots, new_roots = set(before.root_fingerprints), set(after.root_fingerprints)
        added, removed = sorted(new_roots - old_roots), sorted(old_roots - new_roots)
        if added or removed:
            logger.info(
                "trust bundle changed: %d root(s) now%s%s; every proxy is sent it now",
                len(new_roots),
                f", added {', '.join(added)}" if added else "",
                f", removed {', '.join(removed)}" if removed else "",
            )
        if after.certificate != before.certificate:
            logger.info(
                "the CA now signs with %s; workload certificates signed before are reissued",
                after.certificate.subject.rfc4514_string() or "(no subject)",
            )
            signing_root = after.signing_root_fingerprint
            if signing_root not in old_roots:
                logger.warning(
                    "the new signing certificate chains to root %s, which proxies did not trust until now: "
                    "some may refuse its certificates until they have the new bundle (add a new root to "
                    "root-cert.pem first, wait for every proxy, then switch the signing certificate)",
                    signing_root,
                )
