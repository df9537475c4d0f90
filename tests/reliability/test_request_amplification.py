"""docs/api.md "What one request can cost": the limits bound what a request makes the
daemon write and hold.

Every record a request makes is at most 130 + G + 22·b bytes (G the group id's UTF-8
length, at most max_group_id_bytes; b the state batches it carries) and is written
twice, to the journal and to its partition's file, with at most 40 bytes of journal
framing. The worst requests the default limits allow (a 255-byte group id, 5000
entries, 10000 batches an entry, a 4 MiB body) go to a real daemon in both formats,
and what each added to the data directory is measured once it is answered: the bytes
of the journal's records (read back from its files, with checkpoints held off so that
none is freed), the bytes the partitions' segment files grew by, and the blocks the
data directory's files grew by (du: the journal's files are made a segment at a time,
ahead of need). A write that falls on a key's snapshot writes the key's whole stored
state, which the limits do not bound: measured too, against the same formula.

The slow test reads the daemon's resident set after 100,000 share-partitions were made
with the longest group id, and again after a restart.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from persistence import FileOps
from persistence.journal import journal_dir, scan_journal
from protocol.widths import DEFAULT_MAX_GROUP_ID_BYTES
from tests.harness import MEDIA, TOPIC, Api, Daemon, encode

G = DEFAULT_MAX_GROUP_ID_BYTES
ENTRIES = 5000
BATCHES_PER_ENTRY = 10000
MAX_BODY = 4 * 1024 * 1024
# docs/api.md's bound: bytes of one record, besides its group id and batches; of a
# batch; of journal framing a record.
RECORD_BYTES = 130
BATCH_BYTES = 22
JOURNAL_FRAMING = 40
# The smallest entry (a delete's) and the smallest batch in a body: {"partition": n} in
# msgpack, 12 bytes, and a map of the four fields, 60; on the Kafka listener 5 and 20.
SMALLEST_ENTRY = {"msgpack": 12, "json": 16, "kafka": 5}
SMALLEST_BATCH = {"msgpack": 60, "json": 72, "kafka": 20}
# docs/api.md: a share-partition the daemon knows holds about 700 + 2·G bytes.
HELD_PER_KEY = 700 + 2 * G
# Offsets past 2^32: every offset takes its widest form, in the body and in the record.
FAR = 1 << 40
JOURNAL_SEGMENT = 1 << 20  # the journal's files grow in small steps
HOLD_OFF = (
    "--journal-segment-bytes", str(JOURNAL_SEGMENT),
    "--journal-checkpoint-interval-ms", "3600000",
    "--journal-checkpoint-bytes", str(1 << 40),
    "--cold-partition-snapshot-interval-ms", "3600000",
    "--prune-interval-ms", "3600000",
    "--kafka-listener", "127.0.0.1:0",
)  # fmt: skip


def longest_group(fmt: str, tag: str = "") -> str:
    """A group id of exactly G bytes, mostly 3-byte characters, one per format."""
    name = "€" * ((G - 3) // 3) + fmt[0] + tag
    return name + "g" * (G - len(name.encode()))


def request(group: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"group_id": group, "topics": [{"topic_id": TOPIC, "partitions": entries}]}


def batches(count: int, start: int = 0) -> list[dict[str, int]]:
    """Batches that never merge: one offset each, the delivery state alternating."""
    return [
        {
            "first_offset": FAR + 2 * i,
            "last_offset": FAR + 2 * i,
            "delivery_state": 2 * (i % 2),
            "delivery_count": 1,
        }
        for i in range(start, start + count)
    ]


def write_entry(partition: int, batch_list: list[dict[str, int]]) -> dict[str, Any]:
    return {
        "partition": partition,
        "state_epoch": 0,
        "leader_epoch": 1,
        "start_offset": -1,
        "state_batches": batch_list,
    }


class Wire:
    """How a request travels: HTTP in msgpack or JSON, or the Kafka listener."""

    CORRELATION_ID = 7

    def __init__(self, name: str, daemon: Daemon, session: Any, kio: Any = None) -> None:
        self.name = name
        self.api = Api(session, daemon.url, name if name != "kafka" else "msgpack")
        self.kio = kio  # tests.kafka_client, for the Kafka listener
        self.address = kio.kafka_address(daemon.stdout_lines) if kio is not None else None
        self.client: Any = None

    @classmethod
    async def open(cls, name: str, daemon: Daemon, session: Any) -> Wire:
        kio = None
        if name == "kafka":
            # Imported here: kio needs Python 3.11+ (the module skips without it), and
            # off the loop (an import reads files).
            kio = await asyncio.to_thread(importlib.import_module, "tests.kafka_client")
        return cls(name, daemon, session, kio)

    def encode(self, rpc: str, obj: dict[str, Any]) -> bytes:
        """The body as it goes on the wire: for Kafka, the frame after its size."""
        if self.kio is None:
            return encode(obj, self.name)
        framer = self.kio.KafkaClient(None, None)  # framing only, no connection
        frame, _ = framer.frame(self.kio.share_request(rpc, obj), self.CORRELATION_ID)
        return frame[4:]

    async def call(self, rpc: str, obj: dict[str, Any]) -> int:
        """Send one RPC, assert every entry succeeded; the body's size."""
        raw = await asyncio.to_thread(self.encode, rpc, obj)
        assert len(raw) <= MAX_BODY
        if self.kio is not None:
            if self.client is None:
                self.client = await self.kio.KafkaClient.connect(*self.address)
            self.client.writer.write(len(raw).to_bytes(4, "big") + raw)
            frame = await self.client.read_frame()
            answer = await asyncio.to_thread(self._kafka_answer, rpc, obj, frame)
        else:
            reply = await self.api.request(
                "POST",
                f"/v1/share-group-state/{rpc}",
                data=io.BytesIO(raw),  # aiohttp warns about big raw bytes bodies
                headers={"Content-Type": MEDIA[self.name]},
            )
            assert reply.status == 200, reply.body
            answer = reply.body
        codes = {p["error_code"] for t in answer["results"] for p in t["partitions"]}
        assert codes == {0}, codes
        return len(raw)

    def _kafka_answer(self, rpc: str, obj: dict[str, Any], frame: bytes) -> dict[str, Any]:
        request = self.kio.share_request(rpc, obj)
        return self.kio.as_http(self.client.decode(request, frame, self.CORRELATION_ID))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


