"""Compaction of a running daemon's data directory: the daemon keeps serving while
`sharecoord compact` runs, the job stages its output for the daemon, the daemon commits
it on POST /v1/admin/compaction/commit, and no acknowledged write is lost — not then,
not after a restart; the log verifies."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import pytest

from protocol.codec import Format, encode_admin_state
from protocol.records import ShareKey
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch
from spark_jobs.compact import STAGED_FOR_DAEMON
from tests.harness import Acknowledged, Daemon, Daemons, run_cli, wait_until_blocking
from tests.shard.ops import InitializeOp, WriteOp, handle
from tests.spark.histories import state_partition_of

TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"
KEYS = [ShareKey(f"group-{i % 3}", TOPIC, i) for i in range(8)]
PARTITIONS = 4
RECORDS_PER_SNAPSHOT = 20
JOB_TIMEOUT_S = 300
ACKED = 2  # Acknowledged
FLAGS = (
    "--segment-bytes",
    "1024",
    "--snapshot-update-records-per-snapshot",
    str(RECORDS_PER_SNAPSHOT),
    # Only the test's POST commits, so the test knows who did.
    "--compaction-commit-interval-ms",
    "3600000",
)


def run(*args: str) -> tuple[int, str]:
    done = run_cli(*args, timeout=JOB_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def request(
    daemon: Daemon, method: str, path: str, body: object | None = None
) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection(daemon.host, daemon.port, timeout=30)
    try:
        return send(connection, method, path, body)
    finally:
        connection.close()


def send(
    connection: http.client.HTTPConnection, method: str, path: str, body: object | None = None
) -> tuple[int, dict[str, Any]]:
    payload = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    connection.request(method, path, body=payload, headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"{}")


def start_daemon(daemons: Daemons, data_dir: str) -> Daemon:
    return daemons.make(data_dir, *FLAGS, partitions=PARTITIONS).start()


def partition_body(key: ShareKey, **fields: object) -> dict[str, object]:
    return {
        "group_id": key.group_id,
        "topics": [
            {"topic_id": key.topic_id, "partitions": [{"partition": key.partition, **fields}]}
        ],
    }


@dataclass
class Writer:
    """Writes continuously, one acknowledgement batch per write. The acknowledged writes
    are applied, in order, to a shard of its own, which says what admin state each key
    must then show: the model of acknowledged state learns that."""

    daemon: Daemon
    model: ShareCoordinatorShard = field(
        default_factory=lambda: ShareCoordinatorShard(
            ShardConfig(records_per_snapshot=RECORDS_PER_SNAPSHOT)
        )
    )
    acknowledged: Acknowledged[ShareKey, dict[str, Any]] = field(
        default_factory=lambda: Acknowledged({})
    )
    keys: list[ShareKey] = field(default_factory=lambda: list(KEYS))  # written round robin
    acked: int = 0
    acked_offsets: dict[ShareKey, list[int]] = field(default_factory=dict)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    _offset: int = 0

    def apply(self, key: ShareKey, op: object) -> None:
        """An acknowledged ``op`` of ``key``."""
        records, _ = handle(self.model, op)  # type: ignore[arg-type]
        for record in records:
            self.model.replay(self._offset, record)
            self._offset += 1
        state = self.model.admin_state(key)
        assert state is not None
        self.acknowledged.acknowledge(key, json.loads(encode_admin_state(state, Format.JSON)))

    def run(self) -> None:
        connection = http.client.HTTPConnection(self.daemon.host, self.daemon.port, timeout=30)
        try:
            n = 0
            while not self.stop.is_set():
                keys = self.keys
                key = keys[n % len(keys)]
                offset = len(self.acked_offsets.get(key, []))
                batch = {
                    "first_offset": offset,
                    "last_offset": offset,
                    "delivery_state": ACKED,
                    "delivery_count": 1,
                }
                body = partition_body(
                    key, state_epoch=1, leader_epoch=0, start_offset=-1, state_batches=[batch]
                )
                status, answer = send(connection, "POST", "/v1/share-group-state/write", body)
                code = answer["results"][0]["partitions"][0]["error_code"]
                assert (status, code) == (200, 0), answer
                self.apply(key, WriteOp(key, 1, 0, -1, [StateBatch(offset, offset, ACKED, 1)]))
                self.acked_offsets.setdefault(key, []).append(offset)
                self.acked += 1
                n += 1
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            connection.close()


def admin_state(daemon: Daemon, key: ShareKey) -> dict[str, object]:
    query = urllib.parse.urlencode(
        {"group_id": key.group_id, "topic_id": key.topic_id, "partition": key.partition}
    )
    status, body = request(daemon, "GET", f"/v1/admin/state?{query}")
    assert status == 200, body
    return body


def check_every_acknowledged_write(daemon: Daemon, writer: Writer) -> None:
    shown = {key: admin_state(daemon, key) for key in KEYS}
    writer.acknowledged.verify(shown)
    for key, state in shown.items():
        covered: set[int] = set()
        for batch in state["state_batches"]:  # type: ignore[attr-defined]
            if batch["delivery_state"] == ACKED:
                covered.update(range(batch["first_offset"], batch["last_offset"] + 1))
        assert set(writer.acked_offsets.get(key, [])) <= covered


def segment_counts(daemon: Daemon) -> list[int]:
    status, body = request(daemon, "GET", "/v1/admin/partitions")
    assert status == 200
    return [p["segments"] for p in body["partitions"]]


@pytest.mark.spark  # spark-submit, in a subprocess
def test_the_daemon_serves_through_compaction_and_loses_no_acknowledged_write(
    data_dir: str, daemons: Daemons
) -> None:
    daemon = start_daemon(daemons, data_dir)
    writer = Writer(daemon)
    for key in KEYS:
        status, _ = request(
            daemon,
            "POST",
            "/v1/share-group-state/initialize",
            partition_body(key, state_epoch=1, start_offset=0),
        )
        assert status == 200
        writer.apply(key, InitializeOp(key, 1, 0))
    thread = threading.Thread(target=writer.run, name="writer")
    thread.start()
    try:
        wait_until_blocking(
            lambda: writer.acked >= 400 or writer.error is not None, "400 writes acknowledged"
        )
        # From here on half the keys go cold: their state after a restart comes from
        # the compacted segment alone (the others get fresh snapshots later).
        writer.keys = KEYS[: len(KEYS) // 2]
        time.sleep(0.5)  # a while of writes to the hot half alone: time, not a condition
        before_job = writer.acked
        code, output = run("compact", "--data-dir", data_dir, "--master", "local[2]")
        during_job = writer.acked - before_job
        assert code == 0, output
        assert STAGED_FOR_DAEMON in output.splitlines()
        assert during_job > 0  # the daemon kept answering while the job ran

        segments_before = segment_counts(daemon)
        status, committed = request(daemon, "POST", "/v1/admin/compaction/commit")
        assert status == 200
        assert committed["stale"] == []
        used = sorted({state_partition_of(key, PARTITIONS) for key in KEYS})
        assert committed["committed"] == [f"{p}/0" for p in used]
        segments_after = segment_counts(daemon)
        assert all(segments_after[p] < segments_before[p] for p in used)
        acked_at_commit = writer.acked
        wait_until_blocking(
            lambda: writer.acked >= acked_at_commit + 100 or writer.error is not None,
            "100 more writes acknowledged after the commit",
        )
    finally:
        writer.stop.set()
        thread.join(timeout=60)
    assert writer.error is None, writer.error
    check_every_acknowledged_write(daemon, writer)

    assert daemon.terminate() == 0
    code, output = run("log", "verify", "--data-dir", data_dir)
    assert code == 0, output

    restarted = start_daemon(daemons, data_dir)
    check_every_acknowledged_write(restarted, writer)
    assert restarted.terminate() == 0
