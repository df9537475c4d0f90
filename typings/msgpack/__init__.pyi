# Minimal type stubs for the parts of msgpack that sharecoord uses (msgpack ships none).
from collections.abc import Callable
from typing import Any

class ExtType:
    code: int
    data: bytes

class UnpackException(Exception): ...
class FormatError(ValueError, UnpackException): ...
class StackError(ValueError, UnpackException): ...
class ExtraData(ValueError):
    unpacked: Any
    extra: bytes

def packb(
    o: Any,
    *,
    default: Callable[[Any], Any] | None = ...,
    use_bin_type: bool = ...,
    strict_types: bool = ...,
    datetime: bool = ...,
) -> bytes: ...
def unpackb(
    packed: bytes | bytearray | memoryview,
    *,
    raw: bool = ...,
    use_list: bool = ...,
    strict_map_key: bool = ...,
    max_buffer_size: int = ...,
    max_str_len: int = ...,
    max_bin_len: int = ...,
    max_array_len: int = ...,
    max_map_len: int = ...,
    max_ext_len: int = ...,
    object_hook: Callable[[dict[Any, Any]], Any] | None = ...,
    list_hook: Callable[[list[Any]], Any] | None = ...,
    unicode_errors: str | None = ...,
) -> Any: ...

class Packer:
    def __init__(self, *, use_bin_type: bool = ..., autoreset: bool = ...) -> None: ...
    def pack(self, obj: Any) -> bytes: ...

class Unpacker:
    def __init__(
        self,
        file_like: Any = ...,
        *,
        raw: bool = ...,
        use_list: bool = ...,
        max_buffer_size: int = ...,
    ) -> None: ...
    def feed(self, next_bytes: bytes) -> None: ...
    def __iter__(self) -> Unpacker: ...
    def __next__(self) -> Any: ...
    def unpack(self) -> Any: ...
    def skip(self) -> None: ...
    def read_array_header(self) -> int: ...
    def read_map_header(self) -> int: ...
