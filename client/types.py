"""What the per-partition calls return, and the client's counters.

The batch calls (``write_many`` ...) return ``protocol.messages`` results, which carry
``error_code`` and ``error_message``; the per-partition calls raise on error, so what
they return holds only the state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import ReadPartitionResult, ReadSummaryPartitionResult
from protocol.state_batch import StateBatch


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A share-partition's state as ReadShareGroupState returns it (docs/semantics.md §5.2):
    ``state_batches`` sorted by first offset, never overlapping."""

    state_epoch: int
    start_offset: int
    state_batches: list[StateBatch] = field(default_factory=list)

    @classmethod
    def of(cls, result: ReadPartitionResult) -> ReadResult:
        return cls(result.state_epoch, result.start_offset, list(result.state_batches))


@dataclass(frozen=True, slots=True)
class ReadSummaryResult:
    """ReadShareGroupStateSummary (docs/semantics.md §5.5). A key with no state reads as
    ``start_offset`` -1, ``leader_epoch`` 0, ``state_epoch`` 0,
    ``delivery_complete_count`` -1."""

    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int

    @classmethod
    def of(cls, result: ReadSummaryPartitionResult) -> ReadSummaryResult:
        return cls(
            result.state_epoch,
            result.leader_epoch,
            result.start_offset,
            result.delivery_complete_count,
        )


@dataclass(slots=True)
class ClientStats:
    """Counters of what the client did, for logs, metrics and tests.

    ``requests``: HTTP requests of the five RPCs; ``entries_sent``: partition entries
    they carried; ``retries``: entries sent again after a retriable failure;
    ``coordinator_lookups``: find-coordinator requests the routing made;
    ``not_coordinator``: entries answered 16 NOT_COORDINATOR (each drops a cached owner).
    """

    requests: int = 0
    entries_sent: int = 0
    retries: int = 0
    coordinator_lookups: int = 0
    not_coordinator: int = 0
