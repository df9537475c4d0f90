"""The equal-work peers against sharecoord, on real servers (issue #11).

Starts the PostgreSQL 15 and Redis 7 of this machine the way the benchmark does, loads
bench/equal_work.{sql,lua}, and holds them against sharecoord's own code batch for
batch: the combiner alone on docs/semantics.md §7's worked examples and on random
input (against protocol.batches.combine_state_batches), then a few hundred random
writes, single and batched, with fencing and uninitialized keys among them (against
the shard, whose snapshot cadence is set low so both of §6's paths run). Marked slow:
`make reliability` runs it, `make test` does not.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import peers
from bench.equal_work import Entry, Peer, PostgresPeer, RedisPeer, differences, sharecoord_states
from bench.system import ensure_debian_packages, postgres_bin
from bench.wire import pg_array, pg_parse_array
from bench.workload import TOPIC_ID, group_name
from protocol.batches import combine_state_batches
from protocol.state_batch import StateBatch

pytestmark = pytest.mark.slow

AV, ACQ, ACK, ARC = 0, 1, 2, 4
RECORDS_PER_SNAPSHOT = 3  # low, so random writes become snapshots as well as updates
GROUPS, PARTITIONS = 2, 4  # initialized; writes also go to partitions 4 and 5 (never)


def b(first: int, last: int, state: int, count: int) -> StateBatch:
    return StateBatch(first, last, state, count)


# docs/semantics.md §7: stored, new, start offset, and the result the table gives.
WORKED_EXAMPLES = [
    ([b(0, 19, AV, 1)], [b(5, 9, ACQ, 1)], -1,
     [b(0, 4, AV, 1), b(5, 9, ACQ, 1), b(10, 19, AV, 1)]),
    ([b(0, 9, AV, 1)], [b(10, 14, AV, 1)], -1, [b(0, 14, AV, 1)]),
    ([b(0, 9, AV, 1)], [b(11, 14, AV, 1)], -1, [b(0, 9, AV, 1), b(11, 14, AV, 1)]),
    ([b(0, 9, AV, 2)], [b(0, 14, ACK, 1)], -1, [b(0, 9, AV, 2), b(10, 14, ACK, 1)]),
    ([b(0, 9, ARC, 1)], [b(0, 9, AV, 2)], -1, [b(0, 9, AV, 2)]),
    ([b(0, 9, AV, 1), b(20, 29, AV, 1)], [b(10, 18, ACK, 2), b(15, 23, ACK, 2)], -1,
     [b(0, 9, AV, 1), b(10, 23, ACK, 2), b(24, 29, AV, 1)]),
    ([b(0, 9, AV, 1), b(20, 29, AV, 1)], [b(10, 18, ACK, 2), b(15, 23, ACK, 2)], 19,
     [b(19, 23, ACK, 2), b(24, 29, AV, 1)]),
    ([b(0, 9, AV, 1)], [], 5, [b(5, 9, AV, 1)]),
    # The partial-coalescing trap: two touching batches of the same info stay apart.
    ([b(0, 9, ACK, 3), b(10, 19, AV, 1)], [b(10, 19, ACK, 3)], -1,
     [b(0, 9, ACK, 3), b(10, 19, ACK, 3)]),
]  # fmt: skip


def _flat(batches: list[StateBatch]) -> list[int]:
    return [
        n
        for x in batches
        for n in (x.first_offset, x.last_offset, x.delivery_state, x.delivery_count)
    ]


def _unflat(flat: list[int]) -> list[StateBatch]:
    return [StateBatch(*flat[i : i + 4]) for i in range(0, len(flat), 4)]


def pg_combine(peer: PostgresPeer, current: list[StateBatch], new: list[StateBatch], start: int):
    rows = peer.conn.query(
        f"SELECT share_combine_batches('{pg_array(_flat(current))}'::bigint[], "
        f"'{pg_array(_flat(new))}'::bigint[], {start})"
    )
    return _unflat(pg_parse_array(str(rows[0][0])))


def redis_combine(peer: RedisPeer, current: list[StateBatch], new: list[StateBatch], start: int):
    reply = peer.conn.call(
        "FCALL_RO", "share_combine", 0, start, len(current), *_flat(current), *_flat(new)
    )
    assert isinstance(reply, list)
    return _unflat([int(n) for n in reply])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[int, int]]:
    """(PostgreSQL port, Redis port). Under a fresh directory of the system's temporary
    one rather than pytest's: run as root, PostgreSQL runs as its own user and must reach
    its data directory, which pytest's private base directory does not let it."""
    try:  # what `make bench` installs, the same way
        ensure_debian_packages({"redis-server": "redis-server", "postgres": "postgresql-15"})
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"the equal-work peers need PostgreSQL 15 and Redis 7; install failed: {exc}")
    missing = [
        name
        for name, path in (("postgres", postgres_bin("postgres")), ("redis", "redis-server"))
        if shutil.which(path) is None
    ]
    if missing:
        pytest.fail(f"the equal-work peers need {missing} installed (see bench/system.py)")
    with tempfile.TemporaryDirectory(prefix="sharecoord-equal-work-") as tmp:
        work = Path(tmp)
        (work / "pg").mkdir()
        with peers.postgres(work / "pg") as (pg_port, _), peers.redis(work) as (redis_port, _):
            yield pg_port, redis_port


