"""Analysis for proxyless gRPC workloads: what their libraries do not do of the config they get.

A workload is proxyless gRPC when its WorkloadEntry (or the WorkloadGroup it is made from) has
Istio's injection annotation naming a gRPC template, `inject.istio.io/templates: grpc-agent` (or
`grpc-simple`), as Istio marks its proxyless pods. Such a workload gets gRPC's resources
(`xds/grpc_gen.py`), and gRPC implements a subset of what a VirtualService or a
DestinationRule says (Istio's published support list is the floor: host and subset, header and
`/SERVICE/METHOD` matches, weights, ROUND_ROBIN, DISABLE and ISTIO_MUTUAL; fault injection,
timeouts, gRPC retries, consistent hashing on headers and `http2MaxRequests` on top).

- MC0010 (warning): a VirtualService or DestinationRule visible from a gRPC workload's namespace
  uses a field gRPC ignores there, or a PeerAuthentication selecting a gRPC server says
  PERMISSIVE (which it serves as plaintext); the finding names the field and the workloads.
- MC0011 (error): an AuthorizationPolicy or RequestAuthentication selecting a gRPC server
  workload needs what gRPC's RBAC does not have (request principals and JWT claims, which need
  JWT validation; CUSTOM actions): refused rather than half enforced.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from meshctl.config.analysis_mtls import MtlsIssue, workload_labels
from meshctl.config.findings import FieldPath
from meshctl.config.labels import labels_match, selector_labels
from meshctl.config.model import Config
from meshctl.config.references import is_exported

TEMPLATES_ANNOTATION: Final = "inject.istio.io/templates"
#: Istio's injection templates of proxyless gRPC workloads.
GRPC_TEMPLATES: Final = frozenset({"grpc-agent", "grpc-simple"})
#: The retry conditions gRPC implements (gRFC A44): status codes by name.
GRPC_RETRY_ON: Final = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable")
IGNORED: Final = "MC0010"
REFUSED: Final = "MC0011"

_ROUTE_FIELDS: Final = (
    ("rewrite", "rewrite", "gRPC rewrites neither the path nor the authority"),
    ("redirect", "redirect", "gRPC does not redirect: the calls this route matches fail UNAVAILABLE"),
    ("direct_response", "directResponse", "gRPC does not answer for a route: the calls it matches fail UNAVAILABLE"),
    ("mirror", "mirror", "gRPC does not mirror calls"),
    ("mirrors", "mirrors", "gRPC does not mirror calls"),
    ("mirror_percentage", "mirrorPercentage", "gRPC does not mirror calls"),
    ("cors_policy", "corsPolicy", "gRPC has no CORS"),
    ("headers", "headers", "gRPC adds, sets and removes no headers"),
)
_LB_ROUND_ROBIN: Final = {1: "LEAST_CONN", 2: "RANDOM", 3: "PASSTHROUGH", 5: "LEAST_REQUEST"}
_TLS_MODES: Final = {1: "SIMPLE", 2: "MUTUAL"}
_PERMISSIVE_MODE: Final = 2
_PERMISSIVE: Final = (
    "a gRPC server cannot tell mutual TLS from plaintext on one port, so under PERMISSIVE it serves "
    "plaintext (as istiod has it) and clients calling it with ISTIO_MUTUAL fail; use STRICT or DISABLE"
)
_UNIMPLEMENTED: Final = (("tunnel", "tunnel"), ("proxy_protocol", "proxyProtocol"), ("retry_budget", "retryBudget"))


@dataclass(frozen=True, slots=True)
class _GrpcWorkload:
    kind: str
    namespace: str
    name: str
    labels: Mapping[str, str]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def is_grpc_workload(annotations: Mapping[str, str]) -> bool:
    """Whether Istio's injection annotation names a proxyless gRPC template."""
    names = {t.strip() for t in annotations.get(TEMPLATES_ANNOTATION, "").split(",")}
    return bool(names & GRPC_TEMPLATES)


def grpc_workloads(by_kind: Mapping[str, Sequence[Config]]) -> list[_GrpcWorkload]:
    out = [
        _GrpcWorkload("WorkloadEntry", e.namespace, e.name, workload_labels(e))
        for e in by_kind.get("WorkloadEntry", ())
        if is_grpc_workload(e.annotations)
    ]
    for group in by_kind.get("WorkloadGroup", ()):
        meta: Any = group.spec.metadata  # type: ignore[attr-defined]
        if is_grpc_workload(meta.annotations):
            out.append(_GrpcWorkload("WorkloadGroup", group.namespace, group.name, dict(meta.labels)))
    return out


