"""The exceptions meshctl raises, in one tree.

    MeshctlError
    ├── ConfigError            input that cannot be turned into config (reported as findings)
    │   └── YamlError          a file that is not YAML we accept (syntax, duplicate key, bomb, size)
    ├── RegistryError          a service registry that cannot be read (Consul down, bad answer)
    ├── CredentialError        a certificate, key, CA or token file that cannot be used
    ├── NodeIdError            an Envoy node id that is not Istio's TYPE~IP~NAME.NAMESPACE~DOMAIN
    ├── SubscriptionLimitError a stream asking the server to hold more names than it allows
    ├── BindingError           an attested node that no longer binds to the workload it proved
    ├── UsageError             a command given flags, files or addresses it cannot work with
    │   └── RefusedError       a running server that understood an operator's action and said no
    └── OfflineError           a config tree an offline command (dump, diff) cannot build a snapshot from

Bad input is normally reported as a `Finding` and never raised past the loader; these exceptions
exist for the places where a caller must stop, and each carries enough to say what and where.

A command never turns one of these into an exit status itself: it raises, and the CLI's one edge
(`meshctl.cli.exits`) prints the message as one `error:` line on stderr and exits 2. Exit 1 is
kept for an answer ("invalid", "something changes"), which is never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence


class MeshctlError(Exception):
    """Base of every error meshctl raises on purpose."""


class ConfigError(MeshctlError):
    """Input that cannot be turned into config."""


class YamlError(ConfigError):
    """A file that is not YAML we accept; `line` and `column` are 1-based, 0 when unknown."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class RegistryError(MeshctlError):
    """A service registry that cannot be read."""


class CredentialError(MeshctlError):
    """A certificate, key, CA or token file that cannot be used; the message names the file."""


class NodeIdError(MeshctlError):
    """An Envoy node id that is not Istio's `TYPE~IP~NAME.NAMESPACE~DOMAIN` (or bad metadata)."""


class SubscriptionLimitError(MeshctlError):
    """A stream whose request would make the server hold more names of one type than it allows
    (`subscription.MAX_NAMES`): the request is not applied, and the stream should end."""

    def __init__(self, message: str, *, type_url: str, limit: int) -> None:
        super().__init__(message)
        self.type_url = type_url
        self.limit = limit


class BindingError(MeshctlError):
    """An attested node whose workload, in a new snapshot, is not the one its certificate proved
    (deleted, or running as another service account): its stream ends, never re-bound."""


class UsageError(MeshctlError):
    """A command given flags, files or addresses it cannot work with: a malformed address, flags
    that need each other, a missing path, a server that is not there to ask."""


class RefusedError(UsageError):
    """A running server understood an operator's action and refused it (HTTP 409): nothing to
    promote, a version it cannot roll back to. The command catches it and answers no (exit 1)."""


class OfflineError(MeshctlError):
    """A config tree an offline command (`dump`, `diff`) cannot build a snapshot from, or a proxy
    it does not describe. An offline command refuses broken input rather than show output built
    from part of it, so `findings` carries what is wrong with the files, printed before the message."""

    def __init__(self, message: str, findings: Sequence[object] = ()) -> None:
        # The findings are `meshctl.config.findings.Finding`s; this module, at the ground floor of
        # the package, names no other module of it.
        super().__init__(message)
        self.message = message
        self.findings = tuple(findings)
