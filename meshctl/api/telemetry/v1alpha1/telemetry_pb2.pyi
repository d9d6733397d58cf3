import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from meshctl.api.type.v1beta1 import selector_pb2 as _selector_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLIENT_AND_SERVER: _ClassVar[WorkloadMode]
    CLIENT: _ClassVar[WorkloadMode]
    SERVER: _ClassVar[WorkloadMode]
CLIENT_AND_SERVER: WorkloadMode
CLIENT: WorkloadMode
SERVER: WorkloadMode

class Telemetry(_message.Message):
    __slots__ = ("selector", "target_ref", "target_refs", "tracing", "metrics", "access_logging")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TARGET_REF_FIELD_NUMBER: _ClassVar[int]
    TARGET_REFS_FIELD_NUMBER: _ClassVar[int]
    TRACING_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ACCESS_LOGGING_FIELD_NUMBER: _ClassVar[int]
    selector: _selector_pb2.WorkloadSelector
    target_ref: _selector_pb2.PolicyTargetReference
    target_refs: _containers.RepeatedCompositeFieldContainer[_selector_pb2.PolicyTargetReference]
    tracing: _containers.RepeatedCompositeFieldContainer[Tracing]
    metrics: _containers.RepeatedCompositeFieldContainer[Metrics]
    access_logging: _containers.RepeatedCompositeFieldContainer[AccessLogging]
    def __init__(self, selector: _Optional[_Union[_selector_pb2.WorkloadSelector, _Mapping]] = ..., target_ref: _Optional[_Union[_selector_pb2.PolicyTargetReference, _Mapping]] = ..., target_refs: _Optional[_Iterable[_Union[_selector_pb2.PolicyTargetReference, _Mapping]]] = ..., tracing: _Optional[_Iterable[_Union[Tracing, _Mapping]]] = ..., metrics: _Optional[_Iterable[_Union[Metrics, _Mapping]]] = ..., access_logging: _Optional[_Iterable[_Union[AccessLogging, _Mapping]]] = ...) -> None: ...

class ProviderRef(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Tracing(_message.Message):
    __slots__ = ("match", "providers", "random_sampling_percentage", "disable_span_reporting", "custom_tags", "use_request_id_for_trace_sampling", "enable_istio_tags")
    class TracingSelector(_message.Message):
        __slots__ = ("mode",)
        MODE_FIELD_NUMBER: _ClassVar[int]
        mode: WorkloadMode
        def __init__(self, mode: _Optional[_Union[WorkloadMode, str]] = ...) -> None: ...
    class CustomTag(_message.Message):
        __slots__ = ("literal", "environment", "header")
        LITERAL_FIELD_NUMBER: _ClassVar[int]
        ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
        HEADER_FIELD_NUMBER: _ClassVar[int]
        literal: Tracing.Literal
        environment: Tracing.Environment
        header: Tracing.RequestHeader
        def __init__(self, literal: _Optional[_Union[Tracing.Literal, _Mapping]] = ..., environment: _Optional[_Union[Tracing.Environment, _Mapping]] = ..., header: _Optional[_Union[Tracing.RequestHeader, _Mapping]] = ...) -> None: ...
    class Literal(_message.Message):
        __slots__ = ("value",)
        VALUE_FIELD_NUMBER: _ClassVar[int]
        value: str
        def __init__(self, value: _Optional[str] = ...) -> None: ...
    class Environment(_message.Message):
        __slots__ = ("name", "default_value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        default_value: str
        def __init__(self, name: _Optional[str] = ..., default_value: _Optional[str] = ...) -> None: ...
    class RequestHeader(_message.Message):
        __slots__ = ("name", "default_value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        default_value: str
        def __init__(self, name: _Optional[str] = ..., default_value: _Optional[str] = ...) -> None: ...
    class CustomTagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tracing.CustomTag
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tracing.CustomTag, _Mapping]] = ...) -> None: ...
    MATCH_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    RANDOM_SAMPLING_PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    DISABLE_SPAN_REPORTING_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TAGS_FIELD_NUMBER: _ClassVar[int]
    USE_REQUEST_ID_FOR_TRACE_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ISTIO_TAGS_FIELD_NUMBER: _ClassVar[int]
    match: Tracing.TracingSelector
    providers: _containers.RepeatedCompositeFieldContainer[ProviderRef]
    random_sampling_percentage: _wrappers_pb2.DoubleValue
    disable_span_reporting: _wrappers_pb2.BoolValue
    custom_tags: _containers.MessageMap[str, Tracing.CustomTag]
    use_request_id_for_trace_sampling: _wrappers_pb2.BoolValue
    enable_istio_tags: _wrappers_pb2.BoolValue
    def __init__(self, match: _Optional[_Union[Tracing.TracingSelector, _Mapping]] = ..., providers: _Optional[_Iterable[_Union[ProviderRef, _Mapping]]] = ..., random_sampling_percentage: _Optional[_Union[_wrappers_pb2.DoubleValue, _Mapping]] = ..., disable_span_reporting: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., custom_tags: _Optional[_Mapping[str, Tracing.CustomTag]] = ..., use_request_id_for_trace_sampling: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., enable_istio_tags: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ...) -> None: ...

