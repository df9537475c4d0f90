"""Loading a state partition: each key replayed from its last snapshot only.

A snapshot replaces a key's whole state (docs/semantics.md §4), so the records of a key
before its last snapshot (or tombstone) cannot change the state a replay of the whole log
reaches, but for three things a replay carries across them:

* the fencing maxima (docs/semantics.md §2, §4.1-2, §A): the highest leader epoch of any
  record and the highest state epoch of any snapshot since the key's last tombstone;
* the snapshot-update counter (§4.4, §16.5), which a snapshot resets only once it reached
  the limit: it counts every update since the key appeared, reset by such snapshots;
* the order in which the keys appeared (a dict's order: the maintenance jobs append their
  records in it).

``StateLoader`` reads the records in offset order in one light pass that keeps, per key,
just those three and the records since its last snapshot (the *tail*); records that
retire from a tail are decoded (so a value the replay would refuse is refused all the
same) and only their epochs looked at. ``finish`` then folds each tail: the snapshot it
starts with, then its updates merged one by one by ``protocol.batches.merge_batches``,
the replay's own merge, without the record, state and tuple objects a replay builds for
every update. The result is, field for field and in the same key order, the
``ShareStateMap`` a replay of every record gives (tests/protocol/test_loading.py holds the
two equal over random logs).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from protocol.batches import StateBatch, is_clean, merge_batches
from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    decode_snapshot_value,
    decode_update_value,
)
from protocol.replay import KeyState, ShareGroupOffset, snapshot_fences, update_leader_fence

# (offset, timestamp, record_type, key, value): one log frame's fields, value None for a
# tombstone. A plain tuple: a loader holds a partition's worth of them.
RawRecord = tuple[int, int, int, bytes, "bytes | None"]


class LoadDecodeError(RecordDecodeError):
    """A record whose checksum holds but that is no valid record, at ``offset``."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class _Key:
    """What the light pass keeps of one key. ``tail`` is None while the key has no state
    (never seen, or tombstoned); else its last snapshot (or the update that created it)
    and the updates since. ``leader_fence``/``state_fence``: the fences of the records
    retired from the tail since the key appeared. ``update_count``: the replay's
    snapshot-update counter."""

    __slots__ = ("key", "leader_fence", "state_fence", "tail", "update_count")

    def __init__(self, key: ShareKey) -> None:
        self.key = key
        self.tail: list[RawRecord] | None = None
        self.leader_fence: int | None = None
        self.state_fence: int | None = None
        self.update_count: int | None = None


class StateLoader:
    """Records in (``add``, in offset order, as often as the reader likes), the replayed
    state out (``finish``)."""

    def __init__(self, records_per_snapshot: int) -> None:
        self.records_per_snapshot = records_per_snapshot
        self.record_count = 0
        self._decoder = RecordDecoder()
        self._by_bytes: dict[bytes, _Key] = {}
        self._by_key: dict[ShareKey, _Key] = {}
        # The keys that have state, in the order the replay's map holds them.
        self._live: dict[ShareKey, _Key] = {}
        # ShareStateMap's: the offset of the last snapshot-or-tombstone if a tombstone.
        self._tombstone_offset: int | None = None

    def add(self, records: Iterable[RawRecord]) -> None:
        """The light pass over the next records of the log."""
        by_bytes = self._by_bytes
        live = self._live
        limit = self.records_per_snapshot
        count = 0
        for record in records:
            count += 1
            offset, _, record_type, key, value = record
            entry = by_bytes.get(key)
            if entry is None:
                entry = self._entry(offset, key)
            if record_type == UPDATE_RECORD_TYPE:
                if value is None:
                    raise LoadDecodeError(offset, "a ShareUpdate record has a null value")
                tail = entry.tail
                if tail is None:  # the update creates the key (a hand-made log only)
                    entry.tail = [record]
                    live[entry.key] = entry
                else:
                    tail.append(record)
                updates = entry.update_count
                entry.update_count = 0 if updates is None else updates + 1
            elif record_type != SNAPSHOT_RECORD_TYPE:
                raise LoadDecodeError(offset, f"unknown record type {record_type}")
            elif value is None:  # a tombstone clears everything the key had
                if entry.tail is not None:
                    _retire(entry, entry.tail)  # decoded all the same: checked as replayed
                    entry.tail = None
                    entry.leader_fence = entry.state_fence = entry.update_count = None
                    del live[entry.key]
                self._tombstone_offset = offset
            else:
                tail = entry.tail
                if tail is None:
                    live[entry.key] = entry
                else:
                    _retire(entry, tail)
                    updates = entry.update_count
                    if updates is not None and updates >= limit:
                        entry.update_count = 0
                entry.tail = [record]
                self._tombstone_offset = None
        self.record_count += count

    def _entry(self, offset: int, key: bytes) -> _Key:
        """The key's entry, for key bytes seen first: keys are told apart by what they
        decode to, as the replay's map tells them apart."""
        try:
            share_key = self._decoder.decode_key(key)
        except RecordDecodeError as exc:
            raise LoadDecodeError(offset, str(exc)) from None
        entry = self._by_key.get(share_key)
        if entry is None:
            entry = self._by_key[share_key] = _Key(share_key)
        self._by_bytes[key] = entry
        return entry

    def finish(self) -> tuple[list[tuple[ShareKey, KeyState]], int | None]:
        """Each live key's state, in the replay's order, and the map's tombstone offset
        (``ShareStateMap.loaded`` takes both)."""
        return [
            (key, _fold_tail(entry)) for key, entry in self._live.items()
        ], self._tombstone_offset


