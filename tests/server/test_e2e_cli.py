"""The operator commands and the daemon's start-up refusals, as processes (docs/api.md#cli).

* ``sharecoord log verify`` exits 0 on a healthy data directory and 1 on a damaged one;
  the daemon then serves every partition but the damaged one, which answers 15.
* ``sharecoord log dump`` prints the records.
* ``sharecoord state get`` prints admin state and exits 1 for a missing key.
* A second daemon on a data directory in use exits 1 naming the LOCK; a ``--partitions``
  that differs from the directory's is refused with a clear message.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
import pytest

from persistence import list_segments, partition_dir
from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    DaemonExited,
    body,
    next_write,
    partitions_in,
    run_cli,
)

NUM_PARTITIONS = 4
DAMAGED = 3
GROUP = "cli"


async def cli(*args: str):
    return await asyncio.to_thread(run_cli, *args)


async def fill(spawn, data_dir: Path) -> AcknowledgedGroup:
    """A data directory with state in every partition and many records in ``DAMAGED``;
    the daemon is stopped again."""
    keys = {
        p: partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=2) for p in range(NUM_PARTITIONS)
    }
    model = AcknowledgedGroup(GROUP, [k for ks in keys.values() for k in ks])
    rng = random.Random(5)
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
        for _ in range(40):
            writes = {k: next_write(rng, k, model.exact(k)) for k in keys[DAMAGED]}
            entries = [entry for entry, _ in writes.values()]
            assert set(await api.codes("write", body(GROUP, (TOPIC, entries)))) == {0}
            for k, (_, expected) in writes.items():
                model.acknowledge(k, expected)
    assert await asyncio.to_thread(daemon.terminate) == 0
    return model


def flip_middle_byte(data_dir: Path, partition: int) -> Path:
    segment = Path(list_segments(partition_dir(data_dir, partition))[-1].path)
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    return segment


async def test_log_verify_healthy_then_damaged(spawn, tmp_path):
    data_dir = tmp_path / "data"
    model = await fill(spawn, data_dir)
    verify = await cli("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.splitlines()[-1].startswith(f"ok: {NUM_PARTITIONS} partitions")

    segment = await asyncio.to_thread(flip_middle_byte, data_dir, DAMAGED)
    verify = await cli("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 1, verify.stdout
    assert f"partition {DAMAGED}: DAMAGED" in verify.stdout
    assert segment.name in verify.stdout
    assert "DAMAGED" in verify.stdout.splitlines()[-2]

    # The daemon serves the rest and answers 15 for the damaged partition.
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        ready = await api.readyz()
        assert (ready.status, ready.body["failed_partitions"]) == (200, [DAMAGED])
        for key in model.keys:
            expected = model.exact(key)
            reply = await api.admin_state(GROUP, TOPIC, key)
            if key in partitions_in(DAMAGED, NUM_PARTITIONS, group_id=GROUP, count=2):
                assert (reply.status, reply.body["error_code"]) == (503, 15)
                assert "verify" in reply.body["error_message"]
            else:
                assert expected.matches(reply.body), (key, reply.body)
        damaged_key = partitions_in(DAMAGED, NUM_PARTITIONS, group_id=GROUP)[0]
        assert await api.codes(
            "read", body(GROUP, (TOPIC, [{"partition": damaged_key, "leader_epoch": -1}]))
        ) == [15]
    # Still nothing changed on disk by the daemon: verify still names the damage.
    assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await cli("log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 1


async def test_log_dump_prints_every_record(spawn, tmp_path):
    data_dir = tmp_path / "data"
    model = await fill(spawn, data_dir)
    dump = await cli("log", "dump", "--data-dir", str(data_dir))
    assert dump.returncode == 0, dump.stderr
    lines = dump.stdout.splitlines()
    # 8 initializes, 80 writes.
    assert len(lines) == len(model.keys) + 80
    assert sum("ShareSnapshot" in line for line in lines) >= len(model.keys)
    assert any("ShareUpdate" in line for line in lines)
    assert all(f"{GROUP}:{TOPIC}:" in line for line in lines)
    dump = await cli(
        "log", "dump", "--data-dir", str(data_dir), "--partition", str(DAMAGED), "--json"
    )
    assert dump.returncode == 0, dump.stderr
    records = [json.loads(line) for line in dump.stdout.splitlines()]
    assert len(records) == 2 + 80
    assert [r["log_offset"] for r in records] == list(range(len(records)))
    assert {r["state_partition"] for r in records} == {DAMAGED}
    last = {r["partition"]: r for r in records}
    for key, record in last.items():
        assert record["start_offset"] == model.exact(key).start_offset
        assert record["delivery_complete_count"] == model.exact(key).delivery_complete_count
    bad = await cli("log", "dump", "--data-dir", str(data_dir), "--partition", "99")
    assert bad.returncode == 2


async def test_state_get_prints_admin_state_and_exits_1_for_a_missing_key(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data")
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        await api.rpc(
            "initialize",
            body(GROUP, (TOPIC, [{"partition": 3, "state_epoch": 2, "start_offset": 11}])),
        )
        expected = await api.state(GROUP, TOPIC, 3)
    args = ("state", "get", "--url", daemon.url, "--group", GROUP, "--partition")
    found = await cli(*args, "3", "--topic", TOPIC)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == expected
    missing = await cli(*args, "4", "--topic", TOPIC)
    assert missing.returncode == 1
    assert "HTTP 404" in missing.stderr
    assert missing.stdout == ""
    unreachable = await cli(
        "state",
        "get",
        "--url",
        "http://127.0.0.1:1",
        "--group",
        "g",
        "--topic",
        TOPIC,
        "--partition",
        "0",
    )
    assert unreachable.returncode == 1
    usage = await cli("state", "get", "--url", daemon.url, "--group", GROUP)
    assert usage.returncode == 2


async def test_a_second_daemon_on_the_same_data_directory_exits_1_naming_the_lock(spawn, tmp_path):
    data_dir = tmp_path / "data"
    first = await spawn(data_dir)
    with pytest.raises(DaemonExited) as refused:
        await spawn(data_dir)
    assert refused.value.code == 1
    assert "LOCK" in refused.value.stderr
    assert "Traceback" not in refused.value.stderr
    # The first one is unharmed.
    async with aiohttp.ClientSession() as session:
        assert (await Api(session, first.url).readyz()).status == 200
    assert await asyncio.to_thread(first.terminate) == 0


async def test_a_partitions_mismatch_is_refused_with_a_clear_message(spawn, tmp_path):
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, partitions=8)
    assert await asyncio.to_thread(daemon.terminate) == 0
    with pytest.raises(DaemonExited) as refused:
        await spawn(data_dir, partitions=4)
    assert refused.value.code == 1
    message = refused.value.stderr
    assert "num_partitions=8" in message
    assert "num_partitions=4" in message
    assert "fixed" in message
    assert "Traceback" not in message
    # The default (50) is refused the same way.
    with pytest.raises(DaemonExited):
        await spawn(data_dir, partitions=None)
    # And the right count still opens it.
    daemon = await spawn(data_dir, partitions=8)
    assert await asyncio.to_thread(daemon.terminate) == 0


# --- start-up refusals say what is wrong, without a trace -----------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--auth-token-file", "{missing}"), "auth token file"),
        (("--auth-token-file", "{empty}"), "it is empty"),
        (("--tls-cert", "{missing}", "--tls-key", "{missing}"), "TLS certificate"),
        (("--tls-cert", "{empty}", "--tls-key", "{empty}"), "not a PEM certificate"),
    ],
)
async def test_unusable_token_or_tls_files_are_usage_errors(spawn, tmp_path, flags, named):
    """security.py's errors are reported as usage errors (exit 2), naming the file."""
    empty = tmp_path / "empty"
    await asyncio.to_thread(empty.write_text, "")
    paths = {"missing": str(tmp_path / "missing.pem"), "empty": str(empty)}
    with pytest.raises(DaemonExited) as refused:
        await spawn(tmp_path / "data", *(f.format(**paths) for f in flags))
    assert refused.value.code == 2, refused.value.stderr
    assert named in refused.value.stderr
    assert "Traceback" not in refused.value.stderr, refused.value.stderr


async def test_a_damaged_topic_catalog_is_refused_plainly(spawn, tmp_path):
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir)
    assert await asyncio.to_thread(daemon.terminate) == 0
    await asyncio.to_thread((data_dir / "topics.json").write_text, "{not json")
    with pytest.raises(DaemonExited) as refused:
        await spawn(data_dir)
    assert refused.value.code == 1
    assert "topics.json" in refused.value.stderr
    assert "Traceback" not in refused.value.stderr, refused.value.stderr


async def test_a_port_in_use_is_refused_plainly(spawn, tmp_path):
    first = await spawn(tmp_path / "one")
    with pytest.raises(DaemonExited) as refused:
        await spawn(tmp_path / "two", listen=f"127.0.0.1:{first.port}")
    assert refused.value.code == 1
    assert f"127.0.0.1:{first.port}" in refused.value.stderr
    assert "Traceback" not in refused.value.stderr, refused.value.stderr
    # The data directory it did not serve is left unlocked for the next one.
    second = await spawn(tmp_path / "two")
    assert await asyncio.to_thread(second.terminate) == 0
