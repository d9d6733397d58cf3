from meshctl.api.type.v1beta1 import selector_pb2 as _selector_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuthorizationPolicy(_message.Message):
    __slots__ = ("selector", "targetRef", "targetRefs", "rules", "action", "provider")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALLOW: _ClassVar[AuthorizationPolicy.Action]
        DENY: _ClassVar[AuthorizationPolicy.Action]
        AUDIT: _ClassVar[AuthorizationPolicy.Action]
        CUSTOM: _ClassVar[AuthorizationPolicy.Action]
    ALLOW: AuthorizationPolicy.Action
    DENY: AuthorizationPolicy.Action
    AUDIT: AuthorizationPolicy.Action
    CUSTOM: AuthorizationPolicy.Action
    class ExtensionProvider(_message.Message):
        __slots__ = ("name",)
        NAME_FIELD_NUMBER: _ClassVar[int]
        name: str
        def __init__(self, name: _Optional[str] = ...) -> None: ...
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TARGETREF_FIELD_NUMBER: _ClassVar[int]
    TARGETREFS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    selector: _selector_pb2.WorkloadSelector
    targetRef: _selector_pb2.PolicyTargetReference
    targetRefs: _containers.RepeatedCompositeFieldContainer[_selector_pb2.PolicyTargetReference]
    rules: _containers.RepeatedCompositeFieldContainer[Rule]
    action: AuthorizationPolicy.Action
    provider: AuthorizationPolicy.ExtensionProvider
    def __init__(self, selector: _Optional[_Union[_selector_pb2.WorkloadSelector, _Mapping]] = ..., targetRef: _Optional[_Union[_selector_pb2.PolicyTargetReference, _Mapping]] = ..., targetRefs: _Optional[_Iterable[_Union[_selector_pb2.PolicyTargetReference, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[Rule, _Mapping]]] = ..., action: _Optional[_Union[AuthorizationPolicy.Action, str]] = ..., provider: _Optional[_Union[AuthorizationPolicy.ExtensionProvider, _Mapping]] = ...) -> None: ...

class Rule(_message.Message):
    __slots__ = ("to", "when")
    class From(_message.Message):
        __slots__ = ("source",)
        SOURCE_FIELD_NUMBER: _ClassVar[int]
        source: Source
        def __init__(self, source: _Optional[_Union[Source, _Mapping]] = ...) -> None: ...
    class To(_message.Message):
        __slots__ = ("operation",)
        OPERATION_FIELD_NUMBER: _ClassVar[int]
        operation: Operation
        def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    to: _containers.RepeatedCompositeFieldContainer[Rule.To]
    when: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, to: _Optional[_Iterable[_Union[Rule.To, _Mapping]]] = ..., when: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., **kwargs) -> None: ...

class Source(_message.Message):
    __slots__ = ("principals", "not_principals", "request_principals", "not_request_principals", "namespaces", "not_namespaces", "ip_blocks", "not_ip_blocks", "remote_ip_blocks", "not_remote_ip_blocks", "service_accounts", "not_service_accounts", "trust_domains", "not_trust_domains")
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    NOT_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    NOT_REQUEST_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NOT_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    IP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NOT_IP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_IP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NOT_REMOTE_IP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    NOT_SERVICE_ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    TRUST_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    NOT_TRUST_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    principals: _containers.RepeatedScalarFieldContainer[str]
    not_principals: _containers.RepeatedScalarFieldContainer[str]
    request_principals: _containers.RepeatedScalarFieldContainer[str]
    not_request_principals: _containers.RepeatedScalarFieldContainer[str]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    not_namespaces: _containers.RepeatedScalarFieldContainer[str]
    ip_blocks: _containers.RepeatedScalarFieldContainer[str]
    not_ip_blocks: _containers.RepeatedScalarFieldContainer[str]
    remote_ip_blocks: _containers.RepeatedScalarFieldContainer[str]
    not_remote_ip_blocks: _containers.RepeatedScalarFieldContainer[str]
    service_accounts: _containers.RepeatedScalarFieldContainer[str]
    not_service_accounts: _containers.RepeatedScalarFieldContainer[str]
    trust_domains: _containers.RepeatedScalarFieldContainer[str]
    not_trust_domains: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, principals: _Optional[_Iterable[str]] = ..., not_principals: _Optional[_Iterable[str]] = ..., request_principals: _Optional[_Iterable[str]] = ..., not_request_principals: _Optional[_Iterable[str]] = ..., namespaces: _Optional[_Iterable[str]] = ..., not_namespaces: _Optional[_Iterable[str]] = ..., ip_blocks: _Optional[_Iterable[str]] = ..., not_ip_blocks: _Optional[_Iterable[str]] = ..., remote_ip_blocks: _Optional[_Iterable[str]] = ..., not_remote_ip_blocks: _Optional[_Iterable[str]] = ..., service_accounts: _Optional[_Iterable[str]] = ..., not_service_accounts: _Optional[_Iterable[str]] = ..., trust_domains: _Optional[_Iterable[str]] = ..., not_trust_domains: _Optional[_Iterable[str]] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("hosts", "not_hosts", "ports", "not_ports", "methods", "not_methods", "paths", "not_paths")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    NOT_HOSTS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    NOT_PORTS_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    NOT_METHODS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    NOT_PATHS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedScalarFieldContainer[str]
    not_hosts: _containers.RepeatedScalarFieldContainer[str]
    ports: _containers.RepeatedScalarFieldContainer[str]
    not_ports: _containers.RepeatedScalarFieldContainer[str]
    methods: _containers.RepeatedScalarFieldContainer[str]
    not_methods: _containers.RepeatedScalarFieldContainer[str]
    paths: _containers.RepeatedScalarFieldContainer[str]
    not_paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hosts: _Optional[_Iterable[str]] = ..., not_hosts: _Optional[_Iterable[str]] = ..., ports: _Optional[_Iterable[str]] = ..., not_ports: _Optional[_Iterable[str]] = ..., methods: _Optional[_Iterable[str]] = ..., not_methods: _Optional[_Iterable[str]] = ..., paths: _Optional[_Iterable[str]] = ..., not_paths: _Optional[_Iterable[str]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("key", "values", "not_values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NOT_VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    values: _containers.RepeatedScalarFieldContainer[str]
    not_values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ..., not_values: _Optional[_Iterable[str]] = ...) -> None: ...
