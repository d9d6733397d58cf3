"""Protobuf merge as EnvoyFilter's MERGE does it, `google.protobuf.Any` included.

Plain `MergeFrom` treats an `Any` as two opaque fields, so merging `{typed_config: {"@type":
...HttpConnectionManager, stat_prefix: x}}` into a filter would replace its whole configuration.
Istio unpacks two `Any`s of the same type, merges what they hold and packs the result: so does
`merge`, at every depth. Otherwise it is protobuf's merge: set scalars replace, messages merge,
repeated fields append, map entries replace.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_ANY = "google.protobuf.Any"


def _unpack(packed: any_pb2.Any) -> Message | None:
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(packed.type_url.rpartition("/")[2])
    except KeyError:
        return None
    message = message_factory.GetMessageClass(descriptor)()
    message.ParseFromString(packed.value)
    return message


def merge(dst: Message, src: Message) -> None:
    """Merge `src` into `dst` in place."""
    if dst.DESCRIPTOR.full_name == _ANY:
        _merge_any(dst, src)
        return
    for fd, value in src.ListFields():
        target: Any = getattr(dst, fd.name)
        if fd.is_repeated:  # lists append; map entries (repeated too) replace
            target.MergeFrom(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if dst.HasField(fd.name):
                merge(target, value)
            else:
                target.CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _merge_any(dst: Any, src: Any) -> None:
    if dst.type_url != src.type_url or not dst.type_url:
        dst.CopyFrom(src)
        return
    inner, patch = _unpack(dst), _unpack(src)
    if inner is None or patch is None:
        dst.CopyFrom(src)
        return
    merge(inner, patch)
    dst.value = inner.SerializeToString(deterministic=True)
