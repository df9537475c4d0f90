"""An asyncio client for sharecoord, for share-partition leaders (KIP-932).

Example, against ``make serve`` (a daemon on 127.0.0.1:9095)::

    import asyncio

    from client import ACQUIRED, FencedLeaderEpoch, ShareCoordinatorClient, StateBatch

    GROUP, TOPIC = "orders-share-group", "WwwvDo06T2ueIXxNGis8TQ"


    async def main() -> None:
        async with ShareCoordinatorClient("http://127.0.0.1:9095") as coordinator:
            # A share-partition leader takes over partition 0 of TOPIC for GROUP.
            await coordinator.initialize(GROUP, TOPIC, 0, state_epoch=0, start_offset=100)
            state = await coordinator.read(GROUP, TOPIC, 0, leader_epoch=1)
            print(state.start_offset, state.state_batches)
            # 100-109 are done; 110-119 are out for their first delivery.
            await coordinator.write(
                GROUP, TOPIC, 0, state_epoch=0, leader_epoch=1, start_offset=110,
                state_batches=[StateBatch(110, 119, ACQUIRED, 1)],
            )
            state = await coordinator.read(GROUP, TOPIC, 0, leader_epoch=1)
            print(state.start_offset, state.state_batches)
            try:  # a leader of an older epoch is fenced
                await coordinator.read(GROUP, TOPIC, 0, leader_epoch=0)
            except FencedLeaderEpoch as exc:
                print(exc)


    asyncio.run(main())

It prints::

    100 []
    110 [StateBatch(first_offset=110, last_offset=119, delivery_state=1, delivery_count=1)]
    [74 FENCED_LEADER_EPOCH] The leader epoch in the request is older than the epoch on the broker.

See ``ShareCoordinatorClient`` for errors, retries, coalescing and why a retried write
is applied at least once.
"""

from client.client import ShareCoordinatorClient
from client.retry import DeadlineExceeded, RetryPolicy, backoff_delay
from client.routing import ConfigurationError
from client.transport import make_ssl_context
from client.types import ClientStats, ReadResult, ReadSummaryResult
from protocol.batches import ACKNOWLEDGED, ACQUIRED, ARCHIVED, AVAILABLE
from protocol.codec import Format
from protocol.errors import (
    ClusterAuthorizationFailed,
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    FencedLeaderEpoch,
    FencedStateEpoch,
    InvalidRequest,
    NotCoordinator,
    ShareCoordinatorError,
    UnknownServerError,
    UnknownTopicOrPartition,
)
from protocol.messages import (
    AdminState,
    CoordinatorResult,
    DeletePartition,
    InitializePartition,
    PartitionResult,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    ReadSummaryPartitionResult,
    WritePartition,
)
from protocol.state_batch import StateBatch

__all__ = [
    "ACKNOWLEDGED",
    "ACQUIRED",
    "ARCHIVED",
    "AVAILABLE",
    "AdminState",
    "ClientStats",
    "ClusterAuthorizationFailed",
    "ConfigurationError",
    "CoordinatorLoadInProgress",
    "CoordinatorNotAvailable",
    "CoordinatorResult",
    "DeadlineExceeded",
    "DeletePartition",
    "FencedLeaderEpoch",
    "FencedStateEpoch",
    "Format",
    "InitializePartition",
    "InvalidRequest",
    "NotCoordinator",
    "PartitionResult",
    "ReadPartition",
    "ReadPartitionResult",
    "ReadResult",
    "ReadSummaryPartition",
    "ReadSummaryPartitionResult",
    "ReadSummaryResult",
    "RetryPolicy",
    "ShareCoordinatorClient",
    "ShareCoordinatorError",
    "StateBatch",
    "UnknownServerError",
    "UnknownTopicOrPartition",
    "WritePartition",
    "backoff_delay",
    "make_ssl_context",
]