def grpc_issues(by_kind: Mapping[str, Sequence[Config]], root_namespace: str) -> Iterator[MtlsIssue]:
    """MC0010 and MC0011 for the configs of `by_kind` that gRPC workloads get."""
    workloads = grpc_workloads(by_kind)
    if not workloads:
        return
    for vs in by_kind.get("VirtualService", ()):
        users = _users(vs, workloads)
        if users:
            for path, why in _virtual_service_fields(vs.spec):
                yield MtlsIssue(IGNORED, vs.key, path, _ignored(why, users))
    for dr in by_kind.get("DestinationRule", ()):
        users = _users(dr, workloads)
        if users:
            for path, why in _destination_rule_fields(dr.spec):
                yield MtlsIssue(IGNORED, dr.key, path, _ignored(why, users))
    for peer in by_kind.get("PeerAuthentication", ()):
        servers = _selected(peer, workloads, root_namespace)
        if servers:
            for path in _permissive(peer.spec):
                yield MtlsIssue(IGNORED, peer.key, path, _ignored(_PERMISSIVE, servers, "servers it selects"))
    for policy in (*by_kind.get("AuthorizationPolicy", ()), *by_kind.get("RequestAuthentication", ())):
        servers = _selected(policy, workloads, root_namespace)
        if servers:
            for path, why in _policy_fields(policy):
                shown = _names(servers)
                plural = "s" if len(servers) > 1 else ""
                message = f"cannot be enforced by the proxyless gRPC server{plural} the policy selects ({shown}): {why}"
                yield MtlsIssue(REFUSED, policy.key, path, message)


def _users(config: Config, workloads: Sequence[_GrpcWorkload]) -> list[_GrpcWorkload]:
    """The gRPC workloads that get `config`: in a namespace it is exported to (and selected by a
    DestinationRule's workloadSelector)."""
    spec: Any = config.spec
    selector = dict(spec.workload_selector.match_labels) if config.kind == "DestinationRule" else {}
    return [
        w
        for w in workloads
        if is_exported(spec.export_to, config.namespace, w.namespace)
        and (not selector or (w.namespace == config.namespace and labels_match(selector, w.labels)))
    ]


def _selected(policy: Config, workloads: Sequence[_GrpcWorkload], root_namespace: str) -> list[_GrpcWorkload]:
    spec: Any = policy.spec
    fields = spec.DESCRIPTOR.fields_by_name
    if ("targetRef" in fields and spec.HasField("targetRef")) or ("targetRefs" in fields and list(spec.targetRefs)):
        return []  # a policy bound by targetRef is a Gateway's
    selector = selector_labels(spec, "selector")
    mesh_wide = policy.namespace == root_namespace
    return [
        w
        for w in workloads
        if (mesh_wide or w.namespace == policy.namespace) and (not selector or labels_match(selector, w.labels))
    ]


def _names(workloads: Sequence[_GrpcWorkload]) -> str:
    more = f" and {len(workloads) - 3} more" if len(workloads) > 3 else ""
    return ", ".join(str(w) for w in workloads[:3]) + more


def _ignored(why: str, users: Sequence[_GrpcWorkload], who: str = "clients that get it") -> str:
    return f"ignored by the proxyless gRPC {who} ({_names(users)}): {why}"


def _permissive(spec: Any) -> Iterator[FieldPath]:
    if spec.mtls.mode == _PERMISSIVE_MODE:
        yield ("spec", "mtls", "mode")
    for port, setting in sorted(spec.port_level_mtls.items()):
        if setting.mode == _PERMISSIVE_MODE:
            yield ("spec", "portLevelMtls", str(port), "mode")


def _virtual_service_fields(spec: Any) -> Iterator[tuple[FieldPath, str]]:
    for i, route in enumerate(spec.http):
        base: FieldPath = ("spec", "http", i)
        for field, json_name, why in _ROUTE_FIELDS:
            if _route_has(route, field):
                yield (*base, json_name), why
        for j, match in enumerate(route.match):
            if len(match.query_params):
                yield (*base, "match", j, "queryParams"), "gRPC sends no query string: this match never matches"
            if match.HasField("method"):
                yield (*base, "match", j, "method"), "every gRPC call is a POST"
        if route.HasField("retries"):
            retries = route.retries
            dropped = [c.strip() for c in retries.retry_on.split(",") if c.strip() and c.strip() not in GRPC_RETRY_ON]
            if dropped:
                yield (
                    (*base, "retries", "retryOn"),
                    (
                        f"gRPC retries only on the status codes {', '.join(GRPC_RETRY_ON)}; {', '.join(dropped)} "
                        "left out"
                    ),
                )
            if retries.HasField("per_try_timeout"):
                yield (*base, "retries", "perTryTimeout"), "gRPC has no per-try timeout"
    for kind in ("tcp", "tls"):
        if len(getattr(spec, kind)):
            yield ("spec", kind), f"gRPC clients route calls only: {kind} routes are not sent to them"


