"""The daemon fixes glibc's mmap threshold (server/daemon.py,
``return_big_buffers_to_the_system``): a big buffer goes back to the system when it is
freed, even when small blocks allocated after it are still alive, instead of leaving a
hole in the heap that the process keeps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import REPO_ROOT, child_env

# 400 buffers of 200 KB (a Read answer of a large state); every other one is freed
# while its neighbours stay: what the heap looks like while some answers went out and
# others wait.
CHILD = """
from server.daemon import return_big_buffers_to_the_system

def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

assert return_big_buffers_to_the_system()
first = bytearray(200_000)
del first  # the first big block freed: glibc's threshold moves up to its size
answers = [bytearray(200_000) for _ in range(400)]
before = rss_kib()
del answers[::2]
print(before - rss_kib())
"""


def freed_kib() -> int:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True, text=True, env=child_env(), cwd=REPO_ROOT, timeout=120, check=True,
    )  # fmt: skip
    return int(done.stdout)


@pytest.mark.skipif(
    not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
    reason="the threshold is glibc's; other C libraries are left alone",
)
def test_big_buffers_go_back_to_the_system_when_freed():
    # 200 x 200 KB is 39 MiB: nearly all of it must leave the process.
    assert freed_kib() > 35 * 1024
