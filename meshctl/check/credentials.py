"""The secrets that config names by `credentialName`, checked against a credentials directory
(`meshctl validate --credentials-dir`, the directory `serve --credentials-dir` reads).

Without the directory nothing is said: the secrets live on the server, not in the config tree.
With it, each name must lead to a secret that parses, whose key matches its certificate, and,
where the config verifies peers with it (a MUTUAL server, a client's origination), that has a
trust bundle (`ca.crt`, or a `NAME-cacert` secret); the finding names the file at fault.

- Gateway servers (Istio's IST0161, InvalidGatewayCredential): the secret is looked up in the
  namespace of the gateway proxies, as Istio does: the namespaces of the WorkloadEntries the
  Gateway selects, or the Gateway's own when it selects none in the tree.
- DestinationRule client credentials (MC0007): used by the egress gateways the rule applies to,
  which the tree does not say; a name found in no namespace is reported, one found in some is not.

The check reads files, so it sits above `config/` (whose analysis takes it as a callable, as it
takes `check/names.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from meshctl.config.analysis import AnalysisIssue
from meshctl.config.findings import Severity
from meshctl.config.labels import labels_match
from meshctl.config.model import Config
from meshctl.security.credentials import CA_SUFFIX, KubeSecret, find_secret, namespaces

GATEWAY_CODE: Final = "IST0161"
RULE_CODE: Final = "MC0007"
_TERMINATING: Final = frozenset({"SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL"})
_VERIFYING: Final = frozenset({"MUTUAL", "OPTIONAL_MUTUAL"})


class _Secrets:
    """Secrets read once per run, by (namespace, name)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read: dict[tuple[str, str], tuple[Path, KubeSecret | None, str | None]] = {}

    def get(self, namespace: str, name: str) -> tuple[Path, KubeSecret | None, str | None]:
        key = (namespace, name)
        if key not in self._read:
            self._read[key] = find_secret(self.root, namespace, name)
        return self._read[key]

    def problem(self, namespace: str, name: str, *, certificate: bool, bundle: bool) -> str | None:
        """Why secret `name` of `namespace` cannot serve, or None."""
        directory, secret, error = self.get(namespace, name)
        if certificate:
            if secret is None:
                return f"secret {namespace}/{name}: {error}"
            if secret.cert is None:
                return f"secret {namespace}/{name}: {directory} holds no tls.crt/tls.key (or cert/key)"
        if bundle and self._bundle(namespace, name) is None:
            return (
                f"secret {namespace}/{name}: no trust bundle to verify peers with: {directory}/ca.crt "
                f"(or a secret {name}{CA_SUFFIX} holding ca.crt)"
            )
        return None

    def _bundle(self, namespace: str, name: str) -> bytes | None:
        if not name.endswith(CA_SUFFIX):
            _, own, _ = self.get(namespace, name + CA_SUFFIX)
            if own is not None and own.ca is not None:
                return own.ca
        _, secret, _ = self.get(namespace, name)
        return secret.ca if secret is not None else None


def _mode(tls: Any, enum: Any) -> str:
    return str(enum.Name(tls.mode))


def credential_issues(configs: Sequence[Config], root: Path) -> list[AnalysisIssue]:
    """Findings about every secret `configs` name, against `root` (see the module docstring)."""
    secrets = _Secrets(root)
    workloads = [c for c in configs if c.key.kind == "WorkloadEntry"]
    out: list[AnalysisIssue] = []
    for config in configs:
        if config.key.kind == "Gateway":
            out.extend(_gateway(config, workloads, secrets))
        elif config.key.kind == "DestinationRule":
            out.extend(_rule(config, secrets))
    return out


def _gateway_namespaces(gateway: Config, workloads: Sequence[Config]) -> list[str]:
    selector = dict(gateway.spec.selector)  # type: ignore[attr-defined]
    found = sorted(
        {w.key.namespace for w in workloads if selector and labels_match(selector, dict(w.spec.labels))}  # type: ignore[attr-defined]
    )
    return found or [gateway.key.namespace]


def _gateway(gateway: Config, workloads: Sequence[Config], secrets: _Secrets) -> Iterator[AnalysisIssue]:
    spec: Any = gateway.spec
    targets = _gateway_namespaces(gateway, workloads)
    for i, server in enumerate(spec.servers):
        if not server.HasField("tls"):
            continue
        tls = server.tls
        mode = _mode(tls, type(tls).TLSmode)
        if mode not in _TERMINATING:
            continue
        at: tuple[str | int, ...] = ("spec", "servers", i, "tls")
        named = [((*at, "credentialName"), tls.credential_name)] if tls.credential_name else []
        named += [((*at, "credentialNames", j), n) for j, n in enumerate(tls.credential_names)]
        checks = [(path, name, True, False) for path, name in named]
        if mode in _VERIFYING:
            if tls.ca_cert_credential_name:
                checks.append(((*at, "caCertCredentialName"), tls.ca_cert_credential_name, False, True))
            elif named:
                path, name = named[0]
                checks.append((path, name, False, True))
        for path, name, certificate, bundle in checks:
            for namespace in targets:
                problem = secrets.problem(namespace, name, certificate=certificate, bundle=bundle)
                if problem is not None:
                    yield AnalysisIssue(gateway.key, path, problem, Severity.ERROR, GATEWAY_CODE)


def _client_settings(spec: Any) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every ClientTLSSettings of a DestinationRule, with its field path."""
    policies: list[tuple[tuple[str | int, ...], Any]] = []
    if spec.HasField("traffic_policy"):
        policies.append((("spec", "trafficPolicy"), spec.traffic_policy))
    for i, subset in enumerate(spec.subsets):
        if subset.HasField("traffic_policy"):
            policies.append((("spec", "subsets", i, "trafficPolicy"), subset.traffic_policy))
    for at, policy in policies:
        if policy.HasField("tls"):
            yield (*at, "tls"), policy.tls
        for j, port in enumerate(policy.port_level_settings):
            if port.HasField("tls"):
                yield (*at, "portLevelSettings", j, "tls"), port.tls


def _rule(rule: Config, secrets: _Secrets) -> Iterator[AnalysisIssue]:
    everywhere = namespaces(secrets.root)
    for at, tls in _client_settings(rule.spec):
        mode = _mode(tls, type(tls).TLSmode)
        if mode not in ("SIMPLE", "MUTUAL") or not tls.credential_name:
            continue
        name = tls.credential_name
        verify = not tls.insecure_skip_verify.value
        # The rule's own namespace first: the usual place, and the one the finding names.
        problems = [
            secrets.problem(ns, name, certificate=mode == "MUTUAL", bundle=verify)
            for ns in [rule.key.namespace, *(n for n in everywhere if n != rule.key.namespace)]
        ]
        if problems and all(p is not None for p in problems):
            yield AnalysisIssue(rule.key, (*at, "credentialName"), str(problems[0]), Severity.ERROR, RULE_CODE)
