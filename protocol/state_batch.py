"""The state batch: one range of offsets in one delivery state with one delivery count.

A module of its own, apart from the merge rule (protocol/batches.py), so that the rule
can be compiled (server/native.py) while the class stays a msgspec Struct that Python
defines: the decoders read the widths from its annotations.
"""

from __future__ import annotations

import msgspec

from protocol.widths import Int8, Int16, Int64


class StateBatch(msgspec.Struct, frozen=True, gc=False):
    """``[first_offset, last_offset]`` in one delivery state with one delivery count.

    The same object from the request body to the stored state and back out in a read:
    the wire decoders check the widths; construction validates nothing (docs/semantics.md §A.1
    point 9), so the pure combiner passes odd input through exactly as Kafka does, and
    the edge checks live at the edge.
    """

    first_offset: Int64
    last_offset: Int64
    delivery_state: Int8
    delivery_count: Int16


# A batch's fields as ``msgspec.structs.astuple`` gives them, in this order: compiled code
# (server/native.py) reads several fields of a Struct in that one call, where each field
# read is otherwise a generic attribute lookup (protocol/codec.py, protocol/batches.py).
BatchFields = tuple[int, int, int, int]
BATCH_FIELD_ORDER = ("first_offset", "last_offset", "delivery_state", "delivery_count")
if StateBatch.__struct_fields__ != BATCH_FIELD_ORDER:
    raise TypeError(f"StateBatch {StateBatch.__struct_fields__} differs from BatchFields")