@pytest.fixture(params=["postgres", "redis"])
def peer(request: pytest.FixtureRequest, servers: tuple[int, int]) -> Iterator[Peer]:
    pg_port, redis_port = servers
    made: Peer = (
        PostgresPeer(pg_port, RECORDS_PER_SNAPSHOT)
        if request.param == "postgres"
        else RedisPeer(redis_port, RECORDS_PER_SNAPSHOT)
    )
    yield made
    made.conn.close()


def combine(peer: Peer, current: list[StateBatch], new: list[StateBatch], start: int):
    if isinstance(peer, PostgresPeer):
        return pg_combine(peer, current, new, start)
    return redis_combine(peer, current, new, start)


@pytest.mark.parametrize(("current", "new", "start", "expected"), WORKED_EXAMPLES)
def test_worked_examples_of_7(peer: Peer, current, new, start, expected):
    assert combine_state_batches(current, new, start) == expected
    assert combine(peer, current, new, start) == expected


def _random_batches(rng: random.Random, count: int, *, inverted: bool = False) -> list[StateBatch]:
    out = []
    for _ in range(count):
        first = rng.randrange(40)
        last = first + rng.randrange(12)
        if inverted and rng.random() < 0.2:
            first, last = last + 1, first  # a lone inverted batch comes back unchanged
        out.append(b(first, last, rng.choice((AV, ACQ, ACK, ARC)), rng.randint(0, 3)))
    return out


def test_random_merges_match_combine_state_batches(peer: Peer):
    rng = random.Random(11)
    for _ in range(300):
        # Stored lists as the combiner leaves them, partial coalescing and all, or raw.
        current = _random_batches(rng, rng.randint(0, 5))
        if rng.random() < 0.7:
            current = combine_state_batches([], current, -1)
        new = _random_batches(rng, rng.randint(0, 5))
        start = rng.choice((-1, -1, rng.randrange(45)))
        assert combine(peer, current, new, start) == combine_state_batches(current, new, start), (
            current,
            new,
            start,
        )
    # A single inverted batch takes the short cut (step 3), here as in sharecoord.
    assert combine(peer, [], [b(9, 3, AV, 1)], -1) == [b(9, 3, AV, 1)]


def _random_entry(rng: random.Random, group: str, window: int) -> Entry:
    batches = tuple(
        (x.first_offset, x.last_offset, x.delivery_state, x.delivery_count)
        for x in _random_batches(rng, rng.choice((0, 1, 1, 1, 2, 3, 4)))
    )
    return Entry(
        group,
        TOPIC_ID,
        rng.randrange(PARTITIONS + 2),
        # -2 is below every fence: 124 / 74 from the function itself (sharecoord's edge
        # would refuse it first; its shard fences it just so).
        rng.choice((-1, 0, 0, 1, -2)) if rng.random() < 0.2 else 0,
        rng.choice((-1, 0, 0, 5, -2)) if rng.random() < 0.2 else 0,
        rng.choice((-1, -1, -1, window + rng.randrange(10))),
        rng.choice((-1, -1, rng.randrange(100))),
        batches,
    )


