"""The PostgreSQL store's commit cycle, with and without an index on records by key
(docs/design.md#the-postgresql-store: why schema version 3 dropped it).

    python -m bench.pg_cycle [--cycles N]

Starts a primary with a synchronous standby (tests/postgres.py), opens two stores on it
(two schemas, this node leading all 50 partitions of each) and adds to one of them the
index versions 1 and 2 had, on (state_partition, key, offset). Then it commits cycles
the size of a busy batched load's (30 partitions, 27 records each: 810 records of about
120 bytes, 40 keys per partition, one record in a hundred a snapshot) through
PostgresStore.commit_cycle, the stores alternating every ``--cycles`` cycles for
ROUNDS rounds so that a busy machine slows both alike. Prints each store's cycle time
(p50, p99), records per second, and the commit thread's CPU per cycle.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field

from bench.cluster import replicated
from persistence.postgres import PostgresStore
from persistence.postgres.partition import RowBatch
from protocol.records import SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE

PARTITIONS = 50
PER_CYCLE = 30  # partitions a cycle writes
PER_PARTITION = 27  # records each
KEYS = 40  # per partition
ROUNDS = 4
LEASE_MS = 600_000


@dataclass
class Timings:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def row(self, name: str) -> str:
        wall = sorted(self.wall)
        records = PER_CYCLE * PER_PARTITION * len(wall) / sum(wall)
        p50, p99 = wall[len(wall) // 2], wall[int(len(wall) * 0.99)]
        cpu = sum(self.cpu) / len(self.cpu)
        return (
            f"| {name} | {len(wall)} | {1000 * p50:.2f} | {1000 * p99:.2f} | {records:,.0f} "
            f"| {1000 * cpu:.2f} |"
        )


class Writer:
    """Cycles of records for one store, each partition's offsets running on."""

    def __init__(self, store: PostgresStore, seed: int) -> None:
        self.store = store
        self.random = random.Random(seed)
        self.keys = [
            [f"group-{p}:0123456789abcdef0123:{k}".encode() for k in range(KEYS)]
            for p in range(PARTITIONS)
        ]
        for p in range(PARTITIONS):
            assert store.claim(p, LEASE_MS) is not None
            store.partition(p).open()

    def cycle(self) -> list[tuple[int, RowBatch]]:
        batches = []
        for p in self.random.sample(range(PARTITIONS), PER_CYCLE):
            part = self.store.partition(p)
            for _ in range(PER_PARTITION):
                snapshot = self.random.random() < 0.01
                kind = SNAPSHOT_RECORD_TYPE if snapshot else UPDATE_RECORD_TYPE
                value = self.random.randbytes(96)
                part.append(kind, self.random.choice(self.keys[p]), value, 1_700_000_000_000)
            batch = part.take_pending()
            assert batch is not None
            batches.append((p, batch))
        return batches

    def commit(self, timings: Timings) -> None:
        batches = self.cycle()
        started, cpu = time.perf_counter(), time.thread_time()
        result = self.store.commit_cycle(batches)
        timings.cpu.append(time.thread_time() - cpu)
        timings.wall.append(time.perf_counter() - started)
        if result.shared is not None or any(result.errors):
            raise SystemExit(f"a commit failed: {result.shared or result.errors}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_cycle", description=__doc__)
    parser.add_argument("--cycles", type=int, default=100, help="cycles per store per round")
    args = parser.parse_args(argv)
    with replicated() as primary:
        stores = {
            "without the index (version 3)": PostgresStore.open(
                primary.uri(), PARTITIONS, 1, schema="cycle_bare"
            ),
            "with the index on (state_partition, key, offset)": PostgresStore.open(
                primary.uri(), PARTITIONS, 1, schema="cycle_indexed"
            ),
        }
        primary.execute(
            'CREATE INDEX ON cycle_indexed.sharecoord_records (state_partition, key, "offset")'
        )
        writers = {name: Writer(store, seed) for seed, (name, store) in enumerate(stores.items())}
        timings = {name: Timings() for name in stores}
        for writer in writers.values():  # warm up: every key has its keys row
            for _ in range(20):
                writer.commit(Timings())
        for _ in range(ROUNDS):
            for name, writer in writers.items():
                for _ in range(args.cycles):
                    writer.commit(timings[name])
        for store in stores.values():
            store.close()
    print(
        f"commit cycles of {PER_CYCLE * PER_PARTITION} records ({PER_CYCLE} partitions), "
        "primary with a synchronous standby\n"
    )
    print("| store | cycles | p50 ms | p99 ms | records/s | commit thread CPU ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, timing in timings.items():
        print(timing.row(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
