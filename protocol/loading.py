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

The daemon loads lazily (``finish(lazy=True)``): a key whose tail holds updates is
checked and fenced at once, but its merges wait. Its state is a ``LazyKeyState``, which
folds the tail the first time anyone reads its ``state`` or ``batches_clean`` and then
becomes a plain ``KeyState``; the merges are about two thirds of a load, and a partition
serves as soon as the light pass is done, folding the rest in the background
(``PartitionRuntime``). Nothing can read a lazy key's unfolded state: every reader goes
through the two fields, and the fold is the one ``finish`` would have run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from operator import itemgetter
from typing import Any, NoReturn

import msgspec

from protocol.batches import is_clean, merge_batches, merge_one
from protocol.key_state import KeyState, ShareGroupOffset
from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    UpdateValue,
    decode_snapshot_value,
    decode_update_value,
)
from protocol.replay import snapshot_fences, update_leader_fence
from protocol.state_batch import StateBatch

# A lazy key whose tail holds more records than this, or more value bytes than the next
# (a merge copies the stored batches, so a large state costs each merge more), is folded
# off the event loop when a request first touches it (``PartitionRuntime.is_long``) or by
# the background fold. A merge of a small state costs a few microseconds: within both
# bounds an inline fold stays well inside the service's slice of the loop.
INLINE_FOLD_RECORDS = 64
INLINE_FOLD_BYTES = 16 * 1024

# (offset, timestamp, record_type, key, value): one log frame's fields, value None for a
# tombstone. A plain tuple: a loader holds a partition's worth of them.
RawRecord = tuple[int, int, int, bytes, "bytes | None"]
_VALUE = itemgetter(4)
# decode_update_value's decoder itself, for a whole tail's updates in one call
# (_update_values); a value it refuses is then named by the record-by-record path.
_DECODE_UPDATE = msgspec.msgpack.Decoder(UpdateValue).decode


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

    def finish(self, lazy: bool = False) -> tuple[list[tuple[ShareKey, KeyState]], int | None]:
        """Each live key's state, in the replay's order, and the map's tombstone offset
        (``ShareStateMap.loaded`` takes both). ``lazy``: a key with updates since its
        snapshot comes as a ``LazyKeyState``, its records checked and its fences worked
        out now, its merges left for its first reader."""
        fold = _lazy_state if lazy else _fold_tail
        return [(key, fold(entry)) for key, entry in self._live.items()], self._tombstone_offset


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
    first = tail[0]
    head = _decoded(first)
    if first[2] == SNAPSHOT_RECORD_TYPE:
        leader, state = snapshot_fences(leader, state, head)
    else:
        leader = update_leader_fence(leader, head.leader_epoch)
    updates = tail[1:]  # only updates follow the first record
    for value in _update_values(updates):
        if len(value.state_batches) % 4:
            _refuse(updates)
        if value.leader_epoch > leader:  # noqa: PLR1730 (a call per record costs)
            leader = value.leader_epoch
    entry.leader_fence, entry.state_fence = leader, state


def _update_values(updates: list[RawRecord]) -> list[Any]:
    """The values of ``updates`` decoded by one call that loops in C (two Python calls
    per record took the bench's 1M-record load 1.73 s against 1.60 s this way); where
    one does not decode, record by record as ``_decoded`` checks them, which raises at
    the first refused. Their batches are for the caller to check (``_refuse`` if one
    is not a whole number of 4-tuples)."""
    try:
        return list(map(_DECODE_UPDATE, map(_VALUE, updates)))
    except msgspec.MsgspecError:
        return list(map(_decoded, updates))


def _refuse(updates: list[RawRecord]) -> NoReturn:
    """Raise ``_decoded``'s error for the first of ``updates`` it refuses (one is)."""
    for record in updates:
        _decoded(record)
    raise AssertionError("every update passed the checks one of them failed")


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
    head = _decoded(tail[0])
    leader_fence, state_fence, snapshot_offset = _head_fences(entry, tail[0], head)
    state, clean, leader_fence = _fold(tail, head, leader_fence)
    return KeyState(
        state,
        leader_fence,
        state_fence,
        tail[0][3],
        clean,
        entry.update_count,
        snapshot_offset,
    )