class MetricSelector(_message.Message):
    __slots__ = ("metric", "custom_metric", "mode")
    class IstioMetric(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALL_METRICS: _ClassVar[MetricSelector.IstioMetric]
        REQUEST_COUNT: _ClassVar[MetricSelector.IstioMetric]
        REQUEST_DURATION: _ClassVar[MetricSelector.IstioMetric]
        REQUEST_SIZE: _ClassVar[MetricSelector.IstioMetric]
        RESPONSE_SIZE: _ClassVar[MetricSelector.IstioMetric]
        TCP_OPENED_CONNECTIONS: _ClassVar[MetricSelector.IstioMetric]
        TCP_CLOSED_CONNECTIONS: _ClassVar[MetricSelector.IstioMetric]
        TCP_SENT_BYTES: _ClassVar[MetricSelector.IstioMetric]
        TCP_RECEIVED_BYTES: _ClassVar[MetricSelector.IstioMetric]
        GRPC_REQUEST_MESSAGES: _ClassVar[MetricSelector.IstioMetric]
        GRPC_RESPONSE_MESSAGES: _ClassVar[MetricSelector.IstioMetric]
    ALL_METRICS: MetricSelector.IstioMetric
    REQUEST_COUNT: MetricSelector.IstioMetric
    REQUEST_DURATION: MetricSelector.IstioMetric
    REQUEST_SIZE: MetricSelector.IstioMetric
    RESPONSE_SIZE: MetricSelector.IstioMetric
    TCP_OPENED_CONNECTIONS: MetricSelector.IstioMetric
    TCP_CLOSED_CONNECTIONS: MetricSelector.IstioMetric
    TCP_SENT_BYTES: MetricSelector.IstioMetric
    TCP_RECEIVED_BYTES: MetricSelector.IstioMetric
    GRPC_REQUEST_MESSAGES: MetricSelector.IstioMetric
    GRPC_RESPONSE_MESSAGES: MetricSelector.IstioMetric
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METRIC_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    metric: MetricSelector.IstioMetric
    custom_metric: str
    mode: WorkloadMode
    def __init__(self, metric: _Optional[_Union[MetricSelector.IstioMetric, str]] = ..., custom_metric: _Optional[str] = ..., mode: _Optional[_Union[WorkloadMode, str]] = ...) -> None: ...

class MetricsOverrides(_message.Message):
    __slots__ = ("match", "disabled", "tag_overrides")
    class TagOverride(_message.Message):
        __slots__ = ("operation", "value")
        class Operation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            UPSERT: _ClassVar[MetricsOverrides.TagOverride.Operation]
            REMOVE: _ClassVar[MetricsOverrides.TagOverride.Operation]
        UPSERT: MetricsOverrides.TagOverride.Operation
        REMOVE: MetricsOverrides.TagOverride.Operation
        OPERATION_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        operation: MetricsOverrides.TagOverride.Operation
        value: str
        def __init__(self, operation: _Optional[_Union[MetricsOverrides.TagOverride.Operation, str]] = ..., value: _Optional[str] = ...) -> None: ...
    class TagOverridesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetricsOverrides.TagOverride
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetricsOverrides.TagOverride, _Mapping]] = ...) -> None: ...
    MATCH_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    TAG_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    match: MetricSelector
    disabled: _wrappers_pb2.BoolValue
    tag_overrides: _containers.MessageMap[str, MetricsOverrides.TagOverride]
    def __init__(self, match: _Optional[_Union[MetricSelector, _Mapping]] = ..., disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., tag_overrides: _Optional[_Mapping[str, MetricsOverrides.TagOverride]] = ...) -> None: ...

class Metrics(_message.Message):
    __slots__ = ("providers", "overrides", "reporting_interval")
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    REPORTING_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[ProviderRef]
    overrides: _containers.RepeatedCompositeFieldContainer[MetricsOverrides]
    reporting_interval: _duration_pb2.Duration
    def __init__(self, providers: _Optional[_Iterable[_Union[ProviderRef, _Mapping]]] = ..., overrides: _Optional[_Iterable[_Union[MetricsOverrides, _Mapping]]] = ..., reporting_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AccessLogging(_message.Message):
    __slots__ = ("match", "providers", "disabled", "filter")
    class LogSelector(_message.Message):
        __slots__ = ("mode",)
        MODE_FIELD_NUMBER: _ClassVar[int]
        mode: WorkloadMode
        def __init__(self, mode: _Optional[_Union[WorkloadMode, str]] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("expression",)
        EXPRESSION_FIELD_NUMBER: _ClassVar[int]
        expression: str
        def __init__(self, expression: _Optional[str] = ...) -> None: ...
    MATCH_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    match: AccessLogging.LogSelector
    providers: _containers.RepeatedCompositeFieldContainer[ProviderRef]
    disabled: _wrappers_pb2.BoolValue
    filter: AccessLogging.Filter
    def __init__(self, match: _Optional[_Union[AccessLogging.LogSelector, _Mapping]] = ..., providers: _Optional[_Iterable[_Union[ProviderRef, _Mapping]]] = ..., disabled: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., filter: _Optional[_Union[AccessLogging.Filter, _Mapping]] = ...) -> None: ...
