"""Mesh-wide settings, and Istio's MeshConfig YAML they are read from (`--mesh-config FILE`).

Users keep Istio's MeshConfig as they have it: the `mesh` key of istiod's ConfigMap (the whole
ConfigMap, or just the text under `mesh:`), or the MeshConfig document itself. meshctl reads the
fields its generators use and says, as a finding, what it does not apply yet, so nothing in the
file is silently ignored:

| MeshConfig field                 | meshctl                                                    |
|----------------------------------|------------------------------------------------------------|
| rootNamespace                    | the namespace of mesh-wide Sidecars and DestinationRules   |
| outboundTrafficPolicy.mode       | ALLOW_ANY, REGISTRY_ONLY or ALLOW_ANY_DYNAMIC_DNS when no Sidecar says |
| outboundTrafficPolicy.tls        | TLS (SIMPLE, MUTUAL) originated by ALLOW_ANY_DYNAMIC_DNS's cluster |
| connectTimeout                   | every cluster's connect timeout                            |
| trustDomain                      | the SPIFFE trust domain of workload identities             |
| enableAutoMtls                   | mutual TLS to endpoints with a proxy unless a rule says otherwise |
| accessLogFile/Encoding/Format    | Envoy's access log, Istio's default format (`xds/access_log.py`) |
| extensionProviders               | file, gRPC and OTel access logs and tracers for Telemetry; other kinds warned |
| defaultProviders.accessLogging   | the access log providers on where no Telemetry names one   |
| defaultProviders.tracing         | the tracer on where no Telemetry names one (the first)      |
| localityLbSetting                | every cluster's locality settings unless its DestinationRule has its own |
| default*ExportTo                 | where services, VirtualServices, DestinationRules that say nothing are seen |
| defaultConfig.holdApplicationUntilProxyStarts | ignored: a VM has no pod start order         |
| loopbackRange (meshctl's own)    | where TCP-level services get loopback addresses (127.240.0.0/16; "" none) |
| dnsCacheMaxHosts (meshctl's own) | hosts each dynamic forward proxy DNS cache holds (1024)    |
| anything else Istio has          | a warning: read by Istio, not applied by meshctl yet       |

A value every Envoy would refuse is an error at its field and line, as in a config file: a trust
domain that is not lowercase DNS labels (Istio's rule; it is the host of every SPIFFE URI), an
access-log format Envoy cannot parse (`validation/access_log_format.py`), a connect timeout of
292 years or more (`validation/envoy_limits.py`). A file that does not load keeps the settings
last loaded from it (as a config file does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from meshctl.api.networking.v1alpha3.destination_rule_pb2 import ClientTLSSettings, LocalityLoadBalancerSetting
from meshctl.config import positions, yamlsource
from meshctl.config.cert_lifetime import check_secret_ttl
from meshctl.config.files import decode_text, read_config_file
from meshctl.config.findings import Finding, Severity, format_path
from meshctl.config.mesh_providers import NO_PROVIDERS, Providers, read_providers
from meshctl.config.schema import parse_duration, parse_spec
from meshctl.config.validation.access_log_format import access_log_format_problem
from meshctl.config.validation.envoy_limits import duration_limit_problem, trust_domain_problem
from meshctl.errors import ConfigError, YamlError

#: Istio's root namespace: a Sidecar or DestinationRule here applies mesh-wide as a fallback.
DEFAULT_ROOT_NAMESPACE: Final = "istio-system"
#: Where TCP-level services get their own loopback addresses unless `loopbackRange` says.
DEFAULT_LOOPBACK_RANGE: Final = "127.240.0.0/16"
#: Hosts one dynamic forward proxy DNS cache holds unless `dnsCacheMaxHosts` says (Envoy's own
#: default): a bound on what clients can make a proxy resolve and remember.
DEFAULT_DNS_CACHE_MAX_HOSTS: Final = 1024
#: outboundTrafficPolicy modes: ALLOW_ANY_DYNAMIC_DNS is ALLOW_ANY whose HTTP requests for
#: unknown hosts go through Envoy's dynamic forward proxy (resolved by their Host header).
OUTBOUND_MODES: Final = ("ALLOW_ANY", "REGISTRY_ONLY", "ALLOW_ANY_DYNAMIC_DNS")


def loopback_range_problem(cidr: str) -> str | None:
    """Why `cidr` cannot be the range loopback addresses are allocated from, or None."""
    try:
        network = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as exc:
        return f"{cidr!r} is not an IPv4 CIDR range ({exc})"
    if not network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
        return f"{cidr} is not inside 127.0.0.0/8: only loopback addresses are local to every VM"
    if network.num_addresses < 4:
        return f"{cidr} is too small: it needs room for at least two addresses"
    return None


@dataclass(frozen=True, slots=True)
class MeshSettings:
    """Mesh-wide settings (Istio's MeshConfig subset that generation reads)."""

    root_namespace: str = DEFAULT_ROOT_NAMESPACE
    #: ALLOW_ANY (PassthroughCluster), REGISTRY_ONLY (BlackHoleCluster) or ALLOW_ANY_DYNAMIC_DNS
    #: (plaintext HTTP to unknown hosts through the dynamic forward proxy) when no Sidecar says.
    outbound_traffic_policy: str = "ALLOW_ANY"
    connect_timeout_seconds: float = 10.0
    #: Trust domain for SPIFFE identities in endpoint metadata.
    trust_domain: str = "cluster.local"
    #: Where Envoy writes its access log ("" for none, as Istio's default), in TEXT or JSON, with
    #: an optional text format of the user's.
    access_log_file: str = ""
    access_log_encoding: str = "TEXT"
    access_log_format: str = ""
    #: The mesh's `localityLbSetting` in its wire form (b"" for Istio's default: enabled, nothing
    #: configured); a DestinationRule's own setting wins over it.
    locality_lb_setting: bytes = b""
    #: MeshConfig's defaultServiceExportTo, defaultVirtualServiceExportTo and
    #: defaultDestinationRuleExportTo: what a resource that says nothing is exported to.
    default_service_export_to: frozenset[str] = frozenset({"*"})
    default_virtual_service_export_to: frozenset[str] = frozenset({"*"})
    default_destination_rule_export_to: frozenset[str] = frozenset({"*"})
    #: MeshConfig's enableAutoMtls: clients use mutual TLS towards endpoints that run a proxy
    #: (`security.istio.io/tlsMode: istio`) unless a DestinationRule says otherwise.
    enable_auto_mtls: bool = True
    #: meshctl's own `loopbackRange`: the part of 127.0.0.0/8 that TCP-level services get their
    #: own addresses from on VMs without iptables (`snapshot/loopback.py`).
    loopback_range: str = DEFAULT_LOOPBACK_RANGE
    #: meshctl's own `dnsCacheMaxHosts`: how many hosts each DNS cache of Envoy's dynamic
    #: forward proxy (DYNAMIC_DNS ServiceEntries, ALLOW_ANY_DYNAMIC_DNS) holds.
    dns_cache_max_hosts: int = DEFAULT_DNS_CACHE_MAX_HOSTS
    #: MeshConfig's `outboundTrafficPolicy.tls` in its wire form (b"" for none): the TLS that
    #: ALLOW_ANY_DYNAMIC_DNS's cluster originates to the hosts it resolves.
    outbound_tls: bytes = b""
    #: `extensionProviders` and `defaultProviders`: what Telemetry's provider names mean.
    providers: Providers = NO_PROVIDERS

    def locality_default(self) -> LocalityLoadBalancerSetting:
        return LocalityLoadBalancerSetting.FromString(self.locality_lb_setting)


#: MeshConfig fields Istio reads that meshctl does not apply yet: each one present is a warning.
_NOT_APPLIED: Final = frozenset(
    {
        "enableTracing",
        "protocolDetectionTimeout",
        "h2UpgradePolicy",
        "tcpKeepalive",
        "inboundClusterStatName",
        "outboundClusterStatName",
        "dnsRefreshRate",
        "discoverySelectors",
        "meshNetworks",
        "ingressClass",
        "ingressService",
        "ingressControllerMode",
        "ingressSelector",
        "serviceSettings",
        "trustDomainAliases",
        "caCertificates",
        "defaultHttpRetryPolicy",
        "pathNormalization",
        "verifyCertificateAtClient",
    }
)
#: MeshConfig's export defaults and the MeshSettings field each sets.
_EXPORT_DEFAULTS: Final = {
    "defaultServiceExportTo": "default_service_export_to",
    "defaultVirtualServiceExportTo": "default_virtual_service_export_to",
    "defaultDestinationRuleExportTo": "default_destination_rule_export_to",
}
_READ: Final = frozenset(
    {
        "rootNamespace",
        "outboundTrafficPolicy",
        "connectTimeout",
        "trustDomain",
        "enableAutoMtls",
        "defaultConfig",
        "accessLogFile",
        "accessLogEncoding",
        "accessLogFormat",
        "localityLbSetting",
        "loopbackRange",
        "dnsCacheMaxHosts",
        "extensionProviders",
        "defaultProviders",
        *_EXPORT_DEFAULTS,
    }
)


def load_mesh_config(
    path: Path, limit: int = yamlsource.DEFAULT_MAX_FILE_BYTES, *, ca_not_after: datetime | None = None
) -> tuple[MeshSettings | None, list[Finding]]:
    """The settings `path` holds, or None when it cannot be used; and every finding about it
    (with `ca_not_after`, the CA's end, a workload certificate lifetime that outlasts it too)."""
    display = str(path)
    try:
        text = decode_text(read_config_file(path, limit).data)
        docs = yamlsource.parse_documents(text)
    except YamlError as exc:
        return None, [Finding(Severity.ERROR, exc.message, display, exc.line, exc.column)]
    except ConfigError as exc:
        return None, [Finding(Severity.ERROR, str(exc), display)]
    except OSError as exc:
        return None, [Finding(Severity.ERROR, f"cannot read file: {exc.strerror or exc}", display)]
    data: Any = docs[0].data if docs else {}
    try:
        data, place = _mesh_document(data, text)
    except YamlError as exc:
        return None, [Finding(Severity.ERROR, exc.message, display, exc.line, exc.column)]
    settings, findings = mesh_settings(data, display, ca_not_after=ca_not_after)
    return settings, [_placed(f, place) for f in findings]


def place_mesh_findings(path: Path, findings: list[Finding]) -> list[Finding]:
    """`findings` about fields of the MeshConfig at `path` with their lines, where it reads."""
    try:
        text = decode_text(read_config_file(path, yamlsource.DEFAULT_MAX_FILE_BYTES).data)
        docs = yamlsource.parse_documents(text)
        _, place = _mesh_document(docs[0].data if docs else {}, text)
    except (ConfigError, OSError):
        return findings
    return [_placed(f, place) for f in findings]


def read_mesh_mapping(path: Path, limit: int = yamlsource.DEFAULT_MAX_FILE_BYTES) -> Any:
    """The MeshConfig of `path` as plain data, for a reader of fields `MeshSettings` does not
    keep (`meshctl bootstrap` reads `defaultConfig`); raises ConfigError (YamlError) or OSError."""
    text = decode_text(read_config_file(path, limit).data)
    docs = yamlsource.parse_documents(text)
    return _mesh_document(docs[0].data if docs else {}, text)[0]


#: Where a MeshConfig field is written: (line, column) of a field path in the file.
_Place = Callable[[tuple[str | int, ...]], tuple[int, int]]


def _mesh_document(data: Any, text: str) -> tuple[Any, _Place]:
    """The MeshConfig mapping of a ConfigMap (`data.mesh`), of a `mesh:` key, or the document,
    and where each of its fields is written in `text`."""
    outer: tuple[str, ...] = ()
    if isinstance(data, Mapping) and data.get("kind") == "ConfigMap":
        data = (data.get("data") or {}).get("mesh", "")
        outer = ("data", "mesh")
    elif isinstance(data, Mapping) and set(data) == {"mesh"}:
        data = data["mesh"]
        outer = ("mesh",)
    if not isinstance(data, str):
        return data, lambda path: positions.locate(text, 0, (*outer, *path))
    docs = yamlsource.parse_documents(data)
    inner = data

    def place(path: tuple[str | int, ...]) -> tuple[int, int]:
        # The MeshConfig is a block of text inside the file (`mesh: |`): its lines start on the
        # line after its key, each indented by the block's indentation.
        line, column = positions.locate(inner, 0, path)
        key_line, _ = positions.locate(text, 0, outer)
        lines = text.splitlines()
        if not line or not key_line or key_line >= len(lines):
            return (0, 0)
        first = lines[key_line]
        return key_line + line, column + len(first) - len(first.lstrip())

    return (docs[0].data if docs else {}), place


def _placed(finding: Finding, place: _Place) -> Finding:
    """`finding` with the line and column of its field, when it names one."""
    if not finding.field or finding.line:
        return finding
    path = tuple(int(p) if p.isdigit() else p for p in finding.field.replace("[", ".").replace("]", "").split("."))
    line, column = place(path)
    return replace(finding, line=line, column=column)


def mesh_settings(
    data: Any, display: str = "<mesh config>", *, ca_not_after: datetime | None = None
) -> tuple[MeshSettings | None, list[Finding]]:
    """MeshSettings from a MeshConfig mapping, with Istio's defaults for what it leaves out."""
    findings: list[Finding] = []

    def problem(message: str, severity: Severity = Severity.ERROR, field: str = "") -> None:
        findings.append(Finding(severity, message, display, field=field or message.partition(" ")[0]))

    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return None, [Finding(Severity.ERROR, "a MeshConfig must be a mapping", display)]
    defaults = MeshSettings()
    root = data.get("rootNamespace", defaults.root_namespace)
    if not isinstance(root, str) or not root:
        problem("rootNamespace must be a namespace name")
        root = defaults.root_namespace
    policy = defaults.outbound_traffic_policy
    outbound_tls = defaults.outbound_tls
    outbound = data.get("outboundTrafficPolicy")
    if outbound is not None:
        mode = outbound.get("mode") if isinstance(outbound, Mapping) else None
        if mode not in OUTBOUND_MODES:
            problem("outboundTrafficPolicy.mode must be ALLOW_ANY, REGISTRY_ONLY or ALLOW_ANY_DYNAMIC_DNS")
        else:
            policy = mode
        if isinstance(outbound, Mapping) and outbound.get("tls") is not None:
            outbound_tls = _outbound_tls(outbound["tls"], policy, problem)
    timeout = defaults.connect_timeout_seconds
    if "connectTimeout" in data:
        value = data["connectTimeout"]
        nanos = parse_duration(value) if isinstance(value, str) else None
        if nanos is None or nanos <= 0:
            problem("connectTimeout must be a positive duration (10s, 500ms)")
        elif (too_long := duration_limit_problem(nanos, value)) is not None:
            problem(too_long, field="connectTimeout")
        else:
            timeout = nanos / 1e9
    trust = data.get("trustDomain", defaults.trust_domain)
    if not isinstance(trust, str) or not trust:
        problem("trustDomain must be a domain name")
        trust = defaults.trust_domain
    elif (bad_domain := trust_domain_problem(trust)) is not None:
        problem(bad_domain, field="trustDomain")
        trust = defaults.trust_domain
    auto_mtls = data.get("enableAutoMtls", defaults.enable_auto_mtls)
    if not isinstance(auto_mtls, bool):
        problem("enableAutoMtls must be true or false")
        auto_mtls = defaults.enable_auto_mtls
    log_file = data.get("accessLogFile", "")
    encoding = data.get("accessLogEncoding", "TEXT")
    log_format = data.get("accessLogFormat", "")
    if not isinstance(log_file, str):
        problem("accessLogFile must be a path (/dev/stdout)")
        log_file = ""
    if encoding not in ("TEXT", "JSON"):
        problem("accessLogEncoding must be TEXT or JSON")
        encoding = "TEXT"
    if not isinstance(log_format, str):
        problem("accessLogFormat must be a format string")
        log_format = ""
    elif log_format and (bad_format := access_log_format_problem(log_format)) is not None:
        problem(bad_format, field="accessLogFormat")
        log_format = ""
    locality = b""
    if data.get("localityLbSetting") is not None:
        setting, issues = parse_spec(data["localityLbSetting"], LocalityLoadBalancerSetting, ("localityLbSetting",))
        for issue in issues:
            problem(f"{format_path(issue.path)}: {issue.message}", field=format_path(issue.path))
        locality = setting.SerializeToString(deterministic=True)
    exports: dict[str, frozenset[str]] = {}
    for key, field_name in _EXPORT_DEFAULTS.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            problem(f"{key} must be a list of namespaces, '.' or '*'")
            continue
        exports[field_name] = frozenset(value)
    loopback = data.get("loopbackRange", defaults.loopback_range)
    if not isinstance(loopback, str) or (loopback and (bad_range := loopback_range_problem(loopback)) is not None):
        why = bad_range if isinstance(loopback, str) else "must be a CIDR range (127.240.0.0/16)"
        problem(f"loopbackRange: {why}", field="loopbackRange")
        loopback = defaults.loopback_range
    max_hosts = data.get("dnsCacheMaxHosts", defaults.dns_cache_max_hosts)
    if isinstance(max_hosts, bool) or not isinstance(max_hosts, int) or not 1 <= max_hosts <= 2**32 - 1:
        problem("dnsCacheMaxHosts must be a whole number from 1 to 4294967295", field="dnsCacheMaxHosts")
        max_hosts = defaults.dns_cache_max_hosts
    providers = read_providers(data, problem)
    default_config = data.get("defaultConfig")
    if isinstance(default_config, Mapping) and "holdApplicationUntilProxyStarts" in default_config:
        problem("defaultConfig.holdApplicationUntilProxyStarts is ignored: a VM has no pod start order", Severity.INFO)
    check_secret_ttl(default_config, problem, ca_not_after)
    for key in sorted(k for k in data if isinstance(k, str)):
        if key in _NOT_APPLIED:
            problem(f"{key} is Istio's, not applied by meshctl yet", Severity.WARNING)
        elif key not in _READ:
            problem(f"{key} is not a MeshConfig field meshctl knows", Severity.WARNING)
    if any(f.severity is Severity.ERROR for f in findings):
        return None, findings
    public = frozenset({"*"})
    settings = MeshSettings(
        root,
        policy,
        timeout,
        trust,
        log_file,
        encoding,
        log_format,
        locality,
        default_service_export_to=exports.get("default_service_export_to", public),
        default_virtual_service_export_to=exports.get("default_virtual_service_export_to", public),
        default_destination_rule_export_to=exports.get("default_destination_rule_export_to", public),
        enable_auto_mtls=auto_mtls,
        loopback_range=loopback,
        dns_cache_max_hosts=max_hosts,
        outbound_tls=outbound_tls,
        providers=providers,
    )
    return settings, findings


def _outbound_tls(data: Any, mode: str, problem: Callable[..., None]) -> bytes:
    """`outboundTrafficPolicy.tls` in its wire form, b"" when it cannot be used (each reason a
    finding): SIMPLE or MUTUAL with files, as a DestinationRule gives them on a VM."""
    where = "outboundTrafficPolicy.tls"
    tls, issues = parse_spec(data, ClientTLSSettings, ("outboundTrafficPolicy", "tls"))
    for issue in issues:
        problem(f"{format_path(issue.path)}: {issue.message}", field=format_path(issue.path))
    if issues:
        return b""
    if mode != "ALLOW_ANY_DYNAMIC_DNS":
        problem(f"{where} applies only with mode ALLOW_ANY_DYNAMIC_DNS: ignored", Severity.WARNING, field=where)
    name = ClientTLSSettings.TLSmode.Name(tls.mode)
    why = ""
    if name == "ISTIO_MUTUAL":
        why = "mode ISTIO_MUTUAL cannot be used: the hosts it reaches are outside the mesh"
    elif tls.credential_name:
        why = "credentialName needs Kubernetes secrets: give clientCertificate, privateKey, caCertificates files"
    elif name == "MUTUAL" and not (tls.client_certificate and tls.private_key):
        why = "mode MUTUAL needs clientCertificate and privateKey"
    if why:
        problem(f"{where}: {why}", field=where)
        return b""
    return tls.SerializeToString(deterministic=True) if name in ("SIMPLE", "MUTUAL") else b""