def _head_fences(entry: _Key, first: RawRecord, head: Any) -> tuple[int, int | None, int | None]:
    """(leader fence, state fence, snapshot offset) once the tail's first record is
    replayed."""
    if first[2] == SNAPSHOT_RECORD_TYPE:
        leader_fence, state_fence = snapshot_fences(entry.leader_fence, entry.state_fence, head)
        return leader_fence, state_fence, first[0]
    # Created by an update: no state epoch fence, no snapshot.
    return update_leader_fence(None, head.leader_epoch), None, None


def _lazy_state(entry: _Key) -> KeyState:
    """``_fold_tail``'s KeyState but for the merges: every record of the tail decoded and
    checked now (a load refuses what it refused before), the fences worked out from
    them, the state folded by its first reader. A tail of one record, or one with a
    batch whose first offset is above its last (which only a hand-made log holds, and
    whose merge may fail), is folded at once."""
    tail = entry.tail
    assert tail is not None
    if len(tail) == 1:
        return _fold_tail(entry)
    head = _decoded(tail[0])
    if _inverted(head.state_batches):
        return _fold_tail(entry)
    leader_fence, state_fence, snapshot_offset = _head_fences(entry, tail[0], head)
    # What the fold reads: the first record, then only the values of the updates (their
    # offsets, timestamps and key copies are for the checks, done here). A node holds
    # every partition's lazy tails until the background fold: whole records took
    # ~430 more resident bytes per share-partition for good (the heap the fold frees
    # is left in pieces among the state it builds).
    updates = tail[1:]
    for value in _update_values(updates):
        flat = value.state_batches
        # What nearly every update holds, one batch, without a call.
        if len(flat) == 4:
            if flat[0] > flat[1]:
                return _fold_tail(entry)
        elif len(flat) % 4:
            _refuse(updates)
        elif _inverted(flat):
            return _fold_tail(entry)
        if value.leader_epoch > leader_fence:  # noqa: PLR1730 (a call per record costs)
            leader_fence = value.leader_epoch
    lazy: list[Any] = [tail[0]]
    lazy += map(_VALUE, updates)
    return LazyKeyState(
        lazy,  # type: ignore[arg-type]  # the state slot holds the tail until the fold
        leader_fence,
        state_fence,
        tail[0][3],
        None,
        entry.update_count,
        snapshot_offset,
    )


def _inverted(flat: list[int]) -> bool:
    return any(first > last for first, last in zip(flat[0::4], flat[1::4], strict=True))


def _fold(
    tail: list[RawRecord], head: Any, leader_fence: int
) -> tuple[ShareGroupOffset, bool | None, int]:
    """The state the tail folds to (``head``: its first record decoded), whether its
    batches are clean (None: unknown), and ``leader_fence`` raised by the updates."""
    snapshot = tail[0][2] == SNAPSHOT_RECORD_TYPE
    return fold_values(head, map(_decoded, tail[1:]), leader_fence, snapshot=snapshot)


def fold_values(
    head: Any, updates: Iterable[Any], leader_fence: int, *, snapshot: bool
) -> tuple[ShareGroupOffset, bool | None, int]:
    """``_fold`` of values already decoded and checked (compaction's, spark_jobs/fold.py):
    the state a key's tail folds to, ``head`` its first record's value (a snapshot's,
    or with ``snapshot`` False an update's that created the key), ``updates`` the
    values of the updates after it, in order; whether the batches are clean (None:
    unknown), and ``leader_fence`` raised by the updates. Each update is applied as
    ``ShareStateMap._replay_update`` applies it."""
    if snapshot:
        state_epoch = head.state_epoch
        create_timestamp, write_timestamp = head.create_timestamp, head.write_timestamp
    else:
        state_epoch = create_timestamp = write_timestamp = 0
    leader_epoch, start_offset = head.leader_epoch, head.start_offset
    delivery_complete_count = head.delivery_complete_count
    batches: list[StateBatch] = _batches(head.state_batches)
    clean: bool | None = None
    for value in updates:
        epoch = value.leader_epoch
        if epoch > leader_fence:  # noqa: PLR1730 (a call per update costs)
            leader_fence = epoch
        if epoch != -1:
            leader_epoch = epoch
        if value.start_offset != -1:
            start_offset = value.start_offset
        if clean is None:
            clean = is_clean(batches)
        flat = value.state_batches
        if clean and len(flat) == 4 and flat[0] <= flat[1]:
            # What nearly every update holds: one valid batch, into clean batches.
            batch = StateBatch(flat[0], flat[1], flat[2], flat[3])
            batches, clean = merge_one(batches, batch, start_offset)
        else:
            batches, clean = merge_batches(batches, clean, _batches(flat), start_offset)
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
    return state, clean, leader_fence


