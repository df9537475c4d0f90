"""Whether the journal can take records, on a disk that may be full.

The group commit (commit.py) writes a record only into a journal segment made ahead of
need, and only once the data directory's open is finished (StateLog.finish_opening:
ASSIGNMENT, a torn tail's copy, CHECKPOINT). Both need room. JournalReadiness makes
them, in the checkpoint thread, at start and after every roll; when the disk has no
room for them it says the disk is full (`disk_full`, and `on_disk_full` with the
error), so that writes are refused (15) before they reach a shard: a shard that took a
write the journal then refused would have to reload, and its reads would stop
meanwhile. It tries again as the free space grows (room.py; from 50 ms doubling to
DISK_FULL_RETRY_S without a sign of room, for a quota), and says when there is room
again (`on_disk_full(None)`, and RoomWatch.note_room for whoever else waits).

A failure met while writes are taken is tried again at once before they are refused:
one that has already passed (the disk was freed while the try ran) stops none. While
they are refused, the tries go on whatever the disk says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from persistence.fileops import is_disk_full
from persistence.journal import Journal
from persistence.room import DISK_FULL_RETRY_S, RoomWatch
from persistence.statelog import StateLog

_log = logging.getLogger("sharecoord.log")

DISK_FULL_RETRY_INITIAL_S = 0.05  # then doubling to room.DISK_FULL_RETRY_S

# The disk is full (the error that said so), or has room again (None).
DiskFullCallback = Callable[[BaseException | None], None]
# A try's outcome: the error that kept the journal from being ready (None: it is), with
# the free space just after it.
Outcome = tuple[BaseException | None, int | None]


class JournalReadiness:
    """The journal's room for records (module docstring). Its methods run on the event
    loop; the tries run in the executor given to `start` (the checkpoint thread)."""

    def __init__(
        self,
        log: StateLog,
        journal: Journal,
        room: RoomWatch,
        on_disk_full: DiskFullCallback | None = None,
    ) -> None:
        self._log = log
        self._journal = journal
        self._room = room
        self._on_disk_full = on_disk_full
        self._executor: Executor | None = None
        self._disk_full: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = False  # a roll since the running try began: one more after it
        self._prepared: asyncio.Future[None] | None = None

    @property
    def disk_full(self) -> BaseException | None:
        return self._disk_full

    def start(self, executor: Executor) -> None:
        """The first try, at once: the journal's first segments, the end of the open."""
        self._executor = executor
        self._prepared = asyncio.get_running_loop().create_future()
        self.make_ready()

    async def prepared(self) -> None:
        """Return once the first try's outcome is known (and reported)."""
        if self._prepared is not None:
            await asyncio.shield(self._prepared)

    def make_ready(self) -> None:
        """Make the journal ready for records (after a roll: its next segment). The try
        is handed to the executor now, so that it runs before anything given later."""
        if self._executor is None:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._again = False
        attempt = asyncio.wrap_future(self._executor.submit(self._try))
        self._task = asyncio.get_running_loop().create_task(
            self._until_ready(attempt), name="journal-ready"
        )

    def refused(self, error: BaseException) -> None:
        """A cycle's journal record met a full disk: writes are refused until a try
        works."""
        self._report(error)
        self.make_ready()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _until_ready(self, attempt: asyncio.Future[Outcome]) -> None:
        loop = asyncio.get_running_loop()
        delay = DISK_FULL_RETRY_INITIAL_S
        confirm = self._disk_full is None
        try:
            while True:
                error, free = await attempt
                if error is None:
                    self._report(None)
                    self._set_prepared()
                    if not self._again:
                        return
                    confirm = True
                elif not (
                    is_disk_full(error)
                    or self._log.opening_unfinished
                    or self._disk_full is not None
                ):
                    # Not the room: the next roll makes the segment itself, or fails the
                    # cycle.
                    _log.warning("journal: next segment not made ahead of need: %s", error)
                    return
                elif confirm:
                    confirm = False
                else:
                    # No room, or the end of the open refused (by whatever error): no
                    # record can be written until this works.
                    self._report(error)
                    self._set_prepared()
                    await self._room.wait_for_more(free, delay)
                    delay = min(delay * 2, DISK_FULL_RETRY_S)
                self._again = False
                attempt = loop.run_in_executor(self._executor, self._try)
        finally:
            self._set_prepared()

    def _try(self) -> Outcome:
        """(In the executor.) Finish the open, make the next segment."""
        try:
            self._log.finish_opening()
            self._journal.ensure_spare()
        except OSError as exc:
            return exc, self._room.free_bytes()
        return None, None

    def _set_prepared(self) -> None:
        if self._prepared is not None and not self._prepared.done():
            self._prepared.set_result(None)  # its waiters run after this step's report

    def _report(self, error: BaseException | None) -> None:
        if (error is None) == (self._disk_full is None):
            return
        self._disk_full = error
        if error is None:
            self._room.note_room()  # what else waits for room may try now
            _log.info("the journal has room again: writes are taken")
        else:
            _log.warning(
                "the disk is full (%s): writes answer 15 until the journal has room for its "
                "next segment; reads are served",
                error,
            )
        if self._on_disk_full is not None:
            self._on_disk_full(error)
