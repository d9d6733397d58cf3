"""A minimal proxy-wasm module, assembled byte by byte, for tests that need Envoy to run one.

No WebAssembly compiler is at hand where meshctl is tested, and no package ships a small
proxy-wasm module, so `header_module` writes one from the WebAssembly binary format (version 1)
directly. What it does, in proxy-wasm ABI 0.2.1 terms:

- `proxy_on_configure` copies the plugin's configuration (the `configuration` Envoy passes,
  which a WasmPlugin's `pluginConfig` becomes as a JSON string) into the VM's memory;
- `proxy_on_request_headers` adds one request header, named when the module is assembled, whose
  value is that configuration, and lets the request go on (action 0, Continue).

So a backend behind the proxy sees the header, and its value proves the configuration reached
the plugin. The module exports its memory and a bump allocator (`proxy_on_memory_allocate`):
the host asks the module for memory to copy the configuration into, once per configure.
"""

from __future__ import annotations

from typing import Final

from meshctl.xds.resources import varint as uleb  # unsigned LEB128 is protobuf's varint: every count, index and size

I32: Final = 0x7F
_FUNC_TYPE: Final = 0x60

# Instructions used below.
_END: Final = 0x0B
_CALL: Final = 0x10
_DROP: Final = 0x1A
_LOCAL_GET: Final = 0x20
_GLOBAL_GET: Final = 0x23
_GLOBAL_SET: Final = 0x24
_I32_LOAD: Final = 0x28
_I32_CONST: Final = 0x41
_I32_ADD: Final = 0x6A

#: proxy-wasm map and buffer kinds (ABI 0.2.1).
_REQUEST_HEADERS: Final = 0
_PLUGIN_CONFIGURATION: Final = 7

#: Where the module keeps things in its memory: the header name, then the two words the host
#: writes the configuration's address and size to, then the allocator's heap.
_NAME_AT: Final = 64
_CONFIG_PTR_AT: Final = 16
_CONFIG_SIZE_AT: Final = 20
_HEAP_AT: Final = 4096


def sleb(value: int) -> bytes:
    """Signed LEB128, as `i32.const` immediates are written."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _vec(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


def _name(text: str) -> bytes:
    raw = text.encode()
    return uleb(len(raw)) + raw


def _section(section_id: int, body: bytes) -> bytes:
    return bytes([section_id]) + uleb(len(body)) + body


def _func_type(params: int, results: int) -> bytes:
    return bytes([_FUNC_TYPE]) + _vec([bytes([I32])] * params) + _vec([bytes([I32])] * results)


def _const(value: int) -> bytes:
    return bytes([_I32_CONST]) + sleb(value)


def _load(address: int) -> bytes:
    return _const(address) + bytes([_I32_LOAD, 2, 0])  # align 2^2, offset 0


def _body(code: bytes) -> bytes:
    entry = _vec([]) + code + bytes([_END])  # no locals beyond the parameters
    return uleb(len(entry)) + entry


def header_module(header: str = "x-wasm-plugin") -> bytes:
    """A proxy-wasm module that adds request header `header` with the plugin's configuration as
    its value (see the module docstring)."""
    name = header.encode()
    if not name or _NAME_AT + len(name) > _HEAP_AT:
        raise ValueError("the header name must be 1 to 4,000 bytes")
    types = [
        _func_type(5, 1),  # 0: the two host calls
        _func_type(0, 0),  # 1: proxy_abi_version_0_2_1
        _func_type(1, 1),  # 2: proxy_on_memory_allocate
        _func_type(2, 0),  # 3: proxy_on_context_create
        _func_type(2, 1),  # 4: proxy_on_vm_start, proxy_on_configure
        _func_type(3, 1),  # 5: proxy_on_request_headers
    ]
    imports = [
        _name("env") + _name("proxy_add_header_map_value") + b"\x00" + uleb(0),  # function 0
        _name("env") + _name("proxy_get_buffer_bytes") + b"\x00" + uleb(0),  # function 1
    ]
    add_header, get_buffer = 0, 1
    bodies = {
        "proxy_abi_version_0_2_1": (1, b""),
        "proxy_on_memory_allocate": (
            2,
            bytes([_GLOBAL_GET, 0, _GLOBAL_GET, 0, _LOCAL_GET, 0, _I32_ADD, _GLOBAL_SET, 0]),
        ),
        "proxy_on_context_create": (3, b""),
        "proxy_on_vm_start": (4, _const(1)),
        "proxy_on_configure": (
            4,
            _const(_PLUGIN_CONFIGURATION)
            + _const(0)
            + bytes([_LOCAL_GET, 1])
            + _const(_CONFIG_PTR_AT)
            + _const(_CONFIG_SIZE_AT)
            + bytes([_CALL])
            + uleb(get_buffer)
            + bytes([_DROP])
            + _const(1),
        ),
        "proxy_on_request_headers": (
            5,
            _const(_REQUEST_HEADERS)
            + _const(_NAME_AT)
            + _const(len(name))
            + _load(_CONFIG_PTR_AT)
            + _load(_CONFIG_SIZE_AT)
            + bytes([_CALL])
            + uleb(add_header)
            + bytes([_DROP])
            + _const(0),
        ),
    }
    first = len(imports)
    exports = [_name("memory") + b"\x02" + uleb(0)]
    exports += [_name(fn) + b"\x00" + uleb(first + n) for n, fn in enumerate(bodies)]
    heap = bytes([I32, 1]) + _const(_HEAP_AT) + bytes([_END])  # a mutable i32 global
    data = b"\x00" + _const(_NAME_AT) + bytes([_END]) + uleb(len(name)) + name
    return b"".join(
        [
            b"\x00asm\x01\x00\x00\x00",
            _section(1, _vec(types)),
            _section(2, _vec(imports)),
            _section(3, _vec([uleb(t) for t, _ in bodies.values()])),
            _section(5, _vec([b"\x00" + uleb(2)])),  # memory: 2 pages (128 KiB), no maximum
            _section(6, _vec([heap])),
            _section(7, _vec(exports)),
            _section(10, _vec([_body(code) for _, code in bodies.values()])),
            _section(11, _vec([data])),
        ]
    )