class LazyKeyState(KeyState, gc=False):
    """A loaded key's ``KeyState`` whose ``state`` (and ``batches_clean``) are not folded
    yet: its ``state`` field holds the tail. Reading either folds the tail, and the
    object becomes a plain ``KeyState`` (same fields, same layout), so a key costs its
    readers nothing once folded. Setting ``state`` replaces the tail unread, as a
    snapshot replays. Any thread may fold: the first fold to finish is kept, and a fold
    that finishes after the state has moved on is dropped (``_fold_now``)."""


def _unfolded_tail(entry: KeyState) -> list[Any] | None:
    """The tail ``entry`` still has to fold (``_lazy_state``: its first record, then the
    updates' values); None for a folded one."""
    if entry.__class__ is not LazyKeyState:
        return None
    raw = _STATE_SLOT.__get__(entry, KeyState)
    return raw if type(raw) is list else None


def unfolded_records(entry: KeyState) -> int:
    """How many records folding ``entry`` goes through: 0 for a folded one."""
    tail = _unfolded_tail(entry)
    return 0 if tail is None else len(tail)


def fold_is_long(entry: KeyState) -> bool:
    """Whether folding ``entry`` is long work (``INLINE_FOLD_RECORDS``/``_BYTES``)."""
    tail = _unfolded_tail(entry)
    if tail is None:
        return False
    if len(tail) > INLINE_FOLD_RECORDS:
        return True
    return len(tail[0][4] or b"") + sum(map(len, tail[1:])) > INLINE_FOLD_BYTES


def fold(entry: KeyState) -> None:
    """Fold ``entry`` now if it is not yet."""
    if entry.__class__ is LazyKeyState:
        _fold_now(entry)


# The fields' own slots, which LazyKeyState's properties below shadow.
_STATE_SLOT: Any = KeyState.__dict__["state"]
_CLEAN_SLOT: Any = KeyState.__dict__["batches_clean"]
# Held only to put a fold in place: a fold of the same key on two threads (a request
# offloaded to its own thread, and another one reading on the loop) keeps one.
_FOLD_LOCK = threading.Lock()


def _fold_now(entry: KeyState) -> ShareGroupOffset:
    raw = _STATE_SLOT.__get__(entry, KeyState)
    if type(raw) is list:
        first = raw[0]
        state, clean, _ = fold_values(
            _decoded(first),
            map(_DECODE_UPDATE, raw[1:]),  # checked by the load already
            entry.leader_fence,
            snapshot=first[2] == SNAPSHOT_RECORD_TYPE,
        )
        with _FOLD_LOCK:
            if _STATE_SLOT.__get__(entry, KeyState) is raw:
                _CLEAN_SLOT.__set__(entry, clean)
                _STATE_SLOT.__set__(entry, state)
                entry.__class__ = KeyState
        raw = _STATE_SLOT.__get__(entry, KeyState)
    state_now: ShareGroupOffset = raw
    return state_now


def _set_state(entry: KeyState, state: ShareGroupOffset) -> None:
    with _FOLD_LOCK:
        _STATE_SLOT.__set__(entry, state)
        _CLEAN_SLOT.__set__(entry, None)
        entry.__class__ = KeyState


def _folded_clean(entry: KeyState) -> bool | None:
    _fold_now(entry)
    clean: bool | None = _CLEAN_SLOT.__get__(entry, KeyState)
    return clean


def _set_clean(entry: KeyState, clean: bool | None) -> None:
    _fold_now(entry)
    _CLEAN_SLOT.__set__(entry, clean)


# After the class statement: a property in its body would read to msgspec as a default.
setattr(LazyKeyState, "state", property(_fold_now, _set_state))  # noqa: B010
setattr(LazyKeyState, "batches_clean", property(_folded_clean, _set_clean))  # noqa: B010
