"""ProxyConfig resources (networking.istio.io/v1beta1) applied to the bootstrap of one proxy.

Under Istio, ProxyConfig is read by the agent that starts Envoy, never sent over xDS, so a server
refuses it (`model.REFUSED`) and `meshctl bootstrap --config` applies it instead. The proxy's
effective values are merged as Istio merges them: the root namespace's ProxyConfig (without a
selector) first, then its namespace's one without a selector, then the one whose selector matches
its labels, each field of a more specific one replacing the less specific one's.

What each field means without Istio's agent:

- `environmentVariables`: `ISTIO_META_<NAME>` variables are how the agent sets node metadata
  (`ISTIO_META_DNS_CAPTURE` -> `DNS_CAPTURE`): applied to the bootstrap's node metadata. Any
  other variable configures the agent itself: named in a warning.
- `concurrency`: Envoy's `--concurrency` flag, which a bootstrap cannot carry: named in a warning
  that says where it goes (ENVOY_ARGS in the Envoy unit's environment file, docs/vm-setup.md).
- `image`: the container image the injector picks: named in a warning (a VM has none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from meshctl.config import yamlsource
from meshctl.config.files import decode_text, read_config_file, walk_yaml
from meshctl.errors import ConfigError, YamlError

KIND: Final = "ProxyConfig"
GROUP: Final = "networking.istio.io"
#: The agent's prefix of environment variables that become node metadata.
META_PREFIX: Final = "ISTIO_META_"
_FIELDS: Final = frozenset({"selector", "concurrency", "environmentVariables", "image"})


@dataclass(frozen=True, slots=True)
class ProxyConfigDoc:
    """One ProxyConfig as written, with where it was written (for findings)."""

    namespace: str
    name: str
    at: str  # file:line
    selector: Mapping[str, str] | None
    spec: Mapping[str, Any]


@dataclass(slots=True)
class Applied:
    """A proxy's effective ProxyConfig: node metadata for the bootstrap, and one warning a field
    that means nothing without Istio's agent (or that the bootstrap cannot carry)."""

    metadata: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def read(paths: Iterable[Path], default_namespace: str = "default") -> list[ProxyConfigDoc]:
    """Every ProxyConfig under `paths`; raises ConfigError naming file:line for one that is not
    well formed (other kinds are left to `meshctl validate`)."""
    found: list[ProxyConfigDoc] = []
    for path in walk_yaml(paths).paths:
        try:
            text = decode_text(read_config_file(path, yamlsource.DEFAULT_MAX_FILE_BYTES).data)
            documents = yamlsource.parse_documents(text)
        except (OSError, YamlError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        for doc in documents:
            data = doc.data
            if not isinstance(data, dict) or data.get("kind") != KIND:
                continue
            if str(data.get("apiVersion", "")).partition("/")[0] != GROUP:
                continue
            found.append(_document(data, f"{path}:{doc.line}", default_namespace))
    return found


def _document(data: dict[str, Any], at: str, default_namespace: str) -> ProxyConfigDoc:
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{at}: ProxyConfig has no metadata.name")
    namespace = metadata.get("namespace", default_namespace)
    where = f"{at}: ProxyConfig {namespace}/{name}"
    spec = data.get("spec") or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} spec: must be a mapping")
    unknown = sorted(set(spec) - _FIELDS)
    if unknown:
        raise ConfigError(f"{where} spec.{unknown[0]}: unknown field (ProxyConfig has {', '.join(sorted(_FIELDS))})")
    selector = None
    if "selector" in spec:
        labels = (spec["selector"] or {}).get("matchLabels") if isinstance(spec["selector"], dict) else None
        if not isinstance(labels, dict) or not _string_map(labels):
            raise ConfigError(f"{where} spec.selector.matchLabels: must be a mapping of strings to strings")
        selector = dict(labels)
    concurrency = spec.get("concurrency")
    whole = isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 0
    if concurrency is not None and not whole:
        raise ConfigError(f"{where} spec.concurrency: must be a whole number, 0 or more")
    if "environmentVariables" in spec and not _string_map(spec["environmentVariables"]):
        raise ConfigError(f"{where} spec.environmentVariables: must be a mapping of strings to strings")
    return ProxyConfigDoc(namespace, name, at, selector, spec)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


#: MeshConfig `defaultConfig` fields that `mesh_layer` applies or names itself; any other one
#: is named in a warning as not applied.
_MESH_APPLIED: Final = frozenset(
    {"proxyMetadata", "concurrency", "proxyStatsMatcher", "holdApplicationUntilProxyStarts"}
)


