from meshctl.api.security.v1beta1 import jwt_pb2 as _jwt_pb2
from meshctl.api.type.v1beta1 import selector_pb2 as _selector_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestAuthentication(_message.Message):
    __slots__ = ("selector", "targetRef", "targetRefs", "jwt_rules")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TARGETREF_FIELD_NUMBER: _ClassVar[int]
    TARGETREFS_FIELD_NUMBER: _ClassVar[int]
    JWT_RULES_FIELD_NUMBER: _ClassVar[int]
    selector: _selector_pb2.WorkloadSelector
    targetRef: _selector_pb2.PolicyTargetReference
    targetRefs: _containers.RepeatedCompositeFieldContainer[_selector_pb2.PolicyTargetReference]
    jwt_rules: _containers.RepeatedCompositeFieldContainer[_jwt_pb2.JWTRule]
    def __init__(self, selector: _Optional[_Union[_selector_pb2.WorkloadSelector, _Mapping]] = ..., targetRef: _Optional[_Union[_selector_pb2.PolicyTargetReference, _Mapping]] = ..., targetRefs: _Optional[_Iterable[_Union[_selector_pb2.PolicyTargetReference, _Mapping]]] = ..., jwt_rules: _Optional[_Iterable[_Union[_jwt_pb2.JWTRule, _Mapping]]] = ...) -> None: ...
