from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Gateway(_message.Message):
    __slots__ = ("servers", "selector")
    class SelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[Server]
    selector: _containers.ScalarMap[str, str]
    def __init__(self, servers: _Optional[_Iterable[_Union[Server, _Mapping]]] = ..., selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Server(_message.Message):
    __slots__ = ("port", "bind", "hosts", "tls", "default_endpoint", "name")
    PORT_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    port: Port
    bind: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    tls: ServerTLSSettings
    default_endpoint: str
    name: str
    def __init__(self, port: _Optional[_Union[Port, _Mapping]] = ..., bind: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., tls: _Optional[_Union[ServerTLSSettings, _Mapping]] = ..., default_endpoint: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Port(_message.Message):
    __slots__ = ("number", "protocol", "name", "target_port")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_PORT_FIELD_NUMBER: _ClassVar[int]
    number: int
    protocol: str
    name: str
    target_port: int
    def __init__(self, number: _Optional[int] = ..., protocol: _Optional[str] = ..., name: _Optional[str] = ..., target_port: _Optional[int] = ...) -> None: ...

class ServerTLSSettings(_message.Message):
    __slots__ = ("https_redirect", "mode", "server_certificate", "private_key", "ca_certificates", "ca_crl", "credential_name", "credential_names", "tls_certificates", "ca_cert_credential_name", "subject_alt_names", "verify_certificate_spki", "verify_certificate_hash", "min_protocol_version", "max_protocol_version", "cipher_suites")
    class TLSmode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PASSTHROUGH: _ClassVar[ServerTLSSettings.TLSmode]
        SIMPLE: _ClassVar[ServerTLSSettings.TLSmode]
        MUTUAL: _ClassVar[ServerTLSSettings.TLSmode]
        AUTO_PASSTHROUGH: _ClassVar[ServerTLSSettings.TLSmode]
        ISTIO_MUTUAL: _ClassVar[ServerTLSSettings.TLSmode]
        OPTIONAL_MUTUAL: _ClassVar[ServerTLSSettings.TLSmode]
    PASSTHROUGH: ServerTLSSettings.TLSmode
    SIMPLE: ServerTLSSettings.TLSmode
    MUTUAL: ServerTLSSettings.TLSmode
    AUTO_PASSTHROUGH: ServerTLSSettings.TLSmode
    ISTIO_MUTUAL: ServerTLSSettings.TLSmode
    OPTIONAL_MUTUAL: ServerTLSSettings.TLSmode
    class TLSProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TLS_AUTO: _ClassVar[ServerTLSSettings.TLSProtocol]
        TLSV1_0: _ClassVar[ServerTLSSettings.TLSProtocol]
        TLSV1_1: _ClassVar[ServerTLSSettings.TLSProtocol]
        TLSV1_2: _ClassVar[ServerTLSSettings.TLSProtocol]
        TLSV1_3: _ClassVar[ServerTLSSettings.TLSProtocol]
    TLS_AUTO: ServerTLSSettings.TLSProtocol
    TLSV1_0: ServerTLSSettings.TLSProtocol
    TLSV1_1: ServerTLSSettings.TLSProtocol
    TLSV1_2: ServerTLSSettings.TLSProtocol
    TLSV1_3: ServerTLSSettings.TLSProtocol
    class TLSCertificate(_message.Message):
        __slots__ = ("server_certificate", "private_key", "ca_certificates")
        SERVER_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
        PRIVATE_KEY_FIELD_NUMBER: _ClassVar[int]
        CA_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
        server_certificate: str
        private_key: str
        ca_certificates: str
        def __init__(self, server_certificate: _Optional[str] = ..., private_key: _Optional[str] = ..., ca_certificates: _Optional[str] = ...) -> None: ...
    HTTPS_REDIRECT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SERVER_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    CA_CRL_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_NAME_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_NAMES_FIELD_NUMBER: _ClassVar[int]
    TLS_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    CA_CERT_CREDENTIAL_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    VERIFY_CERTIFICATE_SPKI_FIELD_NUMBER: _ClassVar[int]
    VERIFY_CERTIFICATE_HASH_FIELD_NUMBER: _ClassVar[int]
    MIN_PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CIPHER_SUITES_FIELD_NUMBER: _ClassVar[int]
    https_redirect: bool
    mode: ServerTLSSettings.TLSmode
    server_certificate: str
    private_key: str
    ca_certificates: str
    ca_crl: str
    credential_name: str
    credential_names: _containers.RepeatedScalarFieldContainer[str]
    tls_certificates: _containers.RepeatedCompositeFieldContainer[ServerTLSSettings.TLSCertificate]
    ca_cert_credential_name: str
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    verify_certificate_spki: _containers.RepeatedScalarFieldContainer[str]
    verify_certificate_hash: _containers.RepeatedScalarFieldContainer[str]
    min_protocol_version: ServerTLSSettings.TLSProtocol
    max_protocol_version: ServerTLSSettings.TLSProtocol
    cipher_suites: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, https_redirect: _Optional[bool] = ..., mode: _Optional[_Union[ServerTLSSettings.TLSmode, str]] = ..., server_certificate: _Optional[str] = ..., private_key: _Optional[str] = ..., ca_certificates: _Optional[str] = ..., ca_crl: _Optional[str] = ..., credential_name: _Optional[str] = ..., credential_names: _Optional[_Iterable[str]] = ..., tls_certificates: _Optional[_Iterable[_Union[ServerTLSSettings.TLSCertificate, _Mapping]]] = ..., ca_cert_credential_name: _Optional[str] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., verify_certificate_spki: _Optional[_Iterable[str]] = ..., verify_certificate_hash: _Optional[_Iterable[str]] = ..., min_protocol_version: _Optional[_Union[ServerTLSSettings.TLSProtocol, str]] = ..., max_protocol_version: _Optional[_Union[ServerTLSSettings.TLSProtocol, str]] = ..., cipher_suites: _Optional[_Iterable[str]] = ...) -> None: ...
