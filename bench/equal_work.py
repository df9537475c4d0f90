"""Equal-work peers: PostgreSQL and Redis doing per write what sharecoord does.

The blind-overwrite peers (bench/peers.py) only replace a blob. These keep the state
sharecoord keeps for a share-partition and do, in one transaction or one function call,
what a write does to it: fence the epochs (docs/semantics.md §5.3), merge the new batches
into the stored ones with Kafka's combiner (§7), count updates towards the snapshot
cadence (§6) and store the result. PostgreSQL runs it as PL/pgSQL (bench/equal_work.sql)
with synchronous_commit on; Redis as a function library (bench/equal_work.lua) with
appendfsync always.

They replay the very request bodies wrk sends sharecoord (bench/workload.py's files), in
file order, at the same concurrencies; bench/replay.py drives them from pre-built wire
requests. Before the timed runs each peer replays a sample of those writes on fresh
state and must end up with the state sharecoord's own shard computes for them, field
for field and batch for batch; otherwise the run stops.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bench.loadgen import LoadResult
from bench.system import generator_cpus, pinned, python_env
from bench.wire import (
    INT4,
    INT4_ARRAY,
    INT8,
    INT8_ARRAY,
    TEXT,
    PgConnection,
    RedisConnection,
    RespError,
    pg_array,
    pg_error,
    pg_execute,
    pg_parse_array,
    pg_prepare,
    pg_rows,
    pg_startup,
    resp_command,
    resp_parse,
)
from bench.workload import (
    GROUPS,
    PARTITIONS_PER_GROUP,
    TOPIC_ID,
    Body,
    group_name,
    load_bodies,
    write_frames,
)
from protocol.messages import InitializePartition, WritePartition
from protocol.records import ShareKey
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch

HERE = Path(__file__).resolve().parent
SAMPLE_SINGLE = 300  # single-entry bodies replayed for the equality check
SAMPLE_BATCHED = 10  # and 50-entry ones (500 entries)

Batch = tuple[int, int, int, int]  # first, last, state, count
Key = tuple[str, str, int]  # group, topic, partition


@dataclass(frozen=True)
class Entry:
    """One partition entry of a write request."""

    group_id: str
    topic_id: str
    partition: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    batches: tuple[Batch, ...]

    @property
    def key(self) -> Key:
        return self.group_id, self.topic_id, self.partition

    def flat_batches(self) -> list[int]:
        return [n for batch in self.batches for n in batch]


@dataclass(frozen=True)
class KeyView:
    """What the equality check compares: the stored state and what sharecoord keeps
    beside it (fences, update counter; None where it keeps none)."""

    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    leader_fence: int
    state_fence: int | None
    update_count: int | None
    batches: tuple[Batch, ...]


def body_entries(body: Body) -> list[Entry]:
    return [
        Entry(
            body["group_id"],
            topic["topic_id"],
            p["partition"],
            p["state_epoch"],
            p["leader_epoch"],
            p["start_offset"],
            p.get("delivery_complete_count", -1),
            tuple(
                (b["first_offset"], b["last_offset"], b["delivery_state"], b["delivery_count"])
                for b in p["state_batches"]
            ),
        )
        for topic in body["topics"]
        for p in topic["partitions"]
    ]


def library(name: str, records_per_snapshot: int) -> str:
    """bench/equal_work.{sql,lua} with sharecoord's snapshot cadence filled in."""
    text = (HERE / name).read_text()
    return text.replace("@RECORDS_PER_SNAPSHOT@", str(records_per_snapshot))


# --- what sharecoord computes -------------------------------------------------------------


