"""The durable state log: segmented append-only files per state partition, group
commit, crash recovery, readers, pruning and the compaction swap. Deals in bytes only."""

from persistence.commit import DurabilityBarrier, GroupCommitter
from persistence.errors import (
    DurabilityError,
    LogCorruptionError,
    LogError,
    LogLockedError,
    MetaMismatchError,
    PartitionFailedError,
)
from persistence.fileops import FAILPOINTS_ENV, FaultInjectingFileOps, FileOps
from persistence.frame import (
    MAX_FRAME_LENGTH,
    CorruptFrame,
    FrameError,
    IncompleteFrame,
    InvalidFrame,
    LogRecord,
    decode_frame,
    encode_frame,
    iter_frames,
)
from persistence.partition import (
    DEFAULT_SEGMENT_BYTES,
    PartitionLog,
    RecoveryReport,
    TornTail,
)
from persistence.segments import (
    SegmentInfo,
    fingerprint_segment,
    list_segments,
    read_partition,
    read_segment,
)
from persistence.staging import SegmentFingerprint
from persistence.statelog import StateLog, partition_dir, read_meta
from persistence.swap import (
    SwapIncompleteError,
    commit_staged,
    pending_staged,
    recover_staging,
    write_staged,
)
from persistence.verify import Damage, PartitionVerifyResult, VerifyReport, verify

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FAILPOINTS_ENV",
    "MAX_FRAME_LENGTH",
    "CorruptFrame",
    "Damage",
    "DurabilityBarrier",
    "DurabilityError",
    "FaultInjectingFileOps",
    "FileOps",
    "FrameError",
    "GroupCommitter",
    "IncompleteFrame",
    "InvalidFrame",
    "LogCorruptionError",
    "LogError",
    "LogLockedError",
    "LogRecord",
    "MetaMismatchError",
    "PartitionFailedError",
    "PartitionLog",
    "PartitionVerifyResult",
    "RecoveryReport",
    "SegmentFingerprint",
    "SegmentInfo",
    "StateLog",
    "SwapIncompleteError",
    "TornTail",
    "VerifyReport",
    "commit_staged",
    "decode_frame",
    "encode_frame",
    "fingerprint_segment",
    "iter_frames",
    "list_segments",
    "partition_dir",
    "pending_staged",
    "read_meta",
    "read_partition",
    "read_segment",
    "recover_staging",
    "verify",
    "write_staged",
]
