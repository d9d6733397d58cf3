import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JWTRule(_message.Message):
    __slots__ = ("issuer", "audiences", "jwks_uri", "jwks", "from_headers", "from_params", "output_payload_to_header", "from_cookies", "forward_original_token", "output_claim_to_headers", "timeout", "failure_mode", "space_delimited_claims", "presence")
    class FailureMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PERMISSIVE: _ClassVar[JWTRule.FailureMode]
        IGNORE: _ClassVar[JWTRule.FailureMode]
        STRICT: _ClassVar[JWTRule.FailureMode]
    PERMISSIVE: JWTRule.FailureMode
    IGNORE: JWTRule.FailureMode
    STRICT: JWTRule.FailureMode
    class JWTRequirement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPTIONAL: _ClassVar[JWTRule.JWTRequirement]
        REQUIRED: _ClassVar[JWTRule.JWTRequirement]
    OPTIONAL: JWTRule.JWTRequirement
    REQUIRED: JWTRule.JWTRequirement
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    AUDIENCES_FIELD_NUMBER: _ClassVar[int]
    JWKS_URI_FIELD_NUMBER: _ClassVar[int]
    JWKS_FIELD_NUMBER: _ClassVar[int]
    FROM_HEADERS_FIELD_NUMBER: _ClassVar[int]
    FROM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PAYLOAD_TO_HEADER_FIELD_NUMBER: _ClassVar[int]
    FROM_COOKIES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ORIGINAL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CLAIM_TO_HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MODE_FIELD_NUMBER: _ClassVar[int]
    SPACE_DELIMITED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_FIELD_NUMBER: _ClassVar[int]
    issuer: str
    audiences: _containers.RepeatedScalarFieldContainer[str]
    jwks_uri: str
    jwks: str
    from_headers: _containers.RepeatedCompositeFieldContainer[JWTHeader]
    from_params: _containers.RepeatedScalarFieldContainer[str]
    output_payload_to_header: str
    from_cookies: _containers.RepeatedScalarFieldContainer[str]
    forward_original_token: bool
    output_claim_to_headers: _containers.RepeatedCompositeFieldContainer[ClaimToHeader]
    timeout: _duration_pb2.Duration
    failure_mode: JWTRule.FailureMode
    space_delimited_claims: _containers.RepeatedScalarFieldContainer[str]
    presence: JWTRule.JWTRequirement
    def __init__(self, issuer: _Optional[str] = ..., audiences: _Optional[_Iterable[str]] = ..., jwks_uri: _Optional[str] = ..., jwks: _Optional[str] = ..., from_headers: _Optional[_Iterable[_Union[JWTHeader, _Mapping]]] = ..., from_params: _Optional[_Iterable[str]] = ..., output_payload_to_header: _Optional[str] = ..., from_cookies: _Optional[_Iterable[str]] = ..., forward_original_token: _Optional[bool] = ..., output_claim_to_headers: _Optional[_Iterable[_Union[ClaimToHeader, _Mapping]]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., failure_mode: _Optional[_Union[JWTRule.FailureMode, str]] = ..., space_delimited_claims: _Optional[_Iterable[str]] = ..., presence: _Optional[_Union[JWTRule.JWTRequirement, str]] = ...) -> None: ...

class JWTHeader(_message.Message):
    __slots__ = ("name", "prefix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    prefix: str
    def __init__(self, name: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class ClaimToHeader(_message.Message):
    __slots__ = ("header", "claim")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    header: str
    claim: str
    def __init__(self, header: _Optional[str] = ..., claim: _Optional[str] = ...) -> None: ...