def sharecoord_states(
    entries: Sequence[Entry],
    records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT,
    initialized: Iterable[Key] | None = None,
) -> tuple[list[int], dict[Key, KeyView]]:
    """Error codes and final states when sharecoord's shard takes these writes in order.
    The keys in `initialized` (by default every key written) are first initialized with
    state epoch 0 and start offset 0, as the benchmark seeds them."""
    shard = ShareCoordinatorShard(ShardConfig(records_per_snapshot=records_per_snapshot))
    offset = 0
    if initialized is None:
        initialized = dict.fromkeys(e.key for e in entries)
    for group, topic, partition in initialized:
        record, _ = shard.initialize(
            ShareKey(group, topic, partition), InitializePartition(partition, 0, 0)
        )
        assert record is not None
        shard.replay(offset, record)
        offset += 1
    codes = []
    for e in entries:
        record, result = shard.write(
            ShareKey(*e.key),
            WritePartition(
                e.partition,
                e.state_epoch,
                e.leader_epoch,
                e.start_offset,
                [StateBatch(*b) for b in e.batches],
                e.delivery_complete_count,
            ),
        )
        codes.append(result.error_code)
        if record is not None:
            shard.replay(offset, record)
            offset += 1
    states = {}
    for share_key in shard:
        state = shard.key_state(share_key)
        assert state is not None
        stored = state.state
        states[share_key.group_id, share_key.topic_id, share_key.partition] = KeyView(
            stored.snapshot_epoch,
            stored.state_epoch,
            stored.leader_epoch,
            stored.start_offset,
            stored.delivery_complete_count,
            state.leader_fence,
            state.state_fence,
            state.update_count,
            tuple(
                (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                for b in stored.state_batches
            ),
        )
    return codes, states


def differences(peer: dict[Key, KeyView], expected: dict[Key, KeyView]) -> list[str]:
    """Every key whose state differs, or that only one side has."""
    return [
        f"{key}: peer {peer.get(key)}, sharecoord {expected.get(key)}"
        for key in sorted(peer.keys() | expected.keys())
        if peer.get(key) != expected.get(key)
    ]


# --- the peers ----------------------------------------------------------------------------


def _group_of(entries: Sequence[Entry]) -> tuple[str, str]:
    group, topic = entries[0].group_id, entries[0].topic_id
    if any((e.group_id, e.topic_id) != (group, topic) for e in entries):
        raise ValueError("a batched write covers one group and one topic")
    return group, topic


class PostgresPeer:
    """PL/pgSQL in a PostgreSQL reached on `port` (bench.peers.postgres starts one)."""

    protocol = "pg"
    WRITE_ONE = "write_one"
    WRITE_MANY = "write_many"
    STATEMENTS = (
        (WRITE_ONE, "SELECT write_share_state($1, $2, $3, $4, $5, $6, $7, $8)",
         (TEXT, TEXT, INT4, INT4, INT4, INT8, INT4, INT8_ARRAY)),
        (WRITE_MANY, "SELECT write_share_states($1, $2, $3, $4, $5, $6, $7, $8, $9)",
         (TEXT, TEXT, INT4_ARRAY, INT4_ARRAY, INT4_ARRAY, INT8_ARRAY, INT4_ARRAY, INT4_ARRAY,
          INT8_ARRAY)),
    )  # fmt: skip

    def __init__(self, port: int, records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT):
        self.port = port
        self.conn = PgConnection(port)
        self.conn.query(library("equal_work.sql", records_per_snapshot))
        for name, sql, types in self.STATEMENTS:
            self.conn.prepare(name, sql, types)

    def setup_steps(self) -> list[bytes]:
        """What each generator connection sends before its first write."""
        steps = [pg_startup(PgConnection.USER, PgConnection.DATABASE)]
        return steps + [pg_prepare(name, sql, types) for name, sql, types in self.STATEMENTS]

    def reset(self, groups: int = GROUPS, partitions: int = PARTITIONS_PER_GROUP) -> None:
        """Every benchmark share-partition freshly initialized: epochs 0, start offset 0."""
        self.conn.query("TRUNCATE share_partition_state")
        failed = self.conn.query(
            "SELECT count(*) FROM (SELECT initialize_share_state("
            f"'bench-group-' || g, '{TOPIC_ID}', p, 0, 0) AS code "
            f"FROM generate_series(0, {groups - 1}) g, "
            f"generate_series(0, {partitions - 1}) p) i WHERE code <> 0"
        )
        if failed != [["0"]]:
            raise RuntimeError(f"initialize_share_state failed for {failed} share-partitions")

    @classmethod
    def request(cls, entries: Sequence[Entry]) -> bytes:
        """One write request: write_share_state for one entry, else write_share_states."""
        if len(entries) == 1:
            e = entries[0]
            return pg_execute(
                cls.WRITE_ONE,
                [e.group_id, e.topic_id, str(e.partition), str(e.state_epoch),
                 str(e.leader_epoch), str(e.start_offset), str(e.delivery_complete_count),
                 pg_array(e.flat_batches())],
            )  # fmt: skip
        group, topic = _group_of(entries)
        return pg_execute(
            cls.WRITE_MANY,
            [group, topic, pg_array([e.partition for e in entries]),
             pg_array([e.state_epoch for e in entries]),
             pg_array([e.leader_epoch for e in entries]),
             pg_array([e.start_offset for e in entries]),
             pg_array([e.delivery_complete_count for e in entries]),
             pg_array([len(e.batches) for e in entries]),
             pg_array([n for e in entries for n in e.flat_batches()])],
        )  # fmt: skip

    @staticmethod
    def codes(reply: bytes) -> list[int]:
        error = pg_error(reply)
        if error is not None:
            raise RuntimeError(f"PostgreSQL: {error}")
        return pg_parse_array(str(pg_rows(reply)[0][0]))

    def states(self, keys: Iterable[Key]) -> dict[Key, KeyView]:
        """The stored state of those of `keys` that have one."""
        wanted = set(keys)
        rows = self.conn.query(
            "SELECT group_id, topic_id, partition, snapshot_epoch, state_epoch, leader_epoch, "
            "start_offset, delivery_complete_count, leader_fence, state_fence, update_count, "
            "state_batches FROM share_partition_state"
        )
        out = {}
        for group, topic, partition, *numbers, batches in rows:
            key = (str(group), str(topic), int(str(partition)))
            if key in wanted:
                ints = [None if n is None else int(n) for n in numbers]
                out[key] = _view(ints, pg_parse_array(str(batches)))
        return out


def redis_key(group_id: str, topic_id: str, partition: int) -> str:
    """The group as hash tag: a batched call's keys share one slot, as a cluster needs."""
    return f"ss:{{{group_id}}}:{topic_id}:{partition}"


class RedisPeer:
    """The function library in a Redis reached on `port` (bench.peers.redis starts one)."""

    protocol = "redis"

    def __init__(self, port: int, records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT):
        self.port = port
        self.conn = RedisConnection(port)
        self.conn.call(
            "FUNCTION", "LOAD", "REPLACE", library("equal_work.lua", records_per_snapshot)
        )

    def setup_steps(self) -> list[bytes]:
        return []

    def reset(self, groups: int = GROUPS, partitions: int = PARTITIONS_PER_GROUP) -> None:
        keys = [[redis_key(group_name(g), TOPIC_ID, p) for p in range(partitions)]
                for g in range(groups)]  # fmt: skip
        self.conn.pipeline([resp_command("UNLINK", *group) for group in keys])
        replies = self.conn.pipeline(
            [resp_command("FCALL", "share_initialize", len(group), *group, 0, 0) for group in keys]
        )
        if any(reply != [0] * partitions for reply in replies):
            raise RuntimeError(f"share_initialize failed: {replies[:3]}")

    @staticmethod
    def request(entries: Sequence[Entry]) -> bytes:
        """One FCALL: share_write for one entry, else share_write_many."""
        args: list[str | int] = []
        for e in entries:
            args += [e.state_epoch, e.leader_epoch, e.start_offset, e.delivery_complete_count]
            args += [len(e.batches), *e.flat_batches()]
        keys = [redis_key(*e.key) for e in entries]
        if len(entries) == 1:
            return resp_command("FCALL", "share_write", 1, *keys, *args)
        _group_of(entries)
        return resp_command("FCALL", "share_write_many", len(keys), *keys, *args)

    @staticmethod
    def codes(reply: bytes) -> list[int]:
        parsed = resp_parse(reply)
        assert parsed is not None
        value = parsed[0]
        if isinstance(value, RespError):
            raise RuntimeError(f"Redis: {value}")
        return [int(v) for v in value] if isinstance(value, list) else [int(value)]  # type: ignore[arg-type]

    def states(self, keys: Iterable[Key]) -> dict[Key, KeyView]:
        wanted = list(keys)
        values = self.conn.pipeline([resp_command("GET", redis_key(*key)) for key in wanted])
        out = {}
        for key, raw in zip(wanted, values, strict=True):
            if isinstance(raw, bytes):
                numbers = [int(n) for n in msgpack.unpackb(raw)]
                header = numbers[:8]
                out[key] = _view([*header[:7], None if header[7] == -1 else header[7]], numbers[8:])
        return out


Peer = PostgresPeer | RedisPeer


def _view(header: Sequence[int | None], flat: Sequence[int]) -> KeyView:
    """A KeyView from a peer's stored numbers: the eight fields in KeyView's order (only
    the fences' state epoch and the update counter may be None), then the batches, flat."""
    required = [n for n in header[:6] if n is not None]
    if len(required) != 6:
        raise ValueError(f"a peer stored null in a required field: {header}")
    snapshot_epoch, state_epoch, leader_epoch, start_offset, dcc, leader_fence = required
    return KeyView(
        snapshot_epoch,
        state_epoch,
        leader_epoch,
        start_offset,
        dcc,
        leader_fence,
        header[6],
        header[7],
        tuple((flat[i], flat[i + 1], flat[i + 2], flat[i + 3]) for i in range(0, len(flat), 4)),
    )


def check_equal_results(peer: Peer, bodies: Sequence[Body], name: str) -> int:
    """Replay `bodies` on fresh peer state, one request at a time, and compare the error
    codes and the states with sharecoord's; raise on any difference. Returns the number
    of entries checked."""
    peer.reset()
    entries: list[Entry] = []
    codes: list[int] = []
    for body in bodies:
        request_entries = body_entries(body)
        entries += request_entries
        codes += peer.codes(peer.conn.request(peer.request(request_entries)))
    want_codes, want_states = sharecoord_states(entries)
    problems = differences(peer.states(want_states), want_states)
    if codes != want_codes:
        problems.insert(
            0, f"error codes differ: peer {codes[:20]}..., sharecoord {want_codes[:20]}..."
        )
    if problems:
        raise RuntimeError(
            f"EQUAL-WORK CHECK FAILED: {name} does not store what sharecoord stores after "
            f"the same {len(entries)} writes ({len(problems)} differences):\n"
            + "\n".join(problems[:10])
        )
    return len(entries)


def run_replay(
    name: str,
    peer: Peer,
    requests: Path,
    setup: Path,
    *,
    server_pid: int,
    concurrency: int,
    duration_s: float,
    items_per_request: int,
) -> LoadResult:
    out = requests.with_suffix(f".c{concurrency}.json")
    argv = pinned(
        generator_cpus(),
        [sys.executable, "-m", "bench.replay", "--protocol", peer.protocol,
         "--port", str(peer.port), "--requests", str(requests), "--setup", str(setup),
         "--concurrency", str(concurrency), "--duration", f"{duration_s:g}",
         "--server-pid", str(server_pid), "--out", str(out)],
    )  # fmt: skip
    done = subprocess.run(
        argv,
        env=python_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=duration_s + 300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.replay failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(out.read_text())
    if found["errors"]:
        raise RuntimeError(
            f"{name} c={concurrency}: {found['errors']} writes failed, the first with "
            f"{found['first_error']}; a benchmark of errors measures nothing"
        )
    return LoadResult(
        name=name,
        concurrency=concurrency,
        requests_per_s=found["requests_per_s"],
        p50_ms=found["p50_ms"],
        p99_ms=found["p99_ms"],
        requests=found["requests"],
        non_2xx=0,
        errors=0,
        server_cpu=round(found["server_cpu"], 3),
        generator_cpu=round(found["generator_cpu"], 3),
        items_per_request=items_per_request,
    )


def scenarios(
    peer: Peer,
    name: str,
    server_pid: int,
    body_files: dict[str, Path],
    work: Path,
    duration_s: float,
) -> list[LoadResult]:
    """The equality check, then sharecoord's write scenarios replayed against `peer`:
    one entry per request at c=1/16/64, fifty per request at c=16/64."""
    single = load_bodies(body_files["write"])
    batched = load_bodies(body_files["write_batch"])
    checked = check_equal_results(peer, single[:SAMPLE_SINGLE] + batched[:SAMPLE_BATCHED], name)
    print(f"  same state as sharecoord after the first {checked} writes", flush=True)
    peer.reset()
    work.mkdir(parents=True, exist_ok=True)
    slug = name.replace(" ", "-")
    setup = write_frames(peer.setup_steps(), work / f"{slug}-setup.bin")
    results = []
    for bodies, suffix, concurrencies, items in (
        (single, "", (1, 16, 64), 1),
        (batched, " x50", (16, 64), 50),
    ):
        requests = write_frames(
            [peer.request(body_entries(b)) for b in bodies], work / f"{slug}-{items}.bin"
        )
        for c in concurrencies:
            result = run_replay(
                name + suffix,
                peer,
                requests,
                setup,
                server_pid=server_pid,
                concurrency=c,
                duration_s=duration_s,
                items_per_request=items,
            )
            results.append(result)
            print(
                f"  {name + suffix} c={c}: {result.requests_per_s:,.0f} req/s, "
                f"{result.items_per_s:,.0f} share-partitions/s, p99 {result.p99_ms:.2f} ms, "
                f"generator CPU {result.generator_cpu:.0%}",
                flush=True,
            )
    return results
