"""The journal's fdatasync finished by the kernel, not by a thread.

Linux AIO's IOCB_CMD_FDSYNC (4.18 and later) runs the flush in a kernel worker and
signals its end to an eventfd, which the event loop watches. The commit cycle then has
no thread on its path: measured on one core, a thread that returns from fdatasync waits
for the core and the interpreter lock the event loop holds, and that wait, not the disk,
made the open-loop p99 (README, "What bounds each figure").

AIO, not io_uring: the default seccomp profile of Docker refuses io_uring, and AIO's
four system calls are all this needs. Where AIO is not there (another OS or
architecture, a kernel without FDSYNC, a seccomp profile that refuses io_setup, the
system's aio-max-nr spent), ``KernelFlush.open`` says why and the committer keeps the
commit thread.

One request at a time: a cycle flushes one journal record, and the next cycle starts
after it. Event loop thread only.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import platform
import struct
import sys

_log = logging.getLogger("sharecoord.log")

# io_setup, io_destroy, io_submit, io_getevents: the numbers differ by architecture.
_SYSCALLS = {
    "x86_64": (206, 207, 209, 208),
    "aarch64": (0, 1, 2, 4),
}
# struct iocb (64 bytes, little-endian): aio_data, aio_key, aio_rw_flags,
# aio_lio_opcode, aio_reqprio, aio_fildes, aio_buf, aio_nbytes, aio_offset,
# aio_reserved2, aio_flags, aio_resfd.
_IOCB = struct.Struct("<QIIHhIQQqQII")
# struct io_event: data, obj, res, res2.
_EVENT = struct.Struct("<QQqq")
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_MAX_EVENTS = 4


def _syscalls() -> tuple[ctypes.CDLL, tuple[int, int, int, int]] | str:
    """libc and the four numbers, or why there are none here."""
    if not sys.platform.startswith("linux"):
        return f"Linux AIO is Linux only (this is {sys.platform})"
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"no AIO system call numbers for {platform.machine()}"
    if sys.byteorder != "little":
        return "struct iocb is laid out here for little-endian machines only"
    return ctypes.CDLL(None, use_errno=True), numbers


class KernelFlush:
    """fdatasync(fd) -> a future the event loop completes when the kernel is done."""

    def __init__(self, libc: ctypes.CDLL, numbers: tuple[int, int, int, int]) -> None:
        self._libc = libc
        self._setup, self._destroy, self._submit, self._getevents = numbers
        self._context = ctypes.c_ulong(0)
        self._eventfd = -1
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._iocbs = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size * _MAX_EVENTS)
        self._no_wait = (ctypes.c_long * 2)(0, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: asyncio.Future[None] | None = None
        self.flushes = 0  # completed, for the tests and the metrics

    @classmethod
    def open(cls) -> KernelFlush | None:
        """A kernel flush, or None (and a line saying why) where there is none."""
        found = _syscalls()
        if isinstance(found, str):
            _log.info("journal flush: in the commit thread (%s)", found)
            return None
        flush = cls(*found)
        result = flush._libc.syscall(
            ctypes.c_long(flush._setup), ctypes.c_long(_MAX_EVENTS), ctypes.byref(flush._context)
        )
        if result != 0:
            code = ctypes.get_errno()
            _log.info(
                "journal flush: in the commit thread (io_setup refused: %s)", os.strerror(code)
            )
            return None
        try:
            flush._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError as exc:
            flush.close()
            _log.info("journal flush: in the commit thread (no eventfd: %s)", exc)
            return None
        return flush

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._eventfd, self._on_ready)

    def fdatasync(self, fd: int) -> asyncio.Future[None]:
        """Submit the flush of ``fd`` (which must stay open until the future is done).
        Raises OSError at once if the kernel will not take it (EINVAL from a kernel
        without FDSYNC): nothing was submitted, the caller flushes another way."""
        assert self._loop is not None, "start() first"
        if self._waiting is not None:
            raise RuntimeError("one kernel flush at a time")
        _IOCB.pack_into(
            self._iocb, 0, 1, 0, 0, _IOCB_CMD_FDSYNC, 0, fd, 0, 0, 0, 0,
            _IOCB_FLAG_RESFD, self._eventfd,
        )  # fmt: skip
        result = self._libc.syscall(
            ctypes.c_long(self._submit), self._context, ctypes.c_long(1), self._iocbs
        )
        if result != 1:
            code = ctypes.get_errno() if result < 0 else errno.EAGAIN
            raise OSError(code, f"io_submit(IOCB_CMD_FDSYNC): {os.strerror(code)}")
        self._waiting = self._loop.create_future()
        return self._waiting

    def _on_ready(self) -> None:
        try:
            os.eventfd_read(self._eventfd)
        except BlockingIOError:
            return
        count = self._libc.syscall(
            ctypes.c_long(self._getevents),
            self._context,
            ctypes.c_long(0),
            ctypes.c_long(_MAX_EVENTS),
            self._events,
            self._no_wait,
        )
        for index in range(max(count, 0)):
            _, _, result, _ = _EVENT.unpack_from(self._events, _EVENT.size * index)
            waiting, self._waiting = self._waiting, None
            if waiting is None or waiting.done():
                continue  # its cycle was cancelled (a shutdown)
            if result < 0:
                waiting.set_exception(OSError(-result, f"fdatasync: {os.strerror(-result)}"))
            else:
                self.flushes += 1
                waiting.set_result(None)

    def close(self) -> None:
        """Stop watching and release the context. A flush still in the kernel ends
        there (io_destroy waits for it)."""
        if self._loop is not None and self._eventfd >= 0:
            self._loop.remove_reader(self._eventfd)
            self._loop = None
        if self._context.value:
            self._libc.syscall(ctypes.c_long(self._destroy), self._context)
            self._context = ctypes.c_ulong(0)
        if self._eventfd >= 0:
            os.close(self._eventfd)
            self._eventfd = -1