def mesh_layer(path: Path) -> tuple[ProxyConfigDoc | None, dict[str, tuple[str, ...]], list[str]]:
    """MeshConfig `defaultConfig`, the least specific layer under every ProxyConfig: its
    `proxyMetadata` and `concurrency` as a ProxyConfig's `environmentVariables` and `concurrency`,
    its `proxyStatsMatcher` (inclusionPrefixes, inclusionSuffixes, inclusionRegexps), and a
    warning for each other field (they configure Istio's agent). Raises ConfigError."""
    from meshctl.config.mesh import read_mesh_mapping

    try:
        mesh = read_mesh_mapping(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read file: {exc.strerror or exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    default = mesh.get("defaultConfig") if isinstance(mesh, dict) else None
    if not isinstance(default, dict):
        return None, {}, []
    at = f"{path}: MeshConfig defaultConfig"
    warnings = [
        f"{at}.{key} is not applied by meshctl bootstrap: it configures Istio's agent, which a VM does not run"
        for key in sorted(set(default) - _MESH_APPLIED)
    ]
    spec: dict[str, Any] = {}
    if "proxyMetadata" in default:
        if not _string_map(default["proxyMetadata"]):
            raise ConfigError(f"{at}.proxyMetadata: must be a mapping of strings to strings")
        spec["environmentVariables"] = default["proxyMetadata"]
    if "concurrency" in default:
        spec["concurrency"] = default["concurrency"]
    stats: dict[str, tuple[str, ...]] = {}
    matcher = default.get("proxyStatsMatcher") or {}
    for key in ("inclusionPrefixes", "inclusionSuffixes", "inclusionRegexps"):
        values = matcher.get(key) if isinstance(matcher, dict) else None
        if values is not None:
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ConfigError(f"{at}.proxyStatsMatcher.{key}: must be a list of strings")
            stats[key] = tuple(values)
    doc = _document({"metadata": {"name": "defaultConfig", "namespace": ""}, "spec": spec}, at, "")
    return doc, stats, warnings


def select(
    docs: Iterable[ProxyConfigDoc], namespace: str, labels: Mapping[str, str], root_namespace: str
) -> list[ProxyConfigDoc]:
    """The ProxyConfigs that apply to a proxy, least specific first: the root namespace's without
    a selector, the namespace's without one, then the namespace's whose selector matches (the
    oldest first would be Istio's tie-break; files carry no age, so name order)."""
    docs = sorted(docs, key=lambda d: d.name)
    root = [d for d in docs if d.namespace == root_namespace and d.selector is None]
    own = [d for d in docs if d.namespace == namespace and d.selector is None and namespace != root_namespace]
    selected = [
        d
        for d in docs
        if d.namespace == namespace
        and d.selector is not None
        and all(labels.get(k) == v for k, v in d.selector.items())
    ]
    return [*root[:1], *own[:1], *selected[:1]]


def apply(docs: Iterable[ProxyConfigDoc]) -> Applied:
    """Merge `docs` (least specific first) and say what the bootstrap does with each field."""
    env: dict[str, tuple[str, str]] = {}  # variable -> (value, where)
    concurrency: tuple[int, str] | None = None
    image: str | None = None
    for doc in docs:
        for key, value in (doc.spec.get("environmentVariables") or {}).items():
            env[key] = (value, doc.at)
        if doc.spec.get("concurrency") is not None:
            concurrency = (doc.spec["concurrency"], doc.at)
        if doc.spec.get("image") is not None:
            image = doc.at
    applied = Applied()
    for key, (value, at) in sorted(env.items()):
        if key.startswith(META_PREFIX) and len(key) > len(META_PREFIX):
            applied.metadata[key[len(META_PREFIX) :]] = value
        else:
            applied.warnings.append(
                f"{at}: ProxyConfig spec.environmentVariables.{key} is ignored: it configures Istio's agent, "
                f"which a VM does not run (only {META_PREFIX}* variables, node metadata, are applied)"
            )
    if concurrency is not None:
        value, at = concurrency
        applied.warnings.append(
            f"{at}: ProxyConfig spec.concurrency is not in the bootstrap: it is Envoy's --concurrency flag; "
            f"set ENVOY_ARGS=--concurrency {value} in the Envoy unit's environment file"
        )
    if image is not None:
        applied.warnings.append(f"{image}: ProxyConfig spec.image is ignored: a VM's Envoy is no container image")
    return applied
