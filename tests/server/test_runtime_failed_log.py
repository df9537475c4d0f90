"""A partition whose last commit failed answers nothing from its shard until it has
reloaded: the shard may still hold what the failed commit lost, so even an error
answer (a fence) could rest on a write that is then answered 15. The long disk-fault
run found a request whose second entry on such a partition answered 124 after its
first answered 15."""

from __future__ import annotations

import asyncio

import pytest

from persistence import LogError, PartitionFailedError, StateLog
from protocol.messages import InitializePartition, Rpc, WritePartition
from protocol.records import ShareKey
from protocol.shard import ShardConfig
from server.runtime import PartitionRuntime

KEY = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAA", 0)


def write(state_epoch: int) -> WritePartition:
    return WritePartition(0, state_epoch, 0, 5, [])


def test_no_answer_rests_on_a_shard_whose_log_failed(tmp_path) -> None:
    log = StateLog.open(str(tmp_path / "data"), 1)
    try:
        runtime = PartitionRuntime(0, log.partition(0), ShardConfig())
        asyncio.run(runtime.load())
        assert runtime.execute(Rpc.INITIALIZE, KEY, InitializePartition(0, 1, 0)).error_code == 0
        assert runtime.execute(Rpc.WRITE, KEY, write(0)).error_code == 124  # a stale epoch
        log.partition(0).fail(LogError("the journal write failed"))
        with pytest.raises(PartitionFailedError):
            runtime.execute(Rpc.WRITE, KEY, write(0))  # not 124: no record, yet refused
        with pytest.raises(PartitionFailedError):
            runtime.execute(Rpc.READ_SUMMARY, KEY, None)
    finally:
        log.close()
