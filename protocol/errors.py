"""Kafka error codes used by the share-group state RPCs (docs/semantics.md §12, docs/api.md).

One class per error, as in aiokafka: ``errno``, the Kafka name, the default message
and whether a caller may retry. Errors travel as data (a code and a message in each
partition's result); the classes serve the client, which raises them, and the tables
below, which everything else reads.
"""

from __future__ import annotations

from typing import ClassVar


class ShareCoordinatorError(Exception):
    """Base of all Kafka errors sharecoord reports."""

    errno: ClassVar[int]
    name: ClassVar[str]
    default_message: ClassVar[str | None]
    retriable: ClassVar[bool] = False

    def __init__(self, message: str | None = None) -> None:
        self.message = message if message is not None else self.default_message
        super().__init__(f"[{self.errno} {self.name}] {self.message}")


class NoError(ShareCoordinatorError):
    errno = 0
    name = "NONE"
    default_message = None


class UnknownServerError(ShareCoordinatorError):
    errno = -1
    name = "UNKNOWN_SERVER_ERROR"
    default_message = "The server experienced an unexpected error when processing the request."


class UnknownTopicOrPartition(ShareCoordinatorError):
    errno = 3
    name = "UNKNOWN_TOPIC_OR_PARTITION"
    default_message = "This server does not host this topic-partition."
    retriable = True


class CoordinatorLoadInProgress(ShareCoordinatorError):
    errno = 14
    name = "COORDINATOR_LOAD_IN_PROGRESS"
    default_message = "The coordinator is loading and hence can't process requests."
    retriable = True


class CoordinatorNotAvailable(ShareCoordinatorError):
    errno = 15
    name = "COORDINATOR_NOT_AVAILABLE"
    default_message = "The coordinator is not available."
    retriable = True


class NotCoordinator(ShareCoordinatorError):
    errno = 16
    name = "NOT_COORDINATOR"
    default_message = "This is not the correct coordinator."
    retriable = True


class ClusterAuthorizationFailed(ShareCoordinatorError):
    errno = 31
    name = "CLUSTER_AUTHORIZATION_FAILED"
    default_message = "Cluster authorization failed."


class InvalidRequest(ShareCoordinatorError):
    errno = 42
    name = "INVALID_REQUEST"
    default_message = (
        "This most likely occurs because of a request being malformed by the client library "
        "or the message was sent to an incompatible broker."
    )


class GroupIdNotFound(ShareCoordinatorError):
    errno = 69
    name = "GROUP_ID_NOT_FOUND"
    default_message = "The group id does not exist."


class FencedLeaderEpoch(ShareCoordinatorError):
    errno = 74
    name = "FENCED_LEADER_EPOCH"
    default_message = "The leader epoch in the request is older than the epoch on the broker."


class FencedStateEpoch(ShareCoordinatorError):
    errno = 124
    name = "FENCED_STATE_EPOCH"
    # Kafka 4.4.0's text for 124 (earlier Kafka versions said "The share coordinator
    # rejected the request because the share-group state epoch did not match.").
    default_message = "The coordinator rejected the request because the state epoch did not match."


ERRORS: dict[int, type[ShareCoordinatorError]] = {
    cls.errno: cls
    for cls in (
        NoError,
        UnknownServerError,
        UnknownTopicOrPartition,
        CoordinatorLoadInProgress,
        CoordinatorNotAvailable,
        NotCoordinator,
        ClusterAuthorizationFailed,
        InvalidRequest,
        GroupIdNotFound,
        FencedLeaderEpoch,
        FencedStateEpoch,
    )
}


def for_code(code: int) -> type[ShareCoordinatorError]:
    """The error class of a Kafka error code; unknown codes map to UnknownServerError."""
    return ERRORS.get(code, UnknownServerError)


# Codes as plain ints for the hot path, where results carry (code, message).
NONE = NoError.errno
UNKNOWN_SERVER_ERROR = UnknownServerError.errno
UNKNOWN_TOPIC_OR_PARTITION = UnknownTopicOrPartition.errno
COORDINATOR_LOAD_IN_PROGRESS = CoordinatorLoadInProgress.errno
COORDINATOR_NOT_AVAILABLE = CoordinatorNotAvailable.errno
NOT_COORDINATOR = NotCoordinator.errno
CLUSTER_AUTHORIZATION_FAILED = ClusterAuthorizationFailed.errno
INVALID_REQUEST = InvalidRequest.errno
GROUP_ID_NOT_FOUND = GroupIdNotFound.errno
FENCED_LEADER_EPOCH = FencedLeaderEpoch.errno
FENCED_STATE_EPOCH = FencedStateEpoch.errno

# The texts the coordinator supplies instead of a default (docs/semantics.md §12).
MSG_NULL_TOPIC = "The topic id cannot be null."
MSG_NEGATIVE_PARTITION = "The partition id cannot be a negative number."
MSG_WRITE_UNINITIALIZED = "Write operation on uninitialized share partition not allowed."
MSG_READ_UNINITIALIZED = "Read operation on uninitialized share partition not allowed."
# The service's own text for 15 (docs/semantics.md §12).
MSG_SHARE_COORDINATOR_NOT_AVAILABLE = "Share coordinator is not available."


def default_message(code: int) -> str | None:
    """The default message of a code (None for success)."""
    return for_code(code).default_message