def _route_has(route: Any, field: str) -> bool:
    if field == "mirrors":
        return bool(len(route.mirrors))
    if field != "headers":
        return bool(route.HasField(field))
    headers = route.headers
    return any(
        headers.HasField(part) and (len(getattr(headers, part).set) or len(getattr(headers, part).add)
                                    or len(getattr(headers, part).remove))
        for part in ("request", "response")
    )  # fmt: skip


def _destination_rule_fields(spec: Any) -> Iterator[tuple[FieldPath, str]]:
    if spec.HasField("traffic_policy"):
        yield from _policy_of(spec.traffic_policy, ("spec", "trafficPolicy"))
    for k, subset in enumerate(spec.subsets):
        if subset.HasField("traffic_policy"):
            yield from _policy_of(subset.traffic_policy, ("spec", "subsets", k, "trafficPolicy"))


def _policy_of(policy: Any, base: FieldPath, *, port_level: bool = False) -> Iterator[tuple[FieldPath, str]]:
    lb = policy.load_balancer
    if lb.simple in _LB_ROUND_ROBIN:
        yield (
            (*base, "loadBalancer", "simple"),
            (f"gRPC balances {_LB_ROUND_ROBIN[lb.simple]} as ROUND_ROBIN (it implements ROUND_ROBIN and ring hash)"),
        )
    hashing = lb.consistent_hash
    for field, json_name in (("http_cookie", "httpCookie"), ("use_source_ip", "useSourceIp"),
                             ("http_query_parameter_name", "httpQueryParameterName")):  # fmt: skip
        if lb.HasField("consistent_hash") and hashing.HasField(field):
            yield (
                (*base, "loadBalancer", "consistentHash", json_name),
                ("gRPC hashes on headers only: without one each call is hashed at random"),
            )
    if lb.HasField("locality_lb_setting"):
        yield (*base, "loadBalancer", "localityLbSetting"), "gRPC nodes get the assignments without locality rules"
    for field, json_name in (("warmup_duration_secs", "warmupDurationSecs"), ("warmup", "warmup")):
        if lb.HasField(field):
            yield (*base, "loadBalancer", json_name), "gRPC has no slow start"
    pool = policy.connection_pool
    if pool.HasField("tcp"):
        yield (*base, "connectionPool", "tcp"), "gRPC has no connection limits, timeouts or keepalive from xDS"
    if pool.HasField("http"):
        http = pool.http
        others = [f.name for f, _ in http.ListFields() if f.name != "http2_max_requests"]
        if others:
            yield (
                (*base, "connectionPool", "http"),
                (
                    "gRPC takes http2MaxRequests alone (its max_requests); "
                    f"{', '.join(_camel(n) for n in others)} {'is' if len(others) == 1 else 'are'} ignored"
                ),
            )
    if policy.HasField("outlier_detection"):
        yield (
            (*base, "outlierDetection"),
            (
                "gRPC ejects hosts only by success rate or failure percentage, which Istio's fields do not set: "
                "consecutive errors eject nothing"
            ),
        )
    if policy.tls.mode in _TLS_MODES:
        yield (
            (*base, "tls", "mode"),
            (
                "gRPC takes only the mesh's mutual TLS (ISTIO_MUTUAL) from xDS: a "
                f"{_TLS_MODES[policy.tls.mode]} cluster is not sent to gRPC clients and their calls fail UNAVAILABLE"
            ),
        )
    for field, json_name in (
        ("tunnel", "tunnel"),
        ("proxy_protocol", "proxyProtocol"),
        ("retry_budget", "retryBudget"),
    ):
        if policy.HasField(field):
            yield (*base, json_name), "gRPC does not implement it"
    if not port_level:
        for n, settings in enumerate(policy.port_level_settings):
            yield from _policy_of(settings, (*base, "portLevelSettings", n), port_level=True)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _policy_fields(policy: Config) -> Iterator[tuple[FieldPath, str]]:
    spec: Any = policy.spec
    jwt = "it needs JWT validation, which gRPC servers do not have"
    if policy.kind == "RequestAuthentication":
        if len(spec.jwt_rules):
            yield ("spec", "jwtRules"), jwt
        return
    if spec.action == 3:  # CUSTOM
        yield ("spec", "action"), "gRPC servers have no external authorization"
    for i, rule in enumerate(spec.rules):
        for j, source in enumerate(getattr(rule, "from")):
            for field, json_name in (("request_principals", "requestPrincipals"),
                                     ("not_request_principals", "notRequestPrincipals")):  # fmt: skip
                if len(getattr(source.source, field)):
                    yield ("spec", "rules", i, "from", j, "source", json_name), jwt
        for k, condition in enumerate(rule.when):
            if condition.key.startswith("request.auth."):
                yield ("spec", "rules", i, "when", k, "key"), jwt
            elif condition.key == "connection.sni":
                yield ("spec", "rules", i, "when", k, "key"), "gRPC's RBAC does not match the SNI"