def _decoded(record: RawRecord) -> Any:
    """A record's value as its layout (a SnapshotValue or an UpdateValue), checked as the
    record decoder checks it."""
    offset, _, record_type, _, value = record
    assert value is not None
    decoded: Any
    try:
        if record_type == UPDATE_RECORD_TYPE:
            decoded = decode_update_value(value)
        else:
            decoded = decode_snapshot_value(value)
    except RecordDecodeError as exc:
        raise LoadDecodeError(offset, str(exc)) from None
    if len(decoded.state_batches) % 4:
        raise LoadDecodeError(offset, "state_batches is not a flat array of 4-tuples")
    return decoded


def _retire(entry: _Key, tail: list[RawRecord]) -> None:
    """A snapshot replaces the tail: what it leaves behind is its fences."""
    leader, state = entry.leader_fence, entry.state_fence
    for record in tail:
        value = _decoded(record)
        if record[2] == SNAPSHOT_RECORD_TYPE:
            leader, state = snapshot_fences(leader, state, value)
        else:
            leader = update_leader_fence(leader, value.leader_epoch)
    entry.leader_fence, entry.state_fence = leader, state


def _batches(flat: list[int]) -> list[StateBatch]:
    if len(flat) == 4:  # what nearly every update holds
        return [StateBatch(flat[0], flat[1], flat[2], flat[3])]
    fields = iter(flat)
    return list(map(StateBatch, fields, fields, fields, fields))


def _fold_tail(entry: _Key) -> KeyState:
    """The KeyState a replay leaves: the tail's first record as the replay takes it, then
    each update as ``ShareStateMap._replay_update`` applies it."""
    tail = entry.tail
    assert tail is not None
    first = tail[0]
    head = _decoded(first)
    snapshot_offset: int | None
    if first[2] == SNAPSHOT_RECORD_TYPE:
        leader_fence, state_fence = snapshot_fences(entry.leader_fence, entry.state_fence, head)
        state_epoch = head.state_epoch
        create_timestamp, write_timestamp = head.create_timestamp, head.write_timestamp
        snapshot_offset = first[0]
    else:  # created by an update: no state epoch fence, no snapshot
        leader_fence, state_fence = update_leader_fence(None, head.leader_epoch), None
        state_epoch = create_timestamp = write_timestamp = 0
        snapshot_offset = None
    leader_epoch, start_offset = head.leader_epoch, head.start_offset
    delivery_complete_count = head.delivery_complete_count
    batches: list[StateBatch] = _batches(head.state_batches)
    clean: bool | None = None
    for record in tail[1:]:
        value = _decoded(record)
        epoch = value.leader_epoch
        leader_fence = max(leader_fence, epoch)
        if epoch != -1:
            leader_epoch = epoch
        if value.start_offset != -1:
            start_offset = value.start_offset
        if clean is None:
            clean = is_clean(batches)
        batches, clean = merge_batches(batches, clean, _batches(value.state_batches), start_offset)
        if value.delivery_complete_count != -1:
            delivery_complete_count = value.delivery_complete_count
    state = ShareGroupOffset(
        head.snapshot_epoch,
        state_epoch,
        leader_epoch,
        start_offset,
        create_timestamp,
        write_timestamp,
        tuple(batches),
        delivery_complete_count,
    )
    return KeyState(
        state,
        leader_fence,
        state_fence,
        first[3],
        clean,
        entry.update_count,
        snapshot_offset,
    )
