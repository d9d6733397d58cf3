from meshctl.api.networking.v1alpha3 import sidecar_pb2 as _sidecar_pb2
from meshctl.api.networking.v1alpha3 import workload_entry_pb2 as _workload_entry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceEntry(_message.Message):
    __slots__ = ("hosts", "addresses", "ports", "location", "resolution", "endpoints", "workload_selector", "export_to", "subject_alt_names")
    class Location(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MESH_EXTERNAL: _ClassVar[ServiceEntry.Location]
        MESH_INTERNAL: _ClassVar[ServiceEntry.Location]
    MESH_EXTERNAL: ServiceEntry.Location
    MESH_INTERNAL: ServiceEntry.Location
    class Resolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[ServiceEntry.Resolution]
        STATIC: _ClassVar[ServiceEntry.Resolution]
        DNS: _ClassVar[ServiceEntry.Resolution]
        DNS_ROUND_ROBIN: _ClassVar[ServiceEntry.Resolution]
        DYNAMIC_DNS: _ClassVar[ServiceEntry.Resolution]
    NONE: ServiceEntry.Resolution
    STATIC: ServiceEntry.Resolution
    DNS: ServiceEntry.Resolution
    DNS_ROUND_ROBIN: ServiceEntry.Resolution
    DYNAMIC_DNS: ServiceEntry.Resolution
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TO_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedScalarFieldContainer[str]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    ports: _containers.RepeatedCompositeFieldContainer[ServicePort]
    location: ServiceEntry.Location
    resolution: ServiceEntry.Resolution
    endpoints: _containers.RepeatedCompositeFieldContainer[_workload_entry_pb2.WorkloadEntry]
    workload_selector: _sidecar_pb2.WorkloadSelector
    export_to: _containers.RepeatedScalarFieldContainer[str]
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hosts: _Optional[_Iterable[str]] = ..., addresses: _Optional[_Iterable[str]] = ..., ports: _Optional[_Iterable[_Union[ServicePort, _Mapping]]] = ..., location: _Optional[_Union[ServiceEntry.Location, str]] = ..., resolution: _Optional[_Union[ServiceEntry.Resolution, str]] = ..., endpoints: _Optional[_Iterable[_Union[_workload_entry_pb2.WorkloadEntry, _Mapping]]] = ..., workload_selector: _Optional[_Union[_sidecar_pb2.WorkloadSelector, _Mapping]] = ..., export_to: _Optional[_Iterable[str]] = ..., subject_alt_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ServicePort(_message.Message):
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
