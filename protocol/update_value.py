"""The value of a ShareUpdate as the log stores it: the record nearly every write
appends, encoded once per write.

Written out rather than generated from FIELDS (protocol/records.py generates the other
codecs there), so that the compiled mode (server/native.py) compiles it: generated code
always runs in the interpreter. protocol/records.py checks at import that FIELDS lays
the update value out in ``UPDATE_VALUE_ORDER``, the order this module writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import msgspec

if TYPE_CHECKING:
    from protocol.records import ShareUpdate
    from protocol.state_batch import StateBatch

UPDATE_VALUE_ORDER = (
    "snapshot_epoch",
    "leader_epoch",
    "start_offset",
    "state_batches",
    "delivery_complete_count",
)

# Where encode_update_value reads a ShareUpdate's fields (protocol/records.py checks at
# import that the record class has them there).
UPDATE_RECORD_FIELDS = (
    "key",
    "snapshot_epoch",
    "leader_epoch",
    "start_offset",
    "state_batches",
    "delivery_complete_count",
)

# Final: a static of the compiled module, where another module-level name is a lookup in
# the module's dict at each use.
_encode: Final = msgspec.msgpack.Encoder().encode
_fields: Final[Callable[[StateBatch], tuple[int, ...]]] = msgspec.structs.astuple


def flatten(batches: Sequence[StateBatch]) -> list[int]:
    """Batches as the log stores them: four integers each, one flat array, in the order
    of a batch's fields (``BatchFields``), which msgspec's astuple gives in one C call."""
    if len(batches) == 1:  # what nearly every update holds
        return list(_fields(batches[0]))
    return [n for b in batches for n in _fields(b)]


def encode_update_value(record: ShareUpdate) -> bytes:
    """The value bytes of a ShareUpdate."""
    # Read by position (UPDATE_RECORD_FIELDS), as objects: compiled, an int field read
    # by name is unboxed and boxed again on its way into the tuple.
    fields: tuple[object, ...] = record
    return _encode(
        (
            fields[1],
            fields[2],
            fields[3],
            flatten(record.state_batches),
            fields[5],
        )
    )
