"""Waiting for room on a full disk.

What a full disk refused (a commit, a partition's repair, the writes that end an open)
is tried again once there may be room for it: as soon as the file system holding the
data directory has more free space than when the try failed, or someone found room
(``note_room``: the group commit made its next journal segment), and at least every
``max_wait_s`` (a quota, EDQUOT, does not show in the free space). One poll of the
free space serves every waiter, off the event loop: a disk that stays full costs one
statvfs per ``poll_s``, not a failed try per partition.
"""

from __future__ import annotations

import asyncio
import logging

from persistence.fileops import FileOps

_log = logging.getLogger("sharecoord.log")

POLL_S = 0.1
# The group commit's try on a full disk (its next journal segment: cheap) runs as soon as
# the free space grows, and at least every this (from 50 ms, doubling). A partition's
# reload keeps its own backoff (server/runtime.py), cut short the same way.
DISK_FULL_RETRY_S = 2.0


class RoomWatch:
    """The free space of the file system holding `path`, for waiters on a full disk."""

    def __init__(self, fs: FileOps, path: str, poll_s: float = POLL_S) -> None:
        self._fs = fs
        self._path = path
        self.poll_s = poll_s
        self._waiters = 0
        self._poller: asyncio.Task[None] | None = None
        self._polled: asyncio.Future[int | None] | None = None

    def free_bytes(self) -> int | None:
        """Free bytes now (blocking: a thread's call), or None if the system will not
        say."""
        try:
            return self._fs.free_bytes(self._path)
        except OSError as exc:
            _log.debug("%s: free space not known: %s", self._path, exc)
            return None

    async def wait_for_more(self, than: int | None, max_wait_s: float) -> None:
        """Return once the free space exceeds `than` (the free bytes when a try failed;
        None: not known), once someone noted room, or after `max_wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_s
        self._waiters += 1
        try:
            while (left := deadline - loop.time()) > 0:
                if than is None:
                    await asyncio.sleep(left)
                    return
                if self._poller is None or self._poller.done():
                    self._poller = loop.create_task(self._poll(), name="room-watch")
                if self._polled is None or self._polled.done():
                    self._polled = loop.create_future()
                try:
                    free = await asyncio.wait_for(asyncio.shield(self._polled), left)
                except asyncio.TimeoutError:
                    return
                if free is None or free > than:
                    return
        finally:
            self._waiters -= 1

    def note_room(self) -> None:
        """There is room again (a write that needed it worked): every waiter returns."""
        polled, self._polled = self._polled, None
        if polled is not None and not polled.done():
            polled.set_result(None)

    async def _poll(self) -> None:
        """While anyone waits: the free space every poll_s, to every waiter at once."""
        while self._waiters:
            await asyncio.sleep(self.poll_s)
            free = await asyncio.to_thread(self.free_bytes)
            polled, self._polled = self._polled, None
            if polled is not None and not polled.done():
                polled.set_result(free)