def fill_with_batches(group: str, wire: Wire, entries: int, per_entry: int) -> dict[str, Any]:
    """A write of ``entries`` entries of ``per_entry`` batches each, or of fewer batches
    each, the most that keeps the body within the limit."""

    def body(count: int) -> dict[str, Any]:
        entry_batches = batches(count)
        return request(group, [write_entry(p, entry_batches) for p in range(entries)])

    def size(count: int) -> int:
        return len(wire.encode("write", body(count)))

    # A batch costs the same bytes whatever its neighbours (one offset each, all past
    # 2^32): the size is linear in the count, but for a list header or two.
    empty, ten = size(0), size(10)
    per_batch = (ten - empty) / (10 * entries)
    count = min(per_entry, int((MAX_BODY - empty) / (entries * per_batch)))
    while size(count) > MAX_BODY:
        count -= 1
    return body(count)


@dataclass
class Added:
    """What one request added to the data directory."""

    body: int
    journal: int
    partitions: int
    allocated: int  # du: blocks, the journal's files created a segment at a time

    @property
    def written(self) -> int:
        return self.journal + self.partitions


def file_sizes(data_dir: Path) -> tuple[int, int, int]:
    """(bytes of the journal's records, of the partitions' segment files, and allocated
    to every file of the data directory). Read while nothing is being written."""
    scan = scan_journal(FileOps(), journal_dir(str(data_dir)), 0, live=True)
    journal = sum(record.end_lsn - record.lsn for record in scan.records)
    segments = allocated = 0
    for root, _, files in os.walk(data_dir):
        for name in files:
            stat = os.stat(os.path.join(root, name))
            allocated += stat.st_blocks * 512
            if name.endswith(".log"):
                segments += stat.st_size
    return journal, segments, allocated


async def send(wire: Wire, data_dir: Path, rpc: str, obj: Any) -> Added:
    """Send one RPC (every entry must succeed) and measure what it added."""
    before = await asyncio.to_thread(file_sizes, data_dir)
    size = await wire.call(rpc, obj)
    after = await asyncio.to_thread(file_sizes, data_dir)
    return Added(size, *(a - b for a, b in zip(after, before, strict=True)))


