"""Runs `sharecoord partition import` in this process and kills it with SIGKILL right
after the n-th rename whose source path ends with a given suffix has returned: a crash
between two steps of the import (server/partition_import.py's module docstring).

    python -m tests.server.import_crash_child DATA EXPORT NODE SUFFIX N

Exits 3 if the import ends without the kill (the suffix never matched n times).
"""

from __future__ import annotations

import os
import signal
import sys

from persistence import FileOps
from server.partition_import import import_partition


class KilledAfterRename(FileOps):
    def __init__(self, suffix: str, nth: int) -> None:
        self.suffix = suffix
        self.left = nth

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if src.endswith(self.suffix):
            self.left -= 1
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    data_dir, source, node, suffix, nth = sys.argv[1:]
    import_partition(data_dir, source, int(node), fs=KilledAfterRename(suffix, int(nth)))
    return 3


if __name__ == "__main__":
    sys.exit(main())