def test_random_writes_store_what_sharecoord_stores(peer: Peer):
    rng = random.Random(932)
    peer.reset(GROUPS, PARTITIONS)
    entries: list[Entry] = []
    codes: list[int] = []
    for step in range(300):
        group = group_name(rng.randrange(GROUPS))
        window = step // 10  # start offsets creep up, as a leader's do
        # One entry per request, or several of one group, a partition possibly twice.
        request = [_random_entry(rng, group, window) for _ in range(rng.choice((1, 1, 2, 5)))]
        entries += request
        codes += peer.codes(peer.conn.request(peer.request(request)))
    initialized = [(group_name(g), TOPIC_ID, p) for g in range(GROUPS) for p in range(PARTITIONS)]
    want_codes, want_states = sharecoord_states(entries, RECORDS_PER_SNAPSHOT, initialized)
    assert {0, 42, 74, 124} <= set(want_codes)
    assert codes == want_codes
    keys = [(group_name(g), TOPIC_ID, p) for g in range(GROUPS) for p in range(PARTITIONS + 2)]
    assert differences(peer.states(keys), want_states) == []
    snapshots = {view.snapshot_epoch for view in want_states.values()}
    assert max(snapshots) >= 2  # the cadence made snapshots, not only updates


# Five writes to one key: with a cadence of 3 the first four are updates and the fifth a
# snapshot (docs/semantics.md §6). An update merges its batches among themselves before
# they meet the stored ones, a snapshot merges everything at once, and here both
# differences show: a peer that always did one or the other would store a different list.
CADENCE_WRITES = [
    ((20, 24, AV, 2),),
    ((16, 20, ACK, 2),),
    (),
    ((22, 24, ACK, 2), (21, 23, ACK, 2)),
    ((19, 22, ACK, 1), (23, 26, ACK, 1)),
]


def _one_way(pre_combine_updates: bool, pre_combine_snapshots: bool) -> list[StateBatch]:
    """The stored batches after CADENCE_WRITES (start offset 0, never moved)."""
    stored: list[StateBatch] = []
    for i, batches in enumerate(CADENCE_WRITES):
        new = [StateBatch(*x) for x in batches]
        snapshot = i > RECORDS_PER_SNAPSHOT
        if pre_combine_snapshots if snapshot else pre_combine_updates:
            new = combine_state_batches([], new, -1)
        stored = combine_state_batches(stored, new, 0)
    return stored


def test_updates_and_snapshots_merge_as_sharecoords_records_do(peer: Peer):
    key = (group_name(0), TOPIC_ID, 0)
    writes = [Entry(*key, 0, 0, -1, -1, batches) for batches in CADENCE_WRITES]
    _, want = sharecoord_states(writes, RECORDS_PER_SNAPSHOT)
    stored = [StateBatch(*x) for x in want[key].batches]
    assert stored == _one_way(pre_combine_updates=True, pre_combine_snapshots=False)
    assert stored != _one_way(pre_combine_updates=False, pre_combine_snapshots=False)
    assert stored != _one_way(pre_combine_updates=True, pre_combine_snapshots=True)
    peer.reset(1, 1)
    for entry in writes:
        assert peer.codes(peer.conn.request(peer.request([entry]))) == [0]
    assert differences(peer.states([key]), want) == []


def test_initialize_fences_a_lower_state_epoch(peer: Peer):
    key = (group_name(0), TOPIC_ID, 0)
    peer.reset(1, 1)
    if isinstance(peer, PostgresPeer):

        def initialize(state_epoch: int) -> int:
            rows = peer.conn.query(
                f"SELECT initialize_share_state('{key[0]}', '{key[1]}', 0, {state_epoch}, 7)"
            )
            return int(str(rows[0][0]))

    else:
        from bench.equal_work import redis_key  # noqa: PLC0415

        def initialize(state_epoch: int) -> int:
            reply = peer.conn.call("FCALL", "share_initialize", 1, redis_key(*key), state_epoch, 7)
            assert isinstance(reply, list)
            return int(reply[0])  # type: ignore[arg-type]

    assert initialize(3) == 0
    assert initialize(2) == 124
    assert initialize(-1) == 0  # -1 skips the check and is stored (§A.1 point 8)
    view = peer.states([key])[key]
    assert (view.snapshot_epoch, view.state_epoch, view.state_fence) == (2, -1, 3)
    assert (view.start_offset, view.delivery_complete_count, view.batches) == (7, 0, ())
