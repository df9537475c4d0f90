"""The node's state store on PostgreSQL (``--state-store postgresql://...``): the
PostgreSQL store (persistence/postgres/), its group commit, and the leases by which this
node leads state partitions (server/leadership.py), behind the node's ``NodeStore``
(server/store.py). Imported only for such a store: psycopg is the ``postgres`` extra.

A commit refused by the epoch check (``NotLeaderError``) is the leadership's to handle
(the partition is dropped and answers 16); any other failed commit is the runtime's (it
answers 15 and reloads from what PostgreSQL has, as after a failed fsync).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from persistence import GroupCommitter
from persistence.errors import NotLeaderError
from persistence.postgres import PostgresStore
from persistence.room import RoomWatch
from persistence.store_uri import masked
from server.config import ServeConfig
from server.leadership import Leadership, PartitionHost
from server.metrics import ShareCoordinatorMetrics
from server.store import cycle_recorder, not_durable

_log = logging.getLogger("sharecoord.node")


class PostgresNodeStore:
    def __init__(
        self,
        log: PostgresStore,
        config: ServeConfig,
        metrics: ShareCoordinatorMetrics,
        on_partition_failure: Callable[[int, BaseException], None],
    ) -> None:
        self.log = log
        self._config = config
        self._on_partition_failure = on_partition_failure
        self._leadership: Leadership | None = None
        self.committer: GroupCommitter[Any] = GroupCommitter(
            log,
            on_partition_failure=self._partition_failed,
            linger_ms=config.append_linger_ms,
            on_cycle=cycle_recorder(metrics),
        )
        self.description = (
            f"the PostgreSQL store {masked(log.uri)}, schema {log.tables.schema}, "
            f"as node {config.node_id}"
        )

    @classmethod
    async def open(
        cls,
        config: ServeConfig,
        metrics: ShareCoordinatorMetrics,
        *,
        on_partition_failure: Callable[[int, BaseException], None],
    ) -> PostgresNodeStore:
        """Connect and create or upgrade the tables (in a thread). Raises LogError for a
        URI libpq cannot use or another number of partitions, StoreUnavailableError
        when the server cannot be reached: one line each, the password masked."""
        assert config.state_store is not None
        log = await asyncio.to_thread(
            PostgresStore.open,
            config.state_store,
            config.partitions,
            config.node_id,
            schema=config.state_store_schema,
            timeout_ms=config.state_store_timeout_ms,
        )
        return cls(log, config, metrics, on_partition_failure)

    @property
    def room(self) -> RoomWatch | None:
        return None  # no disk of its own fills up

    def leadership(self, host: PartitionHost) -> Leadership:
        if self._leadership is None:
            self._leadership = Leadership(self.log, host, lease_ms=self._config.lease_ms)
        return self._leadership

    def _partition_failed(self, partition: int, cause: BaseException) -> None:
        if isinstance(cause, NotLeaderError):
            if self._leadership is not None:
                self._leadership.lost(partition, cause)
            return
        self._on_partition_failure(partition, cause)

    def start(self) -> None:
        self.committer.start()

    async def close(self) -> None:
        """The final commit (under leases still held), the leases released, the store
        closed; closed even if the commit failed."""
        try:
            await self.committer.close()
            if self._leadership is not None:
                await asyncio.to_thread(self._leadership.release_all)
        finally:
            await asyncio.to_thread(self.log.close)

    def not_durable(self) -> list[int]:
        return not_durable(self.log)
