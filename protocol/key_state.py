"""What a state partition keeps about each share-partition key (protocol/replay.py).

A module of its own, apart from the replay rules, so that the rules can be compiled
(server/native.py) while these stay msgspec Structs that Python defines.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from protocol.state_batch import StateBatch


class ShareGroupOffset(msgspec.Struct, frozen=True, gc=False):
    """The stored state of one share-partition (Kafka's ShareGroupOffset). Replaced,
    never changed: a reader holding the previous one keeps seeing it.

    Its batches are a tuple: a list is tracked by the garbage collector for as long as
    it lives (one per share-partition, each walked by every full collection), while
    CPython stops tracking a tuple of untracked objects (StateBatch is one) the first
    time a collection sees it."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp: int
    write_timestamp: int
    state_batches: tuple[StateBatch, ...]
    delivery_complete_count: int = -1


class KeyState(msgspec.Struct, gc=False):
    """Everything a state partition keeps about one share-partition key.

    Kafka keeps these in separate maps keyed alike (docs/semantics.md §2); one object per key is the
    same information with a fraction of the memory. Not tracked by the garbage collector
    (``gc=False``): it holds numbers, bytes and an immutable ShareGroupOffset, so it can
    never be part of a reference cycle, and a full collection need not walk one object
    per share-partition the daemon knows.
    """

    state: ShareGroupOffset
    # leaderEpochMap: highest leader epoch of any replayed record of the key.
    leader_fence: int
    # stateEpochMap: highest state epoch of any replayed snapshot; None while the key
    # was only ever built from updates (possible in a hand-made log only).
    state_fence: int | None
    # The key as the log stores it, so a write frames it without encoding it again.
    key_bytes: bytes | None = None
    # Whether state.state_batches is in the combiner's clean shape (see
    # protocol.batches.is_clean); None until someone needed to know.
    batches_clean: bool | None = None
    # snapshotUpdateCount: None until the first update (docs/semantics.md §4, §16.5).
    update_count: int | None = None
    # Offsets manager: log offset of the key's latest snapshot, None before one.
    snapshot_offset: int | None = None


# A KeyState's fields in one call, in this order: from compiled code (server/native.py)
# each field read of a Struct is Python's generic attribute lookup (163 instructions),
# and msgspec's astuple reads all seven, the tuple unpacked, for about the price of two
# or three (callgrind: the write and the replay read 9 fewer, 638 instructions saved
# per entry with the two calls). Only for a KeyState whose state is folded
# (protocol/loading.py's LazyKeyState keeps an unfolded tail in the state slot, which
# astuple would hand out as it is).
KEY_STATE_FIELDS = (
    "state",
    "leader_fence",
    "state_fence",
    "key_bytes",
    "batches_clean",
    "update_count",
    "snapshot_offset",
)
KeyFields = tuple[
    ShareGroupOffset, int, int | None, bytes | None, bool | None, int | None, int | None
]
key_fields: Callable[[KeyState], KeyFields] = msgspec.structs.astuple


def check_key_fields(struct: type[msgspec.Struct]) -> None:
    """Refuse a KeyState whose fields are not where ``key_fields``' readers take them."""
    if struct.__struct_fields__ != KEY_STATE_FIELDS:
        raise TypeError(
            f"KeyState {struct.__struct_fields__}; key_fields' readers take {KEY_STATE_FIELDS}"
        )


check_key_fields(KeyState)
