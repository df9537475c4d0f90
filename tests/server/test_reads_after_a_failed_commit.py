"""A read of a key whose last write failed on a full disk answers what is durable.

When a commit cycle meets ENOSPC, its partition fails and reloads from disk; when the
reload needs room too (the journal's durable frames must be laid into the partition
files), the partition rebuilds its shard from what is on disk without writing and
serves reads from it. The key whose write failed then has a record past the durable
end in the log, but none in the shard: its reads must answer the durable state at
once, not wait for a commit that cannot happen (CI once saw the admin read answer 503,
"could not make its state durable", on a real full disk).
"""

from __future__ import annotations

import errno

from persistence import FileOps
from server.runtime import READS_SERVED
from tests.harness import (
    TOPIC,
    Reply,
    batch,
    body,
    init_entry,
    read_entry,
    wait_until,
    write_entry,
)

GROUP = "failed-commit"


class FillableFileOps(FileOps):
    """Every write and pwrite answers ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def _room(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._room()
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._room()
        return super().pwrite(fd, data, offset)


async def test_a_key_whose_write_failed_reads_its_durable_state(serve) -> None:
    fs = FillableFileOps()
    # One state partition, and no checkpoint during the test: the first write's frames
    # stay in the journal only, so the reload after the failure needs room.
    served = await serve(fs=fs, partitions=1, journal_checkpoint_interval_ms=3_600_000)
    api = served.api("msgpack")
    assert await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(0)]))) == [0]
    durable = batch(0, 9, 2, 1)
    assert await api.codes("write", body(GROUP, (TOPIC, [write_entry(0, durable)]))) == [0]

    fs.full = True
    failed = batch(10, 19, 2, 1)
    assert await api.codes("write", body(GROUP, (TOPIC, [write_entry(0, failed)]))) == [15]

    def serving_reads(ready: Reply) -> bool:
        failures = ready.body.get("failures", [])
        return bool(failures) and all(READS_SERVED in f["error"] for f in failures)

    ready = await wait_until(api.readyz, "the failed partition to serve reads", until=serving_reads)
    failures = ready.body["failures"]
    # The reload did need room: the partition serves reads from what is on disk.
    assert "reload attempt" in failures[0]["error"], failures

    state = await api.admin_state(GROUP, TOPIC, 0)
    assert state.status == 200, (state.status, state.body)
    assert [(b["first_offset"], b["last_offset"]) for b in state.body["state_batches"]] == [(0, 9)]
    read = await api.results("read", body(GROUP, (TOPIC, [read_entry(0)])))
    assert read[0]["error_code"] == 0, read
    assert [(b["first_offset"], b["last_offset"]) for b in read[0]["state_batches"]] == [(0, 9)]
    fs.full = False
