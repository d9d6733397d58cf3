"""Per-kind semantic validation: the rules `istioctl validate` enforces beyond the schema.

Each kind has one module with a `validate(spec) -> list[Issue]` function; `validate_spec`
dispatches on the kind. Rules see one resource at a time; rules that need several resources
(a host that no ServiceEntry defines, two gateways claiming one port) live in
`meshctl.config.analysis`. Rules that read a resource's metadata (the `istio.io/dry-run`
annotation, a ServiceEntry's waypoint label) are in `metadata.py`, which the loader calls with
the resource's key; lists written empty, which the parsed spec cannot show, are caught by the
schema layer (`config/schema.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message

from meshctl.config.validation.issue import Issue

__all__ = ["Issue", "Validator", "import_rules", "validate_spec"]

Validator = Callable[[Message], list[Issue]]


def _validators() -> dict[str, Validator]:
    # Imported lazily so that importing the loader does not import every rule module.
    from meshctl.config.validation.authorization_policy import validate as authorization_policy
    from meshctl.config.validation.destination_rule import validate as destination_rule
    from meshctl.config.validation.envoy_filter import validate as envoy_filter
    from meshctl.config.validation.gateway import validate as gateway
    from meshctl.config.validation.peer_authentication import validate as peer_authentication
    from meshctl.config.validation.request_authentication import validate as request_authentication
    from meshctl.config.validation.service_entry import validate as service_entry
    from meshctl.config.validation.sidecar import validate as sidecar
    from meshctl.config.validation.telemetry import validate as telemetry
    from meshctl.config.validation.virtual_service import validate as virtual_service
    from meshctl.config.validation.wasm_plugin import validate as wasm_plugin
    from meshctl.config.validation.workload_entry import validate as workload_entry
    from meshctl.config.validation.workload_group import validate as workload_group

    return {
        "VirtualService": virtual_service,
        "DestinationRule": destination_rule,
        "Gateway": gateway,
        "ServiceEntry": service_entry,
        "WorkloadEntry": workload_entry,
        "WorkloadGroup": workload_group,
        "Sidecar": sidecar,
        "EnvoyFilter": envoy_filter,
        "PeerAuthentication": peer_authentication,
        "AuthorizationPolicy": authorization_policy,
        "RequestAuthentication": request_authentication,
        "Telemetry": telemetry,
        "WasmPlugin": wasm_plugin,
    }


_VALIDATORS: dict[str, Validator] = {}


def import_rules() -> None:
    """Import every rule module now rather than on first use: before forking workers, say, so
    that each does not import them again."""
    if not _VALIDATORS:
        _VALIDATORS.update(_validators())


def validate_spec(kind: str, spec: Message) -> list[Issue]:
    """Every rule `kind` breaks in `spec`; empty when it is valid."""
    import_rules()
    validator = _VALIDATORS.get(kind)
    if validator is None and spec.DESCRIPTOR.full_name == "google.protobuf.Struct":
        from meshctl.config.gateway_api.model import validate as gateway_api

        return gateway_api(kind, spec)
    return validator(spec) if validator is not None else []
