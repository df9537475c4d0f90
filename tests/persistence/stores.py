"""Both state stores behind the seam (persistence/store.py), opened the same way for the
contract tests: the local log in a data directory, and the PostgreSQL store in a
schema of its own on the session's server (this node claims every partition first).

Everything here blocks; async tests call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from persistence import LogRecord, StateLog
from persistence.postgres import PostgresStore
from persistence.store import StateStore, open_in_runs
from protocol.loading import RawRecord
from protocol.records import SNAPSHOT_RECORD_TYPE
from tests.postgres import PostgresServer

STORES = ("local", "postgres")
LEASE_MS = 60_000
_schemas = itertools.count()


def fresh_schema() -> str:
    return f"t{os.getpid()}_{next(_schemas)}"


@dataclass
class StoreOpener:
    """Opens one store again and again (a restart), every partition opened, and hands
    each record replayed at open to ``replayed``."""

    kind: str
    num_partitions: int
    open_store: Callable[[], StateStore[Any]]
    opened: list[StateStore[Any]] = field(default_factory=list)

    def open(self, replayed: dict[int, list[LogRecord]] | None = None) -> StateStore[Any]:
        store = self.open_store()
        self.opened.append(store)
        for p in range(self.num_partitions):
            sink = replayed.setdefault(p, []) if replayed is not None else []
            store.partition(p).open(sink.append)
        return store

    def open_in_runs(self, replayed: dict[int, list[RawRecord]]) -> StateStore[Any]:
        """``open``, each partition loaded the way a runtime loads it: in runs of plain
        tuples (``persistence.store.open_in_runs``)."""
        store = self.open_store()
        self.opened.append(store)
        for p in range(self.num_partitions):
            open_in_runs(store.partition(p), replayed.setdefault(p, []).extend)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def local_opener(data_dir: str, num_partitions: int, segment_bytes: int) -> StoreOpener:
    def open_store() -> StateStore[Any]:
        return StateLog.open(data_dir, num_partitions, segment_bytes=segment_bytes)

    return StoreOpener("local", num_partitions, open_store)


def postgres_opener(
    uri: str, num_partitions: int, schema: str | None = None, node_id: int = 1
) -> StoreOpener:
    """The first open claims every partition; later ones lead with the same epochs."""
    schema = schema or fresh_schema()
    epochs: dict[int, int] = {}

    def open_store() -> StateStore[Any]:
        store = PostgresStore.open(uri, num_partitions, node_id, schema=schema)
        for p in range(num_partitions):
            if p in epochs:
                store.lead(p, epochs[p])
            else:
                epoch = store.claim(p, LEASE_MS)
                assert epoch is not None, f"state partition {p} has a live lease already"
                epochs[p] = epoch
        return store

    return StoreOpener("postgres", num_partitions, open_store)


def opener(
    kind: str,
    data_dir: str,
    server: PostgresServer | None,
    num_partitions: int,
    segment_bytes: int = 1 << 20,
) -> StoreOpener:
    if kind == "local":
        return local_opener(data_dir, num_partitions, segment_bytes)
    assert server is not None
    return postgres_opener(server.uri(), num_partitions)


def from_last_snapshot(records: Iterable[LogRecord]) -> list[LogRecord]:
    """The records a load needs: each key's from its last snapshot (record type 0) on,
    in offset order."""
    records = sorted(records, key=lambda r: r.offset)
    last_snapshot: dict[bytes, int] = {}
    for record in records:
        if record.record_type == SNAPSHOT_RECORD_TYPE:
            last_snapshot[record.key] = record.offset
    return [r for r in records if r.offset >= last_snapshot.get(r.key, -1)]
