from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IstioCertificateRequest(_message.Message):
    __slots__ = ("csr", "validity_duration", "metadata")
    CSR_FIELD_NUMBER: _ClassVar[int]
    VALIDITY_DURATION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    csr: str
    validity_duration: int
    metadata: _struct_pb2.Struct
    def __init__(self, csr: _Optional[str] = ..., validity_duration: _Optional[int] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class IstioCertificateResponse(_message.Message):
    __slots__ = ("cert_chain",)
    CERT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    cert_chain: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cert_chain: _Optional[_Iterable[str]] = ...) -> None: ...
