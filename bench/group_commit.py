"""Sequential versus parallel fdatasync in the group commit (not a test: a measurement).

    python -m bench.group_commit [DIR]

For each number of dirty partitions, runs cycles of: append one 2 KB record to each,
wait until all are durable. Reports ms per cycle for 1, 2, 4 and 8 commit threads
(1 = one thread doing the partitions in sequence). DIR should be on the disk the
daemon will use; the default is a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time

from persistence import GroupCommitter, StateLog

CYCLES = 200
VALUE = os.urandom(2000)


async def cycles_ms(log: StateLog, dirty: int, threads: int) -> float:
    committer = GroupCommitter(log, commit_threads=threads)
    committer.start()
    try:
        started = time.perf_counter()
        for cycle in range(CYCLES):
            waits = []
            for p in range(dirty):
                offset = log.partition(p).append(1, b"key", VALUE, cycle)
                waits.append(committer.wait_durable(p, offset))
            await asyncio.gather(*waits)
        return (time.perf_counter() - started) / CYCLES * 1000
    finally:
        await committer.close()


def main() -> None:
    parent = sys.argv[1] if len(sys.argv) > 1 else None
    print("dirty  " + "  ".join(f"{t} thr" for t in (1, 2, 4, 8)) + "   (ms per cycle)")
    for dirty in (1, 4, 16, 50):
        row = []
        for threads in (1, 2, 4, 8):
            data_dir = tempfile.mkdtemp(prefix="bench-gc-", dir=parent)
            try:
                log = StateLog.open(data_dir, 50)
                for p in range(50):
                    log.partition(p).open()
                row.append(asyncio.run(cycles_ms(log, dirty, threads)))
                log.close()
            finally:
                shutil.rmtree(data_dir)
        print(f"{dirty:5d}  " + "  ".join(f"{ms:5.2f}" for ms in row))


if __name__ == "__main__":
    main()
