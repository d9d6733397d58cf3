"""Gateway credentials over SDS: the secrets `credentialName` names, served from `serve --credentials-dir`.

`CredentialDirectory` follows the directory as the MeshConfig file is followed: once a second it
stats the secret files (`DIR/NAMESPACE/NAME/{tls.crt,tls.key,ca.crt}`, see
`meshctl.security.credentials`), and re-reads a namespace whose files changed. A secret that
fails to read or check (a key that does not match its certificate: a rotation half-way, one file
replaced and not yet the other) keeps the contents last read well and the log names the file, so
a proxy is never sent a pair Envoy would refuse. Each namespace's secrets are one mapping, replaced
only when that namespace changes: streams of other namespaces are not woken.

`CredentialSecrets` sits between the workload secrets and the resource cache (a resolver, like
`WorkloadSecrets`): it tells generation whether the node may be sent credentials
(`ProxyNode.credentials`, so config never names a secret the proxy does not get) and adds the
secrets of the proxy's own namespace (Istio's rule) to what it may be sent. Who may: the rule for
workload keys (`server/secrets.py`): a proxy whose xDS connection proved its workload
(`attested`), or any proxy with `--insecure-send-keys`.

Key material stays out of the resource cache and the logs: a secret's bytes are held here and
added to a proxy's view at resolve time only.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from meshctl.config.files import Signature, signature
from meshctl.errors import CredentialError
from meshctl.security.credentials import (
    CA_FILES,
    CA_SUFFIX,
    CERT_FILES,
    KEY_FILES,
    KubeSecret,
    ca_resource,
    certificate_resource,
    gateway_resource,
    namespaces,
    read_secret,
    secret_names,
)
from meshctl.server.proxy_resources import ProxyResources, Resolved
from meshctl.server.secrets import NodeAs
from meshctl.snapshot.node import ProxyNode
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import mesh_tls, types
from meshctl.xds.resources import Resource, to_resource

logger = logging.getLogger("meshctl.server.credentials")

_EMPTY: Mapping[str, Resource] = MappingProxyType({})
_FILES = CERT_FILES + KEY_FILES + CA_FILES


def _stamps(directory: Path) -> tuple[tuple[str, Signature | None], ...]:
    out = []
    for name in _FILES:
        try:
            stamp: Signature | None = signature(os.stat(directory / name))
        except OSError:
            continue
        out.append((name, stamp))
    return tuple(out)


class CredentialDirectory:
    """The secrets of a credentials directory, as last read well (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: namespace -> {secret name -> stamps of its files}
        self._stamps: dict[str, dict[str, tuple[tuple[str, Signature | None], ...]]] = {}
        #: (namespace, secret name) -> what it held when last read well
        self._good: dict[tuple[str, str], KubeSecret] = {}
        #: namespace -> its SDS secrets by name
        self._secrets: dict[str, Mapping[str, Resource]] = {}
        #: namespace -> the same secrets as messages (for the debug dump, which redacts keys)
        self._messages: dict[str, tuple[secret_pb2.Secret, ...]] = {}
        self._missing = False
        self.check()

    def secrets(self, namespace: str) -> Mapping[str, Resource]:
        """The SDS secrets a proxy of `namespace` may be sent, by Istio's names."""
        return self._secrets.get(namespace, _EMPTY)

    def messages(self, namespace: str) -> tuple[secret_pb2.Secret, ...]:
        """The secrets of `namespace` as messages (for the debug dump, which redacts the keys)."""
        return self._messages.get(namespace, ())

    def names(self) -> dict[str, list[str]]:
        """The SDS names held, by namespace (for the debug pages and tests; no key material)."""
        return {ns: sorted(s) for ns, s in sorted(self._secrets.items())}

    def check(self) -> set[str]:
        """Stat the directory; re-read the namespaces whose files changed. Returns them. A root
        that is gone (a volume unmounted) keeps every secret as last read: a proxy is better off
        with them than with listeners waiting for secrets that never come."""
        if not self.root.is_dir():
            if not self._missing:
                logger.error("credentials directory %s is not there; keeping the secrets last read", self.root)
            self._missing = True
            return set()
        self._missing = False
        seen: dict[str, dict[str, tuple[tuple[str, Signature | None], ...]]] = {}
        for namespace in namespaces(self.root):
            directory = self.root / namespace
            seen[namespace] = {name: _stamps(directory / name) for name in secret_names(directory)}
        changed = {ns for ns in seen.keys() | self._stamps.keys() if seen.get(ns) != self._stamps.get(ns)}
        for namespace in changed:
            self._reload(namespace, seen.get(namespace, {}), self._stamps.get(namespace, {}))
        self._stamps = seen
        return changed

    def _reload(self, namespace: str, now: Mapping[str, Any], before: Mapping[str, Any]) -> None:
        for name in before.keys() - now.keys():
            self._good.pop((namespace, name), None)
        for name, stamps in now.items():
            if before.get(name) == stamps and (namespace, name) in self._good:
                continue
            try:
                self._good[(namespace, name)] = read_secret(self.root / namespace / name)
            except CredentialError as exc:
                kept = (namespace, name) in self._good
                logger.error(
                    "secret %s/%s: %s; %s", namespace, name, exc, "keeping it as last read" if kept else "not served"
                )
        messages: dict[str, secret_pb2.Secret] = {}
        held = sorted((n, s) for (ns, n), s in self._good.items() if ns == namespace)
        # Secrets named NAME-cacert go last: their bundle wins over NAME's own ca.crt (Istio's rule).
        for name, secret in sorted(held, key=lambda item: item[0].endswith(CA_SUFFIX)):
            # Each under Istio's two names: `kubernetes://NAME` and, for the Gateway API's
            # certificateRefs, `kubernetes-gateway://NAMESPACE/NAME`.
            for named in (name, gateway_resource(namespace, name)):
                if secret.cert is not None and secret.key is not None:
                    resource = certificate_resource(named)
                    messages[resource] = mesh_tls.tls_certificate_secret(resource, secret.cert, secret.key)
                if secret.ca is not None:
                    resource = ca_resource(named)
                    messages[resource] = mesh_tls.validation_secret(resource, secret.ca)
        secrets = MappingProxyType({n: to_resource(m, types.SECRET) for n, m in sorted(messages.items())})
        if secrets:
            self._secrets[namespace] = secrets
            self._messages[namespace] = tuple(m for _, m in sorted(messages.items()))
        else:
            self._secrets.pop(namespace, None)
            self._messages.pop(namespace, None)
        logger.info("credentials of namespace %s: %s", namespace, ", ".join(secrets) or "none")


Resolver = Callable[[ProxyNode, Any], Resolved]

#: Joined secret sets kept (`CredentialSecrets._join`): far more than namespaces times certificates.
_JOINED_KEPT = 4096


class CredentialSecrets:
    """Adds a proxy's namespace credentials to what `resolve` (the workload secrets) gives it;
    the servicer's `ConfigSource` (see the module docstring)."""

    def __init__(
        self, resolve: Resolver, directory: CredentialDirectory | None, *, send_keys_unauthenticated: bool = False
    ) -> None:
        self._resolve = resolve
        self.directory = directory
        self._unauthenticated = send_keys_unauthenticated
        self._lock = threading.Lock()
        self._node_as = NodeAs(lambda n: n.credentials, lambda n, v: replace(n, credentials=v))
        #: (id, id) of two secret sets -> them and their union; the two are held so ids stay theirs
        self._joined: dict[tuple[int, int], tuple[Mapping[str, Resource], ...]] = {}

    def may_send(self, node: ProxyNode) -> bool:
        return self.directory is not None and (node.attested or self._unauthenticated)

    def held(self, proxy: Proxy) -> tuple[secret_pb2.Secret, ...]:
        """The credentials `proxy` (as last resolved) is offered, for the debug dump."""
        if self.directory is None or not proxy.node.credentials:
            return ()
        return self.directory.messages(proxy.namespace)

    def resolve(self, node: ProxyNode, state: Any) -> Resolved:
        allowed = self.may_send(node)
        resolved = self._resolve(self._node_as.get(node, allowed), state)
        if not allowed:
            return resolved
        assert self.directory is not None
        secrets = self.directory.secrets(resolved.proxy.namespace)
        if not secrets:
            return resolved
        resources = resolved.resources
        by_type = dict(resources.by_type)
        by_type[types.SECRET] = self._join(resources.of(types.SECRET), secrets)
        return Resolved(
            resolved.proxy,
            ProxyResources(resources.snapshot_version, resources.config_version, MappingProxyType(by_type)),
        )

    def _join(self, first: Mapping[str, Resource], second: Mapping[str, Resource]) -> Mapping[str, Resource]:
        """`first` and `second` as one mapping, the same object for the same two: a stream is
        woken only when a set it is offered is a new object (`Connection.update`)."""
        if not first:
            return second
        key = (id(first), id(second))
        with self._lock:
            found = self._joined.get(key)
            if found is not None and found[0] is first and found[1] is second:
                return found[2]
            if len(self._joined) >= _JOINED_KEPT:
                self._joined.clear()
            joined: Mapping[str, Resource] = MappingProxyType({**first, **second})
            self._joined[key] = (first, second, joined)
            return joined