def bound(records: int, batch_count: int) -> int:
    return records * (2 * (RECORD_BYTES + G) + JOURNAL_FRAMING) + 2 * BATCH_BYTES * batch_count


def check(figures: Any, wire: str, name: str, added: Added, records: int, batch_count: int) -> None:
    """Within the documented bound, and every record really there (each carries its
    key, so at least 2·(34 + G) bytes: the measure measures)."""
    assert added.written <= bound(records, batch_count), (name, added)
    assert added.allocated <= bound(records, batch_count) + 2 * JOURNAL_SEGMENT, (name, added)
    assert added.written >= records * 2 * (34 + G), (name, added)
    # docs/api.md's figures for a request: per entry at most 2·(130 + G) + 40 bytes, and
    # per batch 44, for the fewest bytes each can take in the body.
    per_entry = bound(1, 0)
    assert added.written <= ENTRIES * per_entry + 2 * BATCH_BYTES * MAX_BODY // SMALLEST_BATCH[wire]
    assert (
        added.written
        <= max(per_entry / SMALLEST_ENTRY[wire], 2 * BATCH_BYTES / SMALLEST_BATCH[wire])
        * added.body
    ), (name, added)
    key = f"{wire}_{name}"
    figures.set(f"{key}_body_bytes", added.body)
    figures.set(f"{key}_written_bytes", added.written)
    figures.set(f"{key}_times_body", round(added.written / added.body, 1))
    figures.set(f"{key}_allocated_bytes", added.allocated)


def worst_requests(group: str, wire: Wire) -> list[tuple[str, str, dict[str, Any], int, int]]:
    """(name, rpc, body, records, batches) of each worst request, in an order in which
    each entry succeeds (initialize first, delete last); read-summary writes nothing."""
    every = range(ENTRIES)
    filled = fill_with_batches(group, wire, ENTRIES, BATCHES_PER_ENTRY)
    one_full = len(
        wire.encode("write", request(group, [write_entry(0, batches(BATCHES_PER_ENTRY))]))
    )
    full = fill_with_batches(group, wire, MAX_BODY // one_full, BATCHES_PER_ENTRY)
    entries = [{"partition": p} for p in every]
    initialize = [{"partition": p, "state_epoch": 0, "start_offset": 0} for p in every]
    reads = [{"partition": p, "leader_epoch": 1} for p in every]
    writes = [write_entry(p, []) for p in every]
    return [
        ("initialize", "initialize", request(group, initialize), ENTRIES, 0),
        ("read_new_leader_epoch", "read", request(group, reads), ENTRIES, 0),
        ("write_no_batches", "write", request(group, writes), ENTRIES, 0),
        ("write_filled_with_batches", "write", filled, ENTRIES, batch_count(filled)),
        ("write_full_entries", "write", full, len(partitions(full)), batch_count(full)),
        ("read_summary", "read-summary", request(group, entries), 0, 0),
        ("delete", "delete", request(group, entries), ENTRIES, 0),
    ]


def partitions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry for topic in obj["topics"] for entry in topic["partitions"]]


def batch_count(obj: dict[str, Any]) -> int:
    return sum(len(entry["state_batches"]) for entry in partitions(obj))


# Kafka's bodies are encoded by kio, in Python: 20 s of the slow suite, not of make test.
@pytest.mark.parametrize("wire", ["msgpack", "json", pytest.param("kafka", marks=pytest.mark.slow)])
async def test_the_worst_requests_within_the_limits_write_at_most_the_documented_bound(
    spawn, session, tmp_path, figures, wire
):
    if wire == "kafka":
        pytest.importorskip("kio", reason="kio needs Python 3.11+")
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, *HOLD_OFF)
    group = longest_group(wire)
    # One byte over the group id limit: refused whole, nothing written.
    api = Api(session, daemon.url, "json")
    initialize = [{"partition": p, "state_epoch": 0, "start_offset": 0} for p in range(ENTRIES)]
    reply = await api.rpc_reply("initialize", request(group + "g", initialize))
    assert reply.status == 400, reply.body
    assert reply.body["error_code"] == 42
    assert "over the limit of 255 (max_group_id_bytes)" in reply.body["error_message"]
    assert (await asyncio.to_thread(file_sizes, data_dir))[:2] == (0, 0)
    sender = await Wire.open(wire, daemon, session)
    try:
        requests = await asyncio.to_thread(worst_requests, group, sender)
        for name, rpc, obj, records, batch_count in requests:
            added = await send(sender, data_dir, rpc, obj)
            if records == 0:
                assert added.written == 0, (name, added)
                continue
            check(figures, wire, name, added, records, batch_count)
    finally:
        await sender.close()


async def test_a_write_on_a_keys_snapshot_writes_its_whole_stored_state(
    spawn, session, tmp_path, figures
):
    """With snapshot_update_records_per_snapshot 0 every write is a snapshot (by default
    every 500th update of a key is): one entry without batches writes all the key's
    stored batches, 50,000 here, far more than its body; the formula still holds."""
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, *HOLD_OFF, "--snapshot-update-records-per-snapshot", "0")
    wire = await Wire.open("msgpack", daemon, session)
    group = longest_group("msgpack")
    initialize = request(group, [{"partition": 0, "state_epoch": 0, "start_offset": 0}])
    await send(wire, data_dir, "initialize", initialize)
    stored = 0
    for _ in range(5):
        grow = request(group, [write_entry(0, batches(BATCHES_PER_ENTRY, stored))])
        await send(wire, data_dir, "write", grow)
        stored += BATCHES_PER_ENTRY
    added = await send(wire, data_dir, "write", request(group, [write_entry(0, [])]))
    assert 2 * 20 * stored <= added.written <= bound(1, stored), added
    figures.set("stored_batches", stored)
    figures.set("body_bytes", added.body)
    figures.set("written_bytes", added.written)
    figures.set("times_body", round(added.written / added.body))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_what_share_partitions_of_the_longest_group_id_hold(
    spawn, session, tmp_path, figures
):
    """docs/api.md: a share-partition the daemon knows holds about 700 + 2·G bytes; 20
    initializes of 5000 new keys each (the most a request can make) with a 255-byte group
    id, then a restart that loads them: the resident set grows by less than 1.5 times
    that, per key, both times. The request that, before the limit, made 500 keys of a
    1 MiB group id (1 GB held after a restart) is refused first."""
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir)
    fresh = await asyncio.to_thread(rss_bytes, daemon.pid)
    # The request that held 1 GB after a restart: a 1 MiB group id, 500 entries.
    huge = request(
        "g" * (1 << 20), [{"partition": p, "state_epoch": 0, "start_offset": 0} for p in range(500)]
    )
    raw = io.BytesIO(encode(huge, "msgpack"))
    reply = await Api(session, daemon.url).request(
        "POST",
        "/v1/share-group-state/initialize",
        data=raw,
        headers={"Content-Type": MEDIA["msgpack"]},
    )
    assert (reply.status, reply.body["error_code"]) == (400, 42), reply.status
    wire = await Wire.open("msgpack", daemon, session)
    group = longest_group("msgpack")
    requests = 20
    for r in range(requests):
        entries = [
            {"partition": r * ENTRIES + p, "state_epoch": 0, "start_offset": 0}
            for p in range(ENTRIES)
        ]
        await send(wire, data_dir, "initialize", request(group, entries))
    keys = requests * ENTRIES
    served = await asyncio.to_thread(rss_bytes, daemon.pid)
    assert await asyncio.to_thread(daemon.terminate) == 0
    daemon = await spawn(data_dir)  # ready: every key loaded
    loaded = await asyncio.to_thread(rss_bytes, daemon.pid)
    figures.set("keys", keys)
    figures.set("rss_fresh_mib", round(fresh / 2**20, 1))
    figures.set("rss_after_requests_mib", round(served / 2**20, 1))
    figures.set("rss_after_restart_mib", round(loaded / 2**20, 1))
    figures.set("held_per_key_bytes", round((served - fresh) / keys))
    figures.set("held_per_key_after_restart_bytes", round((loaded - fresh) / keys))
    assert served - fresh <= 1.5 * HELD_PER_KEY * keys, (fresh, served)
    assert loaded - fresh <= 1.5 * HELD_PER_KEY * keys, (fresh, loaded)
